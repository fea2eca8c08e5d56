"""How a claim request ends, typed, and in one place what each outcome is to everyone who
shows it: the poolkeeper API's answer (an error code carries its HTTP status), the
Poseidon API's (its status and `errorCode`), and the `result` label of
`poolkeeper_claims_total`, whose `pool` label is a pool this process knows or UNKNOWN_POOL
(a token holder asking for made-up pools adds no series).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Final

from controller.errors import ErrorCode, ServiceError

# The `pool` label of claims for pools this process does not know (a pool key always
# holds a `/`, this never).
UNKNOWN_POOL: Final = "(unknown)"


@dataclass(frozen=True)
class Answers:
    result: str  # the metric's `result` label
    code: ErrorCode | None  # the poolkeeper API's error (None: 201, or 200 when repeated)
    poseidon_status: int
    poseidon_code: str | None = None  # Poseidon's errorCode, for its 500s


class ClaimOutcome(Enum):
    CLAIMED = Answers("claimed", None, 200)
    REPEATED = Answers("repeated", None, 200)  # a requestId answered again
    EMPTY = Answers("empty", ErrorCode.POOL_EMPTY, 500, "NOMAD_OVERLOAD")
    UNKNOWN_POOL = Answers("rejected", ErrorCode.POOL_NOT_FOUND, 404)
    PREFIX_CONFLICT = Answers("rejected", ErrorCode.PREFIX_CONFLICT, 500, "UNKNOWN")
    INVALID = Answers("rejected", ErrorCode.INVALID_REQUEST, 400)
    REQUEST_ID_CONFLICT = Answers("rejected", ErrorCode.REQUEST_ID_CONFLICT, 500, "UNKNOWN")
    RUNNER_GONE = Answers("rejected", ErrorCode.RUNNER_GONE, 410)
    UNAVAILABLE = Answers("rejected", ErrorCode.NOMAD_UNAVAILABLE, 500, "NOMAD_UNREACHABLE")
    # A Nomad failure the claim did not expect (answered as NomadUnavailable).
    NOMAD_ERROR = Answers("error", ErrorCode.NOMAD_UNAVAILABLE, 500, "NOMAD_UNREACHABLE")
    OTHER = Answers("rejected", None, 500, "UNKNOWN")  # an error no claim is meant to end in

    @property
    def answers(self) -> Answers:
        answers: Answers = self.value
        return answers

    @classmethod
    def for_code(cls, code: ErrorCode) -> ClaimOutcome | None:
        """The outcome a claim refused with this error code has (None: no claim is)."""
        return _BY_CODE.get(code)

    @classmethod
    def of(cls, error: ServiceError) -> ClaimOutcome:
        """The outcome of a claim the claim path refused with `error`."""
        return _BY_CODE.get(error.code, cls.OTHER)


# NOMAD_ERROR shares its code with UNAVAILABLE: it is the claim service's own verdict.
_BY_CODE: Final = {
    outcome.answers.code: outcome
    for outcome in ClaimOutcome
    if outcome.answers.code is not None and outcome is not ClaimOutcome.NOMAD_ERROR
}


def pool_label(key: str, known: bool) -> str:
    return key if known else UNKNOWN_POOL
