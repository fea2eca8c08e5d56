"""Poseidon's wire: its request bodies as Go decodes them, its answers as Go encodes them,
and its error bodies (`{"message"}` for client errors, `{"message", "errorCode"}` for
server errors)."""

from __future__ import annotations

import asyncio
from enum import StrEnum
from typing import Any, Final

from aiohttp import web

from controller.core.gojson import (
    JSON,
    GoJSONError,
    GoMap,
    GoSlice,
    GoStruct,
    decode_struct,
    go_marshal,
)

# Seconds a request body may take to arrive after its headers (as the /v1 API's).
BODY_READ_TIMEOUT_SECONDS: Final = 30.0

ENVIRONMENT_REQUEST: Final = GoStruct(
    "dto.ExecutionEnvironmentRequest",
    {
        "prewarmingPoolSize": "uint",
        "cpuLimit": "uint",
        "memoryLimit": "uint",
        "image": "string",
        "networkAccess": "bool",
        "exposedPorts": GoSlice("uint16"),
    },
)
RUNNER_REQUEST: Final = GoStruct(
    "dto.RunnerRequest", {"executionEnvironmentId": "int", "inactivityTimeout": "int"}
)
UPDATE_FILE_SYSTEM_REQUEST: Final = GoStruct(
    "dto.UpdateFileSystemRequest",
    {
        "delete": GoSlice("string"),
        "copy": GoSlice(GoStruct("dto.File", {"path": "string", "content": "[]uint8"})),
    },
)
EXECUTION_REQUEST: Final = GoStruct(
    "dto.ExecutionRequest",
    {
        "command": "string",
        "timeLimit": "int",
        "privilegedExecution": "bool",
        "environment": GoMap("string"),
    },
)


class ErrorCode(StrEnum):
    """Poseidon's `errorCode` values (of 500 and 503 answers)."""

    NOMAD_UNREACHABLE = "NOMAD_UNREACHABLE"
    NOMAD_OVERLOAD = "NOMAD_OVERLOAD"
    NOMAD_INTERNAL_SERVER_ERROR = "NOMAD_INTERNAL_SERVER_ERROR"
    PREWARMING_POOL_DEPLETING = "PREWARMING_POOL_DEPLETING"
    UNKNOWN = "UNKNOWN"


class PoseidonError(Exception):
    """An answer other than success: `message` None is an empty body (Poseidon's 401 and
    some 404s); `code` is set for server errors."""

    def __init__(self, status: int, message: str | None, code: ErrorCode | None = None) -> None:
        super().__init__(message or str(status))
        self.status = status
        self.message = message
        self.code = code

    def response(self) -> web.Response:
        if self.message is None:
            return web.Response(status=self.status)
        body: JSON = {"message": self.message}
        if self.code is not None:
            body["errorCode"] = self.code.value
        return answer(body, self.status)


def bad_request(message: str) -> PoseidonError:
    return PoseidonError(400, message)


def answer(body: Any, status: int = 200) -> web.Response:
    """A JSON answer as Poseidon's json.Marshal writes it."""
    return web.Response(
        status=status, body=go_marshal(body).encode(), content_type="application/json"
    )


async def read_struct(request: web.Request, struct: GoStruct) -> JSON:
    """The body decoded into `struct` as Poseidon's json.Decoder does: unknown fields
    ignored, missing ones zero; a bad body is 400 with Go's message."""
    try:
        async with asyncio.timeout(BODY_READ_TIMEOUT_SECONDS):
            raw = await request.read()
    except TimeoutError:
        raise bad_request("the body did not arrive in time") from None
    except web.HTTPRequestEntityTooLarge:
        raise PoseidonError(413, "the request body is too large") from None
    return decoded(raw, struct)


def decoded(raw: bytes, struct: GoStruct) -> JSON:
    """A body already read, decoded as `read_struct` decodes it."""
    text = raw.decode("utf-8", errors="replace")
    try:
        return decode_struct(text, struct)
    except EOFError:
        raise bad_request("EOF") from None
    except GoJSONError as error:
        raise bad_request(error.message) from None
