"""`poolkeeper run` as a real process: SIGKILL in a burst of creations, SIGTERM, SIGHUP,
tokens that must never leak into logs, metrics or error bodies, and two processes for one
pool."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from controller.core.leases import DEFAULT_TTL_SECONDS, LOCK_DELAY_SECONDS, takeover_seconds
from controller.core.paths import lease_path
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


def lease_holder(sim: Simulator, pool: str) -> str:
    """Who holds the pool's lease in Nomad right now ("" when nobody)."""
    lease = sim.variables("default").get(lease_path(pool)) or {}
    return str((lease.get("Items") or {}).get("holder", "")) if lease.get("Lock") else ""


async def test_two_processes_with_different_specs_never_fight_and_hand_over(slow_sim, tmp_path):
    """Two `poolkeeper run` processes, 2 and 4 idle runners for one pool: Nomad gets the
    holder's spec only; SIGTERM hands the pool over at once, SIGKILL within the takeover
    time; the simulator's write audit shows every runner write by the holder of the time."""
    sim, server = slow_sim
    auth = {"Authorization": f"Bearer {API_TOKEN}"}
    two = Process(write_pools(tmp_path / "two.yaml", pool_doc("py", idle=2)), server.url, tmp_path)
    four = Process(
        write_pools(tmp_path / "four.yaml", pool_doc("py", idle=4)), server.url, tmp_path
    )

    def identity(process: Process) -> str:
        assert process.proc is not None
        return f"{socket.gethostname()}/{process.proc.pid}"

    async def idle(count: int) -> bool:
        running = {a["JobID"] for a in sim.allocations() if a["ClientStatus"] == "running"}
        return len([j for j in live_runners(sim, "default/py") if j["ID"] in running]) == count

    async def pool_status(process: Process) -> dict[str, Any]:
        async with (
            aiohttp.ClientSession() as http,
            http.get(process.url + "/v1/pools", headers=auth) as response,
        ):
            return dict((await response.json())["pools"][0]["status"])

    two.start()
    try:
        await wait_until(lambda: idle(2), within=30, what="the first holder's fill")
        assert lease_holder(sim, "default/py") == identity(two)
        holders = [identity(two)]
        writes_before = len(sim.audit.writes)
        four.start()
        await wait_until(four.ready, within=30, what="the second process")

        async def four_waits() -> bool:
            conditions = {c["type"]: c for c in (await pool_status(four)).get("conditions", [])}
            return bool(conditions.get("Ready", {}).get("reason") == "LeaseHeldElsewhere")

        await wait_until(four_waits, within=15, what="LeaseHeldElsewhere")
        await asyncio.sleep(4.0)  # four resyncs of both: still nobody else writes
        status = await pool_status(four)
        conditions = {c["type"]: c for c in status["conditions"]}
        assert status["reconciledBy"] == identity(two)
        assert identity(two) in conditions["Ready"]["message"]
        assert conditions["Degraded"]["reason"] == "SpecDiffersFromHolder"
        assert len(sim.audit.writes) == writes_before, "the pool was churned"
        assert await idle(2)

        # SIGTERM releases the lease: the other process takes the pool over at once.
        terminated = time.monotonic()
        assert await two.signal(signal.SIGTERM) == 0
        await wait_until(
            lambda: _holds(sim, identity(four)), within=10, what="the handover on SIGTERM"
        )
        handover = time.monotonic() - terminated
        holders.append(identity(four))
        await wait_until(lambda: idle(4), within=30, what="the new holder's spec")

        # The first comes back and waits; SIGKILL of the holder: taken over by time.
        two.start()
        await wait_until(two.ready, within=30, what="the first process again")
        killed = time.monotonic()
        assert await four.signal(signal.SIGKILL) == -signal.SIGKILL
        await wait_until(
            lambda: _holds(sim, identity(two)),
            within=takeover_seconds(DEFAULT_TTL_SECONDS) + 10,
            what="the takeover after SIGKILL",
        )
        takeover = time.monotonic() - killed
        holders.append(identity(two))
        await wait_until(lambda: idle(2), within=30, what="the spec of the holder again")
    finally:
        for process in (two, four):
            if process.proc is not None and process.proc.poll() is None:
                await process.signal(signal.SIGTERM)
    print(f"handover after SIGTERM {handover:.2f} s, takeover after SIGKILL {takeover:.1f} s")
    assert handover < 3.0, handover  # a second, plus a loaded machine's process exit
    # Nomad frees the lock 2 x TTL after the last renewal, then keeps it for the delay.
    earliest = 2 * DEFAULT_TTL_SECONDS - DEFAULT_TTL_SECONDS / 3 + LOCK_DELAY_SECONDS
    assert takeover >= earliest - 0.5, takeover
    assert takeover <= takeover_seconds(DEFAULT_TTL_SECONDS) + 2, takeover
    assert sim.audit.by_non_holders() == []
    # All three holders wrote: the first filled, the second grew, the third shrank it.
    assert {w.writer for w in sim.audit.writes} == set(holders)
    for process in (two, four):
        assert "Traceback" not in process.output()


async def _holds(sim: Simulator, holder: str) -> bool:
    return lease_holder(sim, "default/py") == holder


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
