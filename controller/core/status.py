"""Status: counts and conditions rebuilt from the classified runners on every pass.

Pure. The caller writes the result only when `needs_write` says so: when anything but
lastReconcileTime and the demand figures changed, and at least once a minute (the figures
move with every claim; written alone they would make a write of every pass).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from controller.core.breaker import BreakerState, degraded
from controller.core.demand import IdleTarget
from controller.core.leases import LeaseStanding, LeaseState
from controller.core.problems import PoolProblem, Problem
from controller.core.times import format_time, parse_time
from controller.core.views import PoolMode, PoolPolicy, Runner, RunnerState

STATUS_REFRESH = timedelta(seconds=60)
SELECTOR_LABEL = "poolkeeper.dev/pool"

READY = "Ready"
PROGRESSING = "Progressing"
DEGRADED = "Degraded"
SPEC_ACCEPTED = "SpecAccepted"

_TERMINATING_STATES = frozenset(
    {RunnerState.TERMINATING, RunnerState.EXPIRED, RunnerState.LOST, RunnerState.FAILED}
)


@dataclass(frozen=True, slots=True)
class PoolCounts:
    idle: int = 0  # claimable now: current and outdated running runners
    starting: int = 0
    claimed: int = 0
    outdated: int = 0
    terminating: int = 0  # being destroyed: tombstoned, expired, lost, failed
    total: int = 0  # every non-dead runner job of the pool
    malformed_claims: int = 0

    @property
    def current_idle(self) -> int:
        return self.idle - self.outdated


def count(runners: Iterable[Runner]) -> PoolCounts:
    idle = starting = claimed = outdated = terminating = total = malformed = 0
    for runner in runners:
        if not runner.job.dead:
            total += 1
        if runner.state is RunnerState.IDLE:
            idle += 1
        elif runner.state is RunnerState.OUTDATED:
            idle += 1
            outdated += 1
        elif runner.state is RunnerState.STARTING:
            starting += 1
        elif runner.state is RunnerState.CLAIMED:
            claimed += 1
            malformed += runner.malformed_claim
        elif runner.state in _TERMINATING_STATES:
            terminating += 1
    return PoolCounts(idle, starting, claimed, outdated, terminating, total, malformed)


@dataclass(frozen=True, slots=True)
class Condition:
    type: str
    status: str  # "True" | "False" | "Unknown"
    reason: str
    message: str
    last_transition_time: datetime
    observed_generation: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "type": self.type,
            "status": self.status,
            "reason": self.reason,
            "message": self.message,
            "lastTransitionTime": format_time(self.last_transition_time),
            "observedGeneration": self.observed_generation,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Condition:
        return cls(
            type=str(data["type"]),
            status=str(data["status"]),
            reason=str(data.get("reason", "")),
            message=str(data.get("message", "")),
            last_transition_time=parse_time(str(data["lastTransitionTime"])),
            observed_generation=int(data.get("observedGeneration", 0)),
        )


@dataclass(frozen=True, slots=True)
class PoolStatus:
    counts: PoolCounts
    selector: str
    template_hash: str
    observed_generation: int
    last_reconcile_time: datetime
    conditions: tuple[Condition, ...]
    target: IdleTarget
    reconciled_by: str = ""  # the holder of the pool's lease, when known

    def condition(self, type_: str) -> Condition | None:
        return next((c for c in self.conditions if c.type == type_), None)

    def to_dict(self) -> dict[str, Any]:
        written: dict[str, Any] = {"reconciledBy": self.reconciled_by} if self.reconciled_by else {}
        return written | {
            "idleRunners": self.counts.idle,
            "startingRunners": self.counts.starting,
            "claimedRunners": self.counts.claimed,
            "outdatedRunners": self.counts.outdated,
            "totalRunners": self.counts.total,
            "desiredIdleRunners": self.target.idle_runners,
            "desiredIdleReason": str(self.target.reason),
            **self._demand(),
            "selector": self.selector,
            "templateHash": self.template_hash,
            "observedGeneration": self.observed_generation,
            "lastReconcileTime": format_time(self.last_reconcile_time),
            "conditions": [condition.to_dict() for condition in self.conditions],
        }

    def _demand(self) -> dict[str, Any]:
        """`demand`, for pools whose target is sized by demand (spec.demand)."""
        if self.target.claims_per_minute is None:
            return {}
        figures: dict[str, float] = {"claimsPerMinute": self.target.claims_per_minute}
        if self.target.start_seconds_p90 is not None:
            figures["startSecondsP90"] = self.target.start_seconds_p90
        return {"demand": figures}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PoolStatus | None:
        """A status written earlier (a custom resource's .status), or None if unusable.

        Lets a restarted operator keep condition transition times.
        """
        try:
            counts = PoolCounts(
                idle=int(data.get("idleRunners", 0)),
                starting=int(data.get("startingRunners", 0)),
                claimed=int(data.get("claimedRunners", 0)),
                outdated=int(data.get("outdatedRunners", 0)),
                total=int(data.get("totalRunners", 0)),
            )
            return cls(
                counts=counts,
                selector=str(data.get("selector", "")),
                template_hash=str(data.get("templateHash", "")),
                observed_generation=int(data.get("observedGeneration", 0)),
                last_reconcile_time=parse_time(str(data["lastReconcileTime"])),
                conditions=tuple(Condition.from_dict(c) for c in data.get("conditions", ())),
                target=IdleTarget.fixed(int(data.get("desiredIdleRunners", 0))),
                reconciled_by=str(data.get("reconciledBy", "")),
            )
        except (KeyError, TypeError, ValueError):
            return None


def selector_for(policy: PoolPolicy) -> str:
    return f"{SELECTOR_LABEL}={policy.name}"


def compute_status(
    policy: PoolPolicy,
    runners: Sequence[Runner],
    *,
    now: datetime,
    previous: PoolStatus | None,
    observed_generation: int,
    breaker: BreakerState,
    blocked: PoolProblem | None = None,
    refusal: PoolProblem | None = None,
    lease: LeaseState | None = None,
    spec_hash: str = "",
    target: IdleTarget | None = None,
    drain_aware: bool = True,
) -> PoolStatus:
    """`blocked` says why the pool is not reconciled at all (a prefix conflict, a spec that
    was never valid); `refusal` why its newest spec was not taken (the last valid version
    runs on); `lease` who reconciles it (None: leases do not apply, as for a claims-only
    replica), compared with this process's `spec_hash`; `target` is the pass's idle target
    (idleRunners when not given); `drain_aware` False when the Nomad token may not read
    the nodes (said by Degraded's reason, which stays False: nothing is broken).

    Ready holds once the floor (idleRunners, or an open schedule window's) is idle;
    Progressing follows the whole target, demand included."""
    counts = count(runners)
    if policy.mode is not PoolMode.ACTIVE:
        target = IdleTarget.fixed(0)
    elif target is None:
        target = IdleTarget.fixed(policy.desired_idle)
    if blocked is None and lease is not None and not lease.held:
        blocked = _lease_problem(lease)
    wanted = [
        _ready(policy, counts, target.floor, blocked),
        _progressing(policy, counts, target.idle_runners, blocked),
        _degraded(counts, breaker, lease is not None and lease.differs(spec_hash), drain_aware),
        _spec_accepted(refusal),
    ]
    conditions = tuple(
        _condition(type_, status, reason, message, previous, now, observed_generation)
        for type_, status, reason, message in wanted
    )
    return PoolStatus(
        counts=counts,
        selector=selector_for(policy),
        template_hash=policy.template_hash,
        observed_generation=observed_generation,
        last_reconcile_time=now,
        conditions=conditions,
        target=target,
        reconciled_by=lease.holder if lease is not None and lease.reconciled else "",
    )


def _lease_problem(lease: LeaseState) -> PoolProblem:
    """Why this process does not reconcile a pool whose lease it wants."""
    if lease.standing is LeaseStanding.ELSEWHERE:
        holder = lease.holder or "another process"
        message = f"reconciled by {holder}; this process only serves claims"
        return PoolProblem(Problem.LEASE_HELD_ELSEWHERE, message)
    if lease.standing is LeaseStanding.STALE:
        message = (
            f"the pool's lease is still held under this process's identity ({lease.holder}) "
            "by an earlier process that did not give it back; this process takes it once "
            "Nomad frees it (2 x TTL + lock delay after that process's last renewal)"
        )
    else:
        message = "nobody holds the pool's lease; this process is taking it"
    return PoolProblem(Problem.LEASE_NOT_HELD, message)


_Wanted = tuple[str, str, str, str]


def _ready(
    policy: PoolPolicy, counts: PoolCounts, desired: int, blocked: PoolProblem | None
) -> _Wanted:
    if blocked is not None:
        return (READY, "False", blocked.kind, blocked.message)
    if policy.mode is PoolMode.DRAIN:
        return (READY, "False", "Draining", "the pool was removed; its runners are drained")
    if policy.mode is PoolMode.DELETE:
        return (READY, "False", "Deleting", "the pool was removed; its runners are deleted")
    message = f"{counts.idle} of {desired} idle runners"
    if counts.idle >= desired:
        return (READY, "True", "IdleRunnersAvailable", message)
    return (READY, "False", "InsufficientIdleRunners", message)


def _progressing(
    policy: PoolPolicy, counts: PoolCounts, desired: int, blocked: PoolProblem | None
) -> _Wanted:
    if blocked is not None:
        elsewhere = blocked.kind in (Problem.LEASE_HELD_ELSEWHERE, Problem.LEASE_NOT_HELD)
        message = blocked.message if elsewhere else "not reconciled: " + blocked.message
        return (PROGRESSING, "False", blocked.kind, message)
    if policy.mode is not PoolMode.ACTIVE:
        busy = counts.total > 0
        return (
            PROGRESSING,
            "True" if busy else "False",
            "Draining" if busy else "Drained",
            f"{counts.total} runner jobs left",
        )
    if counts.outdated:
        return (
            PROGRESSING,
            "True",
            "RollingUpdate",
            f"replacing {counts.outdated} idle runners of an older template",
        )
    if counts.starting:
        return (PROGRESSING, "True", "CreatingRunners", f"{counts.starting} runners starting")
    if counts.idle < desired:
        return (PROGRESSING, "True", "ScalingUp", f"{counts.idle} of {desired} idle runners")
    if counts.idle > desired:
        return (PROGRESSING, "True", "ScalingDown", f"{counts.idle} of {desired} idle runners")
    return (PROGRESSING, "False", "Stable", f"{counts.idle} of {desired} idle runners")


def _degraded(
    counts: PoolCounts, breaker: BreakerState, spec_differs: bool, drain_aware: bool
) -> _Wanted:
    malformed = (
        f"{counts.malformed_claims} runners hold unreadable claim variables"
        if counts.malformed_claims
        else ""
    )
    if degraded(breaker):
        message = f"{breaker.consecutive_failures} failed starts in a row"
        if breaker.last_failure:
            message += f"; last: {breaker.last_failure}"
        return (DEGRADED, "True", "CircuitOpen", "; ".join(filter(None, [message, malformed])))
    if malformed:
        return (DEGRADED, "True", "MalformedClaims", malformed)
    if spec_differs:
        message = "the process holding the pool's lease reconciles another version of its spec"
        return (DEGRADED, "True", "SpecDiffersFromHolder", message)
    if not drain_aware:
        message = (
            "the Nomad token may not read nodes (node read): runners on draining nodes are "
            "not replaced ahead of the drain"
        )
        return (DEGRADED, "False", "DrainAwarenessOff", message)
    return (DEGRADED, "False", "AsExpected", "")


def _spec_accepted(refusal: PoolProblem | None) -> _Wanted:
    if refusal is not None:
        return (SPEC_ACCEPTED, "False", refusal.kind, refusal.message)
    return (SPEC_ACCEPTED, "True", "Accepted", "")


def _condition(
    type_: str,
    status: str,
    reason: str,
    message: str,
    previous: PoolStatus | None,
    now: datetime,
    observed_generation: int,
) -> Condition:
    before = previous.condition(type_) if previous is not None else None
    # metav1.Condition: the transition time moves only when the status flips.
    since = before.last_transition_time if before is not None and before.status == status else now
    return Condition(type_, status, reason, message, since, observed_generation)


def status_changed(old: PoolStatus | None, new: PoolStatus) -> bool:
    """Whether anything written but lastReconcileTime and the demand figures differs."""
    if old is None:
        return True
    before, after = old.to_dict(), new.to_dict()
    for moving in ("lastReconcileTime", "demand"):
        before.pop(moving, None)
        after.pop(moving, None)
    return before != after


def needs_write(old: PoolStatus | None, new: PoolStatus, now: datetime) -> bool:
    """Write when something changed, or when the last written status is a minute old."""
    if old is None or status_changed(old, new):
        return True
    return now - old.last_reconcile_time >= STATUS_REFRESH
