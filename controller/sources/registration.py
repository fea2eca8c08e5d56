"""The one registration rule of both front doors (pool files and RunnerPool resources),
and what removing a pool means.

A new version of a pool's spec replaces the running one when it is valid and changes no
immutable field (`spec.nomad.namespace`, the job prefix). Otherwise the last valid
version keeps running, reconciled and claimable as before, and the refusal is reported
(`SpecAccepted=False`, reason InvalidSpec or ImmutableFieldChanged). A pool that was
never valid is not registered at all.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from controller.core.problems import PoolProblem, Problem
from controller.core.views import PoolMode
from controller.model import DeletionPolicy, RunnerPool, immutable_changes

DELETION_MODES = {
    DeletionPolicy.DRAIN: PoolMode.DRAIN,
    DeletionPolicy.DELETE: PoolMode.DELETE,
    DeletionPolicy.ORPHAN: None,
}


@dataclass(frozen=True)
class Registration:
    """What runs for one pool (None: nothing, it was never valid) and why the newest
    version, if it is not what runs, was refused."""

    pool: RunnerPool | None
    refusal: PoolProblem | None = None


def register(previous: RunnerPool | None, new: RunnerPool | str) -> Registration:
    """`new` is the newest version, or the reason it is invalid."""
    if isinstance(new, str):
        return Registration(previous, PoolProblem(Problem.INVALID_SPEC, new))
    if previous is None:
        return Registration(new)
    changed = immutable_changes(previous, new)
    if changed:
        message = immutable_message(previous, new, changed)
        return Registration(previous, PoolProblem(Problem.IMMUTABLE_FIELD_CHANGED, message))
    return Registration(new)


def immutable_message(old: RunnerPool, new: RunnerPool, changed: list[str]) -> str:
    def value(pool: RunnerPool, path: str) -> str:
        return pool.spec.nomad.namespace if path == "spec.nomad.namespace" else pool.job_prefix

    what = ", ".join(
        f"{path} ({value(old, path)!r} cannot become {value(new, path)!r})" for path in changed
    )
    return (
        f"{what}: immutable; the previous version keeps running. "
        "Delete and re-create the pool to move it."
    )


def removal(pool: RunnerPool, removed_at: datetime) -> tuple[PoolMode | None, datetime]:
    """How a removed pool goes (its deletionPolicy: drain, delete, or None for Orphan) and
    when claimed runners of a drain are destroyed at the latest."""
    deadline = removed_at + timedelta(seconds=pool.spec.drain_timeout_seconds)
    return DELETION_MODES[pool.spec.deletion_policy], deadline
