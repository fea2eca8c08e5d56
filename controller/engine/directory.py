"""The engine as the claim path's pool directory (controller/directory/view.py), in a
process that reconciles: pools are those the engine registered, offered from its own
passes. A claim or release hints the engine's own loop; where another process holds the
pool's lease, the doorbell tells that process too (it alone writes the pool's jobs).

Reconcilers that share pools by lease observe only the pools they hold (engine/observe.py):
a pool another process holds is offered as its holder publishes it in the catalog (the
API tier's directory, directory/catalog.py), as an API replica would offer it."""

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
from controller.directory.catalog import CatalogDirectory, CatalogPool
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
    def current(self) -> bool:
        return self._view.current

    @property
    def unsettled(self) -> frozenset[str]:
        return self._view.unsettled

    @property
    def offer(self) -> Offer:
        return self._view.offer

    @property
    def more_than_offered(self) -> bool:
        return False  # the engine offers every claimable runner it saw

    @property
    def waiting(self) -> WaitingClaims:
        return self._view.waiting


class HeldElsewhere(CatalogPool):
    """A pool another process holds, as a reconciler that also defines it offers it: its
    runners, offer and counts as the holder published them; its conditions this process's
    own (`LeaseHeldElsewhere`, and whether its spec differs from the holder's)."""

    def __init__(self, published: CatalogPool, own: PoolView) -> None:
        super().__init__(published.record, published.pool, published.waiting)
        self._own = own

    @property
    def status(self) -> Mapping[str, Any]:
        own = self._own.status
        if own is None:
            return self.record.status
        return {**self.record.status, "conditions": own.to_dict()["conditions"]}


class _Entries(Mapping[str, PoolEntry]):
    def __init__(self, engine: Engine, catalog: CatalogDirectory | None) -> None:
        self._engine = engine
        self._catalog = catalog

    def __getitem__(self, key: str) -> PoolEntry:
        view = self._engine.pools[key]
        if self._catalog is not None and not self._engine.writes(key):
            published = self._catalog.pools.get(key)
            if published is not None:
                return HeldElsewhere(published, view)
        return EnginePool(view)

    def __iter__(self) -> Iterator[str]:
        return iter(self._engine.pools)

    def __len__(self) -> int:
        return len(self._engine.pools)


class EngineDirectory:
    def __init__(
        self,
        engine: Engine,
        ring: Callable[[str], None] | None = None,
        catalog: CatalogDirectory | None = None,
        unread: Callable[[], str | None] = lambda: None,
    ) -> None:
        """`ring`: tells the reconcilers of other processes that a pool's claims changed
        (the doorbell, when one is configured); `catalog`: where the pools other processes
        hold are offered (None: the engine observes every pool it registered); `unread`:
        why the engine may not have every pool yet (their definitions are still being
        read), None once it has."""
        self._engine = engine
        self._ring = ring
        self._catalog = catalog
        self._unread = unread
        self.pools: Mapping[str, PoolEntry] = _Entries(engine, catalog)

    def pool_for_runner(self, runner_id: str) -> PoolEntry | None:
        view = self._engine.pool_for_runner(runner_id)
        return self.pools.get(view.key) if view is not None else None

    def clock(self) -> datetime:
        return self._engine.clock()

    def node_named(self, name: str) -> NodeView | None:
        return self._engine.node_named(name)

    def available(self) -> str | None:
        # The engine reads Nomad itself (a failed read fails the request); an unknown pool
        # is no answer while the definitions are still being read.
        return self._unread()

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
        if self._catalog is not None and not self._engine.writes(key):
            await self._catalog.wait_for_offer(key, within)
        else:
            await self._engine.wait_for_observation(key, within)

    def keep_claims_in_use(self, in_use: Callable[[str], bool]) -> None:
        self._engine.keep_claims_in_use(in_use)

    def unoffered(self) -> list[str]:
        """Active pools another process holds that the catalog does not offer (yet)."""
        if self._catalog is None:
            return []
        return [
            key
            for key, view in self._engine.pools.items()
            if view.active
            and view.conflict is None
            and not self._engine.writes(key)
            and key not in self._catalog.pools
        ]

    def _changed(self, entry: PoolEntry) -> None:
        """Its reconciler looks at the pool now: this process's own loop, unless the pool's
        holder elsewhere (rung) publishes its offer; the doorbell tells that holder."""
        held_here = self._engine.writes(entry.key)
        if held_here or self._catalog is None:
            self._engine.hint_namespace(entry.namespace)
        if self._ring is not None and not held_here:
            self._ring(entry.key)
