"""The catalog in Nomad (core/catalog.py): each pool's record as its lease holder
publishes it for the API tier, in the controllers' own namespace.

Writes are check-and-set on the index this process last wrote (or read, after a lost
one): a record another holder wrote meanwhile is written over once, never deleted by
mistake. A pool that goes from this process takes its record along, and records nobody
has published for STALE_SECONDS are deleted by any reconciler, so what a dead process
published ends. Readers follow the catalog with the one blocking-list follower.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, TypeVar

from controller.core.catalog import STALE_SECONDS, CatalogRecord
from controller.core.paths import CATALOG_PREFIX, catalog_path
from controller.nomad.errors import NomadError
from controller.nomad.port import VariableLists, Variables
from controller.records.reading import Follower, Known, read_changed
from controller.records.writing import delete_unchanged, index_of, write_over

log = logging.getLogger(__name__)

T = TypeVar("T")


class CatalogRecords:
    def __init__(
        self,
        port: Variables,
        watcher: VariableLists,
        home_namespace: str,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._port = port
        self._watcher = watcher
        self._home = home_namespace
        self._monotonic = monotonic
        self.written: dict[str, tuple[CatalogRecord, int]] = {}  # key -> record, its index
        self._collected = monotonic()

    def follower(
        self,
        on_list: Callable[[dict[str, int]], Awaitable[None]],
        wanted: Callable[[], bool] = lambda: True,
    ) -> Follower:
        """A follower of the catalog (it reads nothing until started)."""
        return Follower(
            self._watcher,
            CATALOG_PREFIX,
            self._home,
            on_list,
            what="the catalog of pools",
            wanted=wanted,
        )

    async def read_changed(
        self,
        present: Mapping[str, int],
        known: Mapping[str, Known[T]],
        decode: Callable[[str, Mapping[str, Any]], T],
    ) -> dict[str, Known[T]]:
        """The records a follower's list names, read again where they changed."""
        return await read_changed(self._port, self._home, present, known, decode)

    async def write(self, record: CatalogRecord) -> None:
        """Publish a pool's record. A failed write is logged: the next pass tries again."""
        last = self.written.get(record.key)
        try:
            stored, _ = await write_over(
                self._port,
                catalog_path(record.key),
                record.to_items(),
                self._home,
                cas=last[1] if last is not None else 0,
                attempts=2,
            )
        except NomadError as error:
            log.warning("could not publish the catalog record of %s: %s", record.key, error)
            return
        if stored is None:
            log.warning("the catalog record of %s changed twice while being written", record.key)
            return
        self.written[record.key] = (record, index_of(stored))

    async def withdraw(self, keys: Iterable[str]) -> None:
        """Delete the records of pools that went from this process (drained, removed); one
        another holder wrote since is theirs and stays."""
        for key in keys:
            written = self.written.pop(key, None)
            if written is None:
                continue
            try:
                await delete_unchanged(self._port, catalog_path(key), self._home, written[1])
            except NomadError as error:
                log.warning("could not delete the catalog record of %s: %s", key, error)

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
                path = str(meta["Path"])
                variable = await self._port.read_variable(path, self._home)
                items = (variable or {}).get("Items") or {}
                if items.get("pool") in defined:
                    continue
                if await delete_unchanged(self._port, path, self._home, index_of(meta)):
                    log.info("deleted the stale catalog record %s (%.0f s old)", path, age)
        except NomadError as error:
            log.warning("collecting stale catalog records: %s", error)
