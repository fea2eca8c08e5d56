"""Leases: one reconciler per pool, across processes and clusters.

A pool's lease is the Nomad variable `poolkeeper/leases/<namespace>~<name>` in the pool's
Nomad namespace, held with Nomad's variable lock. Only its holder writes the pool's runner
jobs; its items say who holds it and which spec that holder reconciles. Pure: paths, the
items, and what a lease means for a pool's status.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from controller.core.times import format_time

# Nomad bounds a lock's TTL to 10 s .. 24 h; the lock delay only to >= 0.
DEFAULT_TTL_SECONDS = 10.0
MIN_TTL_SECONDS = 10.0
LOCK_DELAY_SECONDS = 5.0


def takeover_seconds(ttl_seconds: float) -> float:
    """How long after a holder died without releasing another process has the pool:
    Nomad frees an unrenewed lock twice its TTL after the last renewal, then keeps it for
    the lock delay; a waiting process retries every TTL/3."""
    return 2 * ttl_seconds + LOCK_DELAY_SECONDS + ttl_seconds / 3


@dataclass(frozen=True, slots=True)
class LeaseItems:
    holder: str  # a readable identity: hostname/pid, or the operator's pod name
    spec_hash: str  # the spec the holder reconciles ("" for a pool it only drains)
    acquired_at: str = ""
    # The resource the holder writes the pool's status to (a RunnerPool's UID; "" for a
    # pool file): another replica reading the same resource leaves it to the holder.
    resource: str = ""

    def to_items(self) -> dict[str, str]:
        items = {"holder": self.holder, "specHash": self.spec_hash, "acquiredAt": self.acquired_at}
        return items | ({"resource": self.resource} if self.resource else {})

    @classmethod
    def taken(cls, holder: str, spec_hash: str, now: datetime, resource: str = "") -> LeaseItems:
        return cls(holder, spec_hash, format_time(now), resource)

    @classmethod
    def from_variable(cls, variable: Mapping[str, Any] | None) -> LeaseItems | None:
        items = (variable or {}).get("Items")
        if not isinstance(items, Mapping) or not isinstance(items.get("holder"), str):
            return None
        spec = items.get("specHash")
        acquired = items.get("acquiredAt")
        resource = items.get("resource")
        return cls(
            items["holder"],
            spec if isinstance(spec, str) else "",
            acquired if isinstance(acquired, str) else "",
            resource if isinstance(resource, str) else "",
        )


class LeaseStanding(StrEnum):
    """Where a pool's lease stands, as this process knows it."""

    HELD = "held"  # this process holds it and may write the pool
    ELSEWHERE = "elsewhere"  # Nomad refused it: another process holds it and reconciles
    # Nomad refused it, and its holder is this process's own identity: an earlier process
    # (the one before a restart) that did not give it back. Nobody reconciles the pool
    # until Nomad frees the lock (takeover_seconds after that process's last renewal).
    STALE = "stale"
    # Nobody is known to hold it: not tried yet, just lost, or Nomad does not answer.
    FREE = "free"


@dataclass(frozen=True, slots=True)
class LeaseState:
    """What this process knows of a pool's lease, for its status."""

    standing: LeaseStanding
    holder: str = ""  # who holds it ("" when nobody is known to)
    holder_spec: str = ""  # the spec hash the holder reconciles
    holder_resource: str = ""  # the resource it writes the pool's status to

    @property
    def held(self) -> bool:
        """This process holds the lease and may write the pool."""
        return self.standing is LeaseStanding.HELD

    @property
    def reconciled(self) -> bool:
        """A live process reconciles the pool: this one, or another that holds the lease."""
        return self.standing in (LeaseStanding.HELD, LeaseStanding.ELSEWHERE)

    def differs(self, own_spec: str) -> bool:
        """Another holder reconciles another version of the pool's spec than this process."""
        return bool(
            self.standing is LeaseStanding.ELSEWHERE
            and self.holder_spec
            and own_spec
            and self.holder_spec != own_spec
        )

    def speaks_here(self, resource: str, speaker: bool) -> bool:
        """Whether this process writes what the pool's `resource` shows (its status,
        Events): as the lease's holder; where the holder writes to another resource (a
        pool file's holder beside this RunnerPool: LeaseHeldElsewhere is said only here);
        or, while no live process holds it, as the `speaker` of the live reconcilers."""
        if self.standing is LeaseStanding.HELD:
            return True
        if self.standing is LeaseStanding.ELSEWHERE:
            return not resource or self.holder_resource != resource
        return speaker
