"""Classify: one state per runner *job*, from what Nomad holds now.

Never per allocation and never from event order: an instant reschedule leaves a new
pending allocation and an old desired-stop one on the same job, and that is one
starting runner (the Poseidon bug poolkeeper was started for, docs/architecture.md).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from controller.core.claims import ClaimRecord
from controller.core.times import NS_PER_SECOND, to_ns
from controller.core.views import (
    AllocationView,
    Failure,
    JobView,
    PoolObservation,
    PoolPolicy,
    Runner,
    RunnerState,
)


def _newest_first(alloc: AllocationView) -> tuple[int, int, str]:
    return (alloc.create_index, alloc.create_time_ns, alloc.id)


def counting_allocation(allocations: Iterable[AllocationView]) -> AllocationView | None:
    """The live allocation that represents the job: running preferred, then newest."""
    live = [alloc for alloc in allocations if alloc.live]
    if not live:
        return None
    return max(live, key=lambda a: (a.client_status == "running", *_newest_first(a)))


def classify(policy: PoolPolicy, observation: PoolObservation, now: datetime) -> list[Runner]:
    """One Runner per job of the pool, sorted by job ID."""
    now_ns = to_ns(now)
    runners = [
        _classify_job(
            policy,
            job,
            observation.allocations.get(job.id, ()),
            observation.claims.get(job.id),
            job.id in observation.malformed_claims,
            now,
            now_ns,
        )
        for job in observation.jobs
    ]
    runners.sort(key=lambda runner: runner.id)
    return runners


def _classify_job(
    policy: PoolPolicy,
    job: JobView,
    allocations: tuple[AllocationView, ...],
    claim: ClaimRecord | None,
    malformed: bool,
    now: datetime,
    now_ns: int,
) -> Runner:
    live = [alloc for alloc in allocations if alloc.live]
    counting = counting_allocation(live)
    newest_live_create = max((alloc.create_time_ns for alloc in live), default=0)
    starting_since = max(job.submit_time_ns, newest_live_create)

    def runner(
        state: RunnerState,
        reason: str,
        alloc: AllocationView | None = counting,
        failure: Failure | None = None,
    ) -> Runner:
        return Runner(
            id=job.id,
            state=state,
            job=job,
            allocation=alloc,
            claim=claim,
            reason=reason,
            starting_since_ns=starting_since,
            malformed_claim=malformed and claim is None,
            failure=failure,
        )

    # A runner that ever ran has not failed to start, whatever happened to it since.
    ever_started = any(alloc.started for alloc in allocations)

    def failed(start_failure: Failure, reason: str) -> Runner:
        if ever_started:
            return runner(RunnerState.FAILED, reason, failure=Failure.ENDED)
        nomad_says = _newest_failure(allocations)
        detail = f"{reason}: {nomad_says}" if nomad_says else reason
        return runner(RunnerState.FAILED, detail, failure=start_failure)

    if claim is not None and claim.is_tombstone:
        return runner(RunnerState.TERMINATING, f"claim is a {claim.state} tombstone")
    if claim is None and malformed:
        # Someone holds this runner with a variable we cannot read: never hand it out,
        # never destroy it; status reports it (Degraded).
        return runner(RunnerState.CLAIMED, "claim variable is malformed")
    if claim is not None:
        state, reason, alloc = _classify_claimed(claim, live, now)
        return runner(state, reason, alloc if alloc is not None else counting)

    if job.stop:
        return runner(
            RunnerState.FAILED, "job was stopped outside poolkeeper", failure=Failure.STOPPED
        )
    if counting is not None and counting.client_status == "running":
        if job.template == policy.template_hash:
            return runner(RunnerState.IDLE, "running")
        return runner(
            RunnerState.OUTDATED,
            f"running template {job.template or '(none)'}, pool wants {policy.template_hash}",
        )
    if job.dead:
        return failed(Failure.FAILED_TO_START, "job is dead without a running allocation")
    waited_ns = now_ns - starting_since
    if waited_ns >= policy.startup_timeout_seconds * NS_PER_SECOND:
        return failed(
            Failure.STARTUP_TIMEOUT,
            f"not running {waited_ns // NS_PER_SECOND} s after start "
            f"(startup timeout {policy.startup_timeout_seconds} s)",
        )
    if counting is None:
        return runner(RunnerState.STARTING, "no live allocation yet")
    return runner(RunnerState.STARTING, "allocation pending")


def _newest_failure(allocations: Iterable[AllocationView]) -> str:
    """Nomad's reason for the newest allocation that failed a task, if any."""
    failing = [alloc for alloc in allocations if alloc.failure]
    return max(failing, key=_newest_first).failure if failing else ""


def _classify_claimed(
    claim: ClaimRecord, live: list[AllocationView], now: datetime
) -> tuple[RunnerState, str, AllocationView | None]:
    # The claimed allocation itself, if it is still live, is what counts for this
    # runner, even when the scheduler placed another one beside it (reconnect).
    claimed = next((alloc for alloc in live if alloc.id == claim.allocation_id), None)
    if claimed is None:
        how = "was replaced" if live else "is gone"
        return RunnerState.LOST, f"claimed allocation {claim.allocation_id} {how}", None
    if claim.allocation_restarts is not None and claimed.restarts > claim.allocation_restarts:
        reason = (
            f"claimed allocation restarted ({claimed.restarts} restarts, "
            f"{claim.allocation_restarts} at claim time)"
        )
        return RunnerState.LOST, reason, claimed
    if claim.is_expired(now):
        return RunnerState.EXPIRED, "inactivity timeout passed", claimed
    return RunnerState.CLAIMED, "claimed", claimed
