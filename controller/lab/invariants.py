"""Invariants that must hold once a pool has settled (demo, chaos soak, tests).

Pure: takes what the controller reports and what Nomad holds, returns the violations.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class PoolSnapshot:
    key: str
    desired_idle: int
    max_runners: int
    idle: int
    total: int
    runner_ids: frozenset[str]  # every runner job the controller counts for this pool


@dataclass(frozen=True)
class NomadJob:
    id: str
    pool: str  # its poolkeeper_pool Meta
    live: bool  # not stopped and not dead


def check_invariants(pools: Sequence[PoolSnapshot], jobs: Sequence[NomadJob]) -> list[str]:
    """Violations of: idle == desired, total <= max, and every live runner job counted."""
    violations: list[str] = []
    by_key = {pool.key: pool for pool in pools}
    for pool in pools:
        if pool.idle != pool.desired_idle:
            violations.append(
                f"pool {pool.key} has {pool.idle} idle runners, wants {pool.desired_idle}"
            )
        if pool.total > pool.max_runners:
            violations.append(
                f"pool {pool.key} has {pool.total} runners, more than maxRunners {pool.max_runners}"
            )
    for job in jobs:
        owner = by_key.get(job.pool)
        if job.live and owner is not None and job.id not in owner.runner_ids:
            violations.append(f"job {job.id} of pool {job.pool} is not counted: leaked")
    return violations
