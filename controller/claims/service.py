"""ClaimService: claims as the API serves them, over the claim protocol of
controller/claims/__init__.py: from one pool or the first of a list that has idle
runners, one runner or a batch, with or without a requestId. Pools are read through the
directory (controller/directory); the answer is the claim records, which the API and the
Poseidon API render each in their own words.

Any Nomad failure becomes a 503 `NomadUnavailable` for the client to retry, never a 500.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from controller.claims.outcomes import ClaimOutcome, pool_label
from controller.claims.requests import RequestIds
from controller.claims.runners import unavailable
from controller.claims.taking import Ask, Taker
from controller.core.claims import ClaimRecord
from controller.core.handout import RANDOM, Claimers
from controller.directory.view import PoolDirectory, PoolEntry
from controller.errors import ErrorCode, ServiceError
from controller.metrics import Metrics
from controller.nomad.errors import NomadError
from controller.records.claims import ClaimStore

MAX_WAIT_SECONDS = 30.0


@dataclass(frozen=True)
class ClaimRequest:
    inactivity_timeout_seconds: int | None = None
    request_id: str | None = None
    wait_seconds: float = 0.0
    # None: one runner, answered as a claim; a number: a batch of that many runners of
    # one pool, all or nothing, answered as {"claims": [...]}.
    count: int | None = None


@dataclass(frozen=True)
class Claimed:
    records: list[ClaimRecord]
    created: bool  # False: an earlier request with this requestId is answered again


class ClaimService:
    def __init__(
        self,
        directory: PoolDirectory,
        store: ClaimStore,
        metrics: Metrics,
        *,
        rng: random.Random | None = None,
        claimers: Callable[[], Claimers] = lambda: RANDOM,
    ) -> None:
        """`claimers`: this process and the live API replicas (controller/claims/taking.py)."""
        self.directory = directory
        self.metrics = metrics
        self.taker = Taker(directory, store, metrics, rng, claimers)
        self.request_ids = RequestIds(self.taker, store)

    async def claim(self, namespace: str, name: str, request: ClaimRequest) -> Claimed:
        """Claim from one pool; see claim_from."""
        return await self.claim_from((f"{namespace}/{name}",), request)

    async def claim_from(self, keys: Sequence[str], request: ClaimRequest) -> Claimed:
        """Claim from the first of the pools (in order) that has idle runners: one runner,
        or a batch of `count` runners of one pool, all or nothing. With `wait_seconds` it
        waits for runners in any of them."""
        started = time.perf_counter()
        outcome, pool = ClaimOutcome.NOMAD_ERROR, keys[0]
        try:
            entries = tuple(self._claimable_pool(key) for key in keys)
            ask = Ask(
                entries,
                {entry.key: _inactivity_seconds(entry, request) for entry in entries},
                request.count,
                request.wait_seconds,
            )
            if request.request_id is None:
                records, created = await self.taker.take(ask, None), True
            else:
                records, created = await self.request_ids.take(ask, request.request_id)
            pool = records[0].pool
            outcome = ClaimOutcome.CLAIMED if created else ClaimOutcome.REPEATED
            return Claimed(records, created)
        except ServiceError as error:
            outcome = ClaimOutcome.of(error)
            raise
        except NomadError as error:
            # Whatever Nomad failed at (a read while answering a repeated requestId, an
            # unexpected conflict), the client gets a 503 to retry, never a 500.
            raise unavailable(error) from None
        finally:
            label = pool_label(pool, pool in self.directory.pools)
            duration = time.perf_counter() - started
            self.metrics.claim_answered(label, outcome.answers.result, duration)

    async def drain(self) -> None:
        """Let background work finish (graceful stop, tests)."""
        await self.request_ids.drain()

    def _claimable_pool(self, key: str) -> PoolEntry:
        why = self.directory.available()  # an unknown pool may be one not read yet
        if why is not None:
            raise unavailable(why)
        entry = self.directory.pools.get(key)
        if entry is None or not entry.active:
            raise ServiceError(
                ErrorCode.POOL_NOT_FOUND, f"pool {key} is not known or is being removed"
            )
        if entry.conflict is not None:
            raise ServiceError(ErrorCode.PREFIX_CONFLICT, entry.conflict.message)
        return entry


def _inactivity_seconds(entry: PoolEntry, request: ClaimRequest) -> int:
    assert entry.pool is not None  # only active pools take claims
    claims = entry.pool.spec.claims
    if request.inactivity_timeout_seconds is None:
        return claims.default_inactivity_timeout_seconds
    if request.inactivity_timeout_seconds > claims.max_inactivity_timeout_seconds:
        raise ServiceError(
            ErrorCode.INVALID_REQUEST,
            f"inactivityTimeoutSeconds {request.inactivity_timeout_seconds} exceeds the "
            f"maximum of pool {entry.key} ({claims.max_inactivity_timeout_seconds})",
        )
    return request.inactivity_timeout_seconds
