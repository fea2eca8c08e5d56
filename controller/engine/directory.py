"""The engine as the claim path's pool directory (controller/directory/view.py), in a
process that reconciles: pools are those the engine registered, offered from its own
passes. A claim or release hints the engine's own loop; where another process holds the
pool's lease, the doorbell tells that process too (it alone writes the pool's jobs)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from datetime import datetime
from typing import Any

from controller.core.claims import ClaimState
from controller.core.offers import Offer
from controller.core.problems import PoolProblem
from controller.core.views import NodeView
from controller.core.waiting import WaitingClaims
from controller.directory.view import PoolEntry
from controller.engine.engine import Engine
from controller.engine.registry import PoolView
from controller.model import RunnerPool
from controller.nomad.errors import NomadError

log = logging.getLogger(__name__)


class EnginePool:
    """A registered pool, as the claim path sees it."""

    __slots__ = ("_view",)

    def __init__(self, view: PoolView) -> None:
        self._view = view

    @property
    def key(self) -> str:
        return self._view.key

    @property
    def namespace(self) -> str:
        return self._view.policy.nomad_namespace

    @property
    def job_prefix(self) -> str:
        return self._view.policy.job_prefix

    @property
    def pool(self) -> RunnerPool | None:
        return self._view.pool

    @property
    def active(self) -> bool:
        return self._view.active

    @property
    def conflict(self) -> PoolProblem | None:
        return self._view.conflict

    @property
    def status(self) -> Mapping[str, Any]:
        status = self._view.status
        return status.to_dict() if status is not None else {}

    @property
    def observed(self) -> bool:
        return self._view.observed

    @property
    def offer(self) -> Offer:
        return self._view.offer

    @property
    def more_than_offered(self) -> bool:
        return False  # the engine offers every claimable runner it saw

    @property
    def waiting(self) -> WaitingClaims:
        return self._view.waiting


class _Entries(Mapping[str, PoolEntry]):
    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def __getitem__(self, key: str) -> PoolEntry:
        return EnginePool(self._engine.pools[key])

    def __iter__(self) -> Iterator[str]:
        return iter(self._engine.pools)

    def __len__(self) -> int:
        return len(self._engine.pools)


class EngineDirectory:
    def __init__(self, engine: Engine, ring: Callable[[str], None] | None = None) -> None:
        """`ring`: tells the reconcilers of other processes that a pool's claims changed
        (the doorbell, when one is configured)."""
        self._engine = engine
        self._ring = ring
        self.pools: Mapping[str, PoolEntry] = _Entries(engine)

    def pool_for_runner(self, runner_id: str) -> PoolEntry | None:
        view = self._engine.pool_for_runner(runner_id)
        return EnginePool(view) if view is not None else None

    def clock(self) -> datetime:
        return self._engine.clock()

    def node_named(self, name: str) -> NodeView | None:
        return self._engine.node_named(name)

    def available(self) -> str | None:
        return None  # the engine reads Nomad itself; a failed read fails the request

    def runners_taken(self, entry: PoolEntry) -> None:
        self._changed(entry)

    async def runner_ended(self, entry: PoolEntry, runner_id: str, state: ClaimState) -> None:
        """The holder purges the job at once rather than on its next pass."""
        if self._engine.writes(entry.key):
            try:
                await self._engine.purge_ended(entry.key, runner_id, entry.namespace, state)
            except NomadError as error:
                log.warning("purge of ended runner %s deferred: %s", runner_id, error)
        self._changed(entry)

    async def wait_for_offer(self, key: str, within: float) -> None:
        await self._engine.wait_for_observation(key, within)

    def keep_claims_in_use(self, in_use: Callable[[str], bool]) -> None:
        self._engine.keep_claims_in_use(in_use)

    def _changed(self, entry: PoolEntry) -> None:
        self._engine.hint_namespace(entry.namespace)
        if self._ring is not None and not self._engine.writes(entry.key):
            self._ring(entry.key)
