"""Request bodies: read within a time limit, parsed as JSON objects, validated by models."""

from __future__ import annotations

import asyncio
import json
from typing import Any, TypeVar

from aiohttp import web
from pydantic import BaseModel, ValidationError

from controller.errors import ErrorCode, ServiceError
from controller.executions.streaming import BODY_READ_TIMEOUT_SECONDS

M = TypeVar("M", bound=BaseModel)


def invalid(message: str) -> ServiceError:
    return ServiceError(ErrorCode.INVALID_REQUEST, message)


async def read_json(request: web.Request) -> dict[str, Any]:
    """The request body as a JSON object; an empty body is an empty object. A body that
    takes longer than BODY_READ_TIMEOUT_SECONDS to arrive (a slow-loris client) is 408."""
    if request.content.is_eof():  # it came with the headers (most do): no wait, no timer
        return parse_json(await request.read())
    try:
        async with asyncio.timeout(BODY_READ_TIMEOUT_SECONDS):  # unlike wait_for, no task
            raw = await request.read()
    except TimeoutError:
        raise ServiceError(
            ErrorCode.REQUEST_TIMEOUT,
            f"the body did not arrive within {BODY_READ_TIMEOUT_SECONDS:g} s",
        ) from None
    return parse_json(raw)


def parse_json(raw: bytes) -> dict[str, Any]:
    """`raw` as a JSON object (400 otherwise, saying what is wrong and at which byte);
    an empty body is an empty object."""
    if not raw.strip():
        return {}
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise invalid(f"body is not valid JSON: not UTF-8 (byte {error.start})") from None
    try:
        body = _DECODER.decode(text)
    except json.JSONDecodeError as error:
        at = len(text[: error.pos].encode("utf-8", "surrogatepass"))
        words = _JSON_ERRORS.get(error.msg, error.msg[:1].lower() + error.msg[1:])
        raise invalid(f"body is not valid JSON: {words} at byte {at}") from None
    except _NotJSON as error:
        raise invalid(f"body is not valid JSON: {error}") from None
    except RecursionError:  # a few thousand "[" fit in the size limit
        raise invalid("body is not valid JSON: it nests deeper than this API reads") from None
    if not isinstance(body, dict):
        raise invalid("body must be a JSON object")
    return body


class _NotJSON(ValueError):
    """What Python's parser would take, and JSON does not have (or int() cannot read)."""


# Python's int() reads at most this many digits (sys.int_info.default_max_str_digits).
MAX_DIGITS = 4300


def _integer(text: str) -> int:
    if len(text.lstrip("-")) > MAX_DIGITS:
        raise _NotJSON(f"a number of more than {MAX_DIGITS} digits")
    return int(text)


def _constant(name: str) -> Any:
    raise _NotJSON(f"{name} is no JSON value")


_DECODER = json.JSONDecoder(parse_int=_integer, parse_constant=_constant)
# Python's words for what it expected, as the API says them.
_JSON_ERRORS = {
    "Expecting property name enclosed in double quotes": (
        "expecting a property name in double quotes"
    ),
    "Expecting ':' delimiter": "expecting ':'",
    "Expecting ',' delimiter": "expecting ','",
    "Expecting value": "expecting a value",
    "Unterminated string starting at": "unterminated string",
    "Invalid control character at": "a control character in a string",
    "Invalid \\escape": "invalid \\escape",
}


def validated(model: type[M], body: dict[str, Any]) -> M:
    """`body` validated by `model`; every problem is named in one 400 message."""
    try:
        return model.model_validate(body)
    except ValidationError as error:
        raise invalid(describe(error)) from None


async def read_body(request: web.Request, model: type[M]) -> M:
    """The body validated by `model`; every problem is named in one 400 message."""
    return validated(model, await read_json(request))


def describe(error: ValidationError) -> str:
    """One line: `field: problem; field: problem` (first problem per field)."""
    problems: dict[str, str] = {}
    for item in error.errors():
        loc = item["loc"]
        field = str(loc[0]) if loc else "body"
        message = "unknown field" if item["type"] == "extra_forbidden" else item["msg"]
        problems.setdefault(field, message)
    return "; ".join(f"{field}: {message}" for field, message in problems.items())
