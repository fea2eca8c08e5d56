"""Request bodies of the /v1 API: what a body that is no JSON object is told, in words a
client reads (never a Python exception's name)."""

from __future__ import annotations

import pytest

from controller.api.bodies import parse_json
from controller.errors import ErrorCode, ServiceError

PYTHON_NAMES = ("Error", "Exception", "sys.", "unicode string")


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"{", "body is not valid JSON: expecting a property name in double quotes at byte 1"),
        (
            b'{"a": 1,}',
            "body is not valid JSON: expecting a property name in double quotes at byte 8",
        ),
        (b'{"a" 1}', "body is not valid JSON: expecting ':' at byte 5"),
        (b"[1 2]", "body is not valid JSON: expecting ',' at byte 3"),
        (b'{"a": tru}', "body is not valid JSON: expecting a value at byte 6"),
        (b'{"a": 1} x', "body is not valid JSON: extra data at byte 9"),
        (b'{"a": "\\q"}', "body is not valid JSON: invalid \\escape at byte 7"),
        (b'{"a": "b', "body is not valid JSON: unterminated string at byte 6"),
        (b"\xff\xfe{}", "body is not valid JSON: not UTF-8 (byte 0)"),
        (b"[" * 5_000 + b"]" * 5_000, "body is not valid JSON: it nests deeper than"),
        (
            b'{"a": 1' + b"0" * 4_300 + b"}",
            "body is not valid JSON: a number of more than 4300 digits",
        ),
        (b"[1]", "body must be a JSON object"),
    ],
)
def test_a_body_that_is_no_json_object_is_400_in_plain_words(raw: bytes, message: str) -> None:
    with pytest.raises(ServiceError) as refused:
        parse_json(raw)
    assert refused.value.code is ErrorCode.INVALID_REQUEST
    assert refused.value.message.startswith(message), refused.value.message
    assert not any(name in refused.value.message for name in PYTHON_NAMES)


def test_an_empty_body_is_an_empty_object() -> None:
    assert parse_json(b" \n") == {}
