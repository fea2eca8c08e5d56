"""The API tier's pool directory: the catalog the pools' lease holders publish in Nomad
(core/catalog.py), followed with blocking lists, so an API replica reconciles nothing,
holds no lease and needs nothing but Nomad.

A blocking list of the catalog returns on any variable's change (Nomad blocks a list on
its table's index), so the follower reads again only the records whose ModifyIndex
moved, and lists at most every FOLLOW_GAP_SECONDS. While the catalog cannot be read the
directory says so (`available`), and the claim path answers NomadUnavailable instead of
from what it last read. A claim or a release rings the doorbell: the pool's holder
replaces or purges the runner at once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any, Final

from pydantic import ValidationError

from controller.core.catalog import CatalogError, CatalogRecord
from controller.core.claims import ClaimState
from controller.core.offers import Offer
from controller.core.paths import CATALOG_PREFIX
from controller.core.problems import PoolProblem, Problem
from controller.core.runner_ids import is_runner_id
from controller.core.times import utcnow
from controller.core.views import NodeView
from controller.core.waiting import WaitingClaims
from controller.directory.view import PoolEntry
from controller.model import RunnerPool
from controller.nomad.errors import NomadError
from controller.nomad.port import VariableLists
from controller.records.doorbell import CLAIMS, Doorbell
from controller.records.waiting import WaitingPublisher
from controller.tasks import Background

log = logging.getLogger(__name__)

FOLLOW_GAP_SECONDS: Final = 0.025
WAIT_SECONDS: Final = 8.0
RETRY_SECONDS: Final = (0.5, 5.0)
UNWANTED_CHECK_SECONDS: Final = 0.25


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
        port: VariableLists,
        home_namespace: str,
        doorbell: Doorbell,
        waiting: WaitingPublisher,
        *,
        clock: Callable[[], datetime] = utcnow,
        own: Callable[[], set[str]] = set,
        wanted: Callable[[], bool] = lambda: True,
    ) -> None:
        """`own`: the paths of records this process publishes itself (a reconciler's, for
        the pools it holds): not read back; `wanted`: whether the catalog is to be followed
        now (a reconciler holding every pool it defines needs none of it, and a blocking
        list of the catalog wakes on every variable written)."""
        self._port = port
        self._own = own
        self._wanted = wanted
        self._home = home_namespace
        self._doorbell = doorbell
        self._publisher = waiting
        self.clock = clock
        self.pools: Mapping[str, PoolEntry] = {}
        self._entries: dict[str, CatalogPool] = {}  # by pool key
        self._by_path: dict[str, CatalogPool] = {}  # by record path
        self._indexes: dict[str, int] = {}  # record path -> ModifyIndex read
        self._waiting: dict[str, WaitingClaims] = {}
        self._changed: dict[str, asyncio.Event] = {}
        self._problem: str | None = "the pools have not been read from Nomad yet"
        self._warned: set[tuple[str, int]] = set()
        self.read = asyncio.Event()  # set once the catalog has been read
        self._following = Background("catalog", self._follow)
        self.start, self.stop = self._following.start, self._following.stop

    # ---- following -----------------------------------------------------------------------

    async def _follow(self) -> None:
        index, pause = 0, RETRY_SECONDS[0]
        while True:
            if not self._wanted():
                index = 0  # read it all again once wanted
                await asyncio.sleep(UNWANTED_CHECK_SECONDS)
                continue
            try:
                metas, index = await self._port.wait_variables(
                    CATALOG_PREFIX, self._home, index, WAIT_SECONDS
                )
                await self._take(metas)
            except NomadError as error:
                if self._problem is None:
                    log.warning("cannot read the catalog of pools from Nomad: %s", error)
                self._problem = f"cannot read the catalog of pools: {error}"
                await asyncio.sleep(pause)
                pause = min(pause * 2, RETRY_SECONDS[1])
                continue
            if self._problem is not None and self.read.is_set():
                log.info("the catalog of pools is read again")
            self._problem, pause = None, RETRY_SECONDS[0]
            self.read.set()
            await asyncio.sleep(FOLLOW_GAP_SECONDS)

    async def _take(self, metas: list[dict[str, Any]]) -> None:
        """Read the records that changed; forget those that went."""
        own = self._own()
        present = {
            path: int(m.get("ModifyIndex", 0)) for m in metas if (path := str(m["Path"])) not in own
        }
        changed = [p for p, i in present.items() if self._indexes.get(p) != i]
        variables = await asyncio.gather(
            *(self._port.read_variable(path, self._home) for path in changed)
        )
        for path, variable in zip(changed, variables, strict=True):
            if variable is None:  # deleted between the list and the read
                present.pop(path)
                continue
            self._indexes[path] = int(variable.get("ModifyIndex", 0))
            entry = self._decode(path, variable)
            if entry is not None:
                self._by_path[path] = entry
                self._tell(entry.key)
        for path in set(self._by_path) - set(present):
            self._tell(self._by_path.pop(path).key)
            self._indexes.pop(path, None)
        self._entries = {e.key: e for _, e in sorted(self._by_path.items())}
        self.pools = self._entries

    def _decode(self, path: str, variable: Mapping[str, Any]) -> CatalogPool | None:
        index = int(variable.get("ModifyIndex", 0))
        try:
            record = CatalogRecord.from_items(variable.get("Items") or {})
            pool = RunnerPool.parse_document(record.document) if record.document else None
        except (CatalogError, ValidationError) as error:
            if (path, index) not in self._warned:
                self._warned.add((path, index))
                log.warning("catalog record %s ignored (the last read stays): %s", path, error)
            return None
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
        return self._problem

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
