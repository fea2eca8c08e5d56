from datetime import timedelta

from controller.core.claims import ClaimRecord, ClaimState
from controller.core.requests import REQUEST_GRACE, abandoned_requests
from controller.core.times import to_ns
from tests.support.builders import NOW


def meta(request_id: str, age: timedelta) -> dict[str, object]:
    return {
        "Path": f"poolkeeper/requests/{request_id}",
        "ModifyIndex": 7,
        "ModifyTime": to_ns(NOW - age),
    }


def claim(request_id: str, state: ClaimState = ClaimState.CLAIMED) -> ClaimRecord:
    return ClaimRecord.new(
        runner_id="py-0123456789ab",
        namespace="default",
        pool="default/py",
        allocation_id="a",
        now=NOW,
        inactivity_timeout_seconds=60,
        request_id=request_id,
    ).with_state(state)


def test_only_old_records_no_claim_names_are_abandoned():
    old = REQUEST_GRACE + timedelta(seconds=1)
    metas = [
        meta("live", old),  # its claim is live
        meta("tomb", old),  # its claim is a tombstone: kept as long as the tombstone
        meta("young", timedelta(seconds=5)),  # a claim may still be in flight
        meta("lost", old),  # the claimer died between the record and the claim
        meta("edge", REQUEST_GRACE),  # exactly at the grace: abandoned
    ]
    claims = [claim("live"), claim("tomb", ClaimState.RELEASED)]
    gone = [m["Path"] for m in abandoned_requests(metas, claims, NOW)]
    assert gone == ["poolkeeper/requests/lost", "poolkeeper/requests/edge"]
