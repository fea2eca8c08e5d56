"""Readiness: ready when every pool was read and, for a reconciling process, every pool
is reconciled by a live process (this one or a lease holder elsewhere)."""

from __future__ import annotations

import pytest

from controller.core.leases import LeaseStanding, LeaseState
from controller.core.readiness import Readiness, assess

LEASES = {
    "default/mine": LeaseState(LeaseStanding.HELD, "host/1", "s"),
    "default/theirs": LeaseState(LeaseStanding.ELSEWHERE, "other/7", "s"),
    "default/free": LeaseState(LeaseStanding.FREE),
    "default/stale": LeaseState(LeaseStanding.STALE, "host/1", "s"),
}


@pytest.mark.parametrize(
    ("pools", "ready"),
    [
        (["default/mine"], True),
        # Every lease held by another live process: still ready, to serve claims.
        (["default/theirs"], True),
        (["default/mine", "default/theirs"], True),
        # Nobody holds it, or only this identity's process before a restart: nobody
        # reconciles the pool.
        (["default/mine", "default/free"], False),
        (["default/stale"], False),
    ],
)
def test_a_reconciler_is_ready_while_a_live_process_reconciles_each_pool(
    pools: list[str], ready: bool
) -> None:
    readiness = assess([], pools, reconciler=True, lease=LEASES.__getitem__)
    assert readiness.ready is ready
    body = readiness.to_dict()
    assert body["status"] == ("ready" if ready else "unready")
    assert body["serves"] == ["claims", "reconcile"]
    assert body["reconciles"] == [k for k in pools if k == "default/mine"]
    assert body["reconciledElsewhere"] == (
        {"default/theirs": "other/7"} if "default/theirs" in pools else {}
    )
    assert body["notReconciled"] == [k for k in pools if k in ("default/free", "default/stale")]


def test_pools_not_read_yet_hold_readiness_back() -> None:
    readiness = assess(["default/mine"], ["default/mine"], reconciler=True, lease=None)
    assert not readiness.ready
    assert readiness.to_dict()["pools"] == ["default/mine"]
    # Without leases (a single process) it reconciles every pool.
    readiness = assess([], ["default/a", "default/b"], reconciler=True, lease=None)
    assert readiness.ready and readiness.reconciles == ("default/a", "default/b")


def test_a_claims_only_replica_is_ready_once_every_pool_was_read() -> None:
    readiness = assess(["default/x"], ["default/x"], reconciler=False, lease=None)
    assert not readiness.ready
    readiness = assess([], ["default/x"], reconciler=False, lease=None)
    assert readiness.ready and readiness.to_dict() == {
        "status": "ready",
        "serves": ["claims"],
        "pools": [],
        "reconciles": [],
        "reconciledElsewhere": {},
        "notReconciled": [],
    }


def test_a_process_that_serves_nothing_is_not_ready_and_says_why() -> None:
    readiness = Readiness.idle("cannot read the catalog of pools: connection refused")
    assert not readiness.ready
    body = readiness.to_dict()
    assert body["serves"] == [] and body["reason"].startswith("cannot read the catalog")
