"""ClaimService: claims, keepalives and releases as the API serves them, over the claim
protocol of controller/claims/__init__.py.

Runners are offered from the pool's last observation; a runner this process claimed is
not offered again until an observation that started later shows it claimed. Any Nomad
failure becomes a 503 `NomadUnavailable` for the client to retry, never a 500.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from controller.claims.store import ClaimStore
from controller.core.claims import ClaimRecord, ClaimState, MalformedClaim, RequestRecord
from controller.core.runner_ids import RUNNER_ID_PATTERN, is_runner_id
from controller.core.times import format_time
from controller.core.views import Runner, RunnerState
from controller.engine.engine import Engine
from controller.engine.registry import PoolView
from controller.errors import ErrorCode, ServiceError
from controller.nomad.errors import NomadError

log = logging.getLogger(__name__)

MAX_WAIT_SECONDS = 30.0
REQUEST_RECORD_WAIT_SECONDS = 2.0
# How often a keepalive or release re-reads a claim that changed under it before giving up.
CAS_ATTEMPTS = 5


@dataclass(frozen=True)
class ClaimRequest:
    inactivity_timeout_seconds: int | None = None
    request_id: str | None = None
    wait_seconds: float = 0.0


def claim_view(record: ClaimRecord, ports: dict[str, int] | None = None) -> dict[str, Any]:
    """The API's claim object."""
    return {
        "runnerId": record.runner_id,
        "pool": record.pool,
        "allocationId": record.allocation_id,
        "nodeName": record.node_name,
        "claimedAt": format_time(record.claimed_at),
        "expiresAt": format_time(record.expires_at),
        "inactivityTimeoutSeconds": record.inactivity_timeout_seconds,
        "requestId": record.request_id,
        "ports": ports if ports is not None else {},
    }


def gone(record: ClaimRecord) -> ServiceError:
    reason = record.gone_reason
    return ServiceError(
        ErrorCode.RUNNER_GONE, f"runner {record.runner_id} is gone: {reason}", reason=reason
    )


def unavailable(error: NomadError) -> ServiceError:
    return ServiceError(ErrorCode.NOMAD_UNAVAILABLE, f"Nomad did not answer: {error}")


class ClaimService:
    def __init__(self, engine: Engine, *, rng: random.Random | None = None) -> None:
        self.engine = engine
        self.store: ClaimStore = engine.store
        self.metrics = engine.metrics
        self.rng = rng or random.Random()
        # Runners this process claimed, by when: not offered again until an observation that
        # started later shows them claimed.
        self._taken: dict[str, dict[str, float]] = {}
        self._background: set[asyncio.Task[None]] = set()
        # pool key -> (the runners tuple of a pass, its idle runners, its outdated ones)
        self._idle_cache: dict[str, tuple[tuple[Runner, ...], list[Runner], list[Runner]]] = {}

    # ---- claim -------------------------------------------------------------------------

    async def claim(
        self, namespace: str, name: str, request: ClaimRequest
    ) -> tuple[dict[str, Any], bool]:
        """Claim one idle runner. Returns (claim, created): created is False when an earlier
        claim with the same requestId is answered again."""
        key = f"{namespace}/{name}"
        view = self._claimable_pool(key)
        started = time.perf_counter()
        result = "error"
        try:
            inactivity = self._inactivity_seconds(view, request)
            if request.request_id is None:
                claim = await self._claim_runner(view, inactivity, None, request.wait_seconds)
                created = True
            else:
                claim, created = await self._claim_with_request_id(view, inactivity, request)
            result = "claimed" if created else "repeated"
            return claim, created
        except ServiceError as error:
            result = "empty" if error.code is ErrorCode.POOL_EMPTY else "rejected"
            raise
        except NomadError as error:
            # Whatever Nomad failed at (a read while answering a repeated requestId, an
            # unexpected conflict), the client gets a 503 to retry, never a 500.
            raise unavailable(error) from None
        finally:
            self.metrics.claims_total.labels(pool=key, result=result).inc()
            self.metrics.claim_duration.observe(time.perf_counter() - started)

    def _claimable_pool(self, key: str) -> PoolView:
        view = self.engine.pools.get(key)
        if view is None or not view.active:
            raise ServiceError(
                ErrorCode.POOL_NOT_FOUND, f"pool {key} is not known or is being removed"
            )
        if view.conflict is not None:
            raise ServiceError(ErrorCode.PREFIX_CONFLICT, view.conflict.message)
        return view

    def _inactivity_seconds(self, view: PoolView, request: ClaimRequest) -> int:
        assert view.pool is not None  # only active pools take claims
        claims = view.pool.spec.claims
        if request.inactivity_timeout_seconds is None:
            return claims.default_inactivity_timeout_seconds
        if request.inactivity_timeout_seconds > claims.max_inactivity_timeout_seconds:
            raise ServiceError(
                ErrorCode.INVALID_REQUEST,
                f"inactivityTimeoutSeconds {request.inactivity_timeout_seconds} exceeds the "
                f"pool's maximum of {claims.max_inactivity_timeout_seconds}",
            )
        return request.inactivity_timeout_seconds

    async def _claim_runner(
        self, view: PoolView, inactivity: int, request_id: str | None, wait_seconds: float
    ) -> dict[str, Any]:
        deadline = time.monotonic() + wait_seconds
        while True:
            for runner in self._candidates(view):
                record = await self._try_claim(view, runner, inactivity, request_id)
                if record is not None:
                    self.engine.hint_namespace(view.policy.nomad_namespace)
                    return claim_view(record)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ServiceError(ErrorCode.POOL_EMPTY, f"pool {view.key} has no idle runner")
            await self.engine.wait_for_observation(view.key, within=remaining)

    def _candidates(self, view: PoolView) -> Iterator[Runner]:
        """Idle runners (current template first, then outdated) in random order, skipping
        those this process claimed since the pool was last observed.

        Random order spreads concurrent claimers (and replicas) over different runners. The
        order is drawn lazily (a Fisher-Yates shuffle that stops where the caller stops,
        keeping its swaps in a dict instead of copying the pool) and `taken` is checked as
        each runner comes up, so a claim costs what it tries rather than the size of the
        pool, and a runner a concurrent claimer took meanwhile is skipped instead of
        costing a lost check-and-set."""
        taken = self._taken.setdefault(view.key, {})
        for runner_id, when in list(taken.items()):
            if when < view.observation_started:
                del taken[runner_id]
        current, outdated = self._idle(view)
        for group in (current, outdated):
            swapped: dict[int, int] = {}
            for i in range(len(group)):
                j = i + self.rng.randrange(len(group) - i)
                chosen = swapped.get(j, j)
                swapped[j] = swapped.get(i, i)
                runner = group[chosen]
                if runner.id not in taken:
                    yield runner

    def _idle(self, view: PoolView) -> tuple[list[Runner], list[Runner]]:
        """The pool's idle and outdated runners as the last pass saw them, computed once
        per pass rather than once per claim."""
        runners = view.runners
        cached = self._idle_cache.get(view.key)
        if cached is not None and cached[0] is runners:
            return cached[1], cached[2]
        current = [r for r in runners if r.state is RunnerState.IDLE]
        outdated = [r for r in runners if r.state is RunnerState.OUTDATED]
        self._idle_cache[view.key] = (runners, current, outdated)
        return current, outdated

    async def _try_claim(
        self, view: PoolView, runner: Runner, inactivity: int, request_id: str | None
    ) -> ClaimRecord | None:
        assert runner.allocation is not None  # idle runners always have a running allocation
        self._taken.setdefault(view.key, {})[runner.id] = time.monotonic()
        record = ClaimRecord.new(
            runner_id=runner.id,
            namespace=view.policy.nomad_namespace,
            pool=view.key,
            allocation_id=runner.allocation.id,
            now=self.engine.clock(),
            inactivity_timeout_seconds=inactivity,
            request_id=request_id,
            allocation_restarts=runner.allocation.restarts,
            node_name=runner.allocation.node_name,
        )
        # None: another claimer (or a scale-down) won this runner.
        return await self.store.create(record)

    # ---- idempotent claims ---------------------------------------------------------------

    async def _claim_with_request_id(
        self, view: PoolView, inactivity: int, request: ClaimRequest
    ) -> tuple[dict[str, Any], bool]:
        assert request.request_id is not None
        namespace = view.policy.nomad_namespace
        record, created = await self.store.create_request(request.request_id, namespace, view.key)
        if not created:
            return await self._answer_repeated(view, inactivity, request, record), False
        try:
            claim = await self._claim_runner(
                view, inactivity, request.request_id, request.wait_seconds
            )
        except (ServiceError, NomadError):
            # Nothing was claimed: free the request ID so a retry can claim afresh.
            await self._drop_request(record)
            raise
        self._complete_request(record, claim["runnerId"])
        return claim, True

    def _complete_request(self, record: RequestRecord, runner_id: str) -> None:
        """Complete the request record off the claim path: a crash before it lands is
        repaired by whoever finds the record, from the claim carrying the requestId."""

        async def complete() -> None:
            try:
                await self.store.complete_request(record, runner_id)
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
        self, view: PoolView, inactivity: int, request: ClaimRequest, found: RequestRecord
    ) -> dict[str, Any]:
        assert request.request_id is not None
        namespace = view.policy.nomad_namespace
        deadline = time.monotonic() + REQUEST_RECORD_WAIT_SECONDS
        current: RequestRecord | None = found if found.pool else None
        while True:
            if current is None:
                current = await self.store.read_request(request.request_id, namespace)
                if current is None:  # dropped by a claimer that found no runner: start over
                    claim, _ = await self._claim_with_request_id(view, inactivity, request)
                    return claim
            if current.pool != view.key:
                raise ServiceError(
                    ErrorCode.REQUEST_ID_CONFLICT,
                    f"requestId {request.request_id} was used for pool {current.pool}",
                )
            runner_id = current.runner_id or await self._runner_from_claims(
                namespace, request.request_id
            )
            if runner_id:
                record = await self._read(runner_id, namespace)
                if record is None:
                    raise ServiceError(
                        ErrorCode.RUNNER_GONE, f"runner {runner_id} is gone", reason="Released"
                    )
                if record.is_tombstone:
                    raise gone(record)
                return claim_view(record)
            if time.monotonic() >= deadline:
                raise ServiceError(
                    ErrorCode.NOMAD_UNAVAILABLE,
                    f"request {request.request_id} is still being served elsewhere; retry",
                )
            await asyncio.sleep(0.05)
            current = None

    async def _runner_from_claims(self, namespace: str, request_id: str) -> str | None:
        """The runner whose claim carries this requestId (claims read through the store's
        cache, so only changed variables are read)."""
        claims, _ = await self.store.read_all(namespace)
        for claim in claims.values():
            if claim.request_id == request_id:
                return claim.runner_id
        return None

    # ---- runner routes -------------------------------------------------------------------

    def _pool_of_runner(self, runner_id: str) -> PoolView:
        if not RUNNER_ID_PATTERN.match(runner_id):
            raise ServiceError(ErrorCode.RUNNER_NOT_FOUND, f"runner {runner_id[:80]} is not known")
        view = self.engine.pool_for_runner(runner_id)
        if view is None:
            raise ServiceError(ErrorCode.RUNNER_NOT_FOUND, f"runner {runner_id} is not known")
        return view

    async def _read(self, runner_id: str, namespace: str) -> ClaimRecord | None:
        try:
            return await self.store.read(runner_id, namespace)
        except MalformedClaim:
            raise ServiceError(
                ErrorCode.RUNNER_NOT_FOUND, "the runner's claim cannot be read"
            ) from None

    async def _read_claim(self, runner_id: str) -> tuple[PoolView, ClaimRecord]:
        view = self._pool_of_runner(runner_id)
        try:
            record = await self._read(runner_id, view.policy.nomad_namespace)
        except NomadError as error:
            raise unavailable(error) from None
        if record is None or record.pool not in self.engine.pools:
            raise ServiceError(ErrorCode.RUNNER_NOT_FOUND, f"runner {runner_id} is not claimed")
        return view, record

    async def get(self, runner_id: str) -> dict[str, Any]:
        _, record = await self._read_claim(runner_id)
        if record.is_tombstone:
            raise gone(record)
        return claim_view(record)

    async def keepalive(self, runner_id: str) -> dict[str, Any]:
        for _ in range(CAS_ATTEMPTS):
            _, record = await self._read_claim(runner_id)
            if record.is_tombstone:
                raise gone(record)
            now = self.engine.clock()
            if record.is_expired(now):
                await self._end(record, ClaimState.EXPIRED)
                continue  # re-read: either our tombstone or a concurrent one answers
            stored = await self._cas(record.kept_alive(now), record.modify_index)
            if stored is not None:
                return claim_view(stored)
        raise ServiceError(
            ErrorCode.NOMAD_UNAVAILABLE, f"runner {runner_id} changed too often; retry"
        )

    async def release(self, runner_id: str) -> None:
        for _ in range(CAS_ATTEMPTS):
            view, record = await self._read_claim(runner_id)
            if record.is_tombstone:
                raise gone(record)
            if record.is_expired(self.engine.clock()):
                await self._end(record, ClaimState.EXPIRED)
                continue
            if await self._cas(record.with_state(ClaimState.RELEASED), record.modify_index):
                await self._purge_released(view, runner_id)
                return
        raise ServiceError(
            ErrorCode.NOMAD_UNAVAILABLE, f"runner {runner_id} changed too often; retry"
        )

    async def _purge_released(self, view: PoolView, runner_id: str) -> None:
        namespace = view.policy.nomad_namespace
        try:
            await self.engine.purge_runner(runner_id, namespace)
        except NomadError as error:  # the engine purges tombstoned runners anyway
            log.warning("purge of released runner %s deferred: %s", runner_id, error)
        self.metrics.runners_destroyed.labels(pool=view.key, reason="released").inc()
        self.engine.hint_namespace(namespace)

    async def _end(self, record: ClaimRecord, state: ClaimState) -> None:
        await self._cas(record.with_state(state), record.modify_index)
        self.engine.hint_namespace(record.namespace)

    async def _cas(self, record: ClaimRecord, index: int) -> ClaimRecord | None:
        try:
            return await self.store.update(record, cas=index)
        except NomadError as error:
            raise unavailable(error) from None

    async def pool_claims(self, namespace: str, name: str) -> list[dict[str, Any]]:
        key = f"{namespace}/{name}"
        view = self.engine.pools.get(key)
        if view is None:
            raise ServiceError(ErrorCode.POOL_NOT_FOUND, f"pool {key} is not known")
        try:
            claims, _ = await self.store.read_all(view.policy.nomad_namespace)
        except NomadError as error:
            raise unavailable(error) from None
        return [
            claim_view(c)
            for c in sorted(claims.values(), key=lambda c: c.claimed_at)
            if c.pool == key
            and not c.is_tombstone
            and is_runner_id(view.policy.job_prefix, c.runner_id)
        ]
