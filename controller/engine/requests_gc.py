"""Abandoned request records (CONTRACT.md §5).

A claim with a `requestId` writes `poolkeeper/requests/<requestId>` first and the claim
second. A claimer that dies between the two, or whose clean-up failed, leaves a record no
claim carries. Request records live as long as their claim or its tombstone, so a record
that no claim variable names, and that is older than any claim could still be in flight,
is deleted (check-and-set on the ModifyIndex listed, so a record rewritten meanwhile
stays).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

from controller.core.claims import REQUESTS_PREFIX, ClaimRecord
from controller.core.times import to_ns
from controller.nomad.client import NomadClient
from controller.nomad.errors import NomadConflict

log = logging.getLogger(__name__)

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


async def collect_abandoned_requests(
    client: NomadClient, namespace: str, claims: Iterable[ClaimRecord], now: datetime
) -> int:
    """Delete the namespace's abandoned request records; returns how many went."""
    metas = await client.list_variables(REQUESTS_PREFIX, namespace)
    deleted = 0
    for meta in abandoned_requests(metas, claims, now):
        try:
            await client.delete_variable(meta["Path"], namespace, cas=int(meta["ModifyIndex"]))
        except NomadConflict:
            continue  # written again meanwhile: a claim in flight owns it
        log.info("deleted abandoned request record %s in %s", meta["Path"], namespace)
        deleted += 1
    return deleted
