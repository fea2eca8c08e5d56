"""Schedule windows: when a cron window is open, in its time zone, across midnight and DST."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from controller.core.schedule import (
    ScheduleWindow,
    cron_problem,
    is_open,
    last_opening,
    schedule_floor,
    time_zone_problem,
)

BERLIN = ZoneInfo("Europe/Berlin")
NEW_YORK = ZoneInfo("America/New_York")


def window(cron: str, minutes: int, zone: ZoneInfo = BERLIN, idle: int = 150) -> ScheduleWindow:
    return ScheduleWindow(cron, timedelta(minutes=minutes), idle, zone)


def utc(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


# (cron, minutes, zone, now in UTC, open?)
CASES = [
    # 8:45 Berlin on weekdays is 7:45 UTC in winter (CET)...
    ("45 8 * * 1-5", 90, BERLIN, "2026-01-14T07:44:59", False),
    ("45 8 * * 1-5", 90, BERLIN, "2026-01-14T07:45:00", True),  # opens exactly then
    ("45 8 * * 1-5", 90, BERLIN, "2026-01-14T09:14:59", True),
    ("45 8 * * 1-5", 90, BERLIN, "2026-01-14T09:15:00", False),  # closes exactly then
    # ... and 6:45 UTC in summer (CEST)
    ("45 8 * * 1-5", 90, BERLIN, "2026-07-15T06:45:00", True),
    ("45 8 * * 1-5", 90, BERLIN, "2026-07-15T07:45:00", True),
    ("45 8 * * 1-5", 90, BERLIN, "2026-07-15T08:15:00", False),
    # weekdays only: Saturday 2026-01-17 stays closed
    ("45 8 * * 1-5", 90, BERLIN, "2026-01-17T08:00:00", False),
    # across midnight: Friday 23:00 for two hours is open on Saturday at 00:30 (local)
    ("0 23 * * 5", 120, BERLIN, "2026-01-16T23:30:00", True),  # Sat 00:30 CET
    ("0 23 * * 5", 120, BERLIN, "2026-01-17T00:00:00", False),  # Sat 01:00 CET: closed
    ("0 23 * * 5", 120, BERLIN, "2026-01-15T23:30:00", False),  # Fri 00:30: Thu did not open
    # a window longer than a day, opened on Mondays, is open on Tuesday
    ("0 6 * * 1", 2 * 24 * 60, ZoneInfo("UTC"), "2026-01-13T12:00:00", True),
    ("0 6 * * 1", 2 * 24 * 60, ZoneInfo("UTC"), "2026-01-14T06:00:00", False),
    # spring forward in Berlin (2026-03-29, 02:00 CET -> 03:00 CEST): 02:30 does not
    # exist; it opens as if the clock had not jumped yet, at 03:30 CEST (01:30 UTC)
    ("30 2 * * *", 60, BERLIN, "2026-03-29T01:10:00", False),  # 03:10 CEST
    ("30 2 * * *", 60, BERLIN, "2026-03-29T01:30:00", True),  # 03:30 CEST
    ("30 2 * * *", 60, BERLIN, "2026-03-29T02:29:59", True),
    ("30 2 * * *", 60, BERLIN, "2026-03-29T02:30:00", False),
    # the duration is real time: 01:30 CET for 90 minutes ends at 04:00 CEST (02:00 UTC),
    # not at 03:00 on the wall clock
    ("30 1 * * *", 90, BERLIN, "2026-03-29T01:59:00", True),  # 03:59 CEST
    ("30 1 * * *", 90, BERLIN, "2026-03-29T02:00:00", False),
    # fall back (2026-10-25, 03:00 CEST -> 02:00 CET): 02:30 happens twice; the window
    # opens the first time (00:30 UTC) only
    ("30 2 * * *", 30, BERLIN, "2026-10-25T00:30:00", True),  # 02:30 CEST
    ("30 2 * * *", 30, BERLIN, "2026-10-25T00:59:59", True),
    ("30 2 * * *", 30, BERLIN, "2026-10-25T01:30:00", False),  # 02:30 CET, second time
    # ... and a long window opened the first time is still open in the repeated hour
    ("30 2 * * *", 90, BERLIN, "2026-10-25T01:10:00", True),  # 02:10 CET (second pass)
    ("45 1 * * *", 30, BERLIN, "2026-10-25T00:10:00", True),  # 02:10 CEST: 01:45 opened
    # New York's change (2026-03-08, 02:00 EST -> 03:00 EDT), another zone and date
    ("0 9 * * *", 60, NEW_YORK, "2026-03-07T14:30:00", True),  # 09:30 EST
    ("0 9 * * *", 60, NEW_YORK, "2026-03-09T13:30:00", True),  # 09:30 EDT
    ("0 9 * * *", 60, NEW_YORK, "2026-03-09T14:30:00", False),  # 10:30 EDT
]


@pytest.mark.parametrize(("cron", "minutes", "zone", "now", "expected"), CASES)
def test_window_is_open(cron: str, minutes: int, zone: ZoneInfo, now: str, expected: bool) -> None:
    assert is_open(window(cron, minutes, zone), utc(now)) is expected


def test_last_opening_is_the_latest_at_or_before_now() -> None:
    weekday = window("45 8 * * 1-5", 90)
    assert last_opening(weekday, utc("2026-01-19T07:00:00")) == utc("2026-01-16T07:45:00")
    assert last_opening(weekday, utc("2026-01-19T07:45:00")) == utc("2026-01-19T07:45:00")


def test_the_floor_is_the_highest_open_window() -> None:
    windows = [
        window("0 8 * * *", 120, idle=40),
        window("30 8 * * *", 30, idle=90),
        window("0 20 * * *", 60, idle=500),
    ]
    assert schedule_floor(windows, utc("2026-01-14T06:59:00")) == 0  # 07:59 CET
    assert schedule_floor(windows, utc("2026-01-14T07:10:00")) == 40
    assert schedule_floor(windows, utc("2026-01-14T07:40:00")) == 90
    assert schedule_floor(windows, utc("2026-01-14T08:00:00")) == 40  # 09:00: one left
    assert schedule_floor([], utc("2026-01-14T08:00:00")) == 0


@pytest.mark.parametrize(
    ("expression", "problem"),
    [
        ("45 8 * * 1-5", None),
        ("*/5 * * * *", None),
        ("0 8 * * MON-FRI", None),
        ("45 8 * *", "five fields"),
        ("0 45 8 * * 1-5", "five fields"),
        ("@daily", "five fields"),
        ("", "five fields"),
        ("61 8 * * *", "not a valid"),
        ("45 25 * * *", "not a valid"),
        ("a b c d e", "not a valid"),
    ],
)
def test_cron_problems(expression: str, problem: str | None) -> None:
    found = cron_problem(expression)
    assert (found is None) if problem is None else (found is not None and problem in found)


@pytest.mark.parametrize(
    ("name", "valid"),
    [
        ("UTC", True),
        ("Europe/Berlin", True),
        ("Mars/Base", False),
        ("", False),
        ("../x", False),
        # zoneinfo opens a file of that name: a directory of the database, or a name too
        # long for the file system, is refused too, not an error of its own.
        ("America", False),
        ("Etc", False),
        ("a" * 256, False),
        ("Europe/" + "b" * 249, False),
    ],
)
def test_time_zone_problems(name: str, valid: bool) -> None:
    assert (time_zone_problem(name) is None) is valid
