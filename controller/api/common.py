"""Shared pieces of the API: error bodies `{"error": {"code", "message"}}` (CONTRACT.md §6)
and JSON request bodies."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import web

# Seconds a request body may take to arrive after its headers.
BODY_READ_TIMEOUT_SECONDS = 30.0


class ApiError(Exception):
    """An error answered to the client; never a stack trace."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        extra: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.extra = extra or {}
        self.headers = headers or {}

    def response(self) -> web.Response:
        body: dict[str, Any] = {"code": self.code, "message": self.message, **self.extra}
        return web.json_response({"error": body}, status=self.status, headers=self.headers)


def invalid_request(message: str) -> ApiError:
    return ApiError(400, "InvalidRequest", message)


async def read_json(request: web.Request) -> dict[str, Any]:
    """The request body as a JSON object; an empty body is an empty object. A body that
    takes longer than BODY_READ_TIMEOUT_SECONDS to arrive (a slow-loris client) is 408."""
    try:
        async with asyncio.timeout(BODY_READ_TIMEOUT_SECONDS):  # unlike wait_for, no task
            raw = await request.read()
    except TimeoutError:
        raise ApiError(
            408, "RequestTimeout", f"the body did not arrive within {BODY_READ_TIMEOUT_SECONDS:g} s"
        ) from None
    if not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError) as error:
        # RecursionError: a few thousand "[" fit in the size limit and nest too deep.
        raise invalid_request(f"body is not valid JSON: {type(error).__name__}") from None
    if not isinstance(body, dict):
        raise invalid_request("body must be a JSON object")
    return body
