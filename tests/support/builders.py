"""Builders of the engine's data types for one pool: jobs, allocations and claims of runner
``n`` at a fixed ``NOW``, and the observation they make."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime, timedelta

from controller.core.claims import ClaimRecord, ClaimState
from controller.core.times import to_ns
from controller.core.views import AllocationView, JobView, PoolObservation, PoolPolicy

NOW = datetime(2026, 11, 30, 9, 0, tzinfo=UTC)
POOL = "default/python"
POLICY = PoolPolicy(
    key=POOL,
    nomad_namespace="default",
    job_prefix="python-",
    desired_idle=3,
    max_runners=10,
    startup_timeout_seconds=120,
    template_hash="t1",
)


def rid(n: int, prefix: str = "python-") -> str:
    return f"{prefix}{n:012x}"


def job(
    n: int,
    *,
    template: str = "t1",
    status: str = "running",
    stop: bool = False,
    submitted: datetime = NOW - timedelta(hours=1),
    prefix: str = "python-",
    pool: str = POOL,
    namespace: str = "default",
) -> JobView:
    return JobView(
        id=rid(n, prefix),
        namespace=namespace,
        pool=pool,
        template=template,
        status=status,
        stop=stop,
        submit_time_ns=to_ns(submitted),
    )


RAN = ("running", "complete", "lost", "unknown")


def alloc(
    n: int,
    alloc_id: str,
    *,
    desired: str = "run",
    client: str = "running",
    created: datetime = NOW - timedelta(minutes=30),
    index: int = 10,
    restarts: int = 0,
    prefix: str = "python-",
    started: bool | None = None,
    failure: str = "",
) -> AllocationView:
    return AllocationView(
        id=alloc_id,
        job_id=rid(n, prefix),
        namespace="default",
        node_name="node-1",
        desired_status=desired,
        client_status=client,
        create_time_ns=to_ns(created),
        modify_time_ns=to_ns(created),
        create_index=index,
        restarts=restarts,
        # By default an allocation that got past pending has run its task.
        started_time_ns=to_ns(created) if (client in RAN if started is None else started) else 0,
        failure=failure,
    )


def claim(
    n: int,
    alloc_id: str,
    *,
    state: ClaimState = ClaimState.CLAIMED,
    expires: datetime = NOW + timedelta(minutes=5),
    restarts: int | None = None,
    modified: datetime = NOW - timedelta(minutes=1),
    prefix: str = "python-",
    pool: str = POOL,
) -> ClaimRecord:
    return ClaimRecord(
        runner_id=rid(n, prefix),
        namespace="default",
        modify_index=100 + n,
        modify_time_ns=to_ns(modified),
        pool=pool,
        allocation_id=alloc_id,
        claimed_at=NOW - timedelta(minutes=2),
        expires_at=expires,
        inactivity_timeout_seconds=300,
        state=state,
        allocation_restarts=restarts,
    )


def observe(
    jobs: Iterable[JobView],
    allocs: Iterable[AllocationView] = (),
    claims: Iterable[ClaimRecord] = (),
    malformed: Iterable[str] = (),
) -> PoolObservation:
    by_job: dict[str, list[AllocationView]] = {}
    for a in allocs:
        by_job.setdefault(a.job_id, []).append(a)
    return PoolObservation(
        jobs=tuple(jobs),
        allocations={k: tuple(v) for k, v in by_job.items()},
        claims={c.runner_id: c for c in claims},
        malformed_claims=frozenset(malformed),
    )
