"""The idle target: how many idle runners a pool should hold now, and why.

Pure; `now` and everything measured come in as arguments. The target is the highest of
- the floor, `spec.idleRunners`;
- the floors of the schedule windows open now (core/schedule.py);
- with `spec.demand`, the demand estimate: the claims the buffer must absorb while a new
  runner starts, `ceil(rate * cover + sqrt(rate * cover))` (the square root is a Poisson
  margin), held back by the shrink pacing, plus a runner for every claim request waiting
  now;
capped by `demand.maxIdleRunners` (when set) and by `maxRunners`.

What happened is read from Nomad on every pass, so a restarted controller has the same
estimate as the one before it:
- the claim rate comes from the `claimedAt` of the pool's claim variables, live claims and
  tombstones alike (a tombstone outlives its claim by at least ten minutes, longer than
  any window). Only client claims count: a runner the controller retires gets a
  tombstone with an inactivity timeout of 0, which no client claim has;
- the start time comes from each runner job's `SubmitTime` and the `StartedAt` of the
  first task that ran in any of its allocations, and for runners already gone from the
  same two times written into their claims (`ITEM_REGISTERED_AT`, `ITEM_STARTED_AT`): in a
  burst every started runner is claimed and many are gone before the next pass, and
  their start times must not go with them.
What is happening now comes from the caller: the claim requests waiting for an idle
runner. A claim that waits is written to Nomad only once it is answered, so without them
the rate is what the pool could serve, not what arrives. They count as arrivals in the
rate, and each wants a runner of its own on top of the buffer, which its request takes
when it is answered (so the buffer does not keep it: the rate has the request's arrival
already); the runner of a request that stops waiting unanswered joins the buffer and
shrinks with it, so no runner goes faster than the pacing allows. They live as long
as their request: a restart ends them (their connections were to the old process), so it
loses nothing that would still be waiting; a request waiting in another replica is seen
once it is answered.
The only other thing kept between passes is the shrink pacing (`Pacing`); when it is
missing (a restart, a new pool) the buffer the pool holds now is taken as where the
shrink stands, so a restart never shrinks the buffer faster than the pacing allows.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum

from controller.core.claims import ClaimRecord
from controller.core.schedule import schedule_floor
from controller.core.times import format_time, parse_time, to_ns
from controller.core.views import (
    AllocationView,
    DemandPolicy,
    JobView,
    PoolMode,
    PoolObservation,
    PoolPolicy,
    Runner,
    RunnerState,
)

# Cover time without coverSeconds: the measured p90 start time plus half of it.
START_MARGIN = 1.5
START_PERCENTILE = 90
# The start times of the newest runners only, so an old image's starts fade out.
START_SAMPLES = 100
# The rate between claims is taken over at least this share of the cover time.
BETWEEN_CLAIMS_SHORTEST = 0.25
# The demand part of the target falls to at most this share of itself per minute.
KEPT_PER_MINUTE = 0.9
# Claim items with the claimed runner's start (written for pools with spec.demand): its
# job's SubmitTime and its first task's StartedAt. A tombstone keeps its claim's items, so
# a start time stays readable at least ten minutes after its runner is gone.
ITEM_REGISTERED_AT = "runnerRegisteredAt"
ITEM_STARTED_AT = "runnerStartedAt"


class TargetReason(StrEnum):
    FLOOR = "floor"
    SCHEDULE = "schedule"
    DEMAND = "demand"


@dataclass(frozen=True, slots=True)
class Pacing:
    """Where the shrink of the demand part stands: its value (in runners, fractional so
    the decay is smooth) at a moment."""

    runners: float
    at: datetime


@dataclass(frozen=True, slots=True)
class IdleTarget:
    idle_runners: int  # the effective target
    reason: TargetReason
    floor: int  # idleRunners or the open schedule windows' floor, whichever is higher
    # Measured for pools with spec.demand only.
    claims_per_minute: float | None = None
    start_seconds_p90: float | None = None

    @classmethod
    def fixed(cls, idle_runners: int) -> IdleTarget:
        """The target of a pool sized by idleRunners alone."""
        return cls(idle_runners, TargetReason.FLOOR, idle_runners)


def client_claim_times(claims: Iterable[ClaimRecord]) -> list[datetime]:
    """When clients claimed, from live claims and tombstones alike (retirement
    tombstones, with an inactivity timeout of 0, are not claims)."""
    return [claim.claimed_at for claim in claims if claim.inactivity_timeout_seconds > 0]


def claims_per_second(
    claimed_at: Iterable[datetime],
    now: datetime,
    window_seconds: float,
    cover_seconds: float | None,
) -> float:
    """The claim rate over the window, from the window's claims and the time they span,
    from the oldest of them to now (at most the window): the higher of
    - their count over that span, the span at least the cover time: with claims all over
      the window about count ÷ window, and at the start of a burst the burst's claims per
      cover time, not a rate diluted by the quiet minutes before it;
    - the rate between them: the claims after the oldest moment over that span, the span
      at least a quarter of the cover time (BETWEEN_CLAIMS_SHORTEST). The oldest claims
      only open the span; the ones after them measure the rate. At a burst's onset this
      is the burst's rate as soon as a second claim has come, not its claims per cover
      time, while a claim alone, or a batch (its claims share a moment), gives none. The
      shortest span bounds it at four times the first.
    Without a cover time yet it is count ÷ window.
    """
    start = now - timedelta(seconds=window_seconds)
    recent = [moment for moment in claimed_at if start < moment <= now]
    if not recent:
        return 0.0
    if not cover_seconds:
        return len(recent) / window_seconds
    oldest = min(recent)
    span = (now - oldest).total_seconds()
    per_cover = len(recent) / min(window_seconds, max(span, cover_seconds))
    later = sum(1 for moment in recent if moment > oldest)
    shortest = cover_seconds * BETWEEN_CLAIMS_SHORTEST
    between = later / min(window_seconds, max(span, shortest))
    return max(per_cover, between)


@dataclass(frozen=True, slots=True)
class StartSample:
    """One runner's start: when its job was registered and how long it took from then to
    its first running task."""

    registered_ns: int
    seconds: float


def runner_start(job: JobView, allocations: Sequence[AllocationView]) -> StartSample | None:
    """The start of a runner from its job and allocations; None before a task has run."""
    started = [a.started_time_ns for a in allocations if a.started_time_ns]
    if not started or not job.submit_time_ns or min(started) < job.submit_time_ns:
        return None
    return StartSample(job.submit_time_ns, (min(started) - job.submit_time_ns) / 1e9)


def start_items(sample: StartSample) -> dict[str, str]:
    """The claim items that record a runner's start."""
    registered = _moment(sample.registered_ns)
    return {
        ITEM_REGISTERED_AT: format_time(registered),
        ITEM_STARTED_AT: format_time(registered + timedelta(seconds=sample.seconds)),
    }


def recorded_start(claim: ClaimRecord) -> StartSample | None:
    """The runner's start as its claim recorded it; None when the claim holds none (or
    an unreadable one: it is a measurement, not worth refusing the claim over)."""
    registered, started = claim.extra.get(ITEM_REGISTERED_AT), claim.extra.get(ITEM_STARTED_AT)
    if registered is None or started is None:
        return None
    try:
        registered_ns, started_ns = to_ns(parse_time(registered)), to_ns(parse_time(started))
    except ValueError:
        return None
    if started_ns < registered_ns:
        return None
    return StartSample(registered_ns, (started_ns - registered_ns) / 1e9)


def start_seconds_p90(
    jobs: Iterable[JobView],
    allocations: Mapping[str, Sequence[AllocationView]],
    claims: Iterable[ClaimRecord],
) -> float | None:
    """The p90 (nearest rank) of the newest runners' times from registration to their
    first running task, from the runners there are and the starts recorded in claims
    (each runner once); None before any runner has started."""
    samples = {
        claim.runner_id: sample for claim in claims if (sample := recorded_start(claim)) is not None
    }
    for job in jobs:
        sample = runner_start(job, allocations.get(job.id, ()))
        if sample is not None:
            samples[job.id] = sample
    if not samples:
        return None
    newest = sorted(samples.values(), key=lambda s: s.registered_ns, reverse=True)
    ordered = sorted(sample.seconds for sample in newest[:START_SAMPLES])
    rank = math.ceil(START_PERCENTILE / 100 * len(ordered))
    return ordered[rank - 1]


def demand_runners(rate_per_second: float, cover_seconds: float) -> int:
    """Claims expected over the cover time, with a margin of their square root."""
    expected = rate_per_second * cover_seconds
    return math.ceil(expected + math.sqrt(expected))


def paced(
    demand: int, previous: Pacing | None, buffer: int, now: datetime, abandoned: int = 0
) -> Pacing:
    """The demand part after the shrink pacing: it rises at once and falls to at most
    KEPT_PER_MINUTE of itself per minute (the last fraction of a runner goes once less
    than one is left). Without a previous pacing the buffer held now is where it stands.
    `abandoned` runners were wanted by requests that stopped waiting unanswered since
    the last pass: they join the buffer and shrink with it."""
    start = previous if previous is not None else Pacing(float(buffer), now)
    minutes = max(0.0, (now - start.at).total_seconds() / 60)
    allowed = start.runners * KEPT_PER_MINUTE**minutes + max(0, abandoned)
    if allowed < 1:
        allowed = 0.0
    return Pacing(max(float(demand), allowed), now)


@dataclass(frozen=True, slots=True)
class Measured:
    claims_per_minute: float
    start_seconds_p90: float | None
    demand: int  # ceil(rate * cover + sqrt(rate * cover)): the buffer, before pacing
    waiting: int = 0  # runners wanted by the claim requests waiting now, on top


def measure(
    demand: DemandPolicy,
    claims: Sequence[ClaimRecord],
    jobs: Sequence[JobView],
    allocations: Mapping[str, Sequence[AllocationView]],
    waiting: Sequence[datetime],
    now: datetime,
) -> Measured:
    """The demand estimate from what Nomad holds and the claim requests waiting now (when
    each arrived, once per runner it wants): the claims expected over the cover time,
    none of them until a cover time is known (coverSeconds, or a first runner has
    started), and a runner for each waiting request on top."""
    p90 = start_seconds_p90(jobs, allocations, claims)
    cover: float | None = demand.cover_seconds
    if cover is None and p90 is not None:
        cover = p90 * START_MARGIN
    arrivals = [*client_claim_times(claims), *waiting]
    rate = claims_per_second(arrivals, now, demand.window_seconds, cover)
    expected = demand_runners(rate, cover) if cover else 0
    return Measured(rate * 60, p90, expected, len(waiting))


def idle_target(
    policy: PoolPolicy,
    measured: Measured | None,
    previous: Pacing | None,
    buffer: int,
    now: datetime,
    abandoned: int = 0,
) -> tuple[IdleTarget, Pacing | None]:
    """The effective target and the pacing to keep for the next pass. `measured` is the
    demand estimate (None without spec.demand); `buffer` the idle and starting runners
    the pool holds now; `abandoned` the runners of requests that stopped waiting
    unanswered since the last pass. The pacing holds the buffer; the runners of the
    requests waiting now come on top of it and leave with their requests: an answered
    request takes its runner (a claim, not a shrink), an abandoned one leaves its runner
    to the buffer, which shrinks at its pace."""
    cap = policy.max_runners
    if policy.demand is not None and policy.demand.max_idle_runners is not None:
        cap = min(cap, policy.demand.max_idle_runners)
    scheduled = schedule_floor(policy.schedule, now)
    floor = min(cap, max(policy.desired_idle, scheduled))
    if measured is None:
        reason = TargetReason.SCHEDULE if scheduled > policy.desired_idle else TargetReason.FLOOR
        return IdleTarget(floor, reason, floor), None
    pacing = paced(min(cap, measured.demand), previous, min(cap, buffer), now, abandoned)
    wanted = min(cap, math.ceil(pacing.runners) + measured.waiting)
    if wanted > floor:
        reason = TargetReason.DEMAND
    elif scheduled > policy.desired_idle:
        reason = TargetReason.SCHEDULE
    else:
        reason = TargetReason.FLOOR
    target = IdleTarget(
        max(floor, wanted),
        reason,
        floor,
        claims_per_minute=round(measured.claims_per_minute, 2),
        start_seconds_p90=None
        if measured.start_seconds_p90 is None
        else round(measured.start_seconds_p90, 3),
    )
    return target, pacing


_BUFFER_STATES = frozenset({RunnerState.IDLE, RunnerState.OUTDATED, RunnerState.STARTING})


def pass_target(
    policy: PoolPolicy,
    observation: PoolObservation,
    runners: Sequence[Runner],
    previous: Pacing | None,
    waiting: Sequence[datetime],
    now: datetime,
    abandoned: int = 0,
) -> tuple[IdleTarget, Pacing | None]:
    """One pass's idle target from the pool's observation, classified runners (none for a
    pool being removed), the claim requests waiting for it now and the runners of those
    that stopped waiting unanswered since the last pass."""
    if policy.mode is not PoolMode.ACTIVE:
        return IdleTarget.fixed(0), None
    measured = None
    if policy.demand is not None:
        measured = measure(
            policy.demand,
            list(observation.claims.values()),
            observation.jobs,
            observation.allocations,
            waiting,
            now,
        )
    buffer = sum(1 for runner in runners if runner.state in _BUFFER_STATES)
    return idle_target(policy, measured, previous, buffer, now, abandoned)


def _moment(ns: int) -> datetime:
    """The aware UTC datetime of Unix nanoseconds (to the microsecond)."""
    return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=ns // 1000)
