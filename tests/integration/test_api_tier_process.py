"""`poolkeeper api` as real processes beside a reconciling `poolkeeper run`: claims go on
while the reconciler is frozen, a replica's death costs nothing but its own requests, and
a request retried on the other replica gets the same runner."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from controller.lab.simulator import SimServer
from tests.support.documents import pool_doc
from tests.support.waiting import wait_until

from .conftest import write_pools
from .test_process import API_TOKEN, Process

pytestmark = pytest.mark.slow

CLAIMS = "/v1/pools/default/py/claims"


class ApiProcess(Process):
    """`poolkeeper api` on a free port."""

    def __init__(self, nomad: str, tmp_path: Path) -> None:
        super().__init__(tmp_path / "unused.yaml", nomad, tmp_path)
        tokens = tmp_path / "api-tokens"
        self.args = [
            sys.executable, "-m", "controller", "api", "--listen", f"127.0.0.1:{self.port}",
            "--api-token-file", str(tokens),
        ]  # fmt: skip


async def call(
    http: aiohttp.ClientSession, url: str, method: str, path: str, body: object = None
) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {API_TOKEN}"}
    async with http.request(method, url + path, json=body, headers=headers) as response:
        return response.status, await response.json(content_type=None) or {}


async def test_claims_go_on_while_the_reconciler_is_frozen_and_a_replica_dies(
    sim_server: SimServer, tmp_path: Path
) -> None:
    pools = write_pools(tmp_path / "pools.yaml", pool_doc("py", idle=12, maxRunners=40))
    reconciler = Process(pools, sim_server.url, tmp_path)
    first, second = ApiProcess(sim_server.url, tmp_path), ApiProcess(sim_server.url, tmp_path)
    processes = [reconciler, first, second]
    for process in processes:
        process.start()
    try:
        for process in processes:
            await wait_until(process.ready, within=30, what=f"{process.url} to be ready")
        async with aiohttp.ClientSession() as http:

            async def offered() -> bool:
                _, pools_now = await call(http, first.url, "GET", "/v1/pools")
                listed = pools_now.get("pools") or [{}]
                return bool(listed[0].get("status", {}).get("idleRunners") == 12)

            await wait_until(offered, within=30, what="twelve idle runners offered")
            assert reconciler.proc is not None
            os.kill(reconciler.proc.pid, signal.SIGSTOP)  # its loop holds nothing any more
            try:
                claims = await asyncio.gather(
                    *(call(http, (first, second)[i % 2].url, "POST", CLAIMS, {}) for i in range(8))
                )
                assert [status for status, _ in claims] == [201] * 8, claims
                assert len({body["runnerId"] for _, body in claims}) == 8
                # A replica dies; a request retried on the other gets what it got.
                status, claim = await call(http, first.url, "POST", CLAIMS, {"requestId": "q"})
                assert status == 201, claim
                assert await first.signal(signal.SIGKILL) == -signal.SIGKILL
                status, again = await call(http, second.url, "POST", CLAIMS, {"requestId": "q"})
                assert (status, again["runnerId"]) == (200, claim["runnerId"])
                status, kept = await call(
                    http, second.url, "POST", f"/v1/runners/{claim['runnerId']}/keepalive"
                )
                assert status == 200, kept
            finally:
                os.kill(reconciler.proc.pid, signal.SIGCONT)

            async def refilled() -> bool:
                _, pools_now = await call(http, second.url, "GET", "/v1/pools")
                status = pools_now["pools"][0]["status"]
                return bool(status["idleRunners"] == 12 and status["claimedRunners"] == 9)

            await wait_until(refilled, within=30, what="the reconciler to refill the pool")
    finally:
        for process in processes:
            if process.proc is not None and process.proc.poll() is None:
                await process.signal(signal.SIGTERM)
    assert "Traceback" not in second.output() + reconciler.output()


async def test_run_no_reconcile_is_the_api_tier(sim_server: SimServer, sim, tmp_path: Path):
    pools = write_pools(tmp_path / "pools.yaml", pool_doc("py", idle=2))
    process = Process(pools, sim_server.url, tmp_path, options=("--no-reconcile",))
    process.start()
    try:
        await wait_until(process.ready, within=30, what="the replica to be ready")
        await asyncio.sleep(2.0)  # two resyncs of a reconciler: it would have registered
        assert sim.job_list("*") == []  # it reads pools from Nomad's catalog: none yet
    finally:
        assert await process.signal(signal.SIGTERM) == 0
    assert "serves as the API tier (poolkeeper api)" in process.output()
