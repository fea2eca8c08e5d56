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
    """`raw` as a JSON object (400 otherwise); an empty body is an empty object."""
    if not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError) as error:
        # RecursionError: a few thousand "[" fit in the size limit and nest too deep.
        raise invalid(f"body is not valid JSON: {type(error).__name__}") from None
    if not isinstance(body, dict):
        raise invalid("body must be a JSON object")
    return body


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
