"""Claims: handing out runners exactly once (CONTRACT.md §5 and §6).

Every change of a claim is a check-and-set on its Nomad variable, so any number of
processes can serve claims at once: of two claimers of one runner exactly one wins, and a
keepalive racing an expiry has exactly one winner too.
"""

from __future__ import annotations

import asyncio
import logging
import random
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

from controller.core.claims import ClaimRecord, ClaimState, MalformedClaim, claim_path, request_path
from controller.core.runner_ids import RUNNER_ID_PATTERN, is_runner_id
from controller.core.times import format_time
from controller.core.views import PoolMode, Runner, RunnerState
from controller.engine.reconciler import Engine, ManagedPool
from controller.nomad.errors import NomadConflict, NomadError

log = logging.getLogger(__name__)

REQUEST_ID_PATTERN = re.compile(r"^[A-Za-z0-9_~-]{1,64}$")
MAX_WAIT_SECONDS = 30.0
REQUEST_RECORD_WAIT_SECONDS = 2.0

GONE_REASONS = {
    ClaimState.RELEASED: "Released",
    ClaimState.EXPIRED: "Expired",
    ClaimState.LOST: "AllocationLost",
    ClaimState.RETIRED: "Retired",
}


class ClaimError(Exception):
    """A claim request that cannot be served; the API maps `kind` to a status code."""

    def __init__(self, kind: str, message: str, *, reason: str | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.reason = reason


def invalid(message: str) -> ClaimError:
    return ClaimError("InvalidRequest", message)


@dataclass(frozen=True)
class ClaimRequest:
    inactivity_timeout_seconds: int | None = None
    request_id: str | None = None
    wait_seconds: float = 0.0

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> ClaimRequest:
        unknown = set(body) - {"inactivityTimeoutSeconds", "requestId", "waitSeconds"}
        if unknown:
            raise invalid(f"unknown fields: {', '.join(sorted(unknown))}")
        timeout = body.get("inactivityTimeoutSeconds")
        if timeout is not None and (type(timeout) is not int or timeout <= 0):
            raise invalid("inactivityTimeoutSeconds must be a positive integer")
        request_id = body.get("requestId")
        if request_id is not None and (
            not isinstance(request_id, str) or not REQUEST_ID_PATTERN.match(request_id)
        ):
            raise invalid("requestId must be 1-64 characters of [A-Za-z0-9_~-]")
        wait = body.get("waitSeconds", 0)
        if type(wait) not in (int, float) or not 0 <= wait <= MAX_WAIT_SECONDS:
            raise invalid(f"waitSeconds must be a number from 0 to {MAX_WAIT_SECONDS:g}")
        return cls(timeout, request_id, float(wait))


def claim_view(
    record: ClaimRecord, node_name: str = "", ports: dict[str, int] | None = None
) -> dict[str, Any]:
    """The API's claim object."""
    return {
        "runnerId": record.runner_id,
        "pool": record.pool,
        "allocationId": record.allocation_id,
        "nodeName": node_name or record.node_name,
        "claimedAt": format_time(record.claimed_at),
        "expiresAt": format_time(record.expires_at),
        "inactivityTimeoutSeconds": record.inactivity_timeout_seconds,
        "requestId": record.request_id,
        "ports": ports if ports is not None else {},
    }


def gone(record: ClaimRecord) -> ClaimError:
    reason = GONE_REASONS.get(record.state, "Released")
    return ClaimError("RunnerGone", f"runner {record.runner_id} is gone: {reason}", reason=reason)


class ClaimService:
    def __init__(self, engine: Engine, *, rng: random.Random | None = None) -> None:
        self.engine = engine
        self.client = engine.client
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
        managed = self.engine.pools.get(key)
        if managed is None or managed.pool is None or managed.policy.mode is not PoolMode.ACTIVE:
            raise ClaimError("PoolNotFound", f"pool {key} is not known or is being removed")
        started = time.perf_counter()
        result = "error"
        try:
            inactivity = self._inactivity_seconds(managed, request)
            if request.request_id is None:
                claim, created = (
                    await self._claim_runner(managed, inactivity, None, request.wait_seconds),
                    True,
                )
            else:
                claim, created = await self._claim_with_request_id(managed, inactivity, request)
            result = "claimed" if created else "repeated"
            return claim, created
        except ClaimError as error:
            result = {"PoolEmpty": "empty"}.get(error.kind, "rejected")
            raise
        except NomadError as error:
            # Whatever Nomad failed at (a read while answering a repeated requestId, an
            # unexpected conflict), the client gets a 503 to retry, never a 500.
            raise ClaimError("NomadUnavailable", f"Nomad did not answer: {error}") from None
        finally:
            self.metrics.claims_total.labels(pool=key, result=result).inc()
            self.metrics.claim_duration.observe(time.perf_counter() - started)

    def _inactivity_seconds(self, managed: ManagedPool, request: ClaimRequest) -> int:
        assert managed.pool is not None  # only active pools take claims
        claims = managed.pool.spec.claims
        if request.inactivity_timeout_seconds is None:
            return claims.default_inactivity_timeout_seconds
        if request.inactivity_timeout_seconds > claims.max_inactivity_timeout_seconds:
            raise invalid(
                f"inactivityTimeoutSeconds {request.inactivity_timeout_seconds} exceeds the "
                f"pool's maximum of {claims.max_inactivity_timeout_seconds}"
            )
        return request.inactivity_timeout_seconds

    async def _claim_runner(
        self, managed: ManagedPool, inactivity: int, request_id: str | None, wait_seconds: float
    ) -> dict[str, Any]:
        deadline = time.monotonic() + wait_seconds
        while True:
            for runner in self._candidates(managed):
                record = await self._try_claim(managed, runner, inactivity, request_id)
                if record is not None:
                    self.engine.hint_namespace(managed.policy.nomad_namespace)
                    return claim_view(
                        record, runner.allocation.node_name if runner.allocation else ""
                    )
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ClaimError("PoolEmpty", f"pool {managed.key} has no idle runner")
            await self.engine.wait_for_observation(managed.key, within=remaining)

    def _candidates(self, managed: ManagedPool) -> Iterator[Runner]:
        """Idle runners (current template first, then outdated) in random order, skipping
        those this process claimed since the pool was last observed.

        Random order spreads concurrent claimers (and replicas) over different runners. The
        order is drawn lazily (a Fisher-Yates shuffle that stops where the caller stops,
        keeping its swaps in a dict instead of copying the pool) and `taken` is checked as
        each runner comes up, so a claim costs what it tries rather than the size of the
        pool, and a runner a concurrent claimer took meanwhile is skipped instead of
        costing a lost check-and-set."""
        taken = self._taken.setdefault(managed.key, {})
        for runner_id, when in list(taken.items()):
            if when < managed.observation_started:
                del taken[runner_id]
        current, outdated = self._idle(managed)
        for group in (current, outdated):
            swapped: dict[int, int] = {}
            for i in range(len(group)):
                j = i + self.rng.randrange(len(group) - i)
                chosen = swapped.get(j, j)
                swapped[j] = swapped.get(i, i)
                runner = group[chosen]
                if runner.id not in taken:
                    yield runner

    def _idle(self, managed: ManagedPool) -> tuple[list[Runner], list[Runner]]:
        """The pool's idle and outdated runners as the last pass saw them, computed once
        per pass rather than once per claim."""
        cached = self._idle_cache.get(managed.key)
        if cached is not None and cached[0] is managed.runners:
            return cached[1], cached[2]
        current = [r for r in managed.runners if r.state is RunnerState.IDLE]
        outdated = [r for r in managed.runners if r.state is RunnerState.OUTDATED]
        self._idle_cache[managed.key] = (managed.runners, current, outdated)
        return current, outdated

    async def _try_claim(
        self, managed: ManagedPool, runner: Runner, inactivity: int, request_id: str | None
    ) -> ClaimRecord | None:
        assert runner.allocation is not None  # idle runners always have a running allocation
        self._taken.setdefault(managed.key, {})[runner.id] = time.monotonic()
        now = self.engine.clock()
        record = ClaimRecord(
            runner_id=runner.id,
            namespace=managed.policy.nomad_namespace,
            modify_index=0,
            modify_time_ns=0,
            pool=managed.key,
            allocation_id=runner.allocation.id,
            claimed_at=now,
            expires_at=now + timedelta(seconds=inactivity),
            inactivity_timeout_seconds=inactivity,
            request_id=request_id,
            state=ClaimState.CLAIMED,
            allocation_restarts=runner.allocation.restarts,
            node_name=runner.allocation.node_name,
        )
        try:
            stored = await self.client.put_variable(
                claim_path(runner.id), record.to_items(), record.namespace, cas=0
            )
        except NomadConflict:
            return None  # another claimer (or a scale-down) won this runner
        except NomadError as error:
            raise ClaimError("NomadUnavailable", f"Nomad did not take the claim: {error}") from None
        claimed = ClaimRecord.from_variable(stored)
        self.engine.remember_claim(claimed)  # spares the next pass reading it back
        return claimed

    # ---- idempotent claims ---------------------------------------------------------------

    async def _claim_with_request_id(
        self, managed: ManagedPool, inactivity: int, request: ClaimRequest
    ) -> tuple[dict[str, Any], bool]:
        assert request.request_id is not None
        namespace = managed.policy.nomad_namespace
        path = request_path(request.request_id)
        try:
            record = await self.client.put_variable(path, {"pool": managed.key}, namespace, cas=0)
        except NomadConflict as conflict:
            return await self._answer_repeated(
                managed, inactivity, request, conflict.current
            ), False
        except NomadError as error:
            raise ClaimError("NomadUnavailable", f"Nomad is not reachable: {error}") from None
        try:
            claim = await self._claim_runner(
                managed, inactivity, request.request_id, request.wait_seconds
            )
        except ClaimError:
            # Nothing was claimed: free the request ID so a retry can claim afresh.
            await self._drop_request_record(path, namespace, int(record.get("ModifyIndex", 0)))
            raise
        self._complete_request_record(path, namespace, record, claim["runnerId"])
        return claim, True

    def _complete_request_record(
        self, path: str, namespace: str, record: dict[str, Any], runner_id: str
    ) -> None:
        """Complete the request record off the claim path: a crash before it lands is
        repaired by whoever finds the record, from the claim carrying the requestId."""
        items = {**record.get("Items", {}), "runnerId": runner_id}

        async def complete() -> None:
            try:
                await self.client.put_variable(
                    path, items, namespace, cas=int(record["ModifyIndex"])
                )
            except NomadError as error:
                log.warning("could not complete request record %s: %s", path, error)

        task = asyncio.get_running_loop().create_task(complete())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def drain(self) -> None:
        """Let background completions finish (graceful stop, tests)."""
        await asyncio.gather(*self._background, return_exceptions=True)

    async def _drop_request_record(self, path: str, namespace: str, index: int) -> None:
        try:
            await self.client.delete_variable(path, namespace, cas=index)
        except NomadError as error:
            log.warning("could not drop request record %s: %s", path, error)

    async def _answer_repeated(
        self,
        managed: ManagedPool,
        inactivity: int,
        request: ClaimRequest,
        current: dict[str, Any] | None,
    ) -> dict[str, Any]:
        assert request.request_id is not None
        namespace = managed.policy.nomad_namespace
        path = request_path(request.request_id)
        deadline = time.monotonic() + REQUEST_RECORD_WAIT_SECONDS
        while True:
            if not current or not current.get("Items"):
                current = await self.client.read_variable(path, namespace)
                if current is None:  # dropped by a claimer that found no runner: start over
                    claim, _ = await self._claim_with_request_id(managed, inactivity, request)
                    return claim
            items = current.get("Items", {})
            if items.get("pool") != managed.key:
                raise ClaimError(
                    "RequestIdConflict",
                    f"requestId {request.request_id} was used for pool {items.get('pool')}",
                )
            runner_id = items.get("runnerId") or await self._runner_from_claims(
                namespace, request.request_id
            )
            if runner_id:
                variable = await self.client.read_variable(claim_path(runner_id), namespace)
                if variable is None:
                    raise ClaimError("RunnerGone", f"runner {runner_id} is gone", reason="Released")
                record = _parse(variable)
                if record.is_tombstone:
                    raise gone(record)
                return claim_view(record)
            if time.monotonic() >= deadline:
                raise ClaimError(
                    "NomadUnavailable",
                    f"request {request.request_id} is still being served elsewhere; retry",
                )
            await asyncio.sleep(0.05)
            current = None

    async def _runner_from_claims(self, namespace: str, request_id: str) -> str | None:
        """The runner whose claim carries this requestId (claims read through the engine's
        cache, so only changed variables are read)."""
        for claim in (await self.engine.read_claims(namespace)).values():
            if claim.request_id == request_id:
                return claim.runner_id
        return None

    # ---- runner routes -------------------------------------------------------------------

    def _pool_of_runner(self, runner_id: str) -> ManagedPool:
        if not RUNNER_ID_PATTERN.match(runner_id):
            raise ClaimError("RunnerNotFound", f"runner {runner_id[:80]} is not known")
        for managed in self.engine.pools.values():
            if is_runner_id(managed.policy.job_prefix, runner_id):
                return managed
        raise ClaimError("RunnerNotFound", f"runner {runner_id} is not known")

    async def _read_claim(self, runner_id: str) -> tuple[ManagedPool, ClaimRecord]:
        managed = self._pool_of_runner(runner_id)
        try:
            variable = await self.client.read_variable(
                claim_path(runner_id), managed.policy.nomad_namespace
            )
        except NomadError as error:
            raise ClaimError("NomadUnavailable", f"Nomad is not reachable: {error}") from None
        if variable is None:
            raise ClaimError("RunnerNotFound", f"runner {runner_id} is not claimed")
        record = _parse(variable)
        if record.pool not in self.engine.pools:
            raise ClaimError("RunnerNotFound", f"runner {runner_id} is not claimed")
        return managed, record

    async def get(self, runner_id: str) -> dict[str, Any]:
        _, record = await self._read_claim(runner_id)
        if record.is_tombstone:
            raise gone(record)
        return claim_view(record)

    async def keepalive(self, runner_id: str) -> dict[str, Any]:
        for _ in range(5):
            _, record = await self._read_claim(runner_id)
            if record.is_tombstone:
                raise gone(record)
            now = self.engine.clock()
            if now >= record.expires_at:
                await self._end(record, ClaimState.EXPIRED)
                continue  # re-read: either our tombstone or a concurrent one answers
            moved = replace(
                record, expires_at=now + timedelta(seconds=record.inactivity_timeout_seconds)
            )
            stored = await self._cas(moved, record.modify_index)
            if stored is not None:
                return claim_view(stored)
        raise ClaimError("NomadUnavailable", f"runner {runner_id} changed too often; retry")

    async def release(self, runner_id: str) -> None:
        for _ in range(5):
            managed, record = await self._read_claim(runner_id)
            if record.is_tombstone:
                raise gone(record)
            if self.engine.clock() >= record.expires_at:
                await self._end(record, ClaimState.EXPIRED)
                continue
            if await self._cas(record.with_state(ClaimState.RELEASED), record.modify_index):
                try:
                    await self.client.purge_job(runner_id, managed.policy.nomad_namespace)
                except NomadError as error:  # the engine purges tombstoned runners anyway
                    log.warning("purge of released runner %s deferred: %s", runner_id, error)
                self.metrics.runners_destroyed.labels(pool=managed.key, reason="released").inc()
                self.engine.hint_namespace(managed.policy.nomad_namespace)
                return
        raise ClaimError("NomadUnavailable", f"runner {runner_id} changed too often; retry")

    async def _end(self, record: ClaimRecord, state: ClaimState) -> None:
        await self._cas(record.with_state(state), record.modify_index)
        self.engine.hint_namespace(record.namespace)

    async def _cas(self, record: ClaimRecord, index: int) -> ClaimRecord | None:
        try:
            stored = await self.client.put_variable(
                claim_path(record.runner_id), record.to_items(), record.namespace, cas=index
            )
        except NomadConflict:
            return None
        except NomadError as error:
            raise ClaimError("NomadUnavailable", f"Nomad is not reachable: {error}") from None
        changed = ClaimRecord.from_variable(stored)
        self.engine.remember_claim(changed)
        return changed

    async def pool_claims(self, namespace: str, name: str) -> list[dict[str, Any]]:
        key = f"{namespace}/{name}"
        managed = self.engine.pools.get(key)
        if managed is None:
            raise ClaimError("PoolNotFound", f"pool {key} is not known")
        try:
            claims = await self.engine.read_claims(managed.policy.nomad_namespace)
        except NomadError as error:
            raise ClaimError("NomadUnavailable", f"Nomad is not reachable: {error}") from None
        return [
            claim_view(c)
            for c in sorted(claims.values(), key=lambda c: c.claimed_at)
            if c.pool == key
            and not c.is_tombstone
            and is_runner_id(managed.policy.job_prefix, c.runner_id)
        ]


def _parse(variable: dict[str, Any]) -> ClaimRecord:
    try:
        return ClaimRecord.from_variable(variable)
    except MalformedClaim:
        raise ClaimError("RunnerNotFound", "the runner's claim cannot be read") from None
