"""What runs after the pool files are (re)loaded: the registration rule applied to every
pool of a load (pure).

Valid pools replace their previous version; an invalid document, or a change of an
immutable field, keeps the previous version (reported, with the refusal in the pool's
status); a pool absent from the files is removed, unless some document could not be
attributed to a pool (then nothing is removed: a parse error never deletes anything).
A reload that would remove every pool, or more than a share of them, changes nothing
unless asked for (``RemovalGuard``): a file truncated by a config tool mid-update at a
document boundary looks exactly like that.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from controller.core.problems import PoolProblem
from controller.model import RunnerPool, immutable_changes
from controller.sources.files import LoadResult, PoolFileError
from controller.sources.registration import register


@dataclass
class ReloadOutcome:
    """What runs after a reload, and why.

    ``pools`` is the effective set in document order (kept old versions sit where their
    document is; pools kept because the load was incomplete come last, in their old
    order). ``removed`` pools follow their deletionPolicy (their last version is in the
    ``previous`` mapping given to ``reload``). ``refusals`` holds, per pool whose newest
    document was not taken, why (a pool that was never valid is not in ``pools``).
    ``guard_refusal`` says why the reload as a whole was refused: then nothing changes.
    """

    pools: dict[str, RunnerPool]
    added: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    refusals: dict[str, PoolProblem] = field(default_factory=dict)
    guard_refusal: str | None = None
    # Every problem: the load's errors, then the refused immutable changes.
    errors: list[PoolFileError] = field(default_factory=list)
    # Only the refused immutable changes (the load's own errors are in LoadResult.errors).
    refused: list[PoolFileError] = field(default_factory=list)


@dataclass(frozen=True)
class RemovalGuard:
    """How much one reload may remove without being asked to: a load that defines no pool
    removes every pool only with `allow_empty` (whatever the share), and one that defines
    pools removes more than `max_removed_share` of the running pools only with
    `allow_shrink`."""

    allow_empty: bool = False
    allow_shrink: bool = False
    max_removed_share: float = 0.5

    def refusal(self, running: int, result: LoadResult, removed: list[str]) -> str | None:
        """Why a reload that removes `removed` of the `running` pools is refused, if it is."""
        if not running:
            return None
        if result.empty:
            if self.allow_empty:
                return None
            return "defines no pool; pass --allow-empty to remove every pool"
        if self.allow_shrink or len(removed) <= self.max_removed_share * running:
            return None
        return (
            f"would remove {len(removed)} of {running} pools ({', '.join(removed)}), more "
            f"than --max-removed-share {self.max_removed_share:g}; pass --allow-shrink to "
            "remove them"
        )


def summary(outcome: ReloadOutcome) -> str:
    """One line for the log: what a reload added, changed, removed and refused, and why
    each pool was refused."""
    refused = [f"{key} ({problem.message})" for key, problem in outcome.refusals.items()]
    parts = [
        f"{what} {', '.join(keys)}"
        for what, keys in (
            ("added", outcome.added),
            ("changed", outcome.updated),
            ("removed", outcome.removed),
            ("refused", refused),
        )
        if keys
    ]
    return "; ".join(parts) if parts else "no change"


def reload(
    previous: Mapping[str, RunnerPool],
    result: LoadResult,
    guard: RemovalGuard = RemovalGuard(),
) -> ReloadOutcome:
    """What runs once `result` replaces `previous`; nothing changes when `guard` refuses
    what it would remove."""
    outcome = _replace(previous, result)
    refusal = guard.refusal(len(previous), result, outcome.removed)
    if refusal is not None:
        return ReloadOutcome(pools=dict(previous), kept=list(previous), guard_refusal=refusal)
    return outcome


def _replace(previous: Mapping[str, RunnerPool], result: LoadResult) -> ReloadOutcome:
    outcome = ReloadOutcome(pools={}, errors=list(result.errors))
    valid = {pool.key: pool for pool in result.pools}
    problems: dict[str, list[str]] = {}
    for error in result.errors:
        if error.key is not None:
            problems.setdefault(error.key, []).append(str(error))

    for key, location in result.locations.items():
        old = previous.get(key)
        new = valid.get(key)
        registration = register(
            old, new if new is not None else "; ".join(problems.get(key, ["invalid"]))
        )
        if registration.refusal is not None:
            outcome.refusals[key] = registration.refusal
        if registration.pool is None:
            continue  # never valid: nothing runs
        outcome.pools[key] = registration.pool
        if registration.refusal is not None:
            outcome.kept.append(key)
            if new is not None and old is not None:
                message = registration.refusal.message
                outcome.refused.extend(
                    PoolFileError(location.file, location.document, path, message, key)
                    for path in immutable_changes(old, new)
                )
        elif old is None:
            outcome.added.append(key)
        else:
            (outcome.unchanged if new == old else outcome.updated).append(key)

    outcome.errors.extend(outcome.refused)
    for key, old in previous.items():
        if key in outcome.pools:
            continue
        if result.complete:
            outcome.removed.append(key)
        else:
            outcome.pools[key] = old
            outcome.kept.append(key)
    return outcome
