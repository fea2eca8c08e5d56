"""Taking idle runners: one, or a batch of one pool (all or nothing), from the first pool
of a list that has them, waiting for runners when the request allows it.

Runners are handed out by one `Handout` per pool (core/handout.py): in the offer's order
(current template first), each runner once, so concurrent claims of this process never
try one runner twice, and a runner whose check-and-set was lost is dropped, never tried
again while the offer lists it. An API replica takes from its own slice of the offer
first (the live replicas split it by rendezvous hashing), so replicas claim different
runners until a slice is empty; a process outside the replicas takes at random.

How stale an offer may be: it is what the pool's last pass observed, so it is at most one
pass old; a runner whose job Nomad reported changed (an event) after that pass's
observation began is not handed out until a pass has seen it again (`unsettled`: a claim
written meanwhile is given back), so a runner whose job went is never handed out from
an offer older than the event. Only a change Nomad sends no event about (the event stream
down) can make an offer older than the job: then it is at most the resync period and a
pass old, and the next pass ends such a claim as lost. Events reach the pool's lease
holder only: an API replica's offer is the holder's last published one (which leaves such
runners out), so there an event counts from the holder's next pass and the follow.

A claim that finds nothing waits for the pool's next offer (at most NEXT_OFFER_SECONDS)
rather than answer PoolEmpty where the offer cannot tell: it lists only some of the
pool's idle runners (the API tier's catalog caps it), it was made before this process
last failed to read Nomad (not `current`), it held back unsettled runners, or it passed
over runners of another replica's slice that a lost check-and-set showed taken.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime

from controller.core.claims import ClaimRecord
from controller.core.demand import start_items
from controller.core.handout import RANDOM, Claimers, Handout
from controller.core.offers import Offered
from controller.directory.view import PoolDirectory, PoolEntry
from controller.errors import ErrorCode, ServiceError
from controller.metrics import Metrics
from controller.nomad.errors import NomadError
from controller.records.claims import ClaimStore

log = logging.getLogger(__name__)

# The longest a claim waits for a pool's next offer when this process took every runner
# of a capped one (the pool has others): about a pass over 50,000 runners and its record.
NEXT_OFFER_SECONDS = 5.0


@dataclass(frozen=True)
class Ask:
    """What a claim request asks of its pools (in order of preference)."""

    entries: tuple[PoolEntry, ...]
    inactivity: dict[str, int]  # pool key -> the claims' inactivity timeout
    count: int | None  # None: one runner, answered as a claim; else a batch
    wait_seconds: float

    @property
    def runners(self) -> int:
        return self.count or 1


class Taker:
    def __init__(
        self,
        directory: PoolDirectory,
        store: ClaimStore,
        metrics: Metrics,
        rng: random.Random | None = None,
        claimers: Callable[[], Claimers] = lambda: RANDOM,
    ) -> None:
        """`claimers`: this process and the live API replicas, whose slices of the
        offers it takes from (core/handout.py)."""
        self.directory = directory
        self.store = store
        self.metrics = metrics
        self.rng = rng or random.Random()
        self.claimers = claimers
        self._handouts: dict[str, Handout] = {}  # by pool key

    async def take(self, ask: Ask, request_id: str | None) -> list[ClaimRecord]:
        """The runners asked for, of the first pool that has them, waiting (at most
        `wait_seconds`) for an offer of any of the pools while none has. A request that
        waits says so to the first pool, its preference: the demand estimate counts it
        (core/demand.py), and its reconciler looks at once to raise the target."""
        entries, count, inactivity = ask.entries, ask.runners, ask.inactivity
        deadline = time.monotonic() + ask.wait_seconds
        records = await self._take_first(entries, count, inactivity, request_id)
        if records is None:
            records = await self._take_beyond_offers(ask, request_id)
        if records is None and ask.wait_seconds > 0:
            preferred = entries[0]
            with preferred.waiting.counted(self.directory.clock(), count) as waiting:
                self.directory.runners_taken(preferred)
                while records is None and (remaining := deadline - time.monotonic()) > 0:
                    await self._wait_for_any(entries, remaining)
                    records = await self._take_first(entries, count, inactivity, request_id)
                waiting.answered = records is not None and records[0].pool == preferred.key
        if records is None:
            names = ", ".join(entry.key for entry in entries)
            if not any(entry.current for entry in entries):
                # Not "empty": this process has not read the pools since Nomad answered.
                raise ServiceError(
                    ErrorCode.NOMAD_UNAVAILABLE,
                    f"not read from Nomad yet, or not since it failed to answer: {names}",
                )
            wanted = "an idle runner" if count == 1 else f"{count} idle runners"
            raise ServiceError(ErrorCode.POOL_EMPTY, f"no pool has {wanted}: {names}")
        return records

    async def _take_first(
        self,
        entries: Sequence[PoolEntry],
        count: int,
        inactivity: dict[str, int],
        request_id: str | None,
    ) -> list[ClaimRecord] | None:
        """`count` runners of the first pool (in order) that has them, or None."""
        for key in [entry.key for entry in entries]:
            entry = self.directory.pools.get(key)  # its offer as it is now
            if entry is None:
                continue
            records = await self._take_from(entry, count, inactivity[key], request_id)
            if records:
                self.directory.runners_taken(entry)
                return records
        return None

    async def _take_beyond_offers(
        self, ask: Ask, request_id: str | None
    ) -> list[ClaimRecord] | None:
        """Where a pool's offer cannot tell that it is empty (see the module's docstring),
        its reconciler offers what it has after its next pass: wait for that (at most
        NEXT_OFFER_SECONDS) rather than answer that the pool is empty."""
        deadline = time.monotonic() + NEXT_OFFER_SECONDS
        while (remaining := deadline - time.monotonic()) > 0:
            undecided = [
                entry
                for entry in (self.directory.pools.get(e.key) for e in ask.entries)
                if entry is not None
                and (
                    entry.more_than_offered
                    or not entry.current
                    or entry.unsettled & entry.offer.runner_ids  # held back
                    or self._passed_over(entry)
                )
            ]
            if not undecided:
                return None
            for entry in undecided:
                self.directory.runners_taken(entry)  # its reconciler looks now
            await self._wait_for_any(undecided, remaining)
            records = await self._take_first(ask.entries, ask.runners, ask.inactivity, request_id)
            if records is not None:
                return records
        return None

    def _passed_over(self, entry: PoolEntry) -> bool:
        """Runners of the pool's offer were passed over as another replica's, taken."""
        handout = self._handouts.get(entry.key)
        return handout is not None and handout.passed_over

    async def _wait_for_any(self, entries: Sequence[PoolEntry], within: float) -> None:
        waits = [
            asyncio.ensure_future(self.directory.wait_for_offer(entry.key, within))
            for entry in entries
        ]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()

    async def _take_from(
        self, entry: PoolEntry, count: int, inactivity: int, request_id: str | None
    ) -> list[ClaimRecord]:
        """`count` runners of one pool, or none: runners taken before the pool ran out are
        given back at once (their claims deleted again, so they are idle again)."""
        handout = self._handout(entry)
        if len(handout) < count:
            return []  # cannot succeed: take nothing rather than take and give back
        taken: list[ClaimRecord] = []
        # A batch is claimed at one moment: the demand estimate takes it for one arrival
        # of `count` claims, not for claims a few milliseconds apart (core/demand.py).
        claimed_at = self.directory.clock()
        try:
            while (offered := handout.take(entry.unsettled)) is not None:
                offer = handout.offer
                claim = _new_claim(entry, offered, inactivity, request_id, claimed_at)
                record = await self.store.create(claim)
                if record is None:  # another claimer (or a scale-down) won this runner
                    self.metrics.claim_conflicts.labels(pool=entry.key).inc()
                    handout.lost(offered.runner_id, offer)
                elif record.runner_id in entry.unsettled:
                    await self._give_back(entry, [record])  # its job changed meanwhile
                else:
                    taken.append(record)
                    if len(taken) == count:
                        return taken
                handout = self._handout(entry)  # its offer may have changed meanwhile
        except BaseException:
            await self._give_back(entry, taken)
            raise
        await self._give_back(entry, taken)
        return []

    def _handout(self, entry: PoolEntry) -> Handout:
        """The pool's handout, made of its offer as the directory holds it now."""
        handout = self._handouts.get(entry.key)
        if handout is None:
            handout = self._handouts[entry.key] = Handout(self.rng)
        latest = self.directory.pools.get(entry.key, entry)
        handout.refresh(latest.offer, self.claimers())
        return handout

    async def _give_back(self, entry: PoolEntry, records: Sequence[ClaimRecord]) -> None:
        """Delete claims this process wrote and never handed out (check-and-set), so the
        runners are idle again and offered again."""
        for record in records:
            try:
                if await self.store.withdraw(record):
                    self._handout(entry).give_back(record.runner_id)
                    continue
                log.warning("claim %s changed before it could be given back", record.path)
            except NomadError as error:
                # The claim stays until its inactivity timeout ends it.
                log.warning("could not give back claim %s: %s", record.path, error)


def _new_claim(
    entry: PoolEntry,
    offered: Offered,
    inactivity: int,
    request_id: str | None,
    claimed_at: datetime,
) -> ClaimRecord:
    record = ClaimRecord.new(
        runner_id=offered.runner_id,
        namespace=entry.namespace,
        pool=entry.key,
        allocation_id=offered.allocation_id,
        now=claimed_at,
        inactivity_timeout_seconds=inactivity,
        request_id=request_id,
        allocation_restarts=offered.allocation_restarts,
        node_name=offered.node_name,
    )
    if offered.start is not None:
        # The runner's start outlives it in the claim, for the demand estimate.
        record = dataclasses.replace(record, extra=start_items(offered.start))
    return record
