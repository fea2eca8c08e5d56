"""Things that happen to a pool and that people want to hear of: the engine emits them
through one sink; standalone turns them into log lines, the operator into Kubernetes
Events too. Plain data."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum


class EventKind(Enum):
    """Each kind with its Kubernetes Event reason and whether it is a warning."""

    reason: str
    warning: bool

    def __new__(cls, reason: str, warning: bool) -> EventKind:
        member = object.__new__(cls)
        member._value_ = reason
        member.reason = reason
        member.warning = warning
        return member

    # A runner that never became usable was destroyed; the pool creates another.
    RUNNER_REPLACED = ("RunnerReplaced", True)
    # A claimed runner lost its allocation (replaced, gone or restarted): its user's state
    # is gone, so the runner is destroyed and its claim answers 410 AllocationLost.
    ALLOCATION_LOST = ("AllocationLost", True)
    BREAKER_OPENED = ("CircuitBreakerOpen", True)
    BREAKER_CLOSED = ("CircuitBreakerClosed", False)
    PREFIX_CONFLICT = ("PrefixConflict", True)
    LEASE_ACQUIRED = ("LeaseAcquired", False)
    LEASE_LOST = ("LeaseLost", True)
    SPEC_DIFFERS = ("SpecDiffersFromHolder", True)


@dataclass(frozen=True, slots=True)
class PoolEvent:
    kind: EventKind
    pool: str
    message: str

    @property
    def reason(self) -> str:
        return self.kind.reason

    @property
    def warning(self) -> bool:
        return self.kind.warning


EventSink = Callable[[PoolEvent], None]


def runner_replaced(pool: str, runner_id: str, why: str) -> PoolEvent:
    return PoolEvent(EventKind.RUNNER_REPLACED, pool, f"runner {runner_id} {why}; replaced")


def allocation_lost(pool: str, runner_id: str, detail: str) -> PoolEvent:
    message = f"claimed runner {runner_id} lost its allocation: {detail}"
    return PoolEvent(EventKind.ALLOCATION_LOST, pool, message)


def breaker_opened(pool: str, failures: int, pause_seconds: float, last: str) -> PoolEvent:
    message = (
        f"runner creation paused for {pause_seconds:g} s after {failures} failed starts "
        f"in a row; last: {last}"
    )
    return PoolEvent(EventKind.BREAKER_OPENED, pool, message)


def breaker_closed(pool: str) -> PoolEvent:
    return PoolEvent(EventKind.BREAKER_CLOSED, pool, "runners start again; creation resumed")


def prefix_conflict(pool: str, owner: str, job_prefix: str, nomad_namespace: str) -> PoolEvent:
    message = (
        f"job prefix {job_prefix!r} in Nomad namespace {nomad_namespace!r} is already used "
        f"by pool {owner}; this pool is not reconciled"
    )
    return PoolEvent(EventKind.PREFIX_CONFLICT, pool, message)


def lease_acquired(pool: str, holder: str) -> PoolEvent:
    return PoolEvent(
        EventKind.LEASE_ACQUIRED, pool, f"{holder} holds the pool's lease and reconciles it"
    )


def lease_lost(pool: str, holder: str, why: str) -> PoolEvent:
    message = f"{holder} lost the pool's lease ({why}) and stopped writing the pool"
    return PoolEvent(EventKind.LEASE_LOST, pool, message)


def spec_differs(pool: str, holder: str) -> PoolEvent:
    message = (
        f"the pool's holder {holder} reconciles another version of its spec than this "
        "process; this process only serves claims"
    )
    return PoolEvent(EventKind.SPEC_DIFFERS, pool, message)
