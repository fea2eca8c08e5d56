"""What can be wrong with a pool's registration, as its status reports it."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum


class Problem(StrEnum):
    """Why a pool is not (or not fully) reconciled here; its `Ready` or `SpecAccepted`
    condition carries it as the reason."""

    # Another pool registered first holds the same job prefix in the same Nomad namespace:
    # this one is not reconciled and hands out nothing (its runners would be the other's).
    PREFIX_CONFLICT = "PrefixConflict"
    # The newest version of the spec is invalid; the last valid version keeps running.
    INVALID_SPEC = "InvalidSpec"
    # The newest version changes an immutable field; the last valid version keeps running.
    IMMUTABLE_FIELD_CHANGED = "ImmutableFieldChanged"
    # Another process holds the pool's lease: it reconciles the pool; this one serves claims.
    LEASE_HELD_ELSEWHERE = "LeaseHeldElsewhere"
    # Nobody reconciles the pool: this process wants its lease and does not hold it (yet).
    LEASE_NOT_HELD = "LeaseNotHeld"


@dataclass(frozen=True, slots=True)
class PoolProblem:
    kind: Problem
    message: str


def prefix_owners(pools: Iterable[tuple[str, str, str]]) -> dict[str, str]:
    """For pools given as (key, Nomad namespace, job prefix) in registration order: each
    pool that conflicts, mapped to the earlier pool that owns its prefix."""
    owners: dict[tuple[str, str], str] = {}
    conflicts: dict[str, str] = {}
    for key, namespace, prefix in pools:
        owner = owners.setdefault((namespace, prefix), key)
        if owner != key:
            conflicts[key] = owner
    return conflicts
