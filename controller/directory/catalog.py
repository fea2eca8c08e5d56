"""The API tier's pool directory: the catalog the pools' lease holders publish in Nomad
(core/catalog.py), followed with blocking lists, so an API replica reconciles nothing,
holds no lease and needs nothing but Nomad.

The catalog is followed with the one blocking-list follower (records/reading.py), which
reads again only the records whose ModifyIndex moved. While the catalog cannot be read the
directory says so (`available`), and the claim path answers NomadUnavailable instead of
from what it last read. A claim or a release rings the doorbell: the pool's holder
replaces or purges the runner at once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from controller.core.catalog import CLAIMS, CatalogError, CatalogRecord
from controller.core.claims import ClaimState
from controller.core.offers import EMPTY, Offer
from controller.core.problems import PoolProblem, Problem
from controller.core.runner_ids import is_runner_id
from controller.core.times import utcnow
from controller.core.views import NodeView
from controller.core.waiting import WaitingClaims
from controller.directory.view import PoolEntry
from controller.model import RunnerPool
from controller.records.reading import Known
from controller.records.shared import SharedRecords

log = logging.getLogger(__name__)


class CatalogPool:
    """A pool as its lease holder last published it."""

    def __init__(self, record: CatalogRecord, pool: RunnerPool | None, waiting: WaitingClaims):
        self.record = record
        self._pool = pool
        self._waiting = waiting

    @property
    def key(self) -> str:
        return self.record.key

    @property
    def namespace(self) -> str:
        return self._pool.nomad_namespace if self._pool is not None else ""

    @property
    def job_prefix(self) -> str:
        return self._pool.job_prefix if self._pool is not None else ""

    @property
    def pool(self) -> RunnerPool | None:
        return self._pool

    @property
    def active(self) -> bool:
        return self.record.active and self._pool is not None

    @property
    def conflict(self) -> PoolProblem | None:
        message = self.record.conflict
        return PoolProblem(Problem.PREFIX_CONFLICT, message) if message else None

    @property
    def status(self) -> Mapping[str, Any]:
        return self.record.status

    @property
    def observed(self) -> bool:
        return True  # its holder published what a pass of it saw

    @property
    def current(self) -> bool:
        return True  # published after a pass; while the catalog is unread, nothing is served

    @property
    def unsettled(self) -> frozenset[str]:
        # Events reach the holder only: it leaves such runners out of what it publishes,
        # so a replica's offer is as old as the holder's last pass and the follow.
        return frozenset()

    @property
    def offer(self) -> Offer:
        return self.record.offer

    @property
    def more_than_offered(self) -> bool:
        status = self.record.status
        claimable = int(status.get("idleRunners", 0)) + int(status.get("outdatedRunners", 0))
        return claimable > len(self.record.offer)

    @property
    def waiting(self) -> WaitingClaims:
        return self._waiting


class CatalogDirectory:
    def __init__(
        self,
        records: SharedRecords,
        *,
        clock: Callable[[], datetime] = utcnow,
        own: Callable[[], set[str]] = set,
        wanted: Callable[[], bool] = lambda: True,
    ) -> None:
        """`own`: the paths of records this process publishes itself (a reconciler's, for
        the pools it holds): not read back; `wanted`: whether the catalog is to be followed
        now (a reconciler holding every pool it defines needs none of it, and a blocking
        list of the catalog wakes on every variable written)."""
        self._records = records.catalog
        self._own = own
        self._doorbell = records.doorbell
        self._publisher = records.waiting
        self.clock = clock
        self.pools: Mapping[str, CatalogPool] = {}
        self._entries: dict[str, CatalogPool] = {}  # by pool key
        self._known: dict[str, Known[CatalogPool | None]] = {}  # by record path
        self._waiting: dict[str, WaitingClaims] = {}
        self._changed: dict[str, asyncio.Event] = {}
        self._warned: set[tuple[str, int]] = set()
        self._follower = self._records.follower(self._take, wanted)
        self.read = self._follower.read  # set once the catalog has been read
        self.start, self.stop = self._follower.start, self._follower.stop

    # ---- following -----------------------------------------------------------------------

    async def _take(self, present: dict[str, int]) -> None:
        """Read the records that changed; forget those that went."""
        own = self._own()
        listed = {path: index for path, index in present.items() if path not in own}
        known = await self._records.read_changed(listed, self._known, self._decode)
        for path, hit in known.items():
            before = self._known.get(path)
            if hit.value is not None and (before is None or before.index != hit.index):
                self._tell(hit.value.key)
        for path in self._known.keys() - known.keys():
            gone = self._known[path].value
            if gone is not None:
                self._tell(gone.key)
        self._known = known
        self._entries = {
            hit.value.key: hit.value for _, hit in sorted(known.items()) if hit.value is not None
        }
        self.pools = self._entries

    def _decode(self, path: str, variable: Mapping[str, Any]) -> CatalogPool | None:
        """The record as a pool; one that does not decode is said once and the last read
        stays. What did not change since the last read (its runners, its pool) is taken
        over, not decoded again."""
        index = int(variable.get("ModifyIndex", 0))
        known = self._known.get(path)
        last = known.value if known is not None else None
        try:
            record = CatalogRecord.from_items(
                variable.get("Items") or {}, last.offer if last is not None else EMPTY
            )
            if last is not None and last.record.document == record.document:
                pool = last.pool
            else:
                pool = RunnerPool.parse_document(record.document) if record.document else None
        except (CatalogError, ValidationError) as error:
            if (path, index) not in self._warned:
                self._warned.add((path, index))
                log.warning("catalog record %s ignored (the last read stays): %s", path, error)
            return last
        waiting = self._waiting.get(record.key)
        if waiting is None:
            waiting = self._waiting[record.key] = WaitingClaims()
            self._publisher.follow(record.key, waiting)
        return CatalogPool(record, pool, waiting)

    def _tell(self, key: str) -> None:
        event = self._changed.pop(key, None)
        if event is not None:
            event.set()

    # ---- PoolDirectory -------------------------------------------------------------------

    def pool_for_runner(self, runner_id: str) -> PoolEntry | None:
        for entry in self._entries.values():
            if entry.job_prefix and is_runner_id(entry.job_prefix, runner_id):
                return entry
        return None

    def node_named(self, name: str) -> NodeView | None:
        for entry in self._entries.values():
            nodes = entry.record.draining_nodes
            if name in nodes:
                return NodeView("", name, draining=True, eligible=True, drain_deadline=nodes[name])
        return None

    def available(self) -> str | None:
        return self._follower.problem

    def runners_taken(self, entry: PoolEntry) -> None:
        self._doorbell.ring(CLAIMS, entry.key)

    async def runner_ended(self, entry: PoolEntry, runner_id: str, state: ClaimState) -> None:
        self._doorbell.ring(CLAIMS, entry.key)  # its holder purges the runner's job

    async def wait_for_offer(self, key: str, within: float) -> None:
        event = self._changed.setdefault(key, asyncio.Event())
        try:
            async with asyncio.timeout(within):
                await event.wait()
        except TimeoutError:
            pass

    def keep_claims_in_use(self, in_use: Callable[[str], bool]) -> None:
        """Nothing to do: this process never expires claims (reconcilers do; a busy
        runner's claim is renewed well before its deadline)."""
