"""ClaimStore: every read and check-and-set of claim and request records in Nomad.

The engine (tombstones before a destroy, lost claims, forgetting old tombstones, request
garbage collection) and the claim service (claims, keepalives, releases, requestIds) both
write through here, so the rules of the protocol (controller/claims/__init__.py) are kept
in one place:

- a claim is created with cas=0; every later change is a check-and-set on the
  ModifyIndex last read, and a lost check-and-set is an answer (`None`/`False`), not an
  error: somebody else's change won;
- every record this process writes is remembered, so the next pass takes it from the
  cache instead of reading it back from Nomad; listing re-reads only variables whose
  ModifyIndex moved (Nomad's variable list carries no Items).

Nomad failures other than a lost check-and-set propagate as NomadError.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from controller.core.claims import ClaimRecord, MalformedClaim, RequestRecord
from controller.core.fields import int_field
from controller.core.paths import CLAIMS_PREFIX, REQUESTS_PREFIX, claim_path, request_path
from controller.core.requests import abandoned_requests
from controller.nomad.errors import NomadConflict
from controller.nomad.port import Variables, VariableWatch
from controller.records.reading import Known, listed, read_changed
from controller.records.writing import create, delete_unchanged, index_of

log = logging.getLogger(__name__)


def _decode(namespace: str, path: str, variable: Mapping[str, Any]) -> ClaimRecord | None:
    """A claim variable's record; None (said once per version) when it does not parse."""
    try:
        return ClaimRecord.from_variable(variable)
    except MalformedClaim as error:
        log.warning("claim variable %s in namespace %s is malformed: %s", path, namespace, error)
        return None


class ClaimStore:
    def __init__(self, port: Variables, watcher: VariableWatch | None = None) -> None:
        """`watcher` makes blocking reads (`watch`); a store without one reads again."""
        self._port = port
        self._watcher = watcher
        # Per namespace: claim path -> the claim as last read (None: it did not parse).
        self._caches: dict[str, dict[str, Known[ClaimRecord | None]]] = {}

    # -- claims ------------------------------------------------------------------------

    async def create(self, record: ClaimRecord) -> ClaimRecord | None:
        """Write a new claim or tombstone with cas=0; None when the variable exists (a
        concurrent claimer, or a scale-down, won the runner)."""
        return await self.update(record, cas=0)

    async def update(self, record: ClaimRecord, *, cas: int) -> ClaimRecord | None:
        """Check-and-set `record` over the version with ModifyIndex `cas`; the stored
        record, or None when another change won."""
        try:
            stored = await self._port.put_variable(
                record.path, record.to_items(), record.namespace, cas=cas
            )
        except NomadConflict:
            return None
        # Nomad stored the items as written: only its index and time are new (parsing
        # them back cost a claim more than anything of its own).
        written = record.stored(index_of(stored), int_field(stored, "ModifyTime"))
        self.remember(written)
        return written

    async def delete(self, record: ClaimRecord) -> bool:
        """Delete a claim variable (check-and-set on its ModifyIndex); False when it changed
        meanwhile. A request record its claim carried goes with it."""
        if not await self.withdraw(record):
            return False
        if record.request_id:
            await self._port.delete_variable(request_path(record.request_id), record.namespace)
        return True

    async def withdraw(self, record: ClaimRecord) -> bool:
        """Delete a claim this process wrote and never handed out (check-and-set on its
        index), so the untouched runner is idle again; False when it changed meanwhile.
        Unlike `delete`, the request record stays: it belongs to the request, not to this
        runner."""
        return await delete_unchanged(
            self._port, record.path, record.namespace, record.modify_index
        )

    async def read(self, runner_id: str, namespace: str) -> ClaimRecord | None:
        """The runner's claim as Nomad holds it now, or None when there is none. Raises
        MalformedClaim for a variable that does not parse."""
        variable = await self._port.read_variable(claim_path(runner_id), namespace)
        return None if variable is None else ClaimRecord.from_variable(variable)

    async def watch(self, record: ClaimRecord, within: float) -> ClaimRecord | None:
        """The claim once its variable changes from `record` (or as it is after `within`
        seconds); None once the variable is gone. Raises MalformedClaim."""
        if self._watcher is None:
            return await self.read(record.runner_id, record.namespace)
        variable, _ = await self._watcher.wait_variable(
            record.path, record.namespace, record.modify_index, within
        )
        return None if variable is None else ClaimRecord.from_variable(variable)

    def remember(self, record: ClaimRecord) -> None:
        """A claim variable just written: the next listing need not read it back. Only
        where this store lists the namespace's claims (a reconciler's passes): an API
        replica that never lists them keeps nothing of the claims it made."""
        cache = self._caches.get(record.namespace)
        if cache is not None:
            cache[record.path] = Known(record.modify_index, record)

    async def read_all(
        self,
        namespace: str,
        metas: list[dict[str, Any]] | None = None,
        *,
        within: Sequence[str] | None = None,
    ) -> tuple[dict[str, ClaimRecord], set[str]]:
        """The namespace's claims by runner ID, and the runner IDs of malformed ones,
        reading only the variables that changed since this store last saw them. `metas`
        is the variable list when the caller already has it; `within`: the path prefixes
        that list was narrowed to (what is cached of other paths stays)."""
        if metas is None:
            metas = await self.list(namespace)
        cache = self._caches.setdefault(namespace, {})
        read = await read_changed(
            self._port, namespace, listed(metas), cache, functools.partial(_decode, namespace)
        )
        prefixes = tuple(within) if within is not None else ("",)
        # What is cached of paths outside the list stays (a narrowed list did not see it).
        self._caches[namespace] = read | {
            path: hit for path, hit in cache.items() if not path.startswith(prefixes)
        }
        claims: dict[str, ClaimRecord] = {}
        malformed: set[str] = set()
        for path, hit in read.items():
            runner_id = path.removeprefix(CLAIMS_PREFIX)
            if hit.value is None:
                malformed.add(runner_id)
            else:
                claims[runner_id] = hit.value
        return claims, malformed

    async def list(
        self, namespace: str, prefixes: Sequence[str] | None = None
    ) -> list[dict[str, Any]]:
        """The metadata of the namespace's claim variables; with `prefixes` (runner ID
        prefixes), only of those, each once (one prefix may begin another)."""
        if prefixes is None:
            return await self._port.list_variables(CLAIMS_PREFIX, namespace)
        lists = await asyncio.gather(
            *(self._port.list_variables(CLAIMS_PREFIX + p, namespace) for p in prefixes)
        )
        return list({meta["Path"]: meta for metas in lists for meta in metas}.values())

    # -- request records -----------------------------------------------------------------

    async def create_request(
        self,
        request_id: str,
        namespace: str,
        pools: tuple[str, ...],
        count: int | None,
        served_until: datetime | None = None,
    ) -> tuple[RequestRecord, bool]:
        """Take a requestId (cas=0) for a claim from `pools` (in order) of `count` runners
        (None: one, not a batch). Returns (record, True) when this call took it, or (the
        record Nomad holds, False) when it was taken before; that record may still be
        empty if its writer has only just created it."""
        record = RequestRecord.new(request_id, namespace, pools, count, served_until)
        stored, created = await create(self._port, record.path, record.to_items(), namespace)
        return RequestRecord.from_variable(stored), created

    async def complete_request(
        self, record: RequestRecord, pool: str, runner_ids: tuple[str, ...]
    ) -> None:
        """Note the claimed pool and runners in the request record (check-and-set)."""
        await self._port.put_variable(
            record.path,
            record.completed(pool, runner_ids).to_items(),
            record.namespace,
            cas=record.modify_index,
        )

    async def read_request(self, request_id: str, namespace: str) -> RequestRecord | None:
        variable = await self._port.read_variable(request_path(request_id), namespace)
        return None if variable is None else RequestRecord.from_variable(variable)

    async def drop_request(self, record: RequestRecord) -> bool:
        """Free a requestId whose claim failed, so that a retry claims afresh; False when
        the record changed meanwhile."""
        return await delete_unchanged(
            self._port, record.path, record.namespace, record.modify_index
        )

    async def collect_abandoned_requests(
        self, namespace: str, claims: Iterable[ClaimRecord], now: datetime
    ) -> int:
        """Delete request records that no claim carries and that are too old to belong
        to a claim in flight (a claimer died between the record and the claim); returns
        how many went. A record rewritten meanwhile stays (check-and-set)."""
        metas = await self._port.list_variables(REQUESTS_PREFIX, namespace)
        deleted = 0
        for meta in abandoned_requests(metas, claims, now):
            path = str(meta["Path"])
            if not await delete_unchanged(self._port, path, namespace, index_of(meta)):
                continue  # written again meanwhile: a claim in flight owns it
            log.info("deleted abandoned request record %s in %s", meta["Path"], namespace)
            deleted += 1
        return deleted
