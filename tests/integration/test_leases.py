"""One reconciler per pool: two controllers with different specs for one pool never fight;
the other serves claims and says who reconciles; a graceful stop hands the pool over at
once, a crash within the takeover time."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

import pytest

from controller import service
from controller.core.leases import takeover_seconds
from controller.core.paths import lease_path
from controller.core.runner_ids import META_POOL
from controller.engine import drains
from controller.engine.publish import Publisher
from controller.standalone import Controller
from tests.support.documents import pool_doc
from tests.support.waiting import wait_until

from .conftest import TOKEN, Harness, write_pools

KEY = "default/py"


def condition(controller: Controller, type_: str) -> tuple[str, str, str]:
    view = controller.engine.pools[KEY]
    found = view.status.condition(type_) if view.status else None
    assert found is not None, type_
    return found.status, found.reason, found.message


async def a_settled_holder(
    harness: Harness, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[Path, Controller]:
    """The pools file of `py` (2 idle) and a settled controller `host-a/1` holding it."""
    pools = write_pools(tmp_path / "p.yaml", pool_doc("py", idle=2))
    controller = await start_as(harness, pools, "host-a/1", monkeypatch)
    await harness.settled(controller)
    return pools, controller


async def ready_reason_becomes(controller: Controller, reason: str) -> None:
    async def reason_now() -> bool:
        await controller.engine.reconcile_namespace("default")
        return condition(controller, "Ready")[1] == reason

    await wait_until(reason_now, what=f"Ready with reason {reason}")


async def crash(controller: Controller) -> None:
    """As a crash: the controller stops renewing its leases and never gives them back (so
    it stops writing)."""
    assert controller.engine.leases is not None
    await controller.engine.leases.stop(release=False)


def readiness(status: str, **fields: Any) -> dict[str, Any]:
    """The body of /readyz of a reconciling controller."""
    body: dict[str, Any] = {
        "status": status,
        "serves": ["claims", "reconcile"],
        "pools": [],
        "reconciles": [],
        "reconciledElsewhere": {},
        "notReconciled": [],
    }
    return body | fields


async def start_as(
    harness: Harness, pools: Path, name: str, monkeypatch: pytest.MonkeyPatch, prune: bool = False
) -> Controller:
    """A controller whose identity is `name` (two in one test process differ)."""
    monkeypatch.setattr(service.Service, "identity", lambda self: name)
    return await harness.start(pools, resync_seconds=0.5, prune=prune)


async def test_two_reconcilers_never_fight_and_the_other_one_says_who_reconciles(
    harness: Harness, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = await start_as(
        harness, write_pools(tmp_path / "a.yaml", pool_doc("py", idle=2)), "host-a/1", monkeypatch
    )
    await harness.settled(first)
    registered, deregistered = (
        harness.sim.counters["jobs_created"],
        harness.sim.counters["deregister_calls"],
    )
    second = await start_as(
        harness, write_pools(tmp_path / "b.yaml", pool_doc("py", idle=4)), "host-b/2", monkeypatch
    )
    await ready_reason_becomes(second, "LeaseHeldElsewhere")
    await asyncio.sleep(3.0)  # six resyncs of both: the second never writes the pool
    assert condition(second, "Ready") == (
        "False",
        "LeaseHeldElsewhere",
        "reconciled by host-a/1; this process only serves claims",
    )
    assert condition(second, "Degraded")[:2] == ("True", "SpecDiffersFromHolder")
    assert second.engine.pools[KEY].status.reconciled_by == "host-a/1"  # type: ignore[union-attr]
    assert condition(first, "Ready")[:2] == ("True", "IdleRunnersAvailable")
    assert harness.sim.counters["jobs_created"] == registered
    assert harness.sim.counters["deregister_calls"] == deregistered
    # Both are ready: the holder reconciles the pool, the other one serves its claims
    # while a live process reconciles it.
    assert await harness.api(first, "GET", "/readyz", token=None) == (
        200,
        readiness("ready", reconciles=[KEY]),
    )
    assert await harness.api(second, "GET", "/readyz", token=None) == (
        200,
        readiness("ready", reconciledElsewhere={KEY: "host-a/1"}),
    )
    # The non-holder serves claims; the holder refills.
    status, claim = await harness.api(second, "POST", "/v1/pools/default/py/claims", {})
    assert status == 201, claim
    _, listing = await harness.api(second, "GET", "/v1/pools", token=TOKEN)
    assert listing["pools"][0]["status"]["reconciledBy"] == "host-a/1"
    await harness.settled(first)

    # A graceful stop gives the lease back: the second takes the pool over at once.
    await harness.stop(first)
    stopped = time.monotonic()

    async def taken_over() -> bool:
        view = second.engine.pools[KEY]
        return bool(view.lease and view.lease.held)

    await wait_until(taken_over, within=5, what="the takeover")
    assert time.monotonic() - stopped < 1.5

    # Now the second's spec (4 idle) is what Nomad gets.
    async def four_idle() -> bool:
        await second.engine.reconcile_namespace("default")
        view = second.engine.pools[KEY]
        return bool(view.status and view.status.counts.idle == 4)

    await wait_until(four_idle, what="the new holder's spec")
    assert condition(second, "Degraded")[:2] == ("False", "AsExpected")
    # The simulator's log of runner job writes: each by the holder of the lease then.
    writers = {write.writer for write in harness.sim.audit.writes}
    assert writers == {"host-a/1", "host-b/2"}
    assert harness.sim.audit.by_non_holders() == []


@pytest.mark.slow
async def test_a_crashed_holder_is_taken_over_within_the_takeover_time(
    harness: Harness, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pools, first = await a_settled_holder(harness, tmp_path, monkeypatch)
    second = await start_as(harness, pools, "host-b/2", monkeypatch)
    await ready_reason_becomes(second, "LeaseHeldElsewhere")
    await crash(first)
    crashed = time.monotonic()

    async def taken_over() -> bool:
        view = second.engine.pools[KEY]
        return bool(view.lease and view.lease.held)

    await wait_until(taken_over, within=takeover_seconds(10) + 10, what="the takeover")
    elapsed = time.monotonic() - crashed
    # Nomad frees the lock 2 x TTL after the last renewal, then keeps it for the delay.
    assert 2 * 10 - 10 / 3 <= elapsed <= takeover_seconds(10) + 1, elapsed
    await harness.settled(second)


async def test_a_release_through_a_process_that_does_not_hold_the_pool_leaves_the_purge(
    harness: Harness, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pools = write_pools(tmp_path / "a.yaml", pool_doc("py", idle=2))
    holder = await start_as(harness, pools, "host-a/1", monkeypatch)
    await harness.settled(holder)
    other = await start_as(harness, pools, "host-b/2", monkeypatch)
    await wait_until(lambda: other.readiness().ready, what="the other to serve the pool")
    status, claim = await harness.api(other, "POST", "/v1/pools/default/py/claims", {})
    assert status == 201, claim
    released = time.monotonic()
    assert (await harness.api(other, "DELETE", f"/v1/runners/{claim['runnerId']}"))[0] == 204

    def purged() -> bool:
        return harness.sim.get_job(claim["runnerId"]) is None

    await wait_until(purged, within=5.0, what="the holder to purge the released runner")
    refill = time.monotonic() - released
    # Only the lease holder wrote the pool's jobs: the releasing process purged nothing.
    assert harness.sim.audit.by_non_holders() == []
    purges = [w for w in harness.sim.audit.writes if w.kind == "purge"]
    assert [(w.writer, w.job_id) for w in purges] == [("host-a/1", claim["runnerId"])]
    await harness.settled(holder)
    print(f"released runner purged by the holder {refill:.3f} s after the release")


@pytest.mark.slow
async def test_a_restart_under_the_same_identity_is_unready_until_its_old_lease_is_free(
    harness: Harness, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pools, first = await a_settled_holder(harness, tmp_path, monkeypatch)
    await crash(first)
    crashed = time.monotonic()
    await harness.stop(first)
    # The same host name and PID again (a container's PID 1), or the same pod name.
    restarted = await start_as(harness, pools, "host-a/1", monkeypatch)
    await ready_reason_becomes(restarted, "LeaseNotHeld")
    assert "(host-a/1) by an earlier process" in condition(restarted, "Ready")[2]
    # Nobody reconciles the pool: not ready, though every pool was read.
    assert await harness.api(restarted, "GET", "/readyz", token=None) == (
        503,
        readiness("unready", notReconciled=[KEY]),
    )

    async def ready() -> bool:
        status, _ = await harness.api(restarted, "GET", "/readyz", token=None)
        return status == 200

    await wait_until(ready, within=takeover_seconds(10) + 10, what="the old lease to be free")
    assert time.monotonic() - crashed >= 2 * 10 - 10 / 3
    assert await harness.api(restarted, "GET", "/readyz", token=None) == (
        200,
        readiness("ready", reconciles=[KEY]),
    )
    await harness.settled(restarted)


async def test_a_lease_nomad_forgot_is_taken_again_at_once_and_the_pool_refilled(
    harness: Harness, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, controller = await a_settled_holder(harness, tmp_path, monkeypatch)
    path = lease_path(KEY)

    await harness.sim.lose_state()  # a dev agent restarted: jobs, claims and the lease gone
    lost = time.monotonic()

    def lease_in_nomad() -> str:
        held = harness.sim.variables("default").get(path)
        return str(held["Items"]["holder"]) if held and held.get("Lock") else ""

    def running_runners() -> int:
        return sum(
            a["ClientStatus"] == "running" and a["DesiredStatus"] == "run"
            for a in harness.sim.allocations()
        )

    async def taken_and_refilled() -> bool:
        view = controller.engine.pools[KEY]
        ready = view.status.condition("Ready") if view.status else None
        return bool(
            lease_in_nomad() == "host-a/1"
            and view.lease
            and view.lease.held
            and ready is not None
            and (ready.status, ready.reason) == ("True", "IdleRunnersAvailable")
            and running_runners() == 2
        )

    # The holder learns of the loss at its next renewal (every TTL/3) and takes the lease
    # again in the same round; one pass later the pool is refilled.
    await wait_until(taken_and_refilled, within=10 / 3 + 3, what="the lease and the runners")
    print(f"lease and pool back {time.monotonic() - lost:.2f} s after the state was lost")
    await harness.settled(controller)


async def test_pools_a_live_process_holds_are_no_orphans_even_with_prune(
    harness: Harness,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(drains, "ORPHAN_RECHECK_SECONDS", 0.5)
    first = await start_as(
        harness, write_pools(tmp_path / "a.yaml", pool_doc("py", idle=2)), "host-a/1", monkeypatch
    )
    await harness.settled(first)
    with caplog.at_level(logging.INFO, logger="controller.engine.drains"):
        # Another controller in the same Nomad namespace, with other pools and --prune.
        second = await start_as(
            harness,
            write_pools(tmp_path / "b.yaml", pool_doc("js", idle=1)),
            "host-b/2",
            monkeypatch,
            prune=True,
        )
        await harness.settled(second)
        for _ in range(3):
            await second.engine.reconcile_namespace("default")
        assert "default/py" not in second.engine.pools
        assert caplog.messages == []  # neither reported as orphaned nor pruned

    async def live_py_runners() -> int:
        jobs = await harness.jobs(second)
        return sum(j["Meta"][META_POOL] == "default/py" and j["Status"] != "dead" for j in jobs)

    assert await live_py_runners() == 2
    assert harness.sim.audit.by_non_holders() == []

    # Once no live process holds its lease, the pool is defined nowhere: pruned.
    await harness.stop(first)

    async def pruned() -> bool:
        await second.engine.reconcile_namespace("default")
        return await live_py_runners() == 0

    await wait_until(pruned, what="the runners of the pool nobody defines any more")
    assert "pruning orphaned runners of pool default/py (--prune)" in caplog.messages
    assert harness.sim.audit.by_non_holders() == []


async def test_stopping_ends_the_passes_before_it_gives_the_leases_back(
    harness: Harness, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pass still running when the leases are given back would publish the status of
    pools this process no longer holds: the passes end first."""
    _, controller = await a_settled_holder(harness, tmp_path, monkeypatch)
    engine = controller.engine
    published: list[bool] = []  # for each status published while stopping: whether held
    original = Publisher.publish

    async def recording(self: Publisher, managed: Any, *args: Any, **kwargs: Any) -> None:
        published.append(engine.writes(managed.key))
        await original(self, managed, *args, **kwargs)

    monkeypatch.setattr(Publisher, "publish", recording)
    harness.sim.api_fault("slow", 30, slow_ms=500)  # the pass is still observing below
    engine.hint_namespace("default")
    await asyncio.sleep(0.2)
    await harness.stop(controller)
    assert published and all(published), published
    assert not harness.sim.variables()[lease_path(KEY)].get("Lock")  # given back
