"""The pools' leases in Nomad (core/leases.py): each a variable in the pool's namespace,
held with Nomad's variable lock. Taking, renewing, rewriting and giving back a lock,
watching who holds it, and deleting the variable of a pool that is gone.

Who takes which lease when, and fencing by time, are the engine's (engine/leases.py).
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

from controller.core.leases import LeaseItems
from controller.core.paths import lease_path
from controller.nomad.errors import NomadConflict, NomadError
from controller.nomad.port import Locks, LockTerms, VariableWatch
from controller.records.writing import index_of

log = logging.getLogger(__name__)


class LeasePort(Locks, Protocol):
    """Nomad's locks, and deleting a free lease variable."""

    async def delete_variable(
        self, path: str, namespace: str, *, cas: int | None = None
    ) -> None: ...


class LeaseRecords:
    def __init__(self, port: LeasePort, watcher: VariableWatch, terms: LockTerms) -> None:
        """`watcher` makes the blocking reads (a session whose connections may wait)."""
        self._port = port
        self._watcher = watcher
        self.terms = terms

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
