"""Status: counts, conditions and when to write."""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta

import pytest

from controller.core.breaker import BreakerState
from controller.core.claims import ClaimState
from controller.core.classify import classify
from controller.core.leases import LeaseStanding, LeaseState
from controller.core.problems import PoolProblem, Problem
from controller.core.status import (
    PoolStatus,
    compute_status,
    count,
    needs_write,
    status_changed,
)
from controller.core.views import PoolMode, PoolPolicy, Runner
from tests.support.builders import NOW, POLICY, alloc, claim, job, observe, rid

LATER = NOW + timedelta(seconds=30)


def runners_of(
    idle: int = 0,
    outdated: int = 0,
    starting: int = 0,
    claimed: int = 0,
    tombstones: int = 0,
    malformed: int = 0,
    dead: int = 0,
) -> list[Runner]:
    jobs, allocs, claims, bad = [], [], [], []
    n = 0

    def take() -> int:
        nonlocal n
        n += 1
        return n

    for _ in range(idle):
        i = take()
        jobs.append(job(i))
        allocs.append(alloc(i, f"a{i}"))
    for _ in range(outdated):
        i = take()
        jobs.append(job(i, template="t0"))
        allocs.append(alloc(i, f"a{i}"))
    for _ in range(starting):
        i = take()
        jobs.append(job(i, status="pending", submitted=NOW - timedelta(seconds=5)))
    for _ in range(claimed):
        i = take()
        jobs.append(job(i))
        allocs.append(alloc(i, f"a{i}"))
        claims.append(claim(i, f"a{i}"))
    for _ in range(tombstones):
        i = take()
        jobs.append(job(i, stop=True))
        claims.append(claim(i, f"a{i}", state=ClaimState.RELEASED))
    for _ in range(malformed):
        i = take()
        jobs.append(job(i))
        allocs.append(alloc(i, f"a{i}"))
        bad.append(rid(i))
    for _ in range(dead):
        i = take()
        jobs.append(job(i, status="dead", stop=True))
        claims.append(claim(i, f"a{i}", state=ClaimState.RETIRED))
    return classify(POLICY, observe(jobs, allocs, claims, bad), NOW)


CLOSED = BreakerState()
OPEN = BreakerState(3, None, 1, "Driver Failure: Failed to pull image")


def status(
    runners: list[Runner],
    *,
    policy: PoolPolicy = POLICY,
    previous: PoolStatus | None = None,
    breaker: BreakerState = CLOSED,
    blocked: PoolProblem | None = None,
    refusal: PoolProblem | None = None,
    now: datetime | None = None,
    lease: LeaseState | None = None,
    drain_aware: bool = True,
) -> PoolStatus:
    return compute_status(
        policy,
        runners,
        now=LATER if now is None else now,
        previous=previous,
        observed_generation=7,
        breaker=breaker,
        blocked=blocked,
        refusal=refusal,
        lease=lease,
        spec_hash="spec-a",
        drain_aware=drain_aware,
    )


def conditions(s: PoolStatus) -> dict[str, tuple[str, str]]:
    return {c.type: (c.status, c.reason) for c in s.conditions}


def test_counts() -> None:
    counts = count(
        runners_of(idle=2, outdated=1, starting=3, claimed=1, tombstones=1, malformed=1, dead=1)
    )
    assert counts.idle == 3  # claimable: current and outdated
    assert counts.current_idle == 2
    assert (counts.outdated, counts.starting) == (1, 3)
    assert counts.claimed == 2  # a malformed claim still holds its runner
    assert counts.terminating == 2
    assert counts.total == 9  # the dead job is not counted
    assert counts.malformed_claims == 1


def test_to_dict_has_the_contract_fields() -> None:
    s = status(runners_of(idle=3, outdated=1, claimed=1))
    d = s.to_dict()
    assert d["idleRunners"] == 4 and d["outdatedRunners"] == 1 and d["claimedRunners"] == 1
    assert d["startingRunners"] == 0 and d["totalRunners"] == 5
    assert d["selector"] == "poolkeeper.dev/pool=python"
    assert d["templateHash"] == "t1" and d["observedGeneration"] == 7
    assert d["lastReconcileTime"] == "2026-11-30T09:00:30Z"
    ready = next(c for c in d["conditions"] if c["type"] == "Ready")
    assert set(ready) == {
        "type",
        "status",
        "reason",
        "message",
        "lastTransitionTime",
        "observedGeneration",
    }
    assert {c["type"] for c in d["conditions"]} == {
        "Ready",
        "Progressing",
        "Degraded",
        "SpecAccepted",
    }
    assert PoolStatus.from_dict(d) is not None
    assert PoolStatus.from_dict(d).to_dict() == d  # type: ignore[union-attr]
    assert PoolStatus.from_dict({"idleRunners": "x"}) is None


@pytest.mark.parametrize(
    ("kwargs", "runners", "expected"),
    [
        (
            {},
            {"idle": 3},
            {
                "Ready": ("True", "IdleRunnersAvailable"),
                "Progressing": ("False", "Stable"),
                "Degraded": ("False", "AsExpected"),
            },
        ),
        (
            {},
            {"idle": 1, "starting": 2},
            {
                "Ready": ("False", "InsufficientIdleRunners"),
                "Progressing": ("True", "CreatingRunners"),
            },
        ),
        ({}, {"idle": 1}, {"Progressing": ("True", "ScalingUp")}),
        (
            {},
            {"idle": 5},
            {"Ready": ("True", "IdleRunnersAvailable"), "Progressing": ("True", "ScalingDown")},
        ),
        (
            {},
            {"idle": 2, "outdated": 1},
            {"Ready": ("True", "IdleRunnersAvailable"), "Progressing": ("True", "RollingUpdate")},
        ),
        ({"breaker": OPEN}, {"idle": 3}, {"Degraded": ("True", "CircuitOpen")}),
        ({}, {"idle": 3, "malformed": 1}, {"Degraded": ("True", "MalformedClaims")}),
        (
            {"blocked": PoolProblem(Problem.PREFIX_CONFLICT, "python- is used by default/other")},
            {},
            {"Ready": ("False", "PrefixConflict"), "Progressing": ("False", "PrefixConflict")},
        ),
        (
            {"blocked": PoolProblem(Problem.INVALID_SPEC, "bad jobTemplate")},
            {"idle": 3},
            {"Ready": ("False", "InvalidSpec")},
        ),
        (
            # A refused update: the last valid version runs on, and says why.
            {"refusal": PoolProblem(Problem.INVALID_SPEC, "bad jobTemplate")},
            {"idle": 3},
            {"Ready": ("True", "IdleRunnersAvailable"), "SpecAccepted": ("False", "InvalidSpec")},
        ),
        ({}, {"idle": 3}, {"SpecAccepted": ("True", "Accepted")}),
        # A token that may not read nodes: nothing is broken, the reason says what is off.
        ({"drain_aware": False}, {"idle": 3}, {"Degraded": ("False", "DrainAwarenessOff")}),
        (
            {"drain_aware": False, "breaker": OPEN},
            {"idle": 3},
            {"Degraded": ("True", "CircuitOpen")},
        ),
        (
            {"policy": dataclasses.replace(POLICY, mode=PoolMode.DRAIN)},
            {"claimed": 1},
            {"Ready": ("False", "Draining"), "Progressing": ("True", "Draining")},
        ),
        (
            {"policy": dataclasses.replace(POLICY, mode=PoolMode.DELETE)},
            {},
            {"Ready": ("False", "Deleting"), "Progressing": ("False", "Drained")},
        ),
    ],
)
def test_conditions(
    kwargs: dict[str, object], runners: dict[str, int], expected: dict[str, tuple[str, str]]
) -> None:
    got = conditions(status(runners_of(**runners), **kwargs))  # type: ignore[arg-type]
    assert {k: got[k] for k in expected} == expected


@pytest.mark.parametrize(
    ("lease", "reason", "reconciled_by", "message"),
    [
        (LeaseState(LeaseStanding.HELD, "host/1", "spec-a"), "IdleRunnersAvailable", "host/1", ""),
        (
            LeaseState(LeaseStanding.ELSEWHERE, "other/7", "spec-a"),
            "LeaseHeldElsewhere",
            "other/7",
            "reconciled by other/7; this process only serves claims",
        ),
        (
            # The lease a restart left behind under this process's own name: nobody
            # reconciles the pool, and the status does not name the dead holder as its
            # reconciler.
            LeaseState(LeaseStanding.STALE, "host/1", "spec-a"),
            "LeaseNotHeld",
            "",
            "held under this process's identity (host/1) by an earlier process",
        ),
        (
            LeaseState(LeaseStanding.FREE),
            "LeaseNotHeld",
            "",
            "nobody holds the pool's lease; this process is taking it",
        ),
    ],
)
def test_the_lease_says_who_reconciles_and_nobody_is_not_held_elsewhere(
    lease: LeaseState, reason: str, reconciled_by: str, message: str
) -> None:
    s = status(runners_of(idle=3), lease=lease)
    ready = s.condition("Ready")
    assert ready is not None and ready.reason == reason and message in ready.message
    assert s.reconciled_by == reconciled_by
    progressing = s.condition("Progressing")
    assert progressing is not None
    if not lease.held:
        assert (progressing.status, progressing.reason) == ("False", reason)
    # Another version of the spec matters only where a live holder reconciles it.
    other_spec = dataclasses.replace(lease, holder_spec="spec-b")
    degraded = status(runners_of(idle=3), lease=other_spec).condition("Degraded")
    expected = (
        "SpecDiffersFromHolder" if lease.standing is LeaseStanding.ELSEWHERE else "AsExpected"
    )
    assert degraded is not None and degraded.reason == expected


def test_degraded_message_names_both_problems_and_nomads_reason() -> None:
    s = status(runners_of(idle=3, malformed=2), breaker=OPEN)
    degraded = next(c for c in s.conditions if c.type == "Degraded")
    assert "3 failed starts" in degraded.message and "2 runners" in degraded.message
    assert "Driver Failure: Failed to pull image" in degraded.message


def test_transition_time_moves_only_when_status_flips() -> None:
    first = status(runners_of(idle=1), now=NOW)
    same = status(runners_of(idle=2), previous=first, now=LATER)
    flipped = status(runners_of(idle=3), previous=same, now=LATER + timedelta(seconds=5))

    def since(s: PoolStatus, type_: str) -> datetime:
        return next(c.last_transition_time for c in s.conditions if c.type == type_)

    assert since(first, "Ready") == NOW
    assert since(same, "Ready") == NOW  # still False, message changed
    assert since(flipped, "Ready") == LATER + timedelta(seconds=5)
    assert since(flipped, "Degraded") == NOW  # never flipped


def test_status_changed_ignores_only_reconcile_time() -> None:
    a = status(runners_of(idle=3), now=NOW)
    b = status(runners_of(idle=3), previous=a, now=LATER)
    assert not status_changed(a, b)
    assert status_changed(None, b)
    c = status(runners_of(idle=2), previous=a, now=LATER)
    assert status_changed(a, c)
    d = status(runners_of(idle=3), previous=a, now=LATER, breaker=OPEN)
    assert status_changed(a, d)


@pytest.mark.parametrize(
    ("elapsed", "write"),
    [(timedelta(seconds=59), False), (timedelta(seconds=60), True), (timedelta(hours=1), True)],
)
def test_needs_write_at_least_once_a_minute(elapsed: timedelta, write: bool) -> None:
    written = status(runners_of(idle=3), now=NOW)
    fresh = status(runners_of(idle=3), previous=written, now=NOW + elapsed)
    assert needs_write(written, fresh, NOW + elapsed) is write
    changed = status(runners_of(idle=2), previous=written, now=NOW + timedelta(seconds=1))
    assert needs_write(written, changed, NOW + timedelta(seconds=1))
    assert needs_write(None, fresh, NOW)
