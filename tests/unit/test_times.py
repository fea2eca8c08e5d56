"""Times as poolkeeper writes them into Nomad and its answers: RFC 3339 in UTC with a "Z",
a fraction only when there is one, read back as the same moment."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controller.core.times import format_time, parse_time

RFC3339_UTC = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{0,5}[1-9])?Z$")

# Zones as a client or a clock may hand them over: UTC itself, fixed offsets (whole
# minutes, as RFC 3339 writes them), and zones that are UTC under another name.
zones = st.one_of(
    st.just(UTC),
    st.integers(-(24 * 60 - 1), 24 * 60 - 1).map(lambda m: timezone(timedelta(minutes=m))),
    st.just(timezone(timedelta(0), "Z")),
)
moments = st.builds(
    lambda utc, zone: utc.astimezone(zone),
    st.datetimes(min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30)).map(
        lambda naive: naive.replace(tzinfo=UTC)
    ),
    zones,
)


def written_by_strftime(moment: datetime) -> str:
    """How times were written before (strftime), for the years where glibc's %Y gives
    four digits: what format_time must still write, character for character."""
    utc = moment.astimezone(UTC)
    text = utc.strftime("%Y-%m-%dT%H:%M:%S")
    if utc.microsecond:
        text += f".{utc.microsecond:06d}".rstrip("0")
    return text + "Z"


@given(moments)
def test_every_aware_time_is_written_in_utc_and_read_back_as_the_same_moment(
    moment: datetime,
) -> None:
    text = format_time(moment)
    assert RFC3339_UTC.match(text), text
    assert parse_time(text) == moment
    if moment.astimezone(UTC).year >= 1000:
        assert text == written_by_strftime(moment)


@pytest.mark.parametrize(
    ("moment", "text"),
    [
        (datetime(2026, 12, 7, 12, 0, 0, tzinfo=UTC), "2026-12-07T12:00:00Z"),
        (datetime(2026, 12, 7, 12, 0, 0, 120000, tzinfo=UTC), "2026-12-07T12:00:00.12Z"),
        (datetime(2026, 12, 7, 12, 0, 0, 1, tzinfo=UTC), "2026-12-07T12:00:00.000001Z"),
        (datetime(2026, 12, 7, 12, 0, 0, 100000, tzinfo=UTC), "2026-12-07T12:00:00.1Z"),
        # Another zone: the same moment, written in UTC (across midnight and a year).
        (
            datetime(2027, 1, 1, 1, 30, 0, 500000, tzinfo=timezone(timedelta(hours=2))),
            "2026-12-31T23:30:00.5Z",
        ),
        (datetime(2026, 3, 1, 0, 0, tzinfo=timezone(timedelta(hours=-5))), "2026-03-01T05:00:00Z"),
        # Years before 1000 keep four digits (strftime wrote "999-...", which no reader
        # of RFC 3339 takes).
        (datetime(999, 1, 2, 3, 4, 5, tzinfo=UTC), "0999-01-02T03:04:05Z"),
    ],
)
def test_examples(moment: datetime, text: str) -> None:
    assert format_time(moment) == text


def test_a_naive_time_is_refused() -> None:
    with pytest.raises(ValueError, match="naive"):
        format_time(datetime(2026, 12, 7, 12, 0))
