"""What processes share through Nomad, under the faults that broke it: Nomad unreachable
for longer than a lease TTL, renewals alone failing, slow answers while a runner's job
goes without an event, an API replica reading its own environment writes, and the
records of a pool that is gone."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from controller import service
from controller.core.balance import weight
from controller.core.leases import LeaseItems, takeover_seconds
from controller.core.paths import lease_path
from controller.core.times import utcnow
from controller.standalone import Controller
from tests.support.documents import pool_doc
from tests.support.waiting import wait_until

from .conftest import FakeClock, Harness, write_pools
from .test_poseidon import (
    MANAGED,
    NO_ENVIRONMENT,
    READONLY,
    CodeOcean,
    start,
    synced,
)

KEY = "default/py"
CLAIMS = "/v1/pools/default/py/claims"


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


def idle_in_nomad(harness: Harness, prefix: str = "py-") -> set[str]:
    """The runner jobs of a prefix whose allocation runs, unclaimed."""
    claimed = {p.rsplit("/", 1)[1] for p in harness.sim.variables() if "/claims/" in p}
    running = {
        a["JobID"]
        for a in harness.sim.allocations()
        if a["ClientStatus"] == "running" and a["DesiredStatus"] == "run"
    }
    return {j for j in running if j.startswith(prefix) and j not in claimed}


async def test_the_first_claim_after_nomad_was_unreachable_finds_the_idle_runners(
    harness: Harness, tmp_path: Path
) -> None:
    pools = write_pools(tmp_path / "p.yaml", pool_doc("py", idle=4))
    controller = await harness.start(pools)
    await harness.settled(controller)
    harness.sim.api_fault("refuse", 10)  # longer than the lease TTL (10 s)
    await asyncio.sleep(10.5)

    def back() -> bool:
        lease = harness.sim.variables().get(lease_path(KEY)) or {}
        return bool(
            lease.get("Lock") and controller.engine.writes(KEY) and len(idle_in_nomad(harness)) == 4
        )

    await wait_until(back, within=30.0, what="the lease taken again and the pool converged")
    status, body = await harness.api(controller, "POST", CLAIMS, {})
    assert status == 201, body


async def test_a_holder_whose_renewals_fail_lets_another_process_take_the_pool(
    harness: Harness, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The holder is the process the balance prefers for the pool (its rendezvous weight
    # is the higher): it must still leave the pool to the other once it cannot renew.
    assert weight("host-b/2", KEY) > weight("host-a/1", KEY)
    pools = write_pools(tmp_path / "p.yaml", pool_doc("py", idle=2))
    holder = await start_as(harness, pools, "host-b/2", monkeypatch)
    await harness.settled(holder)
    other = await start_as(harness, pools, "host-a/1", monkeypatch)
    await wait_until(lambda: other.readiness().ready, what="the other to serve the pool")
    assert holder.engine.writes(KEY) and not other.engine.writes(KEY)

    harness.sim.api_fault("renew_error", 120)  # its other writes succeed
    failing = time.monotonic()

    def taken_over() -> bool:
        lease = harness.sim.variables().get(lease_path(KEY)) or {}
        return bool(
            lease.get("Lock")
            and lease["Items"]["holder"] == "host-a/1"
            and other.engine.writes(KEY)
        )

    await wait_until(taken_over, within=takeover_seconds(10) + 3, what="the other to take over")
    print(f"taken over {time.monotonic() - failing:.1f} s after the renewals began to fail")
    assert not holder.engine.writes(KEY)
    await harness.settled(other)
    assert harness.sim.audit.by_non_holders() == []


async def start_as(
    harness: Harness, pools: Path, name: str, monkeypatch: pytest.MonkeyPatch
) -> Controller:
    """A controller whose identity is `name` (two in one test process differ)."""
    monkeypatch.setattr(service.Service, "identity", lambda self: name)
    return await harness.start(pools, resync_seconds=0.5)


async def test_a_replica_reads_its_own_environment_writes_at_once(
    harness: Harness, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    await start(harness, tmp_path, poseidon=MANAGED, resync_seconds=30.0)
    tier = await harness.start_api_tier(poseidon=MANAGED)
    codeocean = CodeOcean(http, tier)

    async def listed() -> list[int]:
        answer = await codeocean.call("GET", "/execution-environments")
        assert answer.status == 200, answer.body
        return [e["id"] for e in answer.json()["executionEnvironments"]]

    assert (await codeocean.call("PUT", "/execution-environments/29", synced(29))).status == 201
    assert await listed() == [29]
    shown = await codeocean.call("GET", "/execution-environments/29")
    assert (shown.status, shown.json()["prewarmingPoolSize"]) == (200, 2)

    async def served() -> bool:
        return (await codeocean.claim(29)).status == 200

    await wait_until(served, within=10.0, what="the environment's pool to run")
    assert (await codeocean.call("DELETE", "/execution-environments/29")).status == 204
    for _ in range(2):
        answer = await codeocean.claim(29)
        assert (answer.status, answer.body) == (404, NO_ENVIRONMENT)
    assert await listed() == []
    gone = await codeocean.call("GET", "/execution-environments/29")
    assert gone.status == 404


async def test_the_records_of_a_pool_that_is_gone_go_with_it(
    harness: Harness, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    clock = FakeClock()
    controller = await start(harness, tmp_path, poseidon=MANAGED, clock=clock)
    codeocean = CodeOcean(http, controller)
    assert (await codeocean.call("PUT", "/execution-environments/11", synced(11))).status == 201
    await harness.settled(controller)
    assert any("environment-11" in path for path in harness.sim.variables())
    assert (await codeocean.call("DELETE", "/execution-environments/11")).status == 204

    def drained() -> bool:
        return not [
            j for j in harness.sim.job_list("default") if j["ID"].startswith("environment-11-")
        ]

    await wait_until(drained, within=20.0, what="the environment's runners to be drained")
    clock.advance(11 * 60)  # the drained runners' tombstones are forgotten after ten minutes

    def forgotten() -> bool:
        return "poseidon/environment-11" not in controller.engine.pools

    await wait_until(forgotten, within=20.0, what="the drained pool to be forgotten")

    def left() -> list[str]:
        return [path for path in harness.sim.variables() if "environment-11" in path]

    await wait_until(lambda: not left(), within=5.0, what="the pool's records to go")


async def test_an_api_tier_whose_reconcilers_keep_no_environments_says_so(
    harness: Harness, tmp_path: Path, http: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    # The reconciler serves the Poseidon API, but not with managed environments.
    await start(harness, tmp_path, pool_doc("py", idle=1), poseidon=READONLY)
    tier = await harness.start_api_tier(poseidon=MANAGED)
    codeocean = CodeOcean(http, tier)
    assert (await codeocean.call("PUT", "/execution-environments/29", synced(29))).status == 201

    async def told() -> bool:
        answer = await codeocean.claim(29)
        return answer.status != 200 and b"--poseidon-environments managed" in answer.body

    await wait_until(told, within=15.0, what="the replica to say why it serves nothing")
    answer = await codeocean.claim(29)
    assert answer.json().get("errorCode") != "NOMAD_OVERLOAD", answer.body
    assert any(
        "--poseidon-environments managed" in record.getMessage() and record.levelname == "WARNING"
        for record in caplog.records
    ), caplog.text


async def test_claims_of_unknown_pools_count_under_one_label(
    harness: Harness, tmp_path: Path
) -> None:
    controller = await harness.start(write_pools(tmp_path / "p.yaml", pool_doc("py", idle=1)))
    await harness.settled(controller)
    for name in ("nope-1", "nope-2", "nope-3"):
        status, _ = await harness.api(controller, "POST", f"/v1/pools/default/{name}/claims", {})
        assert status == 404
    status, text = await harness.api(controller, "GET", "/metrics", token=None)
    assert status == 200
    pools = {
        line.split('pool="', 1)[1].split('"', 1)[0]
        for line in text.splitlines()
        if line.startswith("poolkeeper_claims_total{")
    }
    assert pools == {"(unknown)"}, pools


async def test_a_claim_never_hands_out_a_runner_whose_job_went_since_the_last_pass(
    harness: Harness, tmp_path: Path
) -> None:
    pools = write_pools(tmp_path / "p.yaml", pool_doc("py", idle=4))
    controller = await harness.start(pools, resync_seconds=10.0)
    await harness.settled(controller)
    harness.sim.api_fault("slow", 60, slow_ms=1500)  # a pass takes 1.5 s and more
    offered = idle_in_nomad(harness)
    assert len(offered) == 4
    gone = sorted(offered)[0]
    await harness.sim.remove_job_silently(gone)  # no allocation event: the job just goes
    results = await asyncio.gather(*(harness.api(controller, "POST", CLAIMS, {}) for _ in range(4)))
    handed_out = [body["runnerId"] for status, body in results if status == 201]
    assert handed_out and gone not in handed_out, results
    assert set(handed_out) <= offered - {gone}


async def test_the_lease_a_dead_process_left_of_a_pool_defined_nowhere_is_collected(
    harness: Harness, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("controller.records.leases.STALE_SECONDS", 1.0)
    monkeypatch.setattr("controller.engine.reconcile.WHOLE_LISTING_SECONDS", 0.0)
    # The last process to define `ghost` died with it: its lease stays, free, in Nomad.
    ghost = lease_path("default/ghost")
    left = LeaseItems.taken("dead-host/1", "spec", utcnow()).to_items()
    harness.sim.put_variable("default", ghost, left, None)
    pools = write_pools(tmp_path / "p.yaml", pool_doc("py", idle=1))
    controller = await start_as(harness, pools, "host-a/1", monkeypatch)
    await harness.settled(controller)
    await asyncio.sleep(1.1)  # the ghost's lease is older than STALE_SECONDS now

    async def collected() -> bool:
        await controller.engine.reconcile_namespace("default")
        return ghost not in harness.sim.variables()

    await wait_until(collected, within=5.0, what="the ghost's lease to be deleted")
    assert harness.sim.variables()[lease_path(KEY)].get("Lock")  # the live one stays
