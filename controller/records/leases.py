"""The pools' leases in Nomad (core/leases.py): each a variable in the pool's namespace,
held with Nomad's variable lock. Taking, renewing, rewriting and giving back a lock,
watching who holds it, and deleting the variable of a pool that is gone.

Who takes which lease when, and fencing by time, are the engine's (engine/leases.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection
from typing import Any, Protocol

from controller.core.catalog import STALE_SECONDS
from controller.core.leases import LeaseItems
from controller.core.paths import LEASES_PREFIX, lease_path
from controller.nomad.errors import NomadConflict, NomadError
from controller.nomad.port import Locks, LockTerms, VariableWatch
from controller.records.writing import index_of

log = logging.getLogger(__name__)


class LeasePort(Locks, Protocol):
    """Nomad's locks, and listing and deleting free lease variables."""

    async def list_variables(self, prefix: str, namespace: str) -> list[dict[str, Any]]: ...

    async def delete_variable(
        self, path: str, namespace: str, *, cas: int | None = None
    ) -> None: ...


class LeaseRecords:
    def __init__(self, port: LeasePort, watcher: VariableWatch, terms: LockTerms) -> None:
        """`watcher` makes the blocking reads (a session whose connections may wait)."""
        self._port = port
        self._watcher = watcher
        self.terms = terms
        self._collected: dict[str, float] = {}  # namespace -> monotonic of the last collection

    async def holder(self, key: str, namespace: str) -> LeaseItems | None:
        """Who the lease's items name (None: no lease variable, or none readable)."""
        return LeaseItems.from_variable(await self._port.read_variable(lease_path(key), namespace))

    async def wait(
        self, key: str, namespace: str, index: int, seconds: float
    ) -> tuple[LeaseItems | None, int]:
        """Block (at most `seconds`) until the lease variable's index moves past `index`;
        who it names then, and its index."""
        variable, seen = await self._watcher.wait_variable(
            lease_path(key), namespace, index, seconds
        )
        return LeaseItems.from_variable(variable), seen

    async def take(self, key: str, namespace: str, items: LeaseItems) -> str | None:
        """Acquire the lock with these items; its lock ID, or None when Nomad refuses it
        (it is held, or in its lock delay)."""
        stored = await self._port.acquire_lock(
            lease_path(key), items.to_items(), namespace, self.terms
        )
        return None if stored is None else _lock_id(stored)

    async def renew(self, key: str, namespace: str, lock_id: str) -> bool:
        """False when the lock is not ours any more; other failures raise."""
        return await self._port.renew_lock(lease_path(key), namespace, lock_id)

    async def rewrite(self, key: str, namespace: str, items: LeaseItems, lock_id: str) -> None:
        """New items under the held lock (the holder reconciles another spec now)."""
        await self._port.write_locked(lease_path(key), items.to_items(), namespace, lock_id)

    async def give_back(self, key: str, namespace: str, lock_id: str) -> None:
        await self._port.release_lock(lease_path(key), namespace, lock_id)

    async def taken(self, key: str, namespace: str, items: LeaseItems) -> bool:
        """Whether Nomad refuses the lock (a live process holds it, or it is in its lock
        delay); a lock it gives is given back at once."""
        lock_id = await self.take(key, namespace, items)
        if lock_id is not None:
            await self.give_back(key, namespace, lock_id)
        return lock_id is None

    async def collect_stale(self, namespace: str, defined: Collection[str]) -> None:
        """Every STALE_SECONDS / 2 per namespace: delete the lease variables of pools no
        live reconciler defines (`defined`: their keys) that nobody holds and nobody wrote
        for STALE_SECONDS (the last process to define the pool died with it). Never
        fails: the next collection tries again."""
        now = time.monotonic()
        if now - self._collected.get(namespace, -STALE_SECONDS) < STALE_SECONDS / 2:
            return
        self._collected[namespace] = now
        live = {lease_path(key) for key in defined}
        try:
            now_ns = time.time_ns()
            for meta in await self._port.list_variables(LEASES_PREFIX, namespace):
                path = str(meta["Path"])
                age = (now_ns - int(meta.get("ModifyTime", now_ns))) / 1e9
                if path in live or age < STALE_SECONDS:
                    continue
                variable = await self._port.read_variable(path, namespace)
                if variable is None or variable.get("Lock"):
                    continue  # a renewal writes nothing: a held lease may look old
                try:
                    await self._port.delete_variable(path, namespace, cas=index_of(variable))
                except NomadConflict:
                    continue  # taken or written again meanwhile
                log.info("deleted the lease %s of a pool defined nowhere (%.0f s old)", path, age)
        except NomadError as error:
            log.warning("collecting the leases of pools defined nowhere: %s", error)

    async def forget(self, key: str, namespace: str) -> None:
        """Delete the lease variable of a pool that is gone from this process, unless a
        lock holds it (another process defines the pool still) or it changed since it
        was read. Never fails: a variable left behind only names an old holder."""
        path = lease_path(key)
        try:
            variable = await self._port.read_variable(path, namespace)
            if variable is not None and not variable.get("Lock"):
                await self._port.delete_variable(path, namespace, cas=index_of(variable))
        except NomadConflict:
            pass  # taken or written again meanwhile: another process's now
        except NomadError as error:
            log.warning("could not delete the lease of pool %s: %s", key, error)


def _lock_id(stored: dict[str, Any]) -> str:
    """The lock ID in the variable an acquisition stored."""
    return str((stored.get("Lock") or {}).get("ID", ""))
