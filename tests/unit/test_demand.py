"""The idle target: claim rate, cover time, margin, floors, schedules, pacing and caps.

Every case injects its clock (`NOW`); nothing here waits or reads a real clock.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controller.core.claims import ClaimRecord, ClaimState
from controller.core.demand import (
    ITEM_REGISTERED_AT,
    ITEM_STARTED_AT,
    IdleTarget,
    Measured,
    Pacing,
    StartSample,
    TargetReason,
    claims_per_second,
    client_claim_times,
    demand_runners,
    idle_target,
    measure,
    paced,
    recorded_start,
    runner_start,
    start_items,
    start_seconds_p90,
)
from controller.core.schedule import ScheduleWindow, schedule_floor
from controller.core.times import to_ns
from controller.core.views import AllocationView, DemandPolicy, JobView, PoolPolicy

NOW = datetime(2026, 1, 14, 7, 50, tzinfo=UTC)  # a Wednesday, 08:50 in Berlin


def ago(seconds: float) -> datetime:
    return NOW - timedelta(seconds=seconds)


def claim(
    runner: int,
    claimed_at: datetime,
    *,
    timeout: int = 300,
    state: ClaimState = ClaimState.CLAIMED,
    extra: dict[str, str] | None = None,
) -> ClaimRecord:
    return ClaimRecord(
        runner_id=f"py-{runner:012x}",
        namespace="default",
        modify_index=1,
        modify_time_ns=0,
        pool="default/py",
        allocation_id="a",
        claimed_at=claimed_at,
        expires_at=claimed_at + timedelta(seconds=timeout),
        inactivity_timeout_seconds=timeout,
        state=state,
        extra=extra or {},
    )


def job(runner: int, submitted: datetime) -> JobView:
    return JobView(
        f"py-{runner:012x}", "default", "default/py", "t", "running", False, to_ns(submitted)
    )


def alloc(runner: int, started: datetime | None, *, name: str = "a") -> AllocationView:
    return AllocationView(
        id=f"{name}{runner}",
        job_id=f"py-{runner:012x}",
        namespace="default",
        node_name="n1",
        desired_status="run",
        client_status="running",
        create_time_ns=0,
        modify_time_ns=0,
        create_index=runner,
        started_time_ns=to_ns(started) if started else 0,
    )


def policy(
    idle: int = 5,
    max_runners: int = 100,
    demand: DemandPolicy | None = None,
    schedule: tuple[ScheduleWindow, ...] = (),
) -> PoolPolicy:
    return PoolPolicy(
        key="default/py",
        nomad_namespace="default",
        job_prefix="py-",
        desired_idle=idle,
        max_runners=max_runners,
        startup_timeout_seconds=120,
        template_hash="t",
        demand=demand,
        schedule=schedule,
    )


# ---- the claim rate ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("seconds_ago", "window", "cover", "rate"),
    [
        ([], 300, 5.0, 0.0),
        # claims spread over the whole window: count / the time since the oldest
        ([i * 10 + 5 for i in range(30)], 300, 5.0, 30 / 295),
        # claims older than the window do not count
        ([10, 20, 299, 300, 301, 900], 300, 5.0, 3 / 299),
        # a burst that began 20 s ago: its own rate, not diluted by the quiet window
        ([i * 0.5 for i in range(40)], 300, 5.0, 40 / 19.5),
        # within the cover time: the rate between the claims, the 5 after the oldest over
        # at least a quarter of the cover time (not 5 per 0.6 s, nor 6 per cover time)
        ([0.1, 0.2, 0.3, 0.4, 0.5, 0.6], 300, 10.0, 5 / 2.5),
        # ... the same over the span once it is longer: 3 after the oldest in 3 s
        ([0.0, 1.0, 2.0, 3.0], 300, 10.0, 3 / 3),
        # ... never below the claims per cover time: 2 claims 8 s apart
        ([1.0, 8.0], 300, 10.0, 2 / 10),
        # a claim alone measures no rate between claims: 1 per cover time
        ([0.5], 300, 10.0, 1 / 10),
        # nor does a batch, its claims at one moment: 4 per cover time
        ([0.5, 0.5, 0.5, 0.5], 300, 10.0, 4 / 10),
        # a batch after a claim: 4 after the oldest, over at least a quarter of the cover
        ([0.5, 0.5, 0.5, 0.5, 1.5], 300, 10.0, 4 / 2.5),
        # past the cover time the claims per span are the higher of the two
        ([1.0, 2.0, 3.0, 20.0], 300, 10.0, 4 / 20),
        # without a cover time yet: count / window
        ([0.1, 0.2, 0.3], 300, None, 3 / 300),
        # a claim in the future (clock skew between writers) is not counted
        ([-5, 10], 60, 5.0, 1 / 10),
    ],
)
def test_claim_rate(
    seconds_ago: list[float], window: int, cover: float | None, rate: float
) -> None:
    times = [ago(s) for s in seconds_ago]
    assert claims_per_second(times, NOW, window, cover) == pytest.approx(rate)


def test_only_client_claims_count_live_or_tombstoned() -> None:
    records = [
        claim(1, ago(5)),
        claim(2, ago(6), state=ClaimState.RELEASED),
        claim(3, ago(7), state=ClaimState.EXPIRED),
        claim(4, ago(8), timeout=0, state=ClaimState.RETIRED),  # a scale-down, not a claim
        claim(5, ago(9), state=ClaimState.RETIRED),  # a claimed runner a drain retired
    ]
    assert sorted(client_claim_times(records)) == sorted([ago(5), ago(6), ago(7), ago(9)])


# ---- the cover time ----------------------------------------------------------------


def test_start_p90_is_registration_to_first_running_task_of_the_newest_runners() -> None:
    jobs = [job(i, ago(1000 - i)) for i in range(1, 11)]
    # runner i took i seconds; runner 10 also has a later (replacement) allocation
    allocations: dict[str, tuple[AllocationView, ...]] = {
        j.id: (alloc(i, ago(1000 - i) + timedelta(seconds=i)),) for i, j in enumerate(jobs, 1)
    }
    allocations[jobs[-1].id] += (alloc(10, NOW, name="b"),)
    assert start_seconds_p90(jobs, allocations, ()) == pytest.approx(9.0)


def test_start_p90_ignores_runners_that_never_ran_and_keeps_the_newest_hundred() -> None:
    old = [job(i, ago(5000 + i)) for i in range(1, 201)]
    new = [job(i, ago(100)) for i in range(300, 400)]
    allocations = {j.id: (alloc(int(j.id[3:], 16), ago(5000 - 60)),) for j in old}  # slow
    allocations |= {j.id: (alloc(int(j.id[3:], 16), ago(98)),) for j in new}  # 2 s
    never = job(999, ago(50))
    allocations[never.id] = (alloc(999, None),)
    assert start_seconds_p90([*old, *new, never], allocations, ()) == pytest.approx(2.0)
    assert start_seconds_p90([never], allocations, ()) is None
    assert start_seconds_p90([], {}, ()) is None


def started_claim(runner: int, registered: datetime, seconds: float) -> ClaimRecord:
    """A tombstone of a runner that is gone, with the start its claim recorded."""
    sample = StartSample(to_ns(registered), seconds)
    return claim(runner, registered, state=ClaimState.RELEASED, extra=start_items(sample))


def test_a_start_recorded_in_a_claim_survives_its_runner() -> None:
    sample = StartSample(to_ns(ago(100)), 2.5)
    items = start_items(sample)
    assert items == {
        ITEM_REGISTERED_AT: "2026-01-14T07:48:20Z",
        ITEM_STARTED_AT: "2026-01-14T07:48:22.5Z",
    }
    assert recorded_start(claim(1, ago(90), extra=items)) == sample
    # A job still there counts once, by its own times; gone runners by their claims.
    there = job(1, ago(100))
    allocations = {there.id: (alloc(1, ago(100) + timedelta(seconds=4)),)}
    claims = [started_claim(1, ago(100), 9.0), *(started_claim(i, ago(50), 2.0) for i in (2, 3))]
    assert runner_start(there, allocations[there.id]) == StartSample(to_ns(ago(100)), 4.0)
    assert start_seconds_p90([there], allocations, claims) == pytest.approx(4.0)
    assert start_seconds_p90([], {}, claims) == pytest.approx(9.0)


@pytest.mark.parametrize(
    "items",
    [
        {},  # written by an older version, or by a pool without spec.demand
        {ITEM_REGISTERED_AT: "2026-01-14T07:48:20Z"},
        {ITEM_REGISTERED_AT: "yesterday", ITEM_STARTED_AT: "2026-01-14T07:48:22Z"},
        # started before it was registered: no sample
        {ITEM_REGISTERED_AT: "2026-01-14T07:48:20Z", ITEM_STARTED_AT: "2026-01-14T07:48:19Z"},
    ],
)
def test_a_claim_without_a_readable_start_gives_no_sample(items: dict[str, str]) -> None:
    assert recorded_start(claim(1, ago(90), extra=items)) is None
    assert start_seconds_p90([], {}, [claim(1, ago(90), extra=items)]) is None


@pytest.mark.parametrize(
    ("cover_seconds", "p90", "runners"),
    [
        # rate 1/s: with the measured p90 of 4 s the cover is 6 s: ceil(6 + sqrt 6) = 9
        (None, 4.0, 9),
        # coverSeconds wins over the measurement: ceil(10 + sqrt 10) = 14
        (10, 4.0, 14),
        (10, None, 14),
        # no cover time yet (nothing started, no coverSeconds): no demand
        (None, None, 0),
    ],
)
def test_cover_time(cover_seconds: int | None, p90: float | None, runners: int) -> None:
    demand = DemandPolicy(window_seconds=60, cover_seconds=cover_seconds)
    claims = [claim(i, ago(i + 0.99)) for i in range(60)]  # one a second for a minute
    jobs, allocations = ([job(1, ago(100))], {})
    if p90 is not None:
        allocations = {jobs[0].id: (alloc(1, ago(100) + timedelta(seconds=p90)),)}
    measured = measure(demand, claims, jobs, allocations, (), NOW)
    assert measured.demand == runners
    assert measured.start_seconds_p90 == p90
    assert measured.claims_per_minute == pytest.approx(60.0, rel=1e-3)


# ---- claim requests waiting now ----------------------------------------------------


@pytest.mark.parametrize(
    ("claims_ago", "waiting_ago", "cover_seconds", "rate", "runners", "waiting"),
    [
        # nothing waits: the claims alone (5 in the last 5 s: ceil(5 + sqrt 5) = 8)
        ([0.5, 1.5, 2.5, 3.5, 4.5], [], 5, 1.0, 8, 0),
        # the first seconds of a burst: 5 answered, 4 waiting. They arrived, so the rate
        # is 9 per cover time, ceil(9 + 3), and each wants a runner of its own on top
        ([2.5, 3.0, 3.5, 4.0, 4.5], [0.2, 0.5, 1.0, 2.0], 5, 9 / 5, 12, 4),
        # a batch of 3 waits as 3 arrivals at one moment: ceil(3 + sqrt 3), and 3 on top
        ([], [1.0, 1.0, 1.0], 5, 3 / 5, 5, 3),
        # no cover time yet: no estimate, but the waiting requests still want runners
        ([1.0], [0.5, 0.5], None, 3 / 60, 0, 2),
    ],
)
def test_waiting_requests_are_arrivals_and_each_wants_a_runner(
    claims_ago: list[float],
    waiting_ago: list[float],
    cover_seconds: int | None,
    rate: float,
    runners: int,
    waiting: int,
) -> None:
    demand = DemandPolicy(window_seconds=60, cover_seconds=cover_seconds)
    claims = [claim(i, ago(s)) for i, s in enumerate(claims_ago)]
    measured = measure(demand, claims, [], {}, [ago(s) for s in waiting_ago], NOW)
    assert measured.claims_per_minute == pytest.approx(rate * 60)
    assert (measured.demand, measured.waiting) == (runners, waiting)


@pytest.mark.parametrize(
    ("rate", "cover", "runners"),
    [
        (0.0, 10.0, 0),
        (0.1, 10.0, 2),  # 1 + 1
        (1.0, 4.0, 6),  # 4 + 2
        (200 / 60, 7.5, 30),  # a class of 200 in a minute, 5 s starts: 25 + 5
        (0.01, 1.0, 1),  # 0.01 + 0.1 rounds up
    ],
)
def test_margin_is_the_square_root(rate: float, cover: float, runners: int) -> None:
    expected = rate * cover
    assert demand_runners(rate, cover) == runners == math.ceil(expected + math.sqrt(expected))


# ---- shrink pacing -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("demand", "previous", "minutes_later", "buffer", "kept"),
    [
        (30, Pacing(10.0, NOW), 0.1, 10, 30.0),  # rises at once
        (5, Pacing(30.0, NOW), 1, 30, 27.0),  # falls 10 % in a minute
        (5, Pacing(30.0, NOW), 0.5, 30, 30 * 0.9**0.5),  # smoothly in between
        (5, Pacing(30.0, NOW), 10, 30, 30 * 0.9**10),
        (20, Pacing(30.0, NOW), 10, 30, 20.0),  # never below the demand
        (0, Pacing(1.05, NOW), 1, 1, 0.0),  # the last fraction of a runner goes
        (0, Pacing(30.0, NOW), 0, 30, 30.0),  # no time, no shrink
        (5, Pacing(30.0, NOW), -1, 30, 30.0),  # a clock that went back shrinks nothing
        # no previous pacing (restart): the buffer the pool holds is where it stands
        (5, None, 0, 25, 25.0),
        (40, None, 0, 25, 40.0),
    ],
)
def test_shrink_pacing(
    demand: int, previous: Pacing | None, minutes_later: float, buffer: int, kept: float
) -> None:
    now = NOW + timedelta(minutes=minutes_later)
    result = paced(demand, previous, buffer, now)
    assert result.runners == pytest.approx(kept)
    assert result.at == now


@pytest.mark.parametrize(
    ("demand", "previous", "minutes_later", "abandoned", "kept"),
    [
        # runners of requests that stopped waiting join the buffer as it stands now, then
        # shrink with it
        (5, Pacing(20.0, NOW), 0, 4, 24.0),
        (5, Pacing(20.0, NOW), 1, 4, 20 * 0.9 + 4),
        (30, Pacing(20.0, NOW), 1, 4, 30.0),
        (5, None, 0, 4, 14.0),  # after a restart on top of the buffer held (10)
    ],
)
def test_shrink_pacing_of_abandoned_runners(
    demand: int, previous: Pacing | None, minutes_later: float, abandoned: int, kept: float
) -> None:
    now = NOW + timedelta(minutes=minutes_later)
    result = paced(demand, previous, 10, now, abandoned)
    assert result.runners == pytest.approx(kept)
    assert result.at == now


def test_a_buffer_of_thirty_takes_its_time_to_shrink_to_the_floor() -> None:
    pol = policy(idle=5, demand=DemandPolicy())
    quiet = Measured(0.0, 2.0, 0)
    target, pacing = idle_target(pol, Measured(100.0, 2.0, 30), None, 5, NOW)
    assert target.idle_runners == 30
    seen = []
    for minute in range(1, 31):
        previous_target = target.idle_runners
        target, pacing = idle_target(pol, quiet, pacing, 30, NOW + timedelta(minutes=minute))
        # at most 10 % of the buffer per minute (rounded up: never faster)
        assert target.idle_runners >= math.floor(previous_target * 0.9)
        seen.append(target.idle_runners)
    assert seen[0] == 27 and seen[9] == math.ceil(30 * 0.9**10)
    assert seen[-1] == 5 and target.reason is TargetReason.FLOOR


def test_a_waiting_request_takes_its_runner_along_and_an_abandoned_one_leaves_it() -> None:
    pol = policy(idle=5, demand=DemandPolicy())
    # 12 for the rate, 4 requests waiting on top
    target, pacing = idle_target(pol, Measured(100.0, 2.0, 12, 4), None, 5, NOW)
    assert target.idle_runners == 16
    # a second later 3 of them were answered, each with its runner: not kept by the pacing
    later = NOW + timedelta(seconds=1)
    target, pacing = idle_target(pol, Measured(100.0, 2.0, 12, 1), pacing, 16, later)
    assert target.idle_runners == 13
    # the last one gave up: its runner joins the buffer and shrinks with it
    later += timedelta(seconds=1)
    target, pacing = idle_target(pol, Measured(100.0, 2.0, 12, 0), pacing, 13, later, 1)
    assert target.idle_runners == 13
    assert pacing is not None and pacing.runners == pytest.approx(12 * 0.9 ** (1 / 60) + 1)
    later += timedelta(minutes=1)
    target, _ = idle_target(pol, Measured(0.0, 2.0, 0), pacing, 13, later)
    assert target.idle_runners == math.ceil(pacing.runners * 0.9)


# ---- floors, schedules, caps and reasons ---------------------------------------------

MORNING = ScheduleWindow("45 8 * * 1-5", timedelta(minutes=90), 40, ZoneInfo("Europe/Berlin"))


@pytest.mark.parametrize(
    ("pol", "measured", "expected"),
    [
        # a pool without demand or schedule: idleRunners
        (policy(idle=5), None, IdleTarget(5, TargetReason.FLOOR, 5)),
        # the schedule window (08:45-10:15 Berlin) is open at NOW (08:50)
        (policy(idle=5, schedule=(MORNING,)), None, IdleTarget(40, TargetReason.SCHEDULE, 40)),
        # demand below the floor: the floor, with the figures
        (
            policy(idle=5, demand=DemandPolicy()),
            Measured(6.0, 2.0, 3),
            IdleTarget(5, TargetReason.FLOOR, 5, 6.0, 2.0),
        ),
        # demand above the floor
        (
            policy(idle=5, demand=DemandPolicy()),
            Measured(60.0, 2.0, 12),
            IdleTarget(12, TargetReason.DEMAND, 5, 60.0, 2.0),
        ),
        # demand above an open schedule window's floor
        (
            policy(idle=5, demand=DemandPolicy(), schedule=(MORNING,)),
            Measured(600.0, 2.0, 45),
            IdleTarget(45, TargetReason.DEMAND, 40, 600.0, 2.0),
        ),
        (
            policy(idle=5, demand=DemandPolicy(), schedule=(MORNING,)),
            Measured(60.0, 2.0, 12),
            IdleTarget(40, TargetReason.SCHEDULE, 40, 60.0, 2.0),
        ),
        # capped by maxIdleRunners ...
        (
            policy(idle=5, demand=DemandPolicy(max_idle_runners=20)),
            Measured(600.0, 2.0, 45),
            IdleTarget(20, TargetReason.DEMAND, 5, 600.0, 2.0),
        ),
        # ... and by maxRunners
        (
            policy(idle=5, max_runners=30, demand=DemandPolicy()),
            Measured(600.0, 2.0, 45),
            IdleTarget(30, TargetReason.DEMAND, 5, 600.0, 2.0),
        ),
    ],
)
def test_the_target_and_its_reason(
    pol: PoolPolicy, measured: Measured | None, expected: IdleTarget
) -> None:
    # The pool already holds what demand wants, so pacing does not hold it above that.
    buffer = measured.demand if measured else 0
    target, pacing = idle_target(pol, measured, None, buffer, NOW)
    assert target == expected
    assert (pacing is None) is (pol.demand is None)


def test_a_schedule_window_releases_its_floor_at_once_when_it_closes() -> None:
    pol = policy(idle=5, demand=DemandPolicy(), schedule=(MORNING,))
    quiet = Measured(0.0, 2.0, 0)
    target, _ = idle_target(pol, quiet, None, 40, NOW)
    assert target.idle_runners == 40
    closed = datetime(2026, 1, 14, 9, 15, tzinfo=UTC)  # 10:15 Berlin
    target, _ = idle_target(pol, quiet, Pacing(0.0, closed - timedelta(seconds=10)), 40, closed)
    assert target == IdleTarget(5, TargetReason.FLOOR, 5, 0.0, 2.0)


# ---- the property ----------------------------------------------------------------------


@st.composite
def policies(draw: st.DrawFn) -> PoolPolicy:
    max_runners = draw(st.integers(0, 200))
    idle = draw(st.integers(0, max_runners))
    demand = None
    ceiling = max_runners
    if draw(st.booleans()):
        maximum = draw(st.one_of(st.none(), st.integers(idle, max_runners)))
        ceiling = max_runners if maximum is None else maximum
        demand = DemandPolicy(
            maximum, draw(st.integers(1, 600)), draw(st.none() | st.integers(1, 600))
        )
    windows = tuple(
        ScheduleWindow(
            draw(st.sampled_from(["45 8 * * 1-5", "*/7 * * * *", "0 23 * * *", "30 2 * * 0"])),
            timedelta(minutes=draw(st.integers(1, 10080))),
            draw(st.integers(0, ceiling)),
            ZoneInfo(draw(st.sampled_from(["UTC", "Europe/Berlin", "Pacific/Chatham"]))),
        )
        for _ in range(draw(st.integers(0, 3)))
    )
    return policy(idle, max_runners, demand, windows)


@settings(max_examples=300, deadline=None)
@given(
    policies(),
    st.lists(st.floats(0, 900), max_size=60),
    st.one_of(st.none(), st.floats(0.01, 120)),
    st.one_of(
        st.none(), st.builds(Pacing, st.floats(0, 500), st.just(NOW - timedelta(seconds=30)))
    ),
    st.integers(0, 500),
    st.integers(0, 366 * 24 * 60),
    st.lists(st.floats(0, 30), max_size=300),
    st.integers(0, 300),
)
def test_target_stays_between_the_open_floor_and_the_caps(
    pol: PoolPolicy,
    claims_ago: list[float],
    p90: float | None,
    previous: Pacing | None,
    buffer: int,
    minutes: int,
    waiting_ago: list[float],
    abandoned: int,
) -> None:
    now = NOW + timedelta(minutes=minutes)
    if previous is not None:
        previous = Pacing(previous.runners, now - timedelta(seconds=30))
    measured = None
    if pol.demand is not None:
        submitted = now - timedelta(hours=1)
        jobs = [job(1, submitted)]
        allocations = {}
        if p90 is not None:
            allocations = {jobs[0].id: (alloc(1, submitted + timedelta(seconds=p90)),)}
        claims = [claim(i, now - timedelta(seconds=s)) for i, s in enumerate(claims_ago)]
        waiting = [now - timedelta(seconds=s) for s in waiting_ago]
        measured = measure(pol.demand, claims, jobs, allocations, waiting, now)
    target, _ = idle_target(pol, measured, previous, buffer, now, abandoned)
    assert target.idle_runners <= pol.max_runners
    if pol.demand is not None and pol.demand.max_idle_runners is not None:
        assert target.idle_runners <= pol.demand.max_idle_runners
    assert target.idle_runners >= max(pol.desired_idle, schedule_floor(pol.schedule, now))
    assert target.floor == max(pol.desired_idle, schedule_floor(pol.schedule, now))
