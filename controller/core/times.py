"""Times as poolkeeper writes them into Nomad: RFC 3339 in UTC with a "Z"."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

_RFC3339 = re.compile(
    r"^(\d{4}-\d{2}-\d{2})[Tt](\d{2}:\d{2}:\d{2})(?:\.(\d+))?([Zz]|[+-]\d{2}:\d{2})$"
)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
NS_PER_SECOND = 1_000_000_000


def utcnow() -> datetime:
    """The default clock; the pure code takes `now` as an argument instead."""
    return datetime.now(UTC)


def format_time(dt: datetime) -> str:
    """RFC 3339 in UTC with a "Z"; fractions only when there are any. (Every claim formats
    four times: isoformat is twice as fast as strftime.)"""
    if dt.tzinfo is not UTC:
        if dt.tzinfo is None:
            raise ValueError("naive datetime: claim times must be timezone-aware")
        dt = dt.astimezone(UTC)
    text = dt.isoformat()[:-6]  # without its "+00:00"
    return (text.rstrip("0") if dt.microsecond else text) + "Z"


def parse_time(text: str) -> datetime:
    """Parse RFC 3339 (offset required, any number of fraction digits) into aware UTC."""
    match = _RFC3339.match(text.strip())
    if match is None:
        raise ValueError(f"not an RFC 3339 time: {text!r}")
    day, clock, fraction, offset = match.groups()
    # datetime takes at most microseconds; Go writes nanoseconds, so cut the rest off.
    micro = (fraction or "")[:6].ljust(6, "0")
    zone = "+00:00" if offset in ("Z", "z") else offset
    return datetime.fromisoformat(f"{day}T{clock}.{micro}{zone}").astimezone(UTC)


def to_ns(moment: datetime) -> int:
    """Unix nanoseconds of an aware datetime (Nomad's time unit)."""
    return (moment - _EPOCH) // timedelta(microseconds=1) * 1000
