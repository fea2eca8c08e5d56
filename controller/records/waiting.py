"""Waiting claim requests across processes (core/catalog.py, WaitingRecord).

An API replica publishes the requests it holds waiting in its own waiting record: at once
when they change (at most every RING_SECONDS), again every REFRESH_SECONDS while any
wait (each write moves the record's expiry), then rings the doorbell. A reconciler reads
every replica's record when the doorbell rings and on its resync; an expired record
counts for nothing, and one expired for long is deleted, so a replica that died leaves
nothing that counts.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import Any, Final

from controller.core.catalog import (
    WAITING,
    WAITING_TTL_SECONDS,
    CatalogError,
    WaitingRecord,
    waiting_expiry,
)
from controller.core.paths import WAITING_PREFIX, waiting_path
from controller.core.waiting import WaitingClaims
from controller.nomad.errors import NomadError
from controller.nomad.port import Variables
from controller.records.doorbell import RING_SECONDS, Doorbell
from controller.records.reading import Listing
from controller.records.writing import delete_unchanged

log = logging.getLogger(__name__)

REFRESH_SECONDS: Final = WAITING_TTL_SECONDS / 3
# An expired record is deleted once it has been expired this long.
FORGET_AFTER: Final = timedelta(seconds=60)


class WaitingPublisher:
    def __init__(
        self,
        port: Variables,
        home_namespace: str,
        replica: str,
        clock: Callable[[], datetime],
        doorbell: Doorbell,
    ) -> None:
        self._port = port
        self._home = home_namespace
        self._replica = replica
        self._clock = clock
        self._doorbell = doorbell
        self._pools: dict[str, WaitingClaims] = {}
        self._task: asyncio.Task[None] | None = None
        self._dirty = False
        self._written = False

    def follow(self, key: str, waiting: WaitingClaims) -> None:
        """Publish this pool's waiting requests from now on."""
        self._pools[key] = waiting
        waiting.on_change = self._changed

    def _changed(self) -> None:
        self._dirty = True
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._publish())

    async def _publish(self) -> None:
        try:
            while self._dirty or self._waiting():
                self._dirty = False
                await self._write()
                self._doorbell.ring(WAITING)
                # While requests wait, write again before the record expires.
                for _ in range(int(REFRESH_SECONDS / RING_SECONDS)):
                    await asyncio.sleep(RING_SECONDS)
                    if self._dirty:
                        break
        finally:
            self._task = None

    def _waiting(self) -> bool:
        return any(w.arrivals for w in self._pools.values())

    async def _write(self) -> None:
        record = WaitingRecord(
            self._replica,
            {k: tuple(w.arrivals) for k, w in self._pools.items() if w.arrivals},
            {k: w.abandoned_total for k, w in self._pools.items() if w.abandoned_total},
            waiting_expiry(self._clock()),
        )
        try:
            await self._port.put_variable(
                waiting_path(self._replica), record.to_items(), self._home, cas=None
            )
            self._written = True
        except NomadError as error:
            log.warning("could not publish the waiting claim requests: %s", error)

    async def close(self) -> None:
        """Stop publishing and delete the record: nothing of this replica waits any more."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._written:
            with contextlib.suppress(NomadError):
                await self._port.delete_variable(waiting_path(self._replica), self._home)


class WaitingReader:
    """A reconciler's view of every replica's waiting record."""

    def __init__(self, port: Variables, home_namespace: str, clock: Callable[[], datetime]):
        self._port = port
        self._home = home_namespace
        self._clock = clock
        self._records = Listing(port, WAITING_PREFIX, home_namespace, _decode)

    async def read(self) -> list[WaitingRecord]:
        """The records as Nomad holds them now (only changed ones are read again)."""
        known = await self._records.read()
        now = self._clock()
        for path, hit in known.items():
            if hit.value is not None and now - hit.value.expires_at > FORGET_AFTER:
                await delete_unchanged(self._port, path, self._home, hit.index)
        return [hit.value for hit in known.values() if hit.value is not None]


def _decode(path: str, variable: Mapping[str, Any]) -> WaitingRecord | None:
    try:
        return WaitingRecord.from_items(variable.get("Items") or {})
    except CatalogError as error:
        log.warning("waiting record %s ignored: %s", path, error)
        return None
