"""Publishing the catalog (core/catalog.py): after each pass, the holder of a pool's lease
writes what the API tier needs of the pool, when it changed or REPUBLISH_SECONDS after it
last did; a pool that goes from this process takes its record along, and records nobody
has published for STALE_SECONDS are deleted, so what a dead process published ends.

Writes are check-and-set on the index this process last wrote (or read, after a lost
one): a record another holder wrote meanwhile is read and written over once, never
deleted by mistake. A failed write never fails the pass: the next one tries again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime

from controller.core.catalog import (
    OFFER_LIMIT,
    REPUBLISH_SECONDS,
    STALE_SECONDS,
    CatalogRecord,
    without_job_template,
)
from controller.core.offers import EMPTY
from controller.core.paths import CATALOG_PREFIX, catalog_path
from controller.core.views import NodeView
from controller.engine.registry import ManagedPool
from controller.nomad.errors import NomadConflict, NomadError
from controller.nomad.port import Variables

log = logging.getLogger(__name__)


class CatalogPublisher:
    def __init__(
        self,
        port: Variables,
        home_namespace: str,
        identity: str,
        clock: Callable[[], datetime],
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._port = port
        self._home = home_namespace
        self._identity = identity
        self._clock = clock
        self._monotonic = monotonic
        # pool key -> (the record last written, its ModifyIndex)
        self._written: dict[str, tuple[CatalogRecord, int]] = {}
        self._collected = monotonic()

    async def publish(self, pools: Iterable[ManagedPool], nodes: Mapping[str, NodeView]) -> None:
        """Write the records of these pools (written by this process) that changed."""
        now = self._clock()
        draining = {n.name: n.drain_deadline for n in nodes.values() if n.draining}
        due = []
        for managed in pools:
            record = self._record(managed, draining, now)
            last = self._written.get(managed.key)
            fresh = last is not None and (
                (now - last[0].published_at).total_seconds() < REPUBLISH_SECONDS
            )
            if not (fresh and last is not None and record.same_content(last[0])):
                due.append(self._write(record))
        await asyncio.gather(*due)

    async def withdraw(self, keys: Iterable[str]) -> None:
        """Delete the records of pools that went from this process (drained, removed)."""
        for key in keys:
            written = self._written.pop(key, None)
            if written is None:
                continue
            try:
                await self._port.delete_variable(catalog_path(key), self._home, cas=written[1])
            except NomadConflict:
                pass  # another holder wrote it since: it is theirs now
            except NomadError as error:
                log.warning("could not delete the catalog record of %s: %s", key, error)

    def published(self) -> set[str]:
        return set(self._written)

    async def collect_stale(self, defined: set[str]) -> None:
        """Every STALE_SECONDS / 2: delete records nobody published for STALE_SECONDS of
        pools this process does not define (a pool reconciled nowhere any more)."""
        if self._monotonic() - self._collected < STALE_SECONDS / 2:
            return
        self._collected = self._monotonic()
        try:
            metas = await self._port.list_variables(CATALOG_PREFIX, self._home)
            now_ns = time.time_ns()
            for meta in metas:
                age = (now_ns - int(meta.get("ModifyTime", now_ns))) / 1e9
                if age < STALE_SECONDS:
                    continue
                variable = await self._port.read_variable(str(meta["Path"]), self._home)
                items = (variable or {}).get("Items") or {}
                if items.get("pool") in defined:
                    continue
                try:
                    await self._port.delete_variable(
                        str(meta["Path"]), self._home, cas=int(meta.get("ModifyIndex", 0))
                    )
                except NomadConflict:
                    continue  # published again meanwhile
                log.info("deleted the stale catalog record %s (%.0f s old)", meta["Path"], age)
        except NomadError as error:
            log.warning("collecting stale catalog records: %s", error)

    def _record(
        self, managed: ManagedPool, draining: dict[str, datetime | None], now: datetime
    ) -> CatalogRecord:
        pool = managed.pool
        takes_claims = managed.active and managed.conflict is None
        # Capped before it is compared with what was written: the record's size cuts it
        # further when it is written (core/catalog.py).
        offer = managed.offer.capped(OFFER_LIMIT) if takes_claims else EMPTY
        on = {o.node_name for o in (*offer.current, *offer.rest)} | {
            r.allocation.node_name for r in managed.runners if r.allocation is not None
        }
        return CatalogRecord(
            key=managed.key,
            document=without_job_template(pool.model_dump(mode="json", by_alias=True))
            if pool is not None
            else {},
            active=managed.active,
            status=managed.status.to_dict() if managed.status is not None else {},
            offer=offer,
            draining_nodes={name: d for name, d in draining.items() if name in on},
            holder=self._identity,
            published_at=now,
            conflict=managed.conflict.message if managed.conflict is not None else None,
        )

    async def _write(self, record: CatalogRecord) -> None:
        path = catalog_path(record.key)
        last = self._written.get(record.key)
        cas = last[1] if last is not None else 0
        for _ in range(2):
            try:
                stored = await self._port.put_variable(path, record.to_items(), self._home, cas=cas)
            except NomadConflict as conflict:
                cas = int((conflict.current or {}).get("ModifyIndex", 0))
                continue
            except NomadError as error:
                log.warning("could not publish the catalog record of %s: %s", record.key, error)
                return
            self._written[record.key] = (record, int(stored.get("ModifyIndex", 0)))
            return
        log.warning("the catalog record of %s changed twice while being written", record.key)
