"""The narrow interface through which the claim path reads pools (see __init__.py)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any, Protocol

from controller.core.claims import ClaimState
from controller.core.offers import Offer
from controller.core.problems import PoolProblem
from controller.core.views import NodeView
from controller.core.waiting import WaitingClaims
from controller.model import RunnerPool


class PoolEntry(Protocol):
    """One pool as the claim path sees it."""

    @property
    def key(self) -> str:
        """`<namespace>/<name>`."""

    @property
    def namespace(self) -> str:
        """The Nomad namespace of its runners, their claims and request records."""

    @property
    def job_prefix(self) -> str: ...

    @property
    def pool(self) -> RunnerPool | None:
        """The spec that runs (its claims, executions and Poseidon settings); None for a
        pool only being drained."""

    @property
    def active(self) -> bool:
        """Defined and not being removed: it takes claims."""

    @property
    def conflict(self) -> PoolProblem | None:
        """Its job prefix belongs to another pool: it hands out nothing."""

    @property
    def status(self) -> Mapping[str, Any]:
        """Its status as `GET /v1/pools` shows it; empty before its first pass."""

    @property
    def observed(self) -> bool:
        """Whether its runners have been seen at all (else an empty offer means nothing)."""

    @property
    def current(self) -> bool:
        """Whether its offer was made since this process last failed to read Nomad (else
        an empty or taken offer says nothing of the runners it has now: a claim waits for
        the next offer rather than answer PoolEmpty)."""

    @property
    def unsettled(self) -> frozenset[str]:
        """Runners of its offer whose job Nomad said changed after the offer was made (an
        event, such as the job's removal): not handed out until a pass saw them again."""

    @property
    def offer(self) -> Offer:
        """Its claimable runners as last seen, in the order claims try them."""

    @property
    def more_than_offered(self) -> bool:
        """It had more claimable runners than its offer lists (a catalog record holds what
        fits in one Nomad variable): once those are taken, the next offer lists others."""

    @property
    def waiting(self) -> WaitingClaims:
        """Where a claim request that waits for its runners says so."""


class PoolDirectory(Protocol):
    @property
    def pools(self) -> Mapping[str, PoolEntry]: ...

    def pool_for_runner(self, runner_id: str) -> PoolEntry | None:
        """The pool whose job prefix the runner ID carries."""

    def clock(self) -> datetime: ...

    def node_named(self, name: str) -> NodeView | None:
        """A client node as last seen (a claim's view says whether it drains)."""

    def available(self) -> str | None:
        """None while the directory follows its source; else why it cannot be trusted
        now (the claim path then answers NomadUnavailable rather than from stale memory)."""

    def runners_taken(self, entry: PoolEntry) -> None:
        """Runners of the pool were claimed: its reconciler should replace them now."""

    async def runner_ended(self, entry: PoolEntry, runner_id: str, state: ClaimState) -> None:
        """A claim of the pool became a tombstone (`state` says why): its runner is to be
        destroyed, by the holder of the pool's lease (the only process that writes the
        pool's jobs)."""

    async def wait_for_offer(self, key: str, within: float) -> None:
        """Wait (at most `within` seconds) until the pool's offer may have changed."""

    def keep_claims_in_use(self, in_use: Callable[[str], bool]) -> None:
        """Claims of runners `in_use` (executions of this process run on them) are to be
        renewed rather than expired, where this process expires claims."""
