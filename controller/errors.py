"""Errors every part of poolkeeper shares, and the exit codes of its commands.

Exit codes: 0 success, 2 usage or configuration error (one line naming the bad value),
1 anything else.
"""

from __future__ import annotations

from enum import StrEnum

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2


class UsageError(Exception):
    """A bad command-line value or configuration; reported in one line, exit 2."""


class ErrorCode(StrEnum):
    """The `code` of an API error body, each with its HTTP status.

    A member is declared with its status, so a new code cannot lack one.
    """

    status: int

    def __new__(cls, value: str, status: int) -> ErrorCode:
        member = str.__new__(cls, value)
        member._value_ = value
        member.status = status
        return member

    INVALID_REQUEST = ("InvalidRequest", 400)
    UNAUTHORIZED = ("Unauthorized", 401)
    FORBIDDEN = ("Forbidden", 403)
    POOL_NOT_FOUND = ("PoolNotFound", 404)
    RUNNER_NOT_FOUND = ("RunnerNotFound", 404)
    EXECUTION_NOT_FOUND = ("ExecutionNotFound", 404)
    FILE_NOT_FOUND = ("FileNotFound", 404)
    NOT_FOUND = ("NotFound", 404)
    METHOD_NOT_ALLOWED = ("MethodNotAllowed", 405)
    REQUEST_TIMEOUT = ("RequestTimeout", 408)
    REQUEST_ID_CONFLICT = ("RequestIdConflict", 409)
    PREFIX_CONFLICT = ("PrefixConflict", 409)
    TOO_MANY_EXECUTIONS = ("TooManyExecutions", 409)
    RUNNER_GONE = ("RunnerGone", 410)
    PAYLOAD_TOO_LARGE = ("PayloadTooLarge", 413)
    INTERNAL_ERROR = ("InternalError", 500)
    EXEC_FAILED = ("ExecFailed", 502)
    POOL_EMPTY = ("PoolEmpty", 503)
    NOMAD_UNAVAILABLE = ("NomadUnavailable", 503)


class ServiceError(Exception):
    """A request that cannot be served; the API answers it as an error body with the
    code's status. `reason` is the extra detail some codes carry (RunnerGone)."""

    def __init__(self, code: ErrorCode, message: str, *, reason: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.reason = reason
