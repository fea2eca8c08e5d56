"""Claims with a requestId: idempotent across retries and processes (rule 4 and 6 of
claims/__init__.py). The request record is taken first (cas=0); whoever finds it taken
answers with the claims it names, or, while it is still empty, with the live claims
carrying the requestId."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from datetime import timedelta

from controller.claims.runners import gone, read_claim
from controller.claims.taking import Ask, Taker
from controller.core.claims import ClaimRecord, RequestRecord
from controller.directory.view import PoolEntry
from controller.errors import ErrorCode, ServiceError
from controller.nomad.errors import NomadError
from controller.records.claims import ClaimStore

log = logging.getLogger(__name__)

REQUEST_RECORD_WAIT_SECONDS = 2.0
# A claimer answers within its wait and this: a record still empty after it belongs to a
# claimer that died (a replica killed between its record and its claim), and a repeat
# takes it over rather than waiting for its collection.
ANSWER_GRACE_SECONDS = 10.0


class RequestIds:
    def __init__(self, taker: Taker, store: ClaimStore) -> None:
        self.taker = taker
        self.store = store
        self._background: set[asyncio.Task[None]] = set()

    async def take(self, ask: Ask, request_id: str) -> tuple[list[ClaimRecord], bool]:
        """The claims of this request: taken now (True), or those an earlier request with
        the same requestId took (False)."""
        namespace = one_namespace(ask.entries)
        keys = tuple(entry.key for entry in ask.entries)
        served_until = self.taker.directory.clock() + timedelta(
            seconds=ask.wait_seconds + ANSWER_GRACE_SECONDS
        )
        record, created = await self.store.create_request(
            request_id, namespace, keys, ask.count, served_until
        )
        if not created:
            return await self._answer_repeated(ask, request_id, record)
        try:
            records = await self.taker.take(ask, request_id)
        except (ServiceError, NomadError):
            # Nothing was claimed: free the request ID so a retry can claim afresh.
            await self._drop_request(record)
            raise
        runner_ids = tuple(r.runner_id for r in records)
        if ask.count is None:
            self._complete_in_background(record, records[0].pool, runner_ids)
        else:
            # A batch waits for its record: a repeat can then answer it whole.
            with contextlib.suppress(NomadError):
                await self.store.complete_request(record, records[0].pool, runner_ids)
        return records, True

    def _complete_in_background(
        self, record: RequestRecord, pool: str, runner_ids: tuple[str, ...]
    ) -> None:
        """Complete the request record off the claim path: a crash before it lands is
        repaired by whoever finds the record, from the claim carrying the requestId."""

        async def complete() -> None:
            try:
                await self.store.complete_request(record, pool, runner_ids)
            except NomadError as error:
                log.warning("could not complete request record %s: %s", record.path, error)

        task = asyncio.get_running_loop().create_task(complete())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def drain(self) -> None:
        """Let background completions finish (graceful stop, tests)."""
        await asyncio.gather(*self._background, return_exceptions=True)

    async def _drop_request(self, record: RequestRecord) -> None:
        try:
            await self.store.drop_request(record)
        except NomadError as error:
            log.warning("could not drop request record %s: %s", record.path, error)

    async def _answer_repeated(
        self, ask: Ask, request_id: str, found: RequestRecord
    ) -> tuple[list[ClaimRecord], bool]:
        """The claims an earlier request took (False), or new ones (True) where the record
        was dropped or abandoned."""
        namespace = one_namespace(ask.entries)
        asked = (tuple(entry.key for entry in ask.entries), ask.count)
        deadline = time.monotonic() + REQUEST_RECORD_WAIT_SECONDS
        current: RequestRecord | None = found if found.pool else None
        while True:
            if current is None:
                current = await self.store.read_request(request_id, namespace)
                if current is None:  # dropped by a claimer that found no runner: start over
                    return await self.take(ask, request_id)
            if current.asked != asked:
                raise ServiceError(
                    ErrorCode.REQUEST_ID_CONFLICT,
                    f"requestId {request_id} was used for another request "
                    f"(pools {', '.join(current.asked[0])}, count {current.count or 1})",
                )
            carried = () if current.runner_ids else await self._carried(namespace, request_id)
            runner_ids = current.runner_ids or (carried if len(carried) == ask.runners else ())
            if runner_ids:
                records = [await self._still_claimed(r, namespace) for r in runner_ids]
                return records, False
            if not carried and current.abandoned(self.taker.directory.clock()):
                # Its claimer died before claiming: take the request over (check-and-set,
                # so of two repeats one does), then claim afresh.
                if await self.store.drop_request(current):
                    log.info("request %s: its claimer never answered; taken over", request_id)
                return await self.take(ask, request_id)
            if time.monotonic() >= deadline:
                raise ServiceError(
                    ErrorCode.NOMAD_UNAVAILABLE,
                    f"request {request_id} is still being served elsewhere; retry",
                )
            await asyncio.sleep(0.05)
            current = None

    async def _still_claimed(self, runner_id: str, namespace: str) -> ClaimRecord:
        record = await read_claim(self.store, runner_id, namespace)
        if record is None:
            raise ServiceError(
                ErrorCode.RUNNER_GONE, f"runner {runner_id} is gone", reason="Released"
            )
        if record.is_tombstone:
            raise gone(record)
        return record

    async def _carried(self, namespace: str, request_id: str) -> tuple[str, ...]:
        """The runners whose claims carry this requestId (claims read through the store's
        cache, so only changed variables are read); a batch may still be being claimed."""
        claims, _ = await self.store.read_all(namespace)
        return tuple(sorted(c.runner_id for c in claims.values() if c.request_id == request_id))


def one_namespace(entries: Sequence[PoolEntry]) -> str:
    """The Nomad namespace of every pool of a request with a requestId (request IDs are
    unique per Nomad namespace, so its pools must share one)."""
    namespaces = {entry.namespace for entry in entries}
    if len(namespaces) > 1:
        raise ServiceError(
            ErrorCode.INVALID_REQUEST,
            "with requestId every pool must be in the same Nomad namespace; "
            f"these are in {', '.join(sorted(namespaces))}",
        )
    return namespaces.pop()
