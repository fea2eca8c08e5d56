"""Creation circuit breaker: opens after 3 failures in a row, backs off, a success heals."""

from __future__ import annotations

from datetime import timedelta

import pytest

from controller.core.breaker import (
    BreakerState,
    backoff,
    creation_allowed,
    degraded,
    is_open,
    newly_running,
    record,
)
from controller.core.classify import classify
from controller.core.views import RunnerState
from tests.support.builders import NOW, POLICY, alloc, claim, job, observe

CLOSED = BreakerState()


def test_two_failures_keep_it_closed_the_third_opens() -> None:
    state = record(CLOSED, 0, ["failed"] * 2, NOW)
    assert creation_allowed(state, NOW) and not degraded(state)
    state = record(state, 0, ["failed"] * 1, NOW)
    assert is_open(state, NOW) and not creation_allowed(state, NOW) and degraded(state)
    assert state.open_until == NOW + timedelta(seconds=2)
    # open until exactly open_until, then a probe is allowed
    assert not creation_allowed(state, NOW + timedelta(seconds=1.999))
    assert creation_allowed(state, NOW + timedelta(seconds=2))
    assert degraded(state)  # still degraded while probing


def test_backoff_doubles_per_trip_and_caps_at_five_minutes() -> None:
    state = CLOSED
    now = NOW
    delays = []
    for _ in range(10):
        state = record(state, 0, ["failed"] * 3, now)
        assert state.open_until is not None
        delays.append((state.open_until - now).total_seconds())
        now = state.open_until  # the probe after the pause fails again
    assert delays == [2, 4, 8, 16, 32, 64, 128, 256, 300, 300]
    assert backoff(10_000) == timedelta(minutes=5)


def test_late_failures_while_open_do_not_escalate() -> None:
    opened = record(CLOSED, 0, ["failed"] * 3, NOW)
    again = record(opened, 0, ["failed"] * 5, NOW + timedelta(seconds=1))
    assert again.open_until == opened.open_until and again.trips == opened.trips
    assert again.consecutive_failures == 8


def test_a_success_closes_and_resets_the_backoff() -> None:
    state = record(
        record(CLOSED, 0, ["failed"] * 3, NOW), 0, ["failed"] * 3, NOW + timedelta(seconds=2)
    )
    healed = record(state, 1, [], NOW + timedelta(seconds=10))
    assert healed == CLOSED
    assert record(healed, 0, ["failed"] * 3, NOW).open_until == NOW + timedelta(seconds=2)


@pytest.mark.parametrize(
    ("before", "successes", "failures", "opens"),
    [
        (CLOSED, 5, 3, True),  # failures after the successes of the same pass still count
        (CLOSED, 5, 2, False),
        (BreakerState(consecutive_failures=2), 1, 1, False),  # the success reset the count
        (BreakerState(consecutive_failures=2), 0, 1, True),
    ],
)
def test_mixed_outcomes(before: BreakerState, successes: int, failures: int, opens: bool) -> None:
    assert is_open(record(before, successes, ["failed"] * failures, NOW), NOW) is opens


def test_the_last_failure_is_nomads_reason() -> None:
    state = record(CLOSED, 0, ["placement: no node", "Driver Failure: pull failed"], NOW)
    assert state.last_failure == "Driver Failure: pull failed"
    assert record(state, 1, [], NOW).last_failure == ""


def test_nothing_happened_changes_nothing() -> None:
    state = record(CLOSED, 0, ["failed"] * 3, NOW)
    assert record(state, 0, [], NOW + timedelta(hours=1)) is state


def test_runners_seen_running_for_the_first_time_are_successes() -> None:
    """Whether or not a pass saw them starting: a runner that went from registration to
    running between two passes counts too."""
    first = classify(POLICY, observe([job(4)], [alloc(4, "a4")]), NOW)
    successes, seen = newly_running(frozenset(), first)
    assert successes == 1 and seen == {first[0].id}
    submitted = NOW - timedelta(seconds=5)
    after = classify(
        POLICY,
        observe(
            [job(1), job(2), job(3, status="pending", submitted=submitted), job(4)],
            [alloc(1, "a1"), alloc(2, "a2"), alloc(4, "a4")],
            [claim(2, "a2")],
        ),
        NOW,
    )
    assert [r.state for r in after][:3] == [
        RunnerState.IDLE,
        RunnerState.CLAIMED,
        RunnerState.STARTING,
    ]
    successes, seen = newly_running(seen, after)
    assert successes == 2  # runner 4 was running already; 1 and 2 were never seen starting
    assert newly_running(seen, after)[0] == 0
