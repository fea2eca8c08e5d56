"""The idle target on the simulator: bursts, shrink pacing, schedule windows, restarts.

The controller's clock is injected (`FakeClock`); it moves only when a test says so.
Pools start slowly in no case here: the simulator starts allocations in 50 ms, so the
tests give demand a cover time (`coverSeconds`) instead of measuring one.
"""

from __future__ import annotations

import asyncio
import itertools
import math
from collections.abc import Awaitable, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

from controller.core.claims import ClaimState
from controller.core.demand import ITEM_REGISTERED_AT, ITEM_STARTED_AT, TargetReason
from controller.core.status import count
from controller.core.times import parse_time
from controller.engine.registry import PoolView
from controller.standalone import Controller
from tests.integration.conftest import FakeClock, Harness, write_pools
from tests.support.documents import pool_doc
from tests.support.waiting import wait_until

DEMAND = {"maxIdleRunners": 40, "windowSeconds": 60, "coverSeconds": 5}
# Runners must not time out while the fake clock jumps minutes ahead of the simulator's.
SLOW_START_OK: dict[str, Any] = {"startupTimeoutSeconds": 3600}
LONG_CLAIM = {"inactivityTimeoutSeconds": 3600, "waitSeconds": 10}


def demand_pool(**spec: Any) -> dict[str, Any]:
    return pool_doc(
        "py", idle=2, maxRunners=80, demand=DEMAND, claims={"maxInactivityTimeoutSeconds": 3600},
        **SLOW_START_OK, **spec,
    )  # fmt: skip


def target_at_least(view: PoolView, minimum: int) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return view.idle_target.idle_runners >= minimum

    return check


def reason_of(view: PoolView) -> TargetReason:
    return view.idle_target.reason


def buffer(controller: Controller) -> tuple[int, int]:
    """(idle, starting) as the last pass saw them."""
    counts = count(controller.engine.pools["default/py"].runners)
    return counts.idle, counts.starting


async def claim_many(harness: Harness, controller: Controller, n: int) -> list[str]:
    answers = await asyncio.gather(
        *(
            harness.api(controller, "POST", "/v1/pools/default/py/claims", LONG_CLAIM)
            for _ in range(n)
        )
    )
    return [body["runnerId"] for status, body in answers if status == 201]


async def status_of(harness: Harness, controller: Controller) -> dict[str, Any]:
    _, body = await harness.api(controller, "GET", "/v1/pools")
    (pool,) = [p for p in body["pools"] if p["name"] == "py"]
    return dict(pool["status"])


async def settled_demand_pool(
    harness: Harness, tmp_path: Path
) -> tuple[FakeClock, Controller, PoolView]:
    """A controller on an injected clock with the demand pool `py`, settled; its view."""
    clock = FakeClock()
    controller = await harness.start(write_pools(tmp_path / "p.yaml", demand_pool()), clock=clock)
    await harness.settled(controller)
    return clock, controller, controller.engine.pools["default/py"]


async def test_a_burst_raises_the_target_and_refills_ahead_of_demand(harness: Harness, tmp_path):
    _clock, controller, view = await settled_demand_pool(harness, tmp_path)
    assert view.idle_target.idle_runners == 2
    assert reason_of(view) is TargetReason.FLOOR

    claimed = await claim_many(harness, controller, 8)
    assert len(claimed) == 8

    # Eight claims inside the 5 s cover time: 8 claims per cover time, plus sqrt(8).
    await wait_until(
        target_at_least(view, 8 + math.ceil(math.sqrt(8))), what="the target to follow the burst"
    )
    assert reason_of(view) is TargetReason.DEMAND
    # The buffer is refilled to the new target, far above idleRunners, before any further
    # claim arrives.
    await harness.settled(controller)
    idle, starting = buffer(controller)
    assert idle == view.idle_target.idle_runners > 2 and starting == 0
    status = await status_of(harness, controller)
    assert status["desiredIdleRunners"] == view.idle_target.idle_runners
    assert status["desiredIdleReason"] == "demand"
    assert status["demand"]["claimsPerMinute"] > 0
    metrics = controller.engine.metrics.exposition().decode()
    assert f'poolkeeper_desired_idle_runners{{pool="default/py"}} {float(idle)}' in metrics


async def test_a_claim_that_waits_counts_before_it_is_answered(harness: Harness, tmp_path):
    _clock, controller, view = await settled_demand_pool(harness, tmp_path)
    harness.sim.set_start_delay(1.5)  # long enough to see the request wait
    assert len(await claim_many(harness, controller, 2)) == 2  # the two idle runners
    # Two claims per 5 s cover time: ceil(2 + sqrt 2)
    await wait_until(target_at_least(view, 4), what="the target to follow the claims")

    waiting = asyncio.ensure_future(
        harness.api(controller, "POST", "/v1/pools/default/py/claims", LONG_CLAIM)
    )
    # Not answered yet, so not in Nomad, but an arrival all the same (three per cover
    # time: ceil(3 + sqrt 3)) that wants a runner of its own.
    await wait_until(target_at_least(view, 5 + 1), what="the waiting claim to count")
    assert not waiting.done()
    assert len(view.waiting.arrivals) == 1
    status, body = await waiting
    assert status == 201, body
    assert view.waiting.arrivals == []
    assert view.waiting.abandoned == 0  # answered: its runner went with it
    harness.sim.set_start_delay(0.05)
    await harness.settled(controller)


async def test_the_runner_of_a_request_that_gives_up_waiting_stays_in_the_buffer(
    harness: Harness, tmp_path
):
    _clock, controller, view = await settled_demand_pool(harness, tmp_path)
    harness.sim.set_start_delay(3.0)  # nothing becomes idle while the request waits
    assert len(await claim_many(harness, controller, 2)) == 2
    short = {**LONG_CLAIM, "waitSeconds": 1}
    waiting = asyncio.ensure_future(
        harness.api(controller, "POST", "/v1/pools/default/py/claims", short)
    )
    await wait_until(lambda: bool(view.waiting.arrivals), what="the request to wait")
    await controller.engine.reconcile_namespace("default")
    with_it = view.idle_target.idle_runners
    status, _ = await waiting
    assert status == 503
    # Unanswered, its arrival is gone from the rate and it wants no runner now, but the
    # runner started for it joins the buffer, which shrinks at its pace (not at once).
    await controller.engine.reconcile_namespace("default")
    assert view.waiting.abandoned == 0  # the pass took it
    assert view.idle_target.idle_runners == with_it
    harness.sim.set_start_delay(0.05)
    await harness.settled(controller)


async def test_a_claim_records_its_runners_start_and_its_tombstone_keeps_it(
    harness: Harness, tmp_path
):
    documents = (demand_pool(), pool_doc("fixed", idle=1, maxRunners=5))
    controller = await harness.start(write_pools(tmp_path / "p.yaml", *documents))
    await harness.settled(controller)
    (runner_id,) = await claim_many(harness, controller, 1)
    _, fixed = await harness.api(controller, "POST", "/v1/pools/default/fixed/claims", {})
    status, _ = await harness.api(controller, "DELETE", f"/v1/runners/{runner_id}")
    assert status == 204
    await harness.settled(controller)
    assert runner_id not in {job["ID"] for job in harness.sim.job_list("default")}
    variables = harness.sim.variables("default")
    items = variables[f"poolkeeper/claims/{runner_id}"]["Items"]
    assert items["state"] == ClaimState.RELEASED
    assert parse_time(items[ITEM_REGISTERED_AT]) < parse_time(items[ITEM_STARTED_AT])
    # Only pools with spec.demand measure starts.
    assert ITEM_STARTED_AT not in variables[f"poolkeeper/claims/{fixed['runnerId']}"]["Items"]


async def test_after_a_burst_the_buffer_shrinks_no_faster_than_allowed_and_loses_no_claim(
    harness: Harness, tmp_path
):
    clock, controller, view = await settled_demand_pool(harness, tmp_path)
    await claim_many(harness, controller, 15)
    await wait_until(target_at_least(view, 15), what="the target to follow the burst")
    await harness.settled(controller)
    pool = controller.engine.pools["default/py"]

    def paced_buffer() -> int:
        # The target without the runners of requests waiting at the pass: a claim that
        # waits while the pool refills wants a runner on top, which its answer takes
        # away again (a claim, not a shrink).
        assert pool.pacing is not None
        assert view.idle_target.idle_runners >= math.ceil(pool.pacing.runners)
        return math.ceil(pool.pacing.runners)

    handed_out: list[str] = []
    buffers = [paced_buffer()]
    for _ in range(12):
        clock.advance(20)  # the burst has left the 60 s window after the third step
        # Clients keep claiming while the controller retires the surplus.
        pass_and_claims = await asyncio.gather(
            controller.engine.reconcile_namespace("default"), claim_many(harness, controller, 2)
        )
        handed_out += pass_and_claims[1]
        buffers.append(paced_buffer())
    # 10 % of the buffer per minute, never more: over 20 s at most 1 - 0.9 ** (1/3).
    for before, after in itertools.pairwise(buffers):
        assert after >= math.floor(before * 0.9 ** (1 / 3)), buffers
    assert buffers[-1] < buffers[0]  # and it does shrink
    # Every runner a client got is still claimed and its job still there: no retirement
    # won against a claim.
    claims = harness.sim.variables("default")
    jobs = {job["ID"] for job in harness.sim.job_list("default")}
    for runner_id in handed_out:
        items = claims[f"poolkeeper/claims/{runner_id}"]["Items"]
        assert items["state"] == ClaimState.CLAIMED, runner_id
        assert runner_id in jobs
    await harness.settled(controller)


async def test_a_schedule_window_raises_the_floor_at_its_start_and_releases_it_at_its_end(
    harness: Harness, tmp_path
):
    clock = FakeClock()
    opens = (clock.now + timedelta(minutes=2)).replace(second=0)
    window = {
        "cron": f"{opens.minute} {opens.hour} * * *",
        "durationMinutes": 3,
        "idleRunners": 7,
        "timeZone": "UTC",
    }
    document = pool_doc("py", idle=2, maxRunners=20, schedule=[window], **SLOW_START_OK)
    controller = await harness.start(write_pools(tmp_path / "p.yaml", document), clock=clock)
    await harness.settled(controller)
    view = controller.engine.pools["default/py"]

    clock.now = opens - timedelta(seconds=1)
    await harness.settled(controller)
    assert buffer(controller) == (2, 0)

    clock.now = opens
    await harness.settled(controller)
    assert view.idle_target.idle_runners == 7
    assert reason_of(view) is TargetReason.SCHEDULE
    assert buffer(controller) == (7, 0)
    assert (await status_of(harness, controller))["desiredIdleReason"] == "schedule"

    clock.now = opens + timedelta(minutes=3) - timedelta(seconds=1)
    await harness.settled(controller)
    assert buffer(controller) == (7, 0)

    clock.now = opens + timedelta(minutes=3)
    await harness.settled(controller)
    assert view.idle_target.idle_runners == 2
    assert reason_of(view) is TargetReason.FLOOR
    assert buffer(controller) == (2, 0)


async def test_a_restarted_controller_keeps_the_estimate(harness: Harness, tmp_path):
    clock = FakeClock()
    pools = write_pools(tmp_path / "p.yaml", demand_pool())
    first = await harness.start(pools, clock=clock)
    await harness.settled(first)
    await claim_many(harness, first, 10)
    await wait_until(target_at_least(first.engine.pools["default/py"], 10), what="the burst")
    await harness.settled(first)
    before = first.engine.pools["default/py"].idle_target
    await harness.stop(first)

    second = await harness.start(pools, clock=clock)
    await harness.settled(second)
    after = second.engine.pools["default/py"].idle_target
    # Rebuilt from the claim variables and job times Nomad holds: the same estimate.
    assert after.idle_runners == before.idle_runners
    assert after.reason is TargetReason.DEMAND
    assert after.claims_per_minute == before.claims_per_minute
    assert after.start_seconds_p90 == before.start_seconds_p90
    # And it goes on shrinking at the pace, from the buffer the pool holds.
    clock.advance(60)
    await second.engine.reconcile_namespace("default")
    later = second.engine.pools["default/py"].idle_target.idle_runners
    assert math.floor(before.idle_runners * 0.9) <= later <= before.idle_runners
