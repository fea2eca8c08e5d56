"""Activity keeps claims alive: touches are coalesced, and the engine renews rather than
expires the claim of a runner an execution of this process runs on."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from datetime import timedelta
from typing import Any

import pytest

from controller.core.claims import GONE_REASONS, ClaimRecord, ClaimState
from controller.core.plan import Destroy, DestroyReason, Plan
from controller.core.views import PoolPolicy
from controller.engine.apply import Applier
from controller.engine.registry import ManagedPool
from controller.errors import ErrorCode, ServiceError
from controller.executions.activity import OOM_KILLED, Activity, Target
from controller.metrics import Metrics
from controller.nomad.jobs import TASK_NAME
from controller.records.claims import ClaimStore
from tests.unit.test_engine_property import POOL, PREFIX, Nomad

RUNNER = PREFIX + "0123456789ab"


async def written_claim(nomad: Nomad) -> ClaimRecord:
    record = ClaimRecord.new(
        runner_id=RUNNER,
        namespace="default",
        pool=POOL,
        allocation_id="a1",
        now=nomad.now,
        inactivity_timeout_seconds=60,
    )
    stored = await ClaimStore(nomad).create(record)
    assert stored is not None
    return stored


@pytest.mark.parametrize("busy", [True, False])
async def test_an_expired_claim_of_a_busy_runner_is_renewed(busy: bool) -> None:
    nomad = Nomad()
    record = await written_claim(nomad)
    applier = Applier(
        nomad, ClaimStore(nomad), Metrics(), lambda event: None, in_use=lambda r: busy
    )
    now = record.expires_at + timedelta(hours=1)
    plan = Plan(destroy=(Destroy(RUNNER, DestroyReason.EXPIRED, record, ClaimState.EXPIRED),))
    policy = PoolPolicy(POOL, "default", PREFIX, 0, 4, 120, "t0")
    applied = await applier.apply(ManagedPool(None, policy, {}, 0, 0), plan, [], now)
    stored = nomad.vars[RUNNER]
    if busy:
        assert (applied.destroyed, stored.state) == (0, ClaimState.CLAIMED)
        assert stored.expires_at == now + timedelta(seconds=60)
    else:
        assert (applied.destroyed, stored.state) == (1, ClaimState.EXPIRED)


class Claims:
    """The claim service as Activity uses it: renewals counted."""

    def __init__(self) -> None:
        self.renewals = 0
        self.claim_ended: list[Any] = []
        self.gate = asyncio.Event()
        self.gate.set()

    async def renew(self, record: ClaimRecord, *, past_deadline: bool = False) -> ClaimRecord:
        self.renewals += 1
        await self.gate.wait()
        return record


class Engine:
    def keep_claims_in_use(self, in_use: Any) -> None:
        self.in_use = in_use


async def test_touches_within_a_second_share_one_write(monkeypatch: pytest.MonkeyPatch) -> None:
    claims, now = Claims(), [100.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    activity = Activity(claims, Engine(), nomad=None)  # type: ignore[arg-type]
    target = Target(view=None, record=await written_claim(Nomad()))  # type: ignore[arg-type]
    await activity.touch(target)
    await activity.touch(target)
    now[0] += 0.9
    await activity.touch(target)
    assert claims.renewals == 1
    now[0] += 0.2
    claims.gate.clear()  # the next write takes a while: touches meanwhile share it
    touches = [asyncio.create_task(activity.touch(target)) for _ in range(5)]
    await asyncio.sleep(0)
    claims.gate.set()
    await asyncio.gather(*touches)
    assert claims.renewals == 2


class Gone(Claims):
    """A claim service whose read finds the engine's `lost` tombstone (it landed first)."""

    async def live(self, runner_id: str) -> ClaimRecord:
        raise ServiceError(
            ErrorCode.RUNNER_GONE, "runner lost", reason=GONE_REASONS[ClaimState.LOST]
        )


class OomKilledNomad:
    """The claimed allocation as Nomad holds it after an OOM kill: restarted, running."""

    async def read_allocation(self, allocation_id: str, namespace: str) -> dict[str, Any]:
        terminated = {"Type": "Terminated", "Details": {"oom_killed": "true"}}
        return {
            "ID": allocation_id,
            "JobID": RUNNER,
            "ClientStatus": "running",
            "DesiredStatus": "run",
            "TaskStates": {TASK_NAME: {"Restarts": 1, "Events": [terminated]}},
        }


async def test_a_lost_tombstone_that_landed_first_still_says_oom_killed() -> None:
    """The engine may write the runner's `lost` tombstone before an execution ended by the
    OOM kill looks at the claim: the allocation still says why."""
    record = dataclasses.replace(await written_claim(Nomad()), allocation_restarts=0)
    activity = Activity(Gone(), Engine(), nomad=OomKilledNomad())  # type: ignore[arg-type]
    assert await activity._loss(record) == OOM_KILLED
