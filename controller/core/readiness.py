"""Readiness: what a process does now, and whether that is what it is for.

Pure. A process serves claims; a reconciling one is also there so that its pools are
reconciled, by itself or by another live process that holds a pool's lease. It is ready
once every valid pool has been read from Nomad and, if it reconciles, nobody is missing
for any of its pools: a pool whose lease nobody is known to hold, or that is still held
under this process's own identity by the process before a restart, is reconciled by
nobody (core/leases.py, LeaseStanding).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from controller.core.leases import LeaseStanding, LeaseState

CLAIMS = "claims"
RECONCILE = "reconcile"


@dataclass(frozen=True, slots=True)
class Readiness:
    serves: tuple[str, ...]  # CLAIMS, and RECONCILE for a reconciling process
    unobserved: tuple[str, ...] = ()  # valid pools not read from Nomad yet
    reconciles: tuple[str, ...] = ()  # pools this process reconciles now
    elsewhere: Mapping[str, str] = field(default_factory=dict)  # pool -> its live holder
    unreconciled: tuple[str, ...] = ()  # pools this process should reconcile; nobody does
    reason: str = ""  # why it serves nothing (an API replica that cannot read the catalog)
    waiting: str = ""  # what it waits for before it knows every pool (RunnerPools listed)

    @property
    def ready(self) -> bool:
        return (
            bool(self.serves) and not self.unobserved and not self.unreconciled and not self.waiting
        )

    def to_dict(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "status": "ready" if self.ready else "unready",
            "serves": list(self.serves),
            "pools": list(self.unobserved),
            "reconciles": list(self.reconciles),
            "reconciledElsewhere": dict(self.elsewhere),
            "notReconciled": list(self.unreconciled),
        }
        if self.waiting:
            body["waitingFor"] = self.waiting
        return body | ({"reason": self.reason} if self.reason else {})

    @classmethod
    def idle(cls, reason: str) -> Readiness:
        """A process that serves nothing now (an API replica that cannot read the catalog),
        and why."""
        return cls((), reason=reason)


def assess(
    unobserved: Iterable[str],
    reconciled: Iterable[str],
    *,
    reconciler: bool,
    lease: Callable[[str], LeaseState] | None,
) -> Readiness:
    """`reconciled`: the keys of the pools a reconciling process is to reconcile (prefix
    conflicts excluded); `reconciler`: False for a claims-only replica, which only serves;
    `lease`: each pool's lease, None where this process writes every pool it reconciles."""
    if not reconciler:
        return Readiness((CLAIMS,), tuple(unobserved))
    mine: list[str] = []
    elsewhere: dict[str, str] = {}
    nobody: list[str] = []
    for key in reconciled:
        state = LeaseState(LeaseStanding.HELD) if lease is None else lease(key)
        if state.held:
            mine.append(key)
        elif state.reconciled:
            elsewhere[key] = state.holder
        else:
            nobody.append(key)
    return Readiness((CLAIMS, RECONCILE), tuple(unobserved), tuple(mine), elsewhere, tuple(nobody))
