"""Things that happen to a pool and that people want to hear of: the engine emits them
through one sink; standalone turns them into log lines, the operator into Kubernetes
Events. Plain data."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RunnerReplaced:
    """A runner that never became usable was destroyed; the pool creates another."""

    pool: str
    runner_id: str
    why: str  # "did not start within startupTimeoutSeconds", "failed to start"

    warning = True
    reason = "RunnerReplaced"

    @property
    def message(self) -> str:
        return f"runner {self.runner_id} {self.why}; replaced"


@dataclass(frozen=True, slots=True)
class AllocationLost:
    """A claimed runner lost its allocation (replaced, gone or restarted): its user's state
    is gone, so the runner is destroyed and its claim answers 410 AllocationLost."""

    pool: str
    runner_id: str
    detail: str

    warning = True
    reason = "AllocationLost"

    @property
    def message(self) -> str:
        return f"claimed runner {self.runner_id} lost its allocation: {self.detail}"


@dataclass(frozen=True, slots=True)
class BreakerOpened:
    pool: str
    failures: int
    pause_seconds: float

    warning = True
    reason = "CircuitBreakerOpen"

    @property
    def message(self) -> str:
        return (
            f"runner creation paused for {self.pause_seconds:g} s after "
            f"{self.failures} failed starts in a row"
        )


@dataclass(frozen=True, slots=True)
class BreakerClosed:
    pool: str

    warning = False
    reason = "CircuitBreakerClosed"

    @property
    def message(self) -> str:
        return "runners start again; creation resumed"


@dataclass(frozen=True, slots=True)
class PrefixConflictFound:
    pool: str
    owner: str
    job_prefix: str
    nomad_namespace: str

    warning = True
    reason = "PrefixConflict"

    @property
    def message(self) -> str:
        return (
            f"job prefix {self.job_prefix!r} in Nomad namespace {self.nomad_namespace!r} "
            f"is already used by pool {self.owner}; this pool is not reconciled"
        )


PoolEvent = RunnerReplaced | AllocationLost | BreakerOpened | BreakerClosed | PrefixConflictFound
EventSink = Callable[[PoolEvent], None]
