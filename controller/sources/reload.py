"""What runs after the pool files are (re)loaded: the registration rule applied to every
pool of a load (pure).

Valid pools replace their previous version; an invalid document, or a change of an
immutable field, keeps the previous version (reported, with the refusal in the pool's
status); a pool absent from the files is removed, unless some document could not be
attributed to a pool (then nothing is removed: a parse error never deletes anything).
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
    document was not taken, why.
    """

    pools: dict[str, RunnerPool]
    added: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    refusals: dict[str, PoolProblem] = field(default_factory=dict)
    # The load defined no pool at all while pools run: nothing changed (see reload).
    refused_empty: bool = False
    # Every problem: the load's errors, then the refused immutable changes.
    errors: list[PoolFileError] = field(default_factory=list)
    # Only the refused immutable changes (the load's own errors are in LoadResult.errors).
    refused: list[PoolFileError] = field(default_factory=list)


def summary(outcome: ReloadOutcome) -> str:
    """One line for the log: what a reload added, changed, removed and refused."""
    parts = [
        f"{what} {', '.join(keys)}"
        for what, keys in (
            ("added", outcome.added),
            ("changed", outcome.updated),
            ("removed", outcome.removed),
            ("refused", list(outcome.refusals)),
        )
        if keys
    ]
    return "; ".join(parts) if parts else "no change"


def reload(
    previous: Mapping[str, RunnerPool], result: LoadResult, *, allow_empty: bool = False
) -> ReloadOutcome:
    """A load that would leave no pool at all while pools run (a file truncated by a
    config tool mid-update looks exactly like that) changes nothing, unless
    `allow_empty`: removing every pool must be asked for."""
    if previous and not result.locations and not result.errors and not allow_empty:
        return ReloadOutcome(pools=dict(previous), kept=list(previous), refused_empty=True)
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
        if registration.pool is None:
            continue  # never valid: reported in the load's errors
        outcome.pools[key] = registration.pool
        if registration.refusal is not None:
            outcome.kept.append(key)
            outcome.refusals[key] = registration.refusal
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
