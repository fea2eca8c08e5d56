"""Plan: what to create and destroy so the pool reaches its idle target.

Pure: it takes the classified runners, the idle target (core/demand.py) and `now`, and
returns actions. Every destroy names the claim variable the I/O side must hold first
(controller/claims/__init__.py).

An idle runner on a node that drains or takes no new placements is replaced before
Nomad moves it: it is not counted toward the target, so its replacement is created (and
placed elsewhere), and it is retired like an outdated runner, only while the claimable
runners exceed the target. So a drain never takes the idle count below the target.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from controller.core.claims import TOMBSTONE_RETENTION, ClaimRecord, ClaimState
from controller.core.times import to_ns
from controller.core.views import (
    Failure,
    PoolMode,
    PoolObservation,
    PoolPolicy,
    Runner,
    RunnerState,
)


class DestroyReason(StrEnum):
    SCALE_DOWN = "scale_down"
    OUTDATED = "outdated"
    STARTUP_TIMEOUT = "startup_timeout"
    FAILED = "failed"
    ENDED = "ended"  # ran, then its job ended, or was stopped outside poolkeeper
    EXPIRED = "expired"
    LOST = "lost"
    RELEASED = "released"
    RETIRED = "retired"
    DRAIN = "drain"
    DELETE = "delete"
    NODE_LEAVING = "node_leaving"  # an idle runner on a draining or ineligible node


# A tombstone's job is purged again under the reason its tombstone records.
_REASON_OF_TOMBSTONE = {
    ClaimState.RELEASED: DestroyReason.RELEASED,
    ClaimState.EXPIRED: DestroyReason.EXPIRED,
    ClaimState.LOST: DestroyReason.LOST,
    ClaimState.RETIRED: DestroyReason.RETIRED,
}

_REASON_OF_FAILURE: dict[Failure | None, DestroyReason] = {
    Failure.STARTUP_TIMEOUT: DestroyReason.STARTUP_TIMEOUT,
    Failure.FAILED_TO_START: DestroyReason.FAILED,
}

# With maxRunners leaving no room for replacements, a rollout may take this share of
# the desired idle runners out of service at once (at least one), like Kubernetes'
# default maxUnavailable of 25 %.
_ROLLOUT_UNAVAILABLE_SHARE = 4


@dataclass(frozen=True, slots=True)
class Destroy:
    runner_id: str
    reason: DestroyReason
    # None: create a tombstone with cas=0 (loses to a concurrent claim, as it must).
    # A live claim: CAS it (its modify_index) into a tombstone. A tombstone: purge only.
    claim: ClaimRecord | None
    tombstone_state: ClaimState = ClaimState.RETIRED

    @property
    def purge_only(self) -> bool:
        """The runner already holds a tombstone: only its job needs purging (again)."""
        return self.claim is not None and self.claim.is_tombstone


@dataclass(frozen=True, slots=True)
class Plan:
    create: int = 0
    destroy: tuple[Destroy, ...] = ()
    # Tombstones whose job is gone and which are older than TOMBSTONE_RETENTION.
    forget: tuple[ClaimRecord, ...] = ()
    # Live claims whose job vanished: CAS them into `lost` tombstones.
    lose: tuple[ClaimRecord, ...] = ()

    @property
    def empty(self) -> bool:
        return not (self.create or self.destroy or self.forget or self.lose)


def _newest_first(runners: Sequence[Runner]) -> list[Runner]:
    return sorted(runners, key=lambda r: (r.starting_since_ns, r.id), reverse=True)


def _oldest_first(runners: Sequence[Runner]) -> list[Runner]:
    return sorted(runners, key=lambda r: (r.starting_since_ns, r.id))


class _Destroys:
    """Destroys in decision order; the first decision for a runner wins, so one runner
    never gets two destroys in one plan."""

    def __init__(self) -> None:
        self._by_id: dict[str, Destroy] = {}

    def __call__(
        self, runner: Runner, reason: DestroyReason, state: ClaimState = ClaimState.RETIRED
    ) -> None:
        self._by_id.setdefault(runner.id, Destroy(runner.id, reason, runner.claim, state))

    def __contains__(self, runner_id: object) -> bool:
        return runner_id in self._by_id

    def all(self) -> tuple[Destroy, ...]:
        return tuple(self._by_id.values())


def plan(
    policy: PoolPolicy,
    observation: PoolObservation,
    runners: Sequence[Runner],
    now: datetime,
    creation_allowed: bool,
    *,
    target: int,
) -> Plan:
    """`target` is the idle target of this pass (idleRunners, a schedule floor or the
    demand estimate)."""
    destroy = _Destroys()

    idle: list[Runner] = []
    outdated: list[Runner] = []
    starting: list[Runner] = []
    for runner in runners:
        state = runner.state
        if state is RunnerState.TERMINATING and runner.claim is not None:
            tombstone = runner.claim.state
            destroy(runner, _REASON_OF_TOMBSTONE.get(tombstone, DestroyReason.RETIRED), tombstone)
        elif state is RunnerState.EXPIRED:
            destroy(runner, DestroyReason.EXPIRED, ClaimState.EXPIRED)
        elif state is RunnerState.LOST:
            destroy(runner, DestroyReason.LOST, ClaimState.LOST)
        elif state is RunnerState.FAILED:
            destroy(runner, _REASON_OF_FAILURE.get(runner.failure, DestroyReason.ENDED))
        elif state is RunnerState.CLAIMED:
            # A malformed claim (claim None) is never destroyed: we cannot CAS what we
            # cannot read, and someone may be using the runner.
            if runner.claim is None:
                continue
            if policy.mode is PoolMode.DELETE:
                destroy(runner, DestroyReason.DELETE)
            elif (
                policy.mode is PoolMode.DRAIN
                and policy.drain_deadline is not None
                and now >= policy.drain_deadline
            ):
                destroy(runner, DestroyReason.DRAIN)
        elif state is RunnerState.IDLE:
            idle.append(runner)
        elif state is RunnerState.OUTDATED:
            outdated.append(runner)
        elif state is RunnerState.STARTING:
            if runner.job.template != policy.template_hash:
                destroy(runner, DestroyReason.OUTDATED)
            else:
                starting.append(runner)

    create = 0
    if policy.mode is not PoolMode.ACTIVE:
        reason = DestroyReason.DRAIN if policy.mode is PoolMode.DRAIN else DestroyReason.DELETE
        for runner in (*idle, *outdated, *starting):
            destroy(runner, reason)
    else:
        # Runners on leaving nodes are replaced first, oldest first, then outdated ones.
        leaving = observation.leaving_nodes
        replaced = [
            (r, DestroyReason.NODE_LEAVING)
            for r in _oldest_first(idle + outdated)
            if _on(r, leaving)
        ]
        replaced += [
            (r, DestroyReason.OUTDATED) for r in _oldest_first(outdated) if not _on(r, leaving)
        ]
        idle = [r for r in idle if not _on(r, leaving)]
        create = _scale(
            policy, target, runners, idle, replaced, starting, destroy, creation_allowed
        )

    forget, lose = _leftover_claims(observation, now)
    return Plan(create=create, destroy=destroy.all(), forget=forget, lose=lose)


def _on(runner: Runner, nodes: frozenset[str]) -> bool:
    return runner.allocation is not None and runner.allocation.node_id in nodes


def _scale(
    policy: PoolPolicy,
    target: int,
    runners: Sequence[Runner],
    idle: list[Runner],
    replaced: list[tuple[Runner, DestroyReason]],
    starting: list[Runner],
    destroy: _Destroys,
    creation_allowed: bool,
) -> int:
    """`idle` are the current idle runners that stay; `replaced` the claimable runners to
    replace (on leaving nodes, or of an older template), in the order to retire them."""
    desired = max(0, target)

    # Scale down: only current runners make a surplus; replaced ones go below. Starting
    # runners go first (nobody can claim them yet), then the newest idle ones.
    surplus = len(idle) + len(starting) - desired
    idle_left = len(idle)
    if surplus > 0:
        doomed_starting = _newest_first(starting)[:surplus]
        for runner in doomed_starting:
            destroy(runner, DestroyReason.SCALE_DOWN)
        doomed_idle = _newest_first(idle)[: surplus - len(doomed_starting)]
        for runner in doomed_idle:
            destroy(runner, DestroyReason.SCALE_DOWN)
        idle_left -= len(doomed_idle)

    # Rolling update without unavailability: a runner to replace is retired only while
    # the claimable ones (idle + to replace) exceed the desired count.
    retire = min(len(replaced), max(0, idle_left + len(replaced) - desired))
    for runner, why in replaced[:retire]:
        destroy(runner, why)
    outdated_left = replaced[retire:]

    want = max(0, desired - (len(idle) + len(starting)))
    total = sum(1 for runner in runners if not runner.job.dead)
    headroom = max(0, policy.max_runners - total)
    if not creation_allowed:
        return 0
    create = min(want, headroom, max(0, policy.surge))

    # maxRunners leaves no room for the replacements a rollout needs: give up a bounded
    # number of runners to replace, counting jobs already on their way out as room to come.
    if want > headroom and outdated_left:
        in_flight = sum(1 for runner in runners if runner.id in destroy and not runner.job.dead)
        budget = max(1, desired // _ROLLOUT_UNAVAILABLE_SHARE)
        extra = min(len(outdated_left), want - headroom - in_flight, budget - in_flight)
        for runner, why in outdated_left[: max(0, extra)]:
            destroy(runner, why)
    return create


def _leftover_claims(
    observation: PoolObservation, now: datetime
) -> tuple[tuple[ClaimRecord, ...], tuple[ClaimRecord, ...]]:
    """Claim variables whose job is gone: old tombstones to delete, live claims to lose."""
    job_ids = {job.id for job in observation.jobs}
    retention_ns = TOMBSTONE_RETENTION // timedelta(microseconds=1) * 1000
    now_ns = to_ns(now)
    forget: list[ClaimRecord] = []
    lose: list[ClaimRecord] = []
    for runner_id in sorted(observation.claims):
        claim = observation.claims[runner_id]
        if runner_id in job_ids:
            continue
        if not claim.is_tombstone:
            lose.append(claim)
        elif now_ns - claim.modify_time_ns >= retention_ns:
            forget.append(claim)
    return tuple(forget), tuple(lose)
