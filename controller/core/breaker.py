"""Creation circuit breaker (pure): stop creating runners that keep failing.

An image that never starts, or a cluster without capacity, would otherwise make the
controller register and purge jobs in a tight loop. After FAILURE_THRESHOLD failures in
a row creation pauses for 2 s, then 4 s, 8 s, ... up to 5 min; once the pause ends the
next creations are the probe. A success closes the breaker and resets the backoff.

Failures are failed registrations and runners that failed to start or timed out.
Successes should be runners that reached `running` (see `count_started`): a
registration that Nomad accepted says nothing about whether the image starts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from controller.core.views import Runner, RunnerState

FAILURE_THRESHOLD = 3
BASE_BACKOFF = timedelta(seconds=2)
MAX_BACKOFF = timedelta(minutes=5)

_STARTED = frozenset({RunnerState.IDLE, RunnerState.OUTDATED, RunnerState.CLAIMED})


@dataclass(frozen=True, slots=True)
class BreakerState:
    consecutive_failures: int = 0
    open_until: datetime | None = None
    # How often it opened since the last success: the exponent of the backoff.
    trips: int = 0


def backoff(trips: int) -> timedelta:
    """2 s · 2^trips, capped at 5 min (the exponent is bounded to avoid huge numbers)."""
    return min(BASE_BACKOFF * (1 << min(trips, 32)), MAX_BACKOFF)


def is_open(state: BreakerState, now: datetime) -> bool:
    return state.open_until is not None and now < state.open_until


def creation_allowed(state: BreakerState, now: datetime) -> bool:
    return not is_open(state, now)


def degraded(state: BreakerState) -> bool:
    """Tripped and not yet healed by a success (also while a probe is under way)."""
    return state.consecutive_failures >= FAILURE_THRESHOLD


def record(state: BreakerState, successes: int, failures: int, now: datetime) -> BreakerState:
    """Fold one pass's outcomes into the breaker.

    Within one pass the order of outcomes is unknown; successes are taken to come
    first, so failures in the same pass still count (a partly failing pool trips).
    """
    if successes <= 0 and failures <= 0:
        return state
    if failures <= 0:
        return BreakerState()
    consecutive = (0 if successes > 0 else state.consecutive_failures) + failures
    trips = 0 if successes > 0 else state.trips
    if consecutive < FAILURE_THRESHOLD:
        return BreakerState(consecutive, None, trips)
    if is_open(state, now) and successes <= 0:
        # Late failures of runners created before it opened: do not escalate again.
        return dataclasses.replace(state, consecutive_failures=consecutive)
    return BreakerState(consecutive, now + backoff(trips), trips + 1)


def count_started(previous: Iterable[Runner], current: Iterable[Runner]) -> int:
    """Runners that were starting on the previous pass and are running now."""
    was_starting = {r.id for r in previous if r.state is RunnerState.STARTING}
    return sum(1 for r in current if r.id in was_starting and r.state in _STARTED)
