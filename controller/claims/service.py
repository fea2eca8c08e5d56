"""ClaimService: claims, keepalives and releases as the API serves them, over the claim
protocol of controller/claims/__init__.py.

Runners are offered from the pool's last observation; a runner this process claimed is
not offered again until an observation that started later shows it claimed. Any Nomad
failure becomes a 503 `NomadUnavailable` for the client to retry, never a 500.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import random
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from controller.claims.store import ClaimStore
from controller.core.claims import ClaimRecord, ClaimState, MalformedClaim, RequestRecord
from controller.core.demand import runner_start, start_items
from controller.core.runner_ids import RUNNER_ID_PATTERN, is_runner_id
from controller.core.times import format_time
from controller.core.views import NodeView, Runner, RunnerState
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
    # None: one runner, answered as a claim; a number: a batch of that many runners of
    # one pool, all or nothing, answered as {"claims": [...]}.
    count: int | None = None


def claim_view(record: ClaimRecord, node: NodeView | None = None) -> dict[str, Any]:
    """The API's claim object; `node` is the claimed allocation's node, when known."""
    draining = node is not None and node.draining
    deadline = node.drain_deadline if node is not None and draining else None
    return {
        "runnerId": record.runner_id,
        "pool": record.pool,
        "allocationId": record.allocation_id,
        "nodeName": record.node_name,
        "claimedAt": format_time(record.claimed_at),
        "expiresAt": format_time(record.expires_at),
        "inactivityTimeoutSeconds": record.inactivity_timeout_seconds,
        "requestId": record.request_id,
        "ports": {},
        "nodeDraining": draining,
        "drainDeadline": format_time(deadline) if deadline is not None else None,
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
        # Told whenever this process turns a live claim into a tombstone (release,
        # retirement, expiry found by a keepalive): runner ID and the tombstone's state.
        self.claim_ended: list[Callable[[str, ClaimState], None]] = []

    # ---- claim -------------------------------------------------------------------------

    async def claim(
        self, namespace: str, name: str, request: ClaimRequest
    ) -> tuple[dict[str, Any], bool]:
        """Claim from one pool; see claim_from."""
        return await self.claim_from((f"{namespace}/{name}",), request)

    async def claim_from(
        self, keys: Sequence[str], request: ClaimRequest
    ) -> tuple[dict[str, Any], bool]:
        """Claim from the first of the pools (in order) that has idle runners: one runner,
        or a batch of `count` runners of one pool, all or nothing. With `wait_seconds` it
        waits for runners in any of them. Returns (the answer, created): created is False
        when an earlier claim with the same requestId is answered again."""
        views = [self._claimable_pool(key) for key in keys]
        started = time.perf_counter()
        result, label = "error", views[0].key
        try:
            inactivity = {view.key: self._inactivity_seconds(view, request) for view in views}
            if request.request_id is None:
                records = await self._take(views, inactivity, request, None)
                created = True
            else:
                records, created = await self._take_with_request_id(views, inactivity, request)
            label = records[0].pool
            result = "claimed" if created else "repeated"
            views_of = [claim_view(r, self._node_of(r)) for r in records]
            return (views_of[0] if request.count is None else {"claims": views_of}), created
        except ServiceError as error:
            result = "empty" if error.code is ErrorCode.POOL_EMPTY else "rejected"
            raise
        except NomadError as error:
            # Whatever Nomad failed at (a read while answering a repeated requestId, an
            # unexpected conflict), the client gets a 503 to retry, never a 500.
            raise unavailable(error) from None
        finally:
            self.metrics.claims_total.labels(pool=label, result=result).inc()
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
                f"maximum of pool {view.key} ({claims.max_inactivity_timeout_seconds})",
            )
        return request.inactivity_timeout_seconds

    def _node_of(self, record: ClaimRecord) -> NodeView | None:
        """The node of the claimed allocation, as the latest pass saw the pool's
        allocations (by name for a claim of an allocation not observed yet)."""
        view = self.engine.pools.get(record.pool)
        if view is not None and view.observation is not None:
            for allocation in view.observation.allocations.get(record.runner_id, ()):
                if allocation.id == record.allocation_id:
                    return self.engine.node(allocation.node_id)
        return self.engine.node_named(record.node_name) if record.node_name else None

    async def _take(
        self,
        views: Sequence[PoolView],
        inactivity: dict[str, int],
        request: ClaimRequest,
        request_id: str | None,
    ) -> list[ClaimRecord]:
        """Claims from the first pool that has enough idle runners, waiting (at most
        wait_seconds) for an observation of any of the pools while none has. A request
        that waits says so to the first pool, its preference: the demand estimate
        counts it (core/demand.py), and a pass comes at once to raise the target."""
        count = request.count or 1
        deadline = time.monotonic() + request.wait_seconds
        records = await self._take_first(views, count, inactivity, request_id)
        if records is None and request.wait_seconds > 0:
            preferred = views[0]
            with preferred.waiting.counted(self.engine.clock(), count) as waiting:
                self.engine.hint_namespace(preferred.policy.nomad_namespace)
                while records is None and (remaining := deadline - time.monotonic()) > 0:
                    await self._wait_for_any(views, remaining)
                    records = await self._take_first(views, count, inactivity, request_id)
                waiting.answered = records is not None and records[0].pool == preferred.key
        if records is None:
            names = ", ".join(view.key for view in views)
            if not any(view.observed for view in views):
                # Not "empty": this process has not read the pools from Nomad yet.
                raise ServiceError(ErrorCode.NOMAD_UNAVAILABLE, f"not read from Nomad yet: {names}")
            wanted = "an idle runner" if count == 1 else f"{count} idle runners"
            raise ServiceError(ErrorCode.POOL_EMPTY, f"no pool has {wanted}: {names}")
        return records

    async def _take_first(
        self,
        views: Sequence[PoolView],
        count: int,
        inactivity: dict[str, int],
        request_id: str | None,
    ) -> list[ClaimRecord] | None:
        """`count` runners of the first pool (in order) that has them, or None."""
        for view in views:
            records = await self._take_from(view, count, inactivity[view.key], request_id)
            if records:
                self.engine.hint_namespace(view.policy.nomad_namespace)
                return records
        return None

    async def _wait_for_any(self, views: Sequence[PoolView], within: float) -> None:
        waits = [
            asyncio.ensure_future(self.engine.wait_for_observation(view.key, within))
            for view in views
        ]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()

    async def _take_from(
        self, view: PoolView, count: int, inactivity: int, request_id: str | None
    ) -> list[ClaimRecord]:
        """`count` runners of one pool, or none: runners taken before the pool ran out are
        given back at once (their claims deleted again, so they are idle again)."""
        current, outdated = self._idle(view)
        if len(current) + len(outdated) < count:
            return []  # cannot succeed: take nothing rather than take and give back
        taken: list[ClaimRecord] = []
        # A batch is claimed at one moment: the demand estimate takes it for one arrival
        # of `count` claims, not for claims a few milliseconds apart (core/demand.py).
        claimed_at = self.engine.clock()
        try:
            for runner in self._candidates(view):
                record = await self._try_claim(view, runner, inactivity, request_id, claimed_at)
                if record is not None:
                    taken.append(record)
                    if len(taken) == count:
                        return taken
        except BaseException:
            await self._give_back(view, taken)
            raise
        await self._give_back(view, taken)
        return []

    async def _give_back(self, view: PoolView, records: Sequence[ClaimRecord]) -> None:
        """Delete claims this process wrote and never handed out (check-and-set), so the
        runners are idle again and offered again."""
        taken = self._taken.get(view.key, {})
        for record in records:
            try:
                if await self.store.withdraw(record):
                    taken.pop(record.runner_id, None)
                    continue
                log.warning("claim %s changed before it could be given back", record.path)
            except NomadError as error:
                # The claim stays until its inactivity timeout ends it.
                log.warning("could not give back claim %s: %s", record.path, error)

    def _candidates(self, view: PoolView) -> Iterator[Runner]:
        """Idle runners (current template first, then outdated; those on nodes that drain
        or take no new placements last) in random order, skipping those this process
        claimed since the pool was last observed.

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
        """The pool's claimable runners as the last pass saw them, computed once per pass
        rather than once per claim: the current ones, and the rest (outdated, then those
        on leaving nodes)."""
        runners = view.runners
        cached = self._idle_cache.get(view.key)
        if cached is not None and cached[0] is runners:
            return cached[1], cached[2]
        leaving = view.observation.leaving_nodes if view.observation is not None else frozenset()

        def stays(runner: Runner) -> bool:
            return runner.allocation is None or runner.allocation.node_id not in leaving

        current = [r for r in runners if r.state is RunnerState.IDLE and stays(r)]
        rest = [r for r in runners if r.state is RunnerState.OUTDATED and stays(r)]
        rest += [r for r in runners if r.state in _CLAIMABLE and not stays(r)]
        self._idle_cache[view.key] = (runners, current, rest)
        return current, rest

    async def _try_claim(
        self,
        view: PoolView,
        runner: Runner,
        inactivity: int,
        request_id: str | None,
        claimed_at: datetime,
    ) -> ClaimRecord | None:
        assert runner.allocation is not None  # idle runners always have a running allocation
        self._taken.setdefault(view.key, {})[runner.id] = time.monotonic()
        record = ClaimRecord.new(
            runner_id=runner.id,
            namespace=view.policy.nomad_namespace,
            pool=view.key,
            allocation_id=runner.allocation.id,
            now=claimed_at,
            inactivity_timeout_seconds=inactivity,
            request_id=request_id,
            allocation_restarts=runner.allocation.restarts,
            node_name=runner.allocation.node_name,
        )
        if view.policy.demand is not None and view.observation is not None:
            # The runner's start outlives it in the claim, for the demand estimate.
            allocations = view.observation.allocations.get(runner.id, ())
            start = runner_start(runner.job, allocations)
            if start is not None:
                record = dataclasses.replace(record, extra=start_items(start))
        # None: another claimer (or a scale-down) won this runner.
        return await self.store.create(record)

    # ---- idempotent claims ---------------------------------------------------------------

    async def _take_with_request_id(
        self, views: Sequence[PoolView], inactivity: dict[str, int], request: ClaimRequest
    ) -> tuple[list[ClaimRecord], bool]:
        assert request.request_id is not None
        namespace = _one_namespace(views)
        keys = tuple(view.key for view in views)
        record, created = await self.store.create_request(
            request.request_id, namespace, keys, request.count
        )
        if not created:
            return await self._answer_repeated(views, inactivity, request, record), False
        try:
            records = await self._take(views, inactivity, request, request.request_id)
        except (ServiceError, NomadError):
            # Nothing was claimed: free the request ID so a retry can claim afresh.
            await self._drop_request(record)
            raise
        runner_ids = tuple(r.runner_id for r in records)
        if request.count is None:
            self._complete_request(record, records[0].pool, runner_ids)
        else:
            # A batch waits for its record: a repeat can then answer it whole.
            with contextlib.suppress(NomadError):
                await self.store.complete_request(record, records[0].pool, runner_ids)
        return records, True

    def _complete_request(
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
        self,
        views: Sequence[PoolView],
        inactivity: dict[str, int],
        request: ClaimRequest,
        found: RequestRecord,
    ) -> list[ClaimRecord]:
        assert request.request_id is not None
        namespace = _one_namespace(views)
        asked = (tuple(view.key for view in views), request.count)
        deadline = time.monotonic() + REQUEST_RECORD_WAIT_SECONDS
        current: RequestRecord | None = found if found.pool else None
        while True:
            if current is None:
                current = await self.store.read_request(request.request_id, namespace)
                if current is None:  # dropped by a claimer that found no runner: start over
                    records, _ = await self._take_with_request_id(views, inactivity, request)
                    return records
            if current.asked != asked:
                raise ServiceError(
                    ErrorCode.REQUEST_ID_CONFLICT,
                    f"requestId {request.request_id} was used for another request "
                    f"(pools {', '.join(current.asked[0])}, count {current.count or 1})",
                )
            runner_ids = current.runner_ids or await self._runners_from_claims(
                namespace, request.request_id, request.count or 1
            )
            if runner_ids:
                return [await self._still_claimed(runner_id, namespace) for runner_id in runner_ids]
            if time.monotonic() >= deadline:
                raise ServiceError(
                    ErrorCode.NOMAD_UNAVAILABLE,
                    f"request {request.request_id} is still being served elsewhere; retry",
                )
            await asyncio.sleep(0.05)
            current = None

    async def _still_claimed(self, runner_id: str, namespace: str) -> ClaimRecord:
        record = await self._read(runner_id, namespace)
        if record is None:
            raise ServiceError(
                ErrorCode.RUNNER_GONE, f"runner {runner_id} is gone", reason="Released"
            )
        if record.is_tombstone:
            raise gone(record)
        return record

    async def _runners_from_claims(
        self, namespace: str, request_id: str, count: int
    ) -> tuple[str, ...]:
        """The runners whose claims carry this requestId, once all `count` of them are
        there (claims read through the store's cache, so only changed variables are
        read); nothing while a batch is still being claimed."""
        claims, _ = await self.store.read_all(namespace)
        found = tuple(sorted(c.runner_id for c in claims.values() if c.request_id == request_id))
        return found if len(found) == count else ()

    # ---- runner routes -------------------------------------------------------------------

    def pool_of_runner(self, runner_id: str) -> PoolView:
        """The pool a runner ID belongs to (by its job prefix), before anything is read;
        404 RunnerNotFound for an ID no known pool has."""
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
        view = self.pool_of_runner(runner_id)
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
        return claim_view(record, self._node_of(record))

    async def keepalive(self, runner_id: str) -> dict[str, Any]:
        stored = await self.renew(await self.live(runner_id))
        return claim_view(stored, self._node_of(stored))

    async def live(self, runner_id: str) -> ClaimRecord:
        """The runner's live claim as Nomad holds it now: 404 RunnerNotFound, or 410
        RunnerGone for a tombstone or a claim past its deadline (which becomes an
        `expired` tombstone)."""
        for _ in range(CAS_ATTEMPTS):
            _, record = await self._read_claim(runner_id)
            if record.is_tombstone:
                raise gone(record)
            if not record.is_expired(self.engine.clock()):
                return record
            await self._end(record, ClaimState.EXPIRED)  # then read again: ours or another's
        raise _changing(runner_id)

    async def renew(self, record: ClaimRecord, *, past_deadline: bool = False) -> ClaimRecord:
        """Move a claim's deadline to now + its inactivity timeout (check-and-set on
        `record`; a claim that changed meanwhile is read again). A claim past its deadline
        becomes an `expired` tombstone (410) unless `past_deadline`: activity of this
        process (a running execution) kept it alive, and only a tombstone ends it."""
        for _ in range(CAS_ATTEMPTS):
            if record.is_tombstone:
                raise gone(record)
            now = self.engine.clock()
            if record.is_expired(now) and not past_deadline:
                record = await self.live(record.runner_id)  # expires it, or finds it renewed
                continue
            stored = await self._cas(record.kept_alive(now), record.modify_index)
            if stored is not None:
                return stored
            _, record = await self._read_claim(record.runner_id)
        raise _changing(record.runner_id)

    async def release(self, runner_id: str) -> None:
        """The client is done: a `released` tombstone, and the runner is destroyed."""
        await self._finish(runner_id, ClaimState.RELEASED)

    async def retire(self, runner_id: str) -> None:
        """The controller gives up a claimed runner it cannot trust any more (an
        execution it could not stop): a `retired` tombstone, and the runner is destroyed."""
        await self._finish(runner_id, ClaimState.RETIRED)

    async def _finish(self, runner_id: str, state: ClaimState) -> None:
        for _ in range(CAS_ATTEMPTS):
            record = await self.live(runner_id)
            if await self._cas(record.with_state(state), record.modify_index):
                self._ended(runner_id, state)
                view = self.pool_of_runner(runner_id)
                await self._purge(view, runner_id, state)
                return
        raise _changing(runner_id)

    async def _purge(self, view: PoolView, runner_id: str, state: ClaimState) -> None:
        namespace = view.policy.nomad_namespace
        try:
            await self.engine.purge_runner(runner_id, namespace)
        except NomadError as error:  # the engine purges tombstoned runners anyway
            log.warning("purge of %s runner %s deferred: %s", state, runner_id, error)
        self.metrics.runners_destroyed.labels(pool=view.key, reason=state.value).inc()
        self.engine.hint_namespace(namespace)

    def _ended(self, runner_id: str, state: ClaimState) -> None:
        for listener in self.claim_ended:
            listener(runner_id, state)

    async def _end(self, record: ClaimRecord, state: ClaimState) -> None:
        if await self._cas(record.with_state(state), record.modify_index):
            self._ended(record.runner_id, state)
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
            claim_view(c, self._node_of(c))
            for c in sorted(claims.values(), key=lambda c: c.claimed_at)
            if c.pool == key
            and not c.is_tombstone
            and is_runner_id(view.policy.job_prefix, c.runner_id)
        ]


_CLAIMABLE = frozenset({RunnerState.IDLE, RunnerState.OUTDATED})


def _changing(runner_id: str) -> ServiceError:
    return ServiceError(ErrorCode.NOMAD_UNAVAILABLE, f"runner {runner_id} changed too often; retry")


def _one_namespace(views: Sequence[PoolView]) -> str:
    """The Nomad namespace of every pool of a request with a requestId (request IDs are
    unique per Nomad namespace, so its pools must share one)."""
    namespaces = {view.policy.nomad_namespace for view in views}
    if len(namespaces) > 1:
        raise ServiceError(
            ErrorCode.INVALID_REQUEST,
            "with requestId every pool must be in the same Nomad namespace; "
            f"these are in {', '.join(sorted(namespaces))}",
        )
    return namespaces.pop()
