"""The few ways a Nomad call can fail, as the engine needs to tell them apart.

Messages never contain the ACL token: they are built from the method, the request path
(no query string, no headers) and the response body, and scrubbed of the token anyway.
"""

from __future__ import annotations

from typing import Any


class NomadError(Exception):
    """A Nomad call failed. `status` is the HTTP status, None when no response came."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.index: int | None = None  # the answer's X-Nomad-Index, when it had one
        self.body = ""  # the start of Nomad's answer, when it gave one


class NomadUnavailable(NomadError):
    """Nomad could not answer: connection error, timeout, no leader, other 5xx.

    `maybe_applied` is False only when the request provably had no effect (the
    connection was never made, or Nomad refused it for lack of a leader); only then may a
    non-idempotent write be sent again.
    """

    def __init__(
        self, message: str, *, status: int | None = None, maybe_applied: bool = True
    ) -> None:
        super().__init__(message, status=status)
        self.maybe_applied = maybe_applied


class NomadConflict(NomadError):
    """A check-and-set lost.

    For a variable (409) `current` is the variable Nomad holds now (ModifyIndex 0 when it
    does not exist); for a job registration with an enforced index (500 "Enforcing job
    modify index ...") Nomad returns no object and `current` is empty.
    """

    def __init__(
        self, message: str, *, status: int | None = None, current: dict[str, Any] | None = None
    ) -> None:
        super().__init__(message, status=status)
        self.current: dict[str, Any] = current if current is not None else {}


class NomadNotFound(NomadError):
    """404."""


class NomadPermissionDenied(NomadError):
    """403: the token is unknown or lacks a capability."""


class NomadBadRequest(NomadError):
    """400: Nomad rejected the request as malformed."""
