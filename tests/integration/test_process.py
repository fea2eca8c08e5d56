"""`poolkeeper run` as a real process: SIGKILL in a burst of creations, SIGTERM, SIGHUP,
and tokens that must never leak into logs, metrics or error bodies."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from controller.core.runner_ids import META_POOL
from controller.lab.simulator import SimServer, Simulator, start_sim
from tests.support.documents import pool_doc
from tests.support.ports import free_port
from tests.support.waiting import wait_until

from .conftest import write_pools

pytestmark = pytest.mark.slow

API_TOKEN = "api-token-9f2c1e7d"


class Process:
    def __init__(
        self,
        pools: Path,
        nomad: str,
        tmp_path: Path,
        env: dict[str, str] | None = None,
        options: tuple[str, ...] = (),
    ):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        tokens = tmp_path / "api-tokens"
        tokens.write_text(API_TOKEN + "\n")
        self.log = tmp_path / f"controller-{self.port}.log"
        self.args = [
            sys.executable, "-m", "controller", "run", "--pools", str(pools),
            "--listen", f"127.0.0.1:{self.port}", "--resync-seconds", "1",
            "--api-token-file", str(tokens), *options,
        ]  # fmt: skip
        self.env = {**os.environ, "NOMAD_ADDR": nomad, **(env or {})}
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(self.args, env=self.env, stdout=log, stderr=log)

    async def signal(self, sig: int) -> int:
        """Send a signal and wait for the exit without blocking the in-process simulator."""
        assert self.proc is not None
        self.proc.send_signal(sig)
        return await asyncio.to_thread(self.proc.wait, 20)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    async def ready(self) -> bool:
        try:
            async with (
                aiohttp.ClientSession() as http,
                http.get(self.url + "/readyz") as response,
            ):
                return response.status == 200
        except aiohttp.ClientError:
            return False


@pytest.fixture
async def slow_sim() -> AsyncIterator[tuple[Simulator, SimServer]]:
    sim = Simulator(seed=3, start_delay=0.2)
    server = await start_sim(sim, host="127.0.0.1", port=0)
    yield sim, server
    await server.stop()


def live_runners(sim: Simulator, pool: str) -> list[dict[str, Any]]:
    return [
        job
        for job in sim.job_list("default")
        if (job.get("Meta") or {}).get(META_POOL) == pool and not job.get("Stop")
    ]


async def test_sigkill_in_a_burst_of_creations_duplicates_and_loses_nothing(slow_sim, tmp_path):
    sim, server = slow_sim
    pools = write_pools(tmp_path / "pools.yaml", pool_doc("burst", idle=60, maxRunners=70))
    process = Process(pools, server.url, tmp_path)
    process.start()

    async def burst_started() -> bool:
        return bool(sim.registrations() >= 5)

    await wait_until(burst_started, within=30, what="the first registrations")
    assert await process.signal(signal.SIGKILL) == -signal.SIGKILL
    killed_at = sim.registrations()
    assert killed_at < 60, "the burst finished before the kill; nothing was tested"
    # In flight at the kill: at most one surge of registrations may still land.
    await asyncio.sleep(0.5)
    restarted = Process(pools, server.url, tmp_path)
    restarted.start()
    try:
        await wait_until(restarted.ready, within=30, what="the restarted controller")

        async def filled() -> bool:
            runners = live_runners(sim, "default/burst")
            assert len(runners) <= 70, "maxRunners exceeded"
            running = [
                a
                for a in sim.allocations()
                if a["ClientStatus"] == "running" and a["DesiredStatus"] == "run"
            ]
            return len(runners) == 60 and len(running) >= 60

        await wait_until(filled, within=60, what="the pool to fill after the restart")
        # Exactly the runners needed were registered, across both processes.
        assert sim.registrations() == 60
    finally:
        assert await restarted.signal(signal.SIGTERM) == 0
    # SIGTERM stops gracefully and never destroys runners.
    assert len(live_runners(sim, "default/burst")) == 60
    assert "Traceback" not in restarted.output()


async def test_sighup_reloads_pools_and_tokens(sim_server, tmp_path):
    pools = write_pools(tmp_path / "pools.yaml", pool_doc("py", idle=1))
    process = Process(pools, sim_server.url, tmp_path)
    process.start()
    try:
        await wait_until(process.ready, within=30, what="the controller")
        write_pools(pools, pool_doc("py", idle=1), pool_doc("js", idle=2))
        (tmp_path / "api-tokens").write_text("rotated-token\n")
        assert process.proc is not None
        process.proc.send_signal(signal.SIGHUP)

        async def reloaded() -> bool:
            async with (
                aiohttp.ClientSession() as http,
                http.get(
                    process.url + "/v1/pools", headers={"Authorization": "Bearer rotated-token"}
                ) as response,
            ):
                if response.status != 200:
                    return False
                body = await response.json()
                return sorted(p["name"] for p in body["pools"]) == ["js", "py"]

        await wait_until(reloaded, within=30, what="the reload")
    finally:
        assert await process.signal(signal.SIGTERM) == 0


async def test_tokens_never_appear_in_logs_metrics_or_errors(tmp_path):
    sim = Simulator(seed=4, start_delay=0.05, acl_enabled=True)
    server = await start_sim(sim, host="127.0.0.1", port=0)
    try:
        async with aiohttp.ClientSession() as http:
            async with http.post(server.url + "/v1/acl/bootstrap") as response:
                nomad_token = (await response.json())["SecretID"]
            pools = write_pools(tmp_path / "pools.yaml", pool_doc("py", idle=2))
            process = Process(pools, server.url, tmp_path, env={"NOMAD_TOKEN": nomad_token})
            process.start()
            seen: list[str] = []
            try:
                await wait_until(process.ready, within=30, what="the controller")
                auth = {"Authorization": f"Bearer {API_TOKEN}"}
                claims = process.url + "/v1/pools/default/py/claims"
                # Nomad failing under the controller: errors are logged and answered.
                sim.api_fault(kind="no_leader", seconds=1.5)
                async with http.post(claims, json={}, headers=auth) as response:
                    seen.append(await response.text())
                for headers in ({}, {"Authorization": f"Bearer {API_TOKEN}x"}, auth):
                    async with http.get(process.url + "/v1/pools", headers=headers) as response:
                        seen.append(await response.text())
                async with http.get(process.url + "/metrics") as response:
                    seen.append(await response.text())
                await asyncio.sleep(2)
                async with http.post(claims, json={"waitSeconds": 10}, headers=auth) as response:
                    assert response.status == 201, await response.text()
            finally:
                assert await process.signal(signal.SIGTERM) == 0
            everything = "\n".join([*seen, process.output()])
            assert "poolkeeper_nomad_requests_total" in everything
            assert nomad_token not in everything
            assert API_TOKEN not in everything
    finally:
        await server.stop()


async def test_claims_and_idle_count_survive_a_sigkill(sim_server, tmp_path):
    pools = write_pools(tmp_path / "pools.yaml", pool_doc("py", idle=3))
    process = Process(pools, sim_server.url, tmp_path)
    process.start()
    auth = {"Authorization": f"Bearer {API_TOKEN}"}
    async with aiohttp.ClientSession() as http:

        async def idle_count(url: str) -> int:
            async with http.get(url + "/v1/pools", headers=auth) as response:
                pools_now = (await response.json())["pools"]
                return int(pools_now[0]["status"].get("idleRunners", 0)) if pools_now else 0

        await wait_until(process.ready, within=30, what="the controller")

        async def three_idle_after(url: str) -> bool:
            return await idle_count(url) == 3

        await wait_until(lambda: three_idle_after(process.url), within=30, what="the fill")
        claims_url = process.url + "/v1/pools/default/py/claims"
        async with http.post(
            claims_url, json={"requestId": "kept-1", "inactivityTimeoutSeconds": 600}, headers=auth
        ) as response:
            assert response.status == 201
            claim = await response.json()
        await wait_until(lambda: three_idle_after(process.url), within=30, what="the refill")
        assert await process.signal(signal.SIGKILL) == -signal.SIGKILL

        restarted = Process(pools, sim_server.url, tmp_path)
        restarted.start()
        try:
            await wait_until(restarted.ready, within=30, what="the restarted controller")
            await wait_until(
                lambda: three_idle_after(restarted.url), within=30, what="the same idle count"
            )
            async with http.get(
                f"{restarted.url}/v1/runners/{claim['runnerId']}", headers=auth
            ) as response:
                assert (response.status, await response.json()) == (200, claim)
            # The same requestId, after the restart, answers the same claim.
            async with http.post(
                restarted.url + "/v1/pools/default/py/claims",
                json={"requestId": "kept-1"},
                headers=auth,
            ) as response:
                assert (response.status, await response.json()) == (200, claim)
        finally:
            assert await restarted.signal(signal.SIGTERM) == 0


async def test_json_logs_and_the_access_log(sim_server, tmp_path):
    """Every line is a JSON object, the domain events carry their pool and reason, and
    the access log names route templates only."""
    pools = write_pools(tmp_path / "pools.yaml", pool_doc("py", idle=1))
    options = ("--log-format", "json", "--access-log")
    process = Process(pools, sim_server.url, tmp_path, options=options)
    process.start()
    auth = {"Authorization": f"Bearer {API_TOKEN}"}
    try:
        await wait_until(process.ready, within=30, what="the controller")
        async with (
            aiohttp.ClientSession() as http,
            http.get(process.url + "/v1/runners/py-0123456789ab", headers=auth) as response,
        ):
            assert response.status == 404
    finally:
        assert await process.signal(signal.SIGTERM) == 0
    entries = [json.loads(line) for line in process.output().splitlines()]
    assert all({"time", "level", "logger", "message"} <= set(e) for e in entries)
    lease = next(e for e in entries if e.get("reason") == "LeaseAcquired")
    assert (lease["level"], lease["pool"]) == ("INFO", "default/py")
    access = [e for e in entries if e["logger"] == "controller.api.access_log"]
    assert [(e["method"], e["route"], e["status"]) for e in access] == [
        ("GET", "/v1/runners/{runnerId}", 404)
    ]
    assert API_TOKEN not in process.output() and "0123456789ab" not in process.output()
