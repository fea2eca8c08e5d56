"""Schedules: idle floors by time of day (`spec.schedule`), cron in a time zone.

Pure. A window opens at every wall-clock time its cron expression (five fields) names in
its time zone and stays open for `durationMinutes` of real time, so a window that opens
at 23:00 for two hours is still open at 00:30, whatever day the cron allows. Across a
daylight-saving change the wall clock decides, with two rules for the times a change
makes odd: a time skipped in spring opens the window as if the clock had not jumped yet
(02:30 in a zone that jumps from 02:00 to 03:00 opens at 03:30), and a time that happens
twice in autumn opens it the first time only.

croniter parses and steps the expression on naive wall-clock times; the time zone is
applied here with `zoneinfo`, so the rules above do not depend on how a cron library
treats aware datetimes.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterBadCronError, croniter

CRON_FIELDS = 5
# Wall times stepped over while looking for the latest opening at or before now: only
# openings in a skipped hour come after now in real time, so a few suffice; the bound
# only guards against an expression croniter steps through unusually.
_MAX_STEPS = 400


@dataclass(frozen=True, slots=True)
class ScheduleWindow:
    cron: str
    duration: timedelta
    idle_runners: int
    time_zone: ZoneInfo


def cron_problem(expression: str) -> str | None:
    """Why `expression` is not a five-field cron expression croniter can step, or None."""
    if len(expression.split()) != CRON_FIELDS:
        return "must be a cron expression of five fields (minute hour day month weekday)"
    try:
        valid = croniter.is_valid(expression)
    except CroniterBadCronError:
        valid = False
    return None if valid else "is not a valid cron expression"


def time_zone_problem(name: str) -> str | None:
    """Why `name` is not an IANA time zone known to zoneinfo, or None."""
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):  # OSError: a directory, too long
        return f"unknown time zone {name!r} (an IANA name such as Europe/Berlin or UTC)"
    return None


def last_opening(window: ScheduleWindow, now: datetime) -> datetime | None:
    """The latest moment (UTC) at or before `now` at which the window opened, or None
    when croniter finds none."""
    zone = window.time_zone
    local = now.astimezone(zone)
    wall = local.replace(tzinfo=None)
    if local.fold == 1:
        # In the repeated hour: wall times up to the same instant of the first pass
        # (one shift later on the wall clock) have already happened.
        shift = local.replace(fold=0).utcoffset() or timedelta(0)
        wall += shift - (local.utcoffset() or timedelta(0))
    # croniter's get_prev is strictly before its start; a second later includes `now`'s
    # own minute when now is exactly on it.
    steps = croniter(window.cron, wall + timedelta(seconds=1))
    for _ in range(_MAX_STEPS):
        opened_wall: datetime = steps.get_prev(datetime)
        # In UTC, so the duration is added in real time, not on the wall clock.
        opened = opened_wall.replace(tzinfo=zone, fold=0).astimezone(UTC)
        if opened <= now:
            return opened
    return None


def is_open(window: ScheduleWindow, now: datetime) -> bool:
    opened = last_opening(window, now)
    return opened is not None and now < opened + window.duration


def schedule_floor(windows: Iterable[ScheduleWindow], now: datetime) -> int:
    """The highest idle floor among the windows open at `now`; 0 when none is."""
    return max((w.idle_runners for w in windows if is_open(w, now)), default=0)
