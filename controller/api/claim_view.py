"""A claim as the API shows it (the `Claim` body of api/models.py)."""

from __future__ import annotations

from typing import Any

from controller.claims.service import Claimed
from controller.core.claims import ClaimRecord
from controller.core.times import format_time
from controller.directory.view import PoolDirectory


def claim_view(record: ClaimRecord, directory: PoolDirectory) -> dict[str, Any]:
    """The API's claim object; its node as last seen says whether it drains."""
    node = directory.node_named(record.node_name) if record.node_name else None
    draining = node is not None and node.draining
    deadline = node.drain_deadline if node is not None and draining else None
    return {
        "runnerId": record.runner_id,
        "pool": record.pool,
        "allocationId": record.allocation_id,
        "nodeName": record.node_name,
        "claimedAt": format_time(record.claimed_at),
        "expiresAt": format_time(record.expires_at),
        "inactivityTimeoutSeconds": record.inactivity_timeout_seconds,
        "requestId": record.request_id,
        "ports": {},
        "nodeDraining": draining,
        "drainDeadline": format_time(deadline) if deadline is not None else None,
    }


def claim_answer(claimed: Claimed, directory: PoolDirectory, batch: bool) -> dict[str, Any]:
    """One claim, or a batch's `{"claims": [...]}`."""
    views = [claim_view(record, directory) for record in claimed.records]
    return {"claims": views} if batch else views[0]
