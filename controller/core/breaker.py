"""Creation circuit breaker (pure): stop creating runners that keep failing.

An image that never starts, or a cluster without capacity, would otherwise make the
controller register and purge jobs in a tight loop. After FAILURE_THRESHOLD failures in
a row creation pauses for 2 s, then 4 s, 8 s, ... up to 5 min; once the pause ends the
next creations are the probe. A success closes the breaker and resets the backoff.

Failures are failed starts only: a registration Nomad refused, an allocation that failed
before any task started, a runner not running within startupTimeoutSeconds. A runner
that Nomad drained, migrated or lost with its node, or that poolkeeper retired, is never
a failure (core/views.Failure). Successes are runners seen running for the first time, at
any pass (`newly_running`): a registration that Nomad accepted says nothing about
whether the image starts, and a start that a pass never saw `starting` still counts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
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
    # Nomad's reason for the last failed start (a task event, an evaluation's placement
    # failure, a refused registration), for the Degraded message.
    last_failure: str = ""


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


def record(
    state: BreakerState, successes: int, failures: Sequence[str], now: datetime
) -> BreakerState:
    """Fold one pass's outcomes into the breaker; `failures` are Nomad's reasons.

    Within one pass the order of outcomes is unknown; successes are taken to come
    first, so failures in the same pass still count (a partly failing pool trips).
    """
    if successes <= 0 and not failures:
        return state
    if not failures:
        return BreakerState()
    consecutive = (0 if successes > 0 else state.consecutive_failures) + len(failures)
    trips = 0 if successes > 0 else state.trips
    last = failures[-1]
    if consecutive < FAILURE_THRESHOLD:
        return BreakerState(consecutive, None, trips, last)
    if is_open(state, now) and successes <= 0:
        # Late failures of runners created before it opened: do not escalate again.
        return dataclasses.replace(state, consecutive_failures=consecutive, last_failure=last)
    return BreakerState(consecutive, now + backoff(trips), trips + 1, last)


def newly_running(seen: frozenset[str], runners: Iterable[Runner]) -> tuple[int, frozenset[str]]:
    """How many runners are running (or claimed) for the first time, and the IDs seen
    running from now on (those still present)."""
    running = frozenset(r.id for r in runners if r.state in _STARTED)
    return len(running - seen), running
