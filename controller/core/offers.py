"""What a pool offers to claims: its claimable runners as one pass saw them, in the order
claims should try them, with what a claim records of each.

The current runners come first; then the rest: outdated ones, and those on nodes that
drain or take no new placements (which a claim takes last). The engine computes an offer
from its own pass; the lease holder publishes it in the pool's catalog record for the
API tier (core/catalog.py), capped, so the offer is also a wire format.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property

from controller.core.demand import StartSample, runner_start
from controller.core.views import AllocationView, Runner, RunnerState

_CLAIMABLE = frozenset({RunnerState.IDLE, RunnerState.OUTDATED})


@dataclass(frozen=True, slots=True)
class Offered:
    """A claimable runner and what its claim records of it."""

    runner_id: str
    allocation_id: str
    allocation_restarts: int
    node_name: str
    # The runner's start, recorded in its claim for the demand estimate (demand pools).
    start: StartSample | None = None


@dataclass(frozen=True)
class Offer:
    current: tuple[Offered, ...] = ()
    rest: tuple[Offered, ...] = ()
    runner_ids: frozenset[str] = field(init=False)

    def __post_init__(self) -> None:
        ids = frozenset(o.runner_id for o in (*self.current, *self.rest))
        object.__setattr__(self, "runner_ids", ids)

    def __len__(self) -> int:
        return len(self.current) + len(self.rest)

    @cached_property
    def by_id(self) -> Mapping[str, Offered]:
        return {o.runner_id: o for o in (*self.current, *self.rest)}

    def capped(self, most: int) -> Offer:
        """At most `most` runners, the current ones first."""
        current = self.current[:most]
        return Offer(current, self.rest[: most - len(current)])

    def without(self, runner_ids: frozenset[str]) -> Offer:
        """The offer without these runners."""
        if not runner_ids & self.runner_ids:
            return self
        return Offer(
            tuple(o for o in self.current if o.runner_id not in runner_ids),
            tuple(o for o in self.rest if o.runner_id not in runner_ids),
        )


EMPTY = Offer()


def offer_of(
    runners: Sequence[Runner],
    allocations: Mapping[str, Sequence[AllocationView]],
    leaving_nodes: frozenset[str],
    *,
    with_start: bool,
) -> Offer:
    """The claimable runners of one pass: idle and outdated ones with a running
    allocation; `with_start` (demand pools) adds each runner's start."""

    def offered(runner: Runner) -> Offered:
        allocation = runner.allocation
        assert allocation is not None  # claimable runners run an allocation
        start = runner_start(runner.job, allocations.get(runner.id, ())) if with_start else None
        return Offered(runner.id, allocation.id, allocation.restarts, allocation.node_name, start)

    def stays(runner: Runner) -> bool:
        return runner.allocation is not None and runner.allocation.node_id not in leaving_nodes

    claimable = [r for r in runners if r.state in _CLAIMABLE and r.allocation is not None]
    current = [r for r in claimable if r.state is RunnerState.IDLE and stays(r)]
    rest = [r for r in claimable if r.state is RunnerState.OUTDATED and stays(r)]
    rest += [r for r in claimable if not stays(r)]
    return Offer(tuple(map(offered, current)), tuple(map(offered, rest)))
