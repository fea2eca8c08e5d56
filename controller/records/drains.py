"""Drain records in Nomad (core/drains.py), in the controllers' own namespace: written
when a removal begins, read when a controller starts, deleted when the pool is drained
or defined again."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from controller.core.drains import DrainRecord
from controller.core.paths import DRAINS_PREFIX, drain_path
from controller.nomad.port import Variables
from controller.records.reading import Known, Listing
from controller.records.writing import create, delete_unchanged, index_of

log = logging.getLogger(__name__)


def _decode(path: str, variable: Mapping[str, Any]) -> DrainRecord | None:
    try:
        return DrainRecord.from_items(variable.get("Items") or {})
    except (KeyError, ValueError) as error:
        log.warning("ignoring malformed drain record %s: %s", path, error)
        return None


class DrainRecords:
    def __init__(self, port: Variables, home_namespace: str) -> None:
        self._port = port
        self._home = home_namespace
        self._listing = Listing(port, DRAINS_PREFIX, home_namespace, _decode)

    async def read(self) -> list[Known[DrainRecord]]:
        """The drains recorded now (malformed ones logged and left out)."""
        known = await self._listing.read()
        return [Known(hit.index, hit.value) for hit in known.values() if hit.value is not None]

    async def record(self, drain: DrainRecord) -> int:
        """Record a removal that began (one recorded before stays); its ModifyIndex."""
        stored, _ = await create(self._port, drain_path(drain.key), drain.to_items(), self._home)
        return index_of(stored)

    async def drop(self, key: str, index: int) -> None:
        """Delete a pool's drain record unless it changed since `index`."""
        await delete_unchanged(self._port, drain_path(key), self._home, index)
