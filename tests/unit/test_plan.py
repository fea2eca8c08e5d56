"""Plan: creations, destructions and leftover claims, table-driven."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from datetime import timedelta

import pytest

from controller.core.claims import TOMBSTONE_RETENTION, ClaimRecord, ClaimState
from controller.core.classify import classify
from controller.core.plan import DestroyReason, Plan, plan
from controller.core.views import AllocationView, JobView, PoolMode, PoolPolicy, Runner, RunnerState
from tests.support.builders import NOW, POLICY, alloc, claim, job, observe, rid


@dataclass
class Fixture:
    jobs: list[JobView] = field(default_factory=list)
    allocs: list[AllocationView] = field(default_factory=list)
    claims: list[ClaimRecord] = field(default_factory=list)
    malformed: list[str] = field(default_factory=list)


def idle(n: int, age: int = 3600, template: str = "t1") -> Fixture:
    submitted = NOW - timedelta(seconds=age)
    return Fixture([job(n, template=template, submitted=submitted)], [alloc(n, f"a{n}")])


def outdated(n: int, age: int = 3600) -> Fixture:
    return idle(n, age, template="t0")


def starting(n: int, age: int = 10, template: str = "t1") -> Fixture:
    submitted = NOW - timedelta(seconds=age)
    return Fixture(
        [job(n, status="pending", template=template, submitted=submitted)],
        [alloc(n, f"a{n}", client="pending", created=submitted)],
    )


def claimed(n: int, template: str = "t1") -> Fixture:
    base = idle(n, template=template)
    return dataclasses.replace(base, claims=[claim(n, f"a{n}")])


def expired(n: int) -> Fixture:
    base = idle(n)
    return dataclasses.replace(base, claims=[claim(n, f"a{n}", expires=NOW)])


def lost(n: int) -> Fixture:
    return Fixture([job(n)], [alloc(n, f"b{n}")], [claim(n, f"a{n}")])


def timed_out(n: int) -> Fixture:
    return Fixture([job(n, status="pending", submitted=NOW - timedelta(seconds=500))])


def stopped(n: int) -> Fixture:
    return Fixture([job(n, stop=True)], [alloc(n, f"a{n}")])


def dead(n: int) -> Fixture:
    return Fixture([job(n, status="dead")])


def tomb(n: int, state: ClaimState = ClaimState.RETIRED, job_gone: bool = False,
         age: timedelta = timedelta(minutes=1)) -> Fixture:  # fmt: skip
    record = claim(n, f"a{n}", state=state, modified=NOW - age)
    return Fixture([] if job_gone else [job(n, stop=True)], [], [record])


def malformed(n: int) -> Fixture:
    return dataclasses.replace(idle(n), malformed=[rid(n)])


def orphan_claim(n: int) -> Fixture:
    """A live claim whose job is gone."""
    return Fixture(claims=[claim(n, f"a{n}")])


def run(policy: PoolPolicy, *fixtures: Fixture, creation_allowed: bool = True) -> Plan:
    observation = observe(
        [j for f in fixtures for j in f.jobs],
        [a for f in fixtures for a in f.allocs],
        [c for f in fixtures for c in f.claims],
        [m for f in fixtures for m in f.malformed],
    )
    runners = classify(policy, observation, NOW)
    result = plan(policy, observation, runners, NOW, creation_allowed, target=policy.desired_idle)
    ids = [d.runner_id for d in result.destroy]
    assert len(ids) == len(set(ids)), "two destroys for one runner"
    return result


def reasons(result: Plan) -> dict[int, DestroyReason]:
    return {int(d.runner_id[-12:], 16): d.reason for d in result.destroy}


def policy(**changes: object) -> PoolPolicy:
    return dataclasses.replace(POLICY, **changes)  # type: ignore[arg-type]


S = DestroyReason
D3 = policy(desired_idle=3)


@dataclass
class Case:
    id: str
    policy: PoolPolicy
    fixtures: list[Fixture]
    create: int
    destroy: dict[int, DestroyReason] = field(default_factory=dict)
    creation_allowed: bool = True


CASES = [
    Case("empty pool fills", D3, [], 3),
    Case("idle and starting both count", D3, [idle(1), starting(2)], 1),
    Case("at desired: nothing to do", D3, [idle(1), idle(2), starting(3)], 0),
    Case("claimed runners do not count as idle", D3, [claimed(1), claimed(2), idle(3)], 2),
    Case("surge caps one tick", policy(desired_idle=50, max_runners=100), [], 20),
    Case("small surge", policy(desired_idle=5, surge=2), [idle(1)], 2),
    Case("max caps creation, claimed count toward it",
         policy(desired_idle=5, max_runners=6),
         [claimed(1), claimed(2), claimed(3), claimed(4)], 2),
    Case("terminating jobs count toward max",
         policy(desired_idle=5, max_runners=6),
         [claimed(1), claimed(2), claimed(3), tomb(4)], 2, {4: S.RETIRED}),
    Case("dead jobs do not count toward max",
         policy(desired_idle=2, max_runners=2), [dead(1), dead(2)], 2,
         {1: S.FAILED, 2: S.FAILED}),
    Case("breaker open: no creation, destroys still planned",
         D3, [timed_out(1)], 0, {1: S.STARTUP_TIMEOUT}, creation_allowed=False),
    Case("failed runners destroyed and replaced in one tick; a stopped job is no failed start",
         policy(desired_idle=2), [timed_out(1), stopped(2)], 2,
         {1: S.STARTUP_TIMEOUT, 2: S.ENDED}),
    # scale down
    Case("scale down prefers starting, then the newest idle",
         policy(desired_idle=1),
         [idle(1, age=300), idle(2, age=200), idle(3, age=100), starting(4)], 0,
         {4: S.SCALE_DOWN, 3: S.SCALE_DOWN, 2: S.SCALE_DOWN}),
    Case("scale down removes starting before any idle",
         policy(desired_idle=2), [idle(1), idle(2), starting(3), starting(4)], 0,
         {3: S.SCALE_DOWN, 4: S.SCALE_DOWN}),
    Case("scale down with outdated: outdated go, current idle stay",
         policy(desired_idle=2), [idle(1), idle(2), outdated(3), outdated(4)], 0,
         {3: S.OUTDATED, 4: S.OUTDATED}),
    Case("scale to zero", policy(desired_idle=0), [idle(1), starting(2), outdated(3)], 0,
         {1: S.SCALE_DOWN, 2: S.SCALE_DOWN, 3: S.OUTDATED}),
    Case("claimed runners are never scaled down",
         policy(desired_idle=0), [claimed(1), claimed(2, template="t0")], 0),
    # rolling update
    Case("rollout starts by creating, outdated stay claimable",
         D3, [outdated(1), outdated(2), outdated(3)], 3),
    Case("rollout retires only the outdated beyond desired",
         D3, [idle(4), outdated(1, age=300), outdated(2, age=200), outdated(3, age=100)], 2,
         {1: S.OUTDATED}),
    Case("rollout retires all outdated once current idle suffice",
         D3, [idle(4), idle(5), idle(6), outdated(1), outdated(2)], 0,
         {1: S.OUTDATED, 2: S.OUTDATED}),
    Case("rollout waits for starting replacements",
         D3, [outdated(1), outdated(2), outdated(3), starting(4), starting(5), starting(6)], 0),
    Case("starting runner of an old template is replaced",
         policy(desired_idle=1), [starting(1, template="t0")], 1, {1: S.OUTDATED}),
    Case("claimed runners are untouched by a rollout",
         policy(desired_idle=1), [claimed(1, template="t0"), idle(2)], 0),
    Case("rollout blocked by maxRunners gives up a bounded number of outdated",
         policy(desired_idle=4, max_runners=4),
         [outdated(1, age=400), outdated(2, age=300), outdated(3, age=200),
          outdated(4, age=100)], 0, {1: S.OUTDATED}),
    Case("blocked rollout waits while room is already being freed",
         policy(desired_idle=4, max_runners=4),
         [tomb(1), outdated(2), outdated(3), outdated(4)], 0, {1: S.RETIRED}),
    Case("blocked rollout: no outdated given up while creation is paused",
         policy(desired_idle=4, max_runners=4),
         [outdated(1), outdated(2), outdated(3), outdated(4)], 0, creation_allowed=False),
    # claims and tombstones
    Case("expired, lost, tombstoned runners are destroyed and replaced",
         D3, [expired(1), lost(2), tomb(3, ClaimState.RELEASED)], 3,
         {1: S.EXPIRED, 2: S.LOST, 3: S.RELEASED}),
    Case("malformed claim: never destroyed, not idle",
         policy(desired_idle=1), [malformed(1)], 1),
    # drain and delete
    Case("drain: unclaimed runners go now, claimed stay before the deadline",
         policy(mode=PoolMode.DRAIN, drain_deadline=NOW + timedelta(minutes=1)),
         [idle(1), starting(2), outdated(3), starting(4, template="t0"), claimed(5),
          expired(6), malformed(7)], 0,
         {1: S.DRAIN, 2: S.DRAIN, 3: S.DRAIN, 4: S.OUTDATED, 6: S.EXPIRED}),
    Case("drain: claimed runners retired at the deadline",
         policy(mode=PoolMode.DRAIN, drain_deadline=NOW), [claimed(1), tomb(2)], 0,
         {1: S.DRAIN, 2: S.RETIRED}),
    Case("drain without a deadline keeps claimed runners",
         policy(mode=PoolMode.DRAIN), [claimed(1)], 0),
    Case("delete: everything goes, claimed retired, malformed kept",
         policy(mode=PoolMode.DELETE), [idle(1), starting(2), claimed(3), malformed(4)], 0,
         {1: S.DELETE, 2: S.DELETE, 3: S.DELETE}),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_plan(case: Case) -> None:
    result = run(case.policy, *case.fixtures, creation_allowed=case.creation_allowed)
    assert result.create == case.create
    assert reasons(result) == case.destroy


def test_destroy_carries_the_claim_to_hold() -> None:
    fixtures = [idle(1), expired(2), lost(3), tomb(4, ClaimState.RELEASED), claimed(5)]
    result = run(policy(desired_idle=0, mode=PoolMode.DELETE), *fixtures)
    by_id = {int(d.runner_id[-12:], 16): d for d in result.destroy}
    # an idle runner has no variable yet: the I/O side creates a tombstone with cas=0
    assert by_id[1].claim is None and by_id[1].tombstone_state is ClaimState.RETIRED
    assert not by_id[1].purge_only
    # live claims are CAS-updated into the tombstone state the reason implies
    assert by_id[2].claim is not None and by_id[2].claim.modify_index == 102
    assert by_id[2].tombstone_state is ClaimState.EXPIRED and not by_id[2].purge_only
    assert by_id[3].tombstone_state is ClaimState.LOST
    assert by_id[5].tombstone_state is ClaimState.RETIRED and by_id[5].claim is not None
    # an existing tombstone: purge the job again, keep the variable as it is
    assert by_id[4].purge_only and by_id[4].tombstone_state is ClaimState.RELEASED


@pytest.mark.parametrize(
    ("age", "forgotten"),
    [
        (TOMBSTONE_RETENTION - timedelta(seconds=1), False),
        (TOMBSTONE_RETENTION, True),
        (TOMBSTONE_RETENTION + timedelta(hours=1), True),
    ],
)
def test_tombstone_forgotten_only_when_old_and_job_gone(age: timedelta, forgotten: bool) -> None:
    gone = run(D3, idle(5), idle(6), idle(7), tomb(1, job_gone=True, age=age))
    assert [c.runner_id for c in gone.forget] == ([rid(1)] if forgotten else [])
    assert gone.destroy == () and gone.lose == ()
    # while the job still exists the tombstone stays and the job is purged again
    present = run(D3, idle(5), idle(6), idle(7), tomb(1, age=age))
    assert present.forget == ()
    assert [d.runner_id for d in present.destroy] == [rid(1)]


def test_live_claim_without_a_job_is_lost() -> None:
    result = run(D3, idle(5), idle(6), idle(7), orphan_claim(1))
    assert [c.runner_id for c in result.lose] == [rid(1)]
    assert result.forget == () and result.destroy == ()


def test_plan_for_a_settled_pool_is_empty() -> None:
    result = run(D3, idle(1), idle(2), idle(3), claimed(4), tomb(5, job_gone=True))
    assert result.empty
    assert not Plan(create=1).empty


def test_rollout_keeps_claimable_at_desired_through_every_step() -> None:
    """Walk a whole rollout by hand: claimable (idle + outdated) never drops below 3."""
    pool = D3
    fixtures: dict[int, Fixture] = {n: outdated(n, age=1000 - n) for n in (1, 2, 3)}
    next_id = 10
    for _step in range(6):
        result = run(pool, *fixtures.values())
        for d in result.destroy:
            del fixtures[int(d.runner_id[-12:], 16)]
        claimable = [
            r for r in _classified(pool, fixtures)
            if r.state in (RunnerState.IDLE, RunnerState.OUTDATED)
        ]  # fmt: skip
        assert len(claimable) >= 3
        # promote last tick's new runners to idle, then add this tick's as starting
        for n, f in list(fixtures.items()):
            if f.jobs[0].status == "pending":
                fixtures[n] = idle(n, age=5)
        for _ in range(result.create):
            fixtures[next_id] = starting(next_id)
            next_id += 1
    states = [r.state for r in _classified(pool, fixtures)]
    assert states == [RunnerState.IDLE] * 3


def _classified(pool: PoolPolicy, fixtures: dict[int, Fixture]) -> list[Runner]:
    fs = list(fixtures.values())
    observation = observe([j for f in fs for j in f.jobs], [a for f in fs for a in f.allocs])
    return list(classify(pool, observation, NOW))
