"""Reading fields of Nomad's JSON objects, which omit empty values in some payloads."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def str_field(obj: Mapping[str, Any], key: str, default: str = "") -> str:
    value = obj.get(key)
    return value if isinstance(value, str) else default


def int_field(obj: Mapping[str, Any], key: str) -> int:
    value = obj.get(key)
    # bool is an int subclass; a boolean is never a valid count or timestamp.
    return value if isinstance(value, int) and not isinstance(value, bool) else 0
