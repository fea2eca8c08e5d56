"""The standalone controller against the simulator: filling, scaling, rollouts, pool files,
prefix conflicts and deletion policies."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from controller.core.runner_ids import META_POOL, META_TEMPLATE
from controller.core.views import RunnerState
from controller.model import RunnerPool
from controller.standalone import Controller
from tests.support.documents import pool_doc
from tests.support.waiting import wait_until

from .conftest import Harness, write_pools


async def test_pool_fills_to_its_idle_count_without_over_creation(harness: Harness, tmp_path):
    pools = write_pools(tmp_path / "pools.yaml", pool_doc("py", idle=4), pool_doc("js", idle=2))
    controller = await harness.start(pools)
    await harness.settled(controller)
    jobs = await harness.jobs(controller)
    assert sorted(j["Meta"][META_POOL] for j in jobs) == ["default/js"] * 2 + ["default/py"] * 4
    # Every registration created a runner that was needed: nothing was created twice.
    assert harness.sim.registrations() == 6
    ready = {m.key: m.status.to_dict() for m in controller.engine.pools.values() if m.status}
    assert ready["default/py"]["idleRunners"] == 4
    status, body = await harness.api(controller, "GET", "/readyz", token=None)
    assert status == 200, body


async def test_a_pass_over_many_pools_compares_no_two_whole(
    harness: Harness, tmp_path, monkeypatch
):
    """A pass tells its pools apart by key: comparing them whole compared their specs,
    for every pair (500 pools: three times 125,000 comparisons in each pass)."""
    documents = [pool_doc(f"p{i:02d}", idle=1) for i in range(20)]
    controller = await harness.start(write_pools(tmp_path / "pools.yaml", *documents))
    await harness.settled(controller)
    compared: list[object] = []
    equal = RunnerPool.__eq__

    def counted(self: RunnerPool, other: object) -> bool:
        compared.append(other)
        return equal(self, other)

    monkeypatch.setattr(RunnerPool, "__eq__", counted)
    await controller.engine.reconcile_namespace("default")
    assert compared == []


async def test_scale_up_and_down_follow_a_reload(harness: Harness, tmp_path):
    pools = write_pools(tmp_path / "pools.yaml", pool_doc("py", idle=3))
    controller = await harness.start(pools)
    await harness.settled(controller)
    write_pools(pools, pool_doc("py", idle=6))
    await controller.load_pools()
    await harness.settled(controller)
    assert len(await harness.jobs(controller)) == 6
    write_pools(pools, pool_doc("py", idle=1))
    await controller.load_pools()
    await harness.settled(controller)
    live = [j for j in await harness.jobs(controller) if j["Status"] != "dead"]
    assert len(live) == 1


async def test_template_change_rolls_idle_runners_over(harness: Harness, tmp_path):
    pools = write_pools(tmp_path / "pools.yaml", pool_doc("py", idle=3))
    controller = await harness.start(pools)
    await harness.settled(controller)
    old = {j["Meta"][META_TEMPLATE] for j in await harness.jobs(controller)}
    write_pools(pools, pool_doc("py", idle=3, runner={"image": "python:3.13-slim"}))
    await controller.load_pools()
    managed = controller.engine.pools["default/py"]

    async def rolled() -> bool:
        await controller.engine.reconcile_namespace("default")
        idle = [r for r in managed.runners if r.state is RunnerState.IDLE]
        outdated = [r for r in managed.runners if r.state is RunnerState.OUTDATED]
        # Claimable runners never drop below the desired count during the rollout.
        assert len(idle) + len(outdated) >= 3 or any(
            r.state is RunnerState.STARTING for r in managed.runners
        )
        return len(idle) == 3 and not outdated

    await wait_until(rolled, what="the rollout")
    await harness.settled(controller)
    new = {
        j["Meta"][META_TEMPLATE] for j in await harness.jobs(controller) if j["Status"] != "dead"
    }
    assert new.isdisjoint(old)


async def test_invalid_document_is_skipped_and_valid_pools_run(harness: Harness, tmp_path, caplog):
    folder = tmp_path / "pools"
    folder.mkdir()
    write_pools(folder / "a.yaml", pool_doc("good", idle=2))
    bad = pool_doc("bad", idle=2)
    del bad["spec"]["runner"]["image"]
    write_pools(folder / "b.yaml", pool_doc("fine", idle=1), bad)
    controller = await harness.start(folder)
    await harness.settled(controller)
    assert set(controller.engine.pools) == {"default/good", "default/fine"}
    assert any(
        "b.yaml:1:" in r.message and "spec.runner.image" in r.message for r in caplog.records
    )


async def test_invalid_reload_keeps_the_last_valid_version(harness: Harness, tmp_path):
    pools = write_pools(tmp_path / "pools.yaml", pool_doc("py", idle=2))
    controller = await harness.start(pools)
    await harness.settled(controller)
    broken = pool_doc("py", idle=-1)
    write_pools(pools, broken)
    await controller.load_pools()
    assert controller.engine.pools["default/py"].policy.desired_idle == 2
    pools.write_text("{not yaml: [")
    await controller.load_pools()
    assert "default/py" in controller.engine.pools
    await harness.settled(controller)


async def test_second_pool_with_the_same_prefix_is_refused(harness: Harness, tmp_path):
    pools = write_pools(
        tmp_path / "pools.yaml",
        pool_doc("first", idle=2, nomad={"jobPrefix": "shared-"}),
        pool_doc("second", idle=2, nomad={"jobPrefix": "shared-"}),
    )
    controller = await harness.start(pools)
    await harness.settled(controller)
    second = controller.engine.pools["default/second"]
    assert second.status is not None
    ready = next(c for c in second.status.to_dict()["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "PrefixConflict")
    assert {j["Meta"][META_POOL] for j in await harness.jobs(controller)} == {"default/first"}
    # Readiness does not wait for a conflicting pool, and the pool hands out nothing:
    # the runners under its prefix are the first pool's.
    status, _ = await harness.api(controller, "GET", "/readyz", token=None)
    assert status == 200
    status, body = await harness.api(controller, "POST", "/v1/pools/default/second/claims", {})
    assert (status, body["error"]["code"]) == (409, "PrefixConflict")


@pytest.mark.parametrize(
    ("update", "reason"),
    [
        ({"runner": {"image": ""}}, "InvalidSpec"),
        ({"nomad": {"jobPrefix": "moved-"}}, "ImmutableFieldChanged"),
    ],
)
async def test_a_refused_update_keeps_the_last_valid_version_running(
    harness: Harness, tmp_path, update, reason
):
    pools = write_pools(tmp_path / "pools.yaml", pool_doc("py", idle=2))
    controller = await harness.start(pools)
    await harness.settled(controller)
    write_pools(pools, pool_doc("py", idle=3, **update))
    await controller.load_pools()

    async def refused() -> bool:
        await controller.engine.reconcile_namespace("default")
        _, listing = await harness.api(controller, "GET", "/v1/pools")
        conditions = {c["type"]: c for c in listing["pools"][0]["status"]["conditions"]}
        accepted = conditions["SpecAccepted"]
        return bool(accepted["status"] == "False" and accepted["reason"] == reason)

    await wait_until(refused, what=f"SpecAccepted=False {reason}")
    # Still reconciled with the old spec (2 idle, not 3) and claimable: a claim is
    # answered and its runner replaced.
    status, claim = await harness.api(controller, "POST", "/v1/pools/default/py/claims", {})
    assert status == 201, claim
    await harness.settled(controller)
    assert controller.engine.pools["default/py"].policy.desired_idle == 2
    # A valid version is taken again.
    write_pools(pools, pool_doc("py", idle=3))
    await controller.load_pools()
    await harness.settled(controller)
    view = controller.engine.pools["default/py"]
    assert view.refusal is None and view.policy.desired_idle == 3


@pytest.mark.parametrize(("policy", "left"), [("Delete", 0), ("Orphan", 2), ("Drain", 0)])
async def test_removed_pool_follows_its_deletion_policy(harness: Harness, tmp_path, policy, left):
    pools, controller = await keep_and_gone(harness, tmp_path, policy, gone_idle=2)
    write_pools(pools, pool_doc("keep", idle=1))
    await controller.load_pools()

    async def done() -> bool:
        await controller.engine.reconcile_namespace("default")
        managed = controller.engine.pools.get("default/gone")
        gone = [
            j
            for j in await harness.jobs(controller)
            if j["Meta"][META_POOL] == "default/gone" and j["Status"] != "dead"
        ]
        return bool(len(gone) == left and (managed is None or managed.runners == ()))

    await wait_until(done, what=f"{policy} to finish")
    if policy == "Orphan":
        assert "default/gone" not in controller.engine.pools
    else:  # kept, unclaimable, until its tombstones are forgotten
        assert controller.engine.pools["default/gone"].runners == ()
        status, body = await harness.api(controller, "POST", "/v1/pools/default/gone/claims", {})
        assert (status, body["error"]["code"]) == (404, "PoolNotFound")
    status, listing = await harness.api(controller, "GET", "/v1/pools")
    assert [p["name"] for p in listing["pools"]] == ["keep"]


async def test_drain_waits_for_claimed_runners_and_resumes_after_restart(
    harness: Harness, tmp_path
):
    pools = write_pools(
        tmp_path / "pools.yaml",
        pool_doc("keep", idle=1),
        pool_doc("gone", idle=2, deletionPolicy="Drain", drainTimeoutSeconds=3600),
    )
    controller = await harness.start(pools)
    await harness.settled(controller)
    status, claim = await harness.api(controller, "POST", "/v1/pools/default/gone/claims", {})
    assert status == 201, claim
    write_pools(pools, pool_doc("keep", idle=1))
    await controller.load_pools()

    async def only_claimed_left() -> bool:
        await controller.engine.reconcile_namespace("default")
        gone = [
            j["ID"]
            for j in await harness.jobs(controller)
            if j["Meta"][META_POOL] == "default/gone" and j["Status"] != "dead"
        ]
        return gone == [claim["runnerId"]]

    await wait_until(only_claimed_left, what="idle runners drained")
    # A restarted controller resumes the drain from its record in Nomad.
    await harness.stop(controller)
    restarted = await harness.start(pools)

    async def resumed() -> bool:
        return "default/gone" in restarted.engine.pools

    await wait_until(resumed, what="the recorded drain to be resumed")
    status, _ = await harness.api(restarted, "DELETE", f"/v1/runners/{claim['runnerId']}")
    assert status == 204

    async def drained() -> bool:
        await restarted.engine.reconcile_namespace("default")
        return restarted.engine.pools["default/gone"].runners == ()

    await wait_until(drained, what="the drain to finish")


async def test_orphans_are_left_alone_unless_pruned(harness: Harness, tmp_path, caplog):
    pools = write_pools(tmp_path / "pools.yaml", pool_doc("keep", idle=1), pool_doc("old", idle=2))
    controller = await harness.start(pools)
    await harness.settled(controller)
    await harness.stop(controller)
    write_pools(pools, pool_doc("keep", idle=1))
    # Without --prune the runners of the pool that vanished while we were down stay.
    with caplog.at_level(logging.WARNING, logger="controller.engine.drains"):
        survivor = await harness.start(pools)
        await harness.settled(survivor)
    old = [j for j in await harness.jobs(survivor) if j["Meta"][META_POOL] == "default/old"]
    assert len([j for j in old if j["Status"] != "dead"]) == 2
    assert caplog.messages == [
        "namespace default holds runner jobs of pool default/old, which is not defined: "
        "left alone (orphaned; --prune drains them)"
    ]
    await harness.stop(survivor)
    pruner = await harness.start(pools, prune=True)

    async def pruned() -> bool:
        await pruner.engine.reconcile_namespace("default")
        return not [
            j
            for j in await harness.jobs(pruner)
            if j["Meta"][META_POOL] == "default/old" and j["Status"] != "dead"
        ]

    await wait_until(pruned, what="orphans pruned")


async def keep_and_gone(
    harness: Harness, tmp_path: Path, policy: str, gone_idle: int = 1
) -> tuple[Path, Controller]:
    """A settled controller of the pools `keep` and `gone` (deletionPolicy `policy`)."""
    pools = write_pools(
        tmp_path / "pools.yaml",
        pool_doc("keep", idle=1),
        pool_doc("gone", idle=gone_idle, deletionPolicy=policy),
    )
    controller = await harness.start(pools)
    await harness.settled(controller)
    return pools, controller


async def test_orphan_after_a_drain_began_cancels_the_recorded_drain(harness: Harness, tmp_path):
    pools, controller = await keep_and_gone(harness, tmp_path, "Drain")
    status, claim = await harness.api(controller, "POST", "/v1/pools/default/gone/claims", {})
    assert status == 201, claim
    write_pools(pools, pool_doc("keep", idle=1))
    await controller.load_pools()
    await controller.engine.reconcile_namespace("default")
    assert any(path.startswith("poolkeeper/pools/") for path in harness.sim.variables("default"))
    # The operator's escape from a stuck drain: the policy becomes Orphan.
    controller.engine.remove_pool("default/gone", None)
    await controller.engine.reconcile_namespace("default")
    assert not any(
        path.startswith("poolkeeper/pools/") for path in harness.sim.variables("default")
    )
    await harness.stop(controller)
    restarted = await harness.start(pools)
    assert "default/gone" not in restarted.engine.pools
    assert claim["runnerId"] in {j["ID"] for j in await harness.jobs(restarted)}


@pytest.mark.slow
async def test_starts_while_nomad_is_unreachable_and_catches_up(harness: Harness, tmp_path):
    pools, controller = await keep_and_gone(harness, tmp_path, "Delete")
    write_pools(pools, pool_doc("keep", idle=1))
    await controller.load_pools()
    await controller.engine.reconcile_namespace("default")  # the drain record is written
    await harness.stop(controller)
    harness.sim.api_fault(kind="refuse", seconds=2.0)
    restarted = await harness.start(pools)  # must not fail: Nomad is the one that is down
    status, _ = await harness.api(restarted, "GET", "/readyz", token=None)
    assert status == 503

    async def resumed() -> bool:
        return "default/gone" in restarted.engine.pools

    await wait_until(resumed, within=30, what="the recorded drain to be resumed")
    await harness.settled(restarted, within=30)


@pytest.mark.parametrize("turns", [0, 1, 2, 3])
async def test_stop_wins_over_a_hint_that_arrives_just_before_it(
    harness: Harness, tmp_path, turns: int
):
    # On Python 3.11, asyncio.wait_for swallowed a cancel arriving while the hint it
    # waited for had just been set: the loop kept running and stop() never returned.
    # `turns` walks a stop through that window, one event-loop turn at a time.
    controller = await harness.start(
        write_pools(tmp_path / "pools.yaml", pool_doc("py", idle=2, maxRunners=10))
    )
    await harness.settled(controller)
    engine = controller.engine
    lock = engine._reconciler._locks["default"]
    wake = engine._scheduler._wake["default"]

    async def idle() -> bool:  # no pass running or pending: the loop waits for a hint
        await asyncio.sleep(0.1)
        return not lock.locked() and not wake.is_set()

    await wait_until(idle, what="the loop to wait for a hint")
    engine.hint_namespace("default")
    for _ in range(turns):
        await asyncio.sleep(0)
    stopping = asyncio.create_task(engine.stop())
    async with asyncio.timeout(10):
        await stopping
