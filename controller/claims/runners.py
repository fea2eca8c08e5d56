"""A claimed runner's claim, as the runner routes serve it: read, kept alive, released,
retired, watched. Every change is a check-and-set (claims/__init__.py); a claim that
changed under a change is read again and decided afresh, at most CAS_ATTEMPTS times.

Runner routes answer for runners with a live claim, or a tombstone (410 with its reason),
in a known pool's Nomad namespace; any other ID is 404. Any Nomad failure becomes a 503
`NomadUnavailable` for the client to retry, never a 500.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from controller.core.claims import ClaimRecord, ClaimState, MalformedClaim
from controller.core.runner_ids import RUNNER_ID_PATTERN, is_runner_id
from controller.directory.view import PoolDirectory, PoolEntry
from controller.errors import ErrorCode, ServiceError
from controller.metrics import Metrics
from controller.nomad.errors import NomadError
from controller.records.claims import ClaimStore

log = logging.getLogger(__name__)

# How often a keepalive or release re-reads a claim that changed under it before giving up.
CAS_ATTEMPTS = 5


def gone(record: ClaimRecord) -> ServiceError:
    reason = record.gone_reason
    return ServiceError(
        ErrorCode.RUNNER_GONE, f"runner {record.runner_id} is gone: {reason}", reason=reason
    )


def unavailable(error: NomadError | str) -> ServiceError:
    return ServiceError(ErrorCode.NOMAD_UNAVAILABLE, f"Nomad did not answer: {error}")


def changing(runner_id: str) -> ServiceError:
    return ServiceError(ErrorCode.NOMAD_UNAVAILABLE, f"runner {runner_id} changed too often; retry")


async def read_claim(store: ClaimStore, runner_id: str, namespace: str) -> ClaimRecord | None:
    """The runner's claim as Nomad holds it now; a variable that does not parse is 404."""
    try:
        return await store.read(runner_id, namespace)
    except MalformedClaim:
        raise ServiceError(
            ErrorCode.RUNNER_NOT_FOUND, "the runner's claim cannot be read"
        ) from None


class RunnerClaims:
    def __init__(self, directory: PoolDirectory, store: ClaimStore, metrics: Metrics) -> None:
        self.directory = directory
        self.store = store
        self.metrics = metrics
        # Told whenever this process turns a live claim into a tombstone (release,
        # retirement, expiry found by a keepalive): runner ID and the tombstone's state.
        self.claim_ended: list[Callable[[str, ClaimState], None]] = []

    def pool_of_runner(self, runner_id: str) -> PoolEntry:
        """The pool a runner ID belongs to (by its job prefix), before anything is read;
        404 RunnerNotFound for an ID no known pool has."""
        if not RUNNER_ID_PATTERN.match(runner_id):
            raise ServiceError(ErrorCode.RUNNER_NOT_FOUND, f"runner {runner_id[:80]} is not known")
        why = self.directory.available()  # its pool may be one not read yet
        if why is not None:
            raise unavailable(why)
        entry = self.directory.pool_for_runner(runner_id)
        if entry is None:
            raise ServiceError(ErrorCode.RUNNER_NOT_FOUND, f"runner {runner_id} is not known")
        return entry

    async def _read_claim(self, runner_id: str) -> tuple[PoolEntry, ClaimRecord]:
        entry = self.pool_of_runner(runner_id)
        try:
            record = await read_claim(self.store, runner_id, entry.namespace)
        except NomadError as error:
            raise unavailable(error) from None
        if record is None or record.pool not in self.directory.pools:
            raise ServiceError(ErrorCode.RUNNER_NOT_FOUND, f"runner {runner_id} is not claimed")
        return entry, record

    async def get(self, runner_id: str) -> ClaimRecord:
        _, record = await self._read_claim(runner_id)
        if record.is_tombstone:
            raise gone(record)
        return record

    async def keepalive(self, runner_id: str) -> ClaimRecord:
        return await self.renew(await self.live(runner_id))

    async def live(self, runner_id: str) -> ClaimRecord:
        """The runner's live claim as Nomad holds it now: 404 RunnerNotFound, or 410
        RunnerGone for a tombstone or a claim past its deadline (which becomes an
        `expired` tombstone)."""
        for _ in range(CAS_ATTEMPTS):
            _, record = await self._read_claim(runner_id)
            if record.is_tombstone:
                raise gone(record)
            if not record.is_expired(self.directory.clock()):
                return record
            await self._end(record, ClaimState.EXPIRED)  # then read again: ours or another's
        raise changing(runner_id)

    async def renew(self, record: ClaimRecord, *, past_deadline: bool = False) -> ClaimRecord:
        """Move a claim's deadline to now + its inactivity timeout (check-and-set on
        `record`; a claim that changed meanwhile is read again). A claim past its deadline
        becomes an `expired` tombstone (410) unless `past_deadline`: activity of this
        process (a running execution) kept it alive, and only a tombstone ends it."""
        for _ in range(CAS_ATTEMPTS):
            if record.is_tombstone:
                raise gone(record)
            now = self.directory.clock()
            if record.is_expired(now) and not past_deadline:
                record = await self.live(record.runner_id)  # expires it, or finds it renewed
                continue
            stored = await self._cas(record.kept_alive(now), record.modify_index)
            if stored is not None:
                return stored
            _, record = await self._read_claim(record.runner_id)
        raise changing(record.runner_id)

    async def release(self, runner_id: str) -> None:
        """The client is done: a `released` tombstone, and the runner is destroyed."""
        await self._finish(runner_id, ClaimState.RELEASED)

    async def retire(self, runner_id: str) -> None:
        """The controller gives up a claimed runner it cannot trust any more (an
        execution it could not stop): a `retired` tombstone, and the runner is destroyed."""
        await self._finish(runner_id, ClaimState.RETIRED)

    async def watch(self, record: ClaimRecord, within: float) -> ClaimRecord | None:
        """The claim once it changes from `record` (a renewal elsewhere, a tombstone), or
        as it is after `within` seconds; None once its variable is gone."""
        try:
            return await self.store.watch(record, within)
        except MalformedClaim:
            return None

    async def _finish(self, runner_id: str, state: ClaimState) -> None:
        for _ in range(CAS_ATTEMPTS):
            record = await self.live(runner_id)
            if await self._cas(record.with_state(state), record.modify_index):
                self._ended(runner_id, state)
                await self.directory.runner_ended(self.pool_of_runner(runner_id), runner_id, state)
                return
        raise changing(runner_id)

    def _ended(self, runner_id: str, state: ClaimState) -> None:
        for listener in self.claim_ended:
            listener(runner_id, state)

    async def _end(self, record: ClaimRecord, state: ClaimState) -> None:
        if await self._cas(record.with_state(state), record.modify_index):
            self._ended(record.runner_id, state)
            entry = self.directory.pools.get(record.pool)
            if entry is not None:
                await self.directory.runner_ended(entry, record.runner_id, state)

    async def _cas(self, record: ClaimRecord, index: int) -> ClaimRecord | None:
        try:
            return await self.store.update(record, cas=index)
        except NomadError as error:
            raise unavailable(error) from None

    async def pool_claims(self, namespace: str, name: str) -> list[ClaimRecord]:
        """The pool's live claims, oldest first."""
        key = f"{namespace}/{name}"
        why = self.directory.available()
        if why is not None:
            raise unavailable(why)
        entry = self.directory.pools.get(key)
        if entry is None:
            raise ServiceError(ErrorCode.POOL_NOT_FOUND, f"pool {key} is not known")
        try:
            claims, _ = await self.store.read_all(entry.namespace)
        except NomadError as error:
            raise unavailable(error) from None
        return [
            c
            for c in sorted(claims.values(), key=lambda c: c.claimed_at)
            if c.pool == key and not c.is_tombstone and is_runner_id(entry.job_prefix, c.runner_id)
        ]
