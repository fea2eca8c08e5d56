"""Fixtures: the Nomad simulator on a free port and standalone controllers in-process."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from controller.api_tier import ApiTier
from controller.core.runner_ids import META_POOL
from controller.core.times import utcnow
from controller.core.views import RunnerState
from controller.engine.engine import Clock
from controller.lab.invariants import NomadJob, PoolSnapshot, check_invariants
from controller.lab.simulator import SimServer, Simulator, start_sim
from controller.nomad.config import NomadConfig
from controller.poseidon.context import PoseidonSettings
from controller.serving import ServingSettings
from controller.standalone import Controller, Settings
from tests.integration.fake_http import Loopback
from tests.support.waiting import wait_until

TOKEN = "test-api-token"


class FakeClock:
    """An injected clock for the controller: time moves only when a test says so."""

    def __init__(self) -> None:
        self.now = datetime.now(UTC).replace(microsecond=0)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


def write_pools(path: Path, *documents: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump_all(list(documents), sort_keys=False))
    return path


@pytest.fixture
async def sim() -> AsyncIterator[Simulator]:
    yield Simulator(seed=1, start_delay=0.05)


@pytest.fixture
async def sim_server(sim: Simulator) -> AsyncIterator[SimServer]:
    server = await start_sim(sim, host="127.0.0.1", port=0)
    yield server
    await server.stop()


class Harness:
    """A controller under test plus the simulator it runs against."""

    def __init__(self, sim: Simulator, server: SimServer, tmp_path: Path) -> None:
        self.sim = sim
        self.server = server
        self.tmp_path = tmp_path
        self.controllers: list[Controller] = []
        self.tiers: list[ApiTier] = []
        self.http: aiohttp.ClientSession | None = None

    async def start(
        self,
        pools_file: Path,
        *,
        resync_seconds: float = 1.0,
        prune: bool = False,
        allow_empty: bool = False,
        allow_shrink: bool = False,
        access_log: bool = False,
        clock: Clock = utcnow,
        poseidon: PoseidonSettings | None = None,
        tokens_text: str = TOKEN + "\n",
    ) -> Controller:
        tokens = self.tmp_path / "tokens"
        tokens.write_text(tokens_text)
        settings = Settings(
            pools_path=pools_file,
            listen=("127.0.0.1", 0),
            resync_seconds=resync_seconds,
            token_file=tokens,
            prune=prune,
            allow_empty=allow_empty,
            allow_shrink=allow_shrink,
            poseidon=poseidon or PoseidonSettings(),
            access_log=access_log,
        )
        controller = Controller(
            settings, NomadConfig.from_env({"NOMAD_ADDR": self.server.url}), clock=clock
        )
        await controller.start()
        self.controllers.append(controller)
        return controller

    async def start_api_tier(
        self,
        *,
        poseidon: PoseidonSettings | None = None,
        resync_seconds: float = 1.0,
        nomad: NomadConfig | None = None,
    ) -> ApiTier:
        """An API replica (`poolkeeper api`) on this simulator, once it is ready."""
        tokens = self.tmp_path / "tokens"
        if not tokens.exists():
            tokens.write_text(TOKEN + "\n")
        settings = ServingSettings(
            listen=("127.0.0.1", 0),
            resync_seconds=resync_seconds,
            token_file=tokens,
            poseidon=poseidon or PoseidonSettings(),
        )
        nomad = nomad or NomadConfig.from_env({"NOMAD_ADDR": self.server.url})
        # Replicas in one process: each its own identity, as each pod has its own host.
        tier = ApiTier(settings, nomad, identity=f"test-replica-{len(self.tiers) + 1}/1")
        await tier.start()
        self.tiers.append(tier)
        await wait_until(lambda: tier.readiness().ready, what="the API tier to read the catalog")
        return tier

    async def stop(self, controller: Controller) -> None:
        self.controllers.remove(controller)
        await controller.stop()

    async def api(
        self,
        controller: Controller | ApiTier,
        method: str,
        path: str,
        body: Any = None,
        *,
        token: str | None = TOKEN,
    ) -> tuple[int, Any]:
        if self.http is None:
            self.http = aiohttp.ClientSession()
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        async with self.http.request(
            method, controller.url + path, json=body, headers=headers
        ) as response:
            text = await response.text()
            try:
                payload = await response.json(content_type=None) if text else None
            except ValueError:
                payload = text
            return response.status, payload

    async def jobs(self, controller: Controller) -> list[dict[str, Any]]:
        return await controller.client.list_jobs("default")

    async def violations(self, controller: Controller) -> list[str]:
        """What is wrong with the pools the controller writes (those another process holds
        are that one's to settle)."""
        engine = controller.engine
        for namespace in engine.namespaces():
            await engine.reconcile_namespace(namespace)
        elsewhere = {key for key in engine.pools if not engine.writes(key)}
        pools = [
            PoolSnapshot(
                key=m.key,
                desired_idle=m.idle_target.idle_runners,
                max_runners=m.policy.max_runners,
                idle=sum(r.state in (RunnerState.IDLE, RunnerState.OUTDATED) for r in m.runners),
                total=len(m.runners),
                runner_ids=frozenset(r.id for r in m.runners),
            )
            for m in engine.pools.values()
            if m.conflict is None and m.key not in elsewhere
        ]
        jobs = [
            NomadJob(s["ID"], s["Meta"][META_POOL], s.get("Status") != "dead" and not s.get("Stop"))
            for s in await self.jobs(controller)
            if (s.get("Meta") or {}).get(META_POOL) not in (None, "", *elsewhere)
        ]
        return check_invariants(pools, jobs)

    async def settled(self, controller: Controller, *, within: float = 15.0) -> None:
        last: list[str] = []

        async def check() -> bool:
            nonlocal last
            last = await self.violations(controller)
            return not last

        try:
            await wait_until(check, within=within, what="the pools to settle")
        except AssertionError:
            raise AssertionError(f"pools did not settle: {last}") from None

    async def close(self) -> None:
        for tier in self.tiers:
            await tier.stop()
        for controller in list(self.controllers):
            await self.stop(controller)
        if self.http is not None:
            await self.http.close()


@pytest.fixture
async def harness(sim: Simulator, sim_server: SimServer, tmp_path: Path) -> AsyncIterator[Harness]:
    h = Harness(sim, sim_server, tmp_path)
    yield h
    await h.close()


@pytest.fixture
async def loopback() -> AsyncIterator[Loopback]:
    """Loopback servers for scripted Nomad answers, stopped after the test."""
    servers = Loopback()
    yield servers
    await servers.close()
