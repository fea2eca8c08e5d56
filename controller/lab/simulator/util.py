"""Small helpers shared by the simulator: Go durations, timestamps, omitempty, errors."""

from __future__ import annotations

import re
import time
from typing import Any

JSON = dict[str, Any]

_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")
_UNIT_NS = {
    "ns": 1,
    "us": 1_000,
    "µs": 1_000,
    "μs": 1_000,
    "ms": 1_000_000,
    "s": 1_000_000_000,
    "m": 60_000_000_000,
    "h": 3_600_000_000_000,
}


def parse_go_duration(text: str) -> float:
    """Seconds for a Go `time.ParseDuration` string; ValueError like Go's parser."""
    s = text.strip()
    if not s:
        raise ValueError("empty duration")
    sign = 1.0
    if s[0] in "+-":
        sign = -1.0 if s[0] == "-" else 1.0
        s = s[1:]
    if s == "0":
        return 0.0
    pos = 0
    total_ns = 0.0
    while pos < len(s):
        m = _DURATION_PART.match(s, pos)
        if m is None:
            raise ValueError(f"invalid duration {text!r}")
        total_ns += float(m.group(1)) * _UNIT_NS[m.group(2)]
        pos = m.end()
    return sign * total_ns / 1e9


def format_go_duration(seconds: float) -> str:
    """Go's `time.Duration.String()`: "15s", "1m0s", "1h30m0s", "1.5s", "250ms"."""
    total_ns = round(seconds * 1e9)
    sign = "-" if total_ns < 0 else ""
    total_ns = abs(total_ns)
    if total_ns == 0:
        return "0s"
    if total_ns < 1_000_000_000:
        for unit, size in (("ms", 1_000_000), ("µs", 1_000), ("ns", 1)):
            if total_ns >= size:
                return sign + _with_fraction(total_ns, size) + unit
    hours, rest = divmod(total_ns, 3_600_000_000_000)
    minutes, rest = divmod(rest, 60_000_000_000)
    text = _with_fraction(rest, 1_000_000_000) + "s"
    if hours or minutes:
        text = f"{minutes}m{text}"
    if hours:
        text = f"{hours}h{text}"
    return sign + text


def _with_fraction(value: int, unit: int) -> str:
    whole, fraction = divmod(value, unit)
    digits = str(fraction).rjust(len(str(unit)) - 1, "0").rstrip("0")
    return f"{whole}.{digits}" if digits else str(whole)


class WallClock:
    """The time the simulator reports (SubmitTime, CreateTime, StartedAt, variables' times):
    real time, or real time sped up from an origin and moved forward, so `poolkeeper
    bench` can replay a day in minutes with a controller whose clock does the same. It is
    the process's: every simulator in the process reports the same time. Delays
    (`start_delay`, drain deadlines) stay in real seconds."""

    def __init__(self) -> None:
        self.speed = 1.0
        self.origin_ns = 0
        self.offset_ns = 0

    def now_ns(self) -> int:
        real = time.time_ns()
        return real + int((self.speed - 1.0) * (real - self.origin_ns)) + self.offset_ns

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("the clock only moves forward")
        self.offset_ns += int(seconds * 1e9)


WALL_CLOCK = WallClock()


def now_ns() -> int:
    return WALL_CLOCK.now_ns()


def _iso(ns: int, fraction: bool) -> str:
    text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ns // 10**9))
    return text + (f".{ns % 10**9:09d}Z" if fraction else "Z")


def iso_now() -> str:
    return _iso(now_ns(), fraction=True)


def iso_seconds() -> str:
    """Now in whole seconds, as Nomad's node times (drain metadata, node events) show."""
    return _iso(now_ns(), fraction=False)


def iso_after(seconds: float | None) -> str:
    return _iso(now_ns() + int((seconds or 0) * 1e9), fraction=False)


def _is_empty(value: Any) -> bool:
    # Go's omitempty: zero scalars, empty strings and empty/nil containers.
    if value is None or value is False:
        return True
    if isinstance(value, bool):
        return False
    if isinstance(value, int | float):
        return value == 0
    if isinstance(value, str | list | dict):
        return len(value) == 0
    return False


def omit_empty(obj: JSON, keep: frozenset[str] = frozenset()) -> JSON:
    """Top-level omitempty as go-msgpack applies it to Allocation and Evaluation."""
    return {k: v for k, v in obj.items() if k in keep or not _is_empty(v)}


class ApiError(Exception):
    """An error answered as Nomad does: text/plain body with a status code."""

    def __init__(self, status: int, message: str, index: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        # A read's index, for the errors Nomad answers with one (a blocking read of what
        # does not exist, such as a variable, can go on from it).
        self.index = index


def not_found(what: str = "resource") -> ApiError:
    return ApiError(404, f"{what} not found")


def bad_request(message: str) -> ApiError:
    return ApiError(400, message)
