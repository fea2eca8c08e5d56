"""Claim outcomes: each mapped once to the poolkeeper API's answer, Poseidon's and the
metric's label, and the labels bounded whatever clients ask for."""

from __future__ import annotations

import pytest

from controller.claims.outcomes import UNKNOWN_POOL, ClaimOutcome, pool_label
from controller.errors import ErrorCode, ServiceError
from controller.poseidon.context import from_service_error

# Every error the claim path refuses a claim with (claims/service.py, taking.py,
# requests.py, runners.py).
CLAIM_ERRORS = (
    ErrorCode.POOL_EMPTY,
    ErrorCode.POOL_NOT_FOUND,
    ErrorCode.PREFIX_CONFLICT,
    ErrorCode.INVALID_REQUEST,
    ErrorCode.REQUEST_ID_CONFLICT,
    ErrorCode.RUNNER_GONE,
    ErrorCode.NOMAD_UNAVAILABLE,
)


@pytest.mark.parametrize("code", CLAIM_ERRORS)
def test_every_refusal_has_its_outcome_and_the_same_answer_everywhere(code: ErrorCode) -> None:
    error = ServiceError(code, "why")
    outcome = ClaimOutcome.of(error)
    assert outcome is not ClaimOutcome.OTHER and outcome.answers.code is code
    poseidon = from_service_error(error)
    assert poseidon.status == outcome.answers.poseidon_status
    assert (poseidon.code.value if poseidon.code else None) == outcome.answers.poseidon_code


def test_the_answers_are_those_of_the_contract() -> None:
    empty = from_service_error(ServiceError(ErrorCode.POOL_EMPTY, "no pool has one"))
    assert (empty.status, empty.message, empty.code and empty.code.value) == (
        500,
        "no runners available for this execution environment",
        "NOMAD_OVERLOAD",
    )
    unknown = from_service_error(ServiceError(ErrorCode.POOL_NOT_FOUND, "pool x"))
    assert (unknown.status, unknown.message) == (
        404,
        "nomad wrapped: execution environment not found",
    )


def test_labels_are_bounded() -> None:
    results = {outcome.answers.result for outcome in ClaimOutcome}
    assert results == {"claimed", "repeated", "empty", "rejected", "error"}
    assert pool_label("default/py", known=True) == "default/py"
    assert pool_label("default/made-up-123", known=False) == UNKNOWN_POOL
    assert "/" not in UNKNOWN_POOL  # never a pool's key


def test_an_error_no_claim_ends_in_is_rejected_not_a_crash() -> None:
    outcome = ClaimOutcome.of(ServiceError(ErrorCode.PAYLOAD_TOO_LARGE, "big"))
    assert outcome is ClaimOutcome.OTHER and outcome.answers.result == "rejected"
