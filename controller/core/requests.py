"""Abandoned request records.

A claim with a `requestId` writes `poolkeeper/requests/<requestId>` first and the claim
second. A claimer that dies between the two, or whose clean-up failed, leaves a record no
claim carries. Request records live as long as their claim or its tombstone, so a record
that no claim variable names, and that is older than any claim could still be in flight,
is abandoned.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

from controller.core.claims import ClaimRecord
from controller.core.paths import REQUESTS_PREFIX
from controller.core.times import to_ns

# Twice as long as any claim can take: the record is written before a wait of at most
# 30 s (waitSeconds), and the claim itself takes milliseconds.
REQUEST_GRACE = timedelta(seconds=60)


def abandoned_requests(
    metas: Iterable[Mapping[str, Any]],
    claims: Iterable[ClaimRecord],
    now: datetime,
    grace: timedelta = REQUEST_GRACE,
) -> list[Mapping[str, Any]]:
    """Record metadata (from a variable list) that no claim names and that is old enough."""
    named = {claim.request_id for claim in claims if claim.request_id}
    horizon = to_ns(now - grace)
    return [
        meta
        for meta in metas
        if str(meta.get("Path", "")).removeprefix(REQUESTS_PREFIX) not in named
        and int(meta.get("ModifyTime", 0)) <= horizon
    ]
