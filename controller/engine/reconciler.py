"""The level-triggered loop: observe → classify → plan → apply → status, per Nomad namespace.

One loop per Nomad namespace. It runs on the resync period and whenever a hint arrives
(an event from Nomad's stream, a claim that consumed an idle runner, a spec change). A hint
never changes state by itself; it only makes the loop look again soon. Hints arriving
within the coalescing window cost one pass.

The event loop also serves the claim API, so a pass must not hold it: the CPU-heavy,
pure steps (building views of Nomad's lists, splitting them among pools, classifying,
planning) run in a worker thread that only computes (the loop thread stores every
result), and the service has the interpreter hand the GIL back to the loop thread every
half millisecond (service.GIL_SWITCH_SECONDS). With 1,000 runners this cut the p99 of a
claim made during a pass about threefold (docs/performance.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import random
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from controller.core import breaker as breakers
from controller.core.claims import ClaimRecord, ClaimState, claim_path, request_path
from controller.core.classify import classify
from controller.core.plan import Destroy, DestroyReason, Plan, plan
from controller.core.runner_ids import is_runner_id, new_runner_id, runner_prefix
from controller.core.split import split_observation
from controller.core.status import PoolStatus, compute_status, count, needs_write
from controller.core.times import format_time, parse_time, utcnow
from controller.core.views import (
    JobView,
    PoolMode,
    PoolObservation,
    PoolPolicy,
    Runner,
    RunnerState,
)
from controller.engine.observe import (
    ClaimCache,
    NamespaceObservation,
    observe_namespace,
    read_claims,
)
from controller.engine.offload import compute
from controller.engine.requests_gc import collect_abandoned_requests
from controller.metrics import Metrics
from controller.model import RunnerPool
from controller.nomad.client import NomadClient
from controller.nomad.errors import NomadConflict, NomadError
from controller.nomad.jobs import render_job, runner_job, template_hash

log = logging.getLogger(__name__)

DRAINS_PREFIX = "poolkeeper/pools/"
DEFAULT_DRAIN_SECONDS = 3600

Clock = Callable[[], datetime]
StatusSink = Callable[[str, PoolStatus], Awaitable[None] | None]

COALESCE_SECONDS = 0.02
MAX_COALESCE_SECONDS = 0.25
# Runner states whose classification does not depend on the clock (see Engine._classify).
_CLOCK_FREE_STATES = frozenset({RunnerState.IDLE, RunnerState.OUTDATED, RunnerState.TERMINATING})
APPLY_CONCURRENCY = 32
# Abandoned request records are looked for this often (one extra list call per namespace).
REQUEST_GC_SECONDS = 30.0


def drain_path(key: str) -> str:
    # Variable paths allow no ".", which pool names may hold; "~" never occurs in a name.
    return DRAINS_PREFIX + key.replace(".", "~")


@dataclass
class ManagedPool:
    """A pool the engine keeps, with what it learnt on the last pass."""

    pool: RunnerPool | None  # None: a drain resumed from Nomad or an orphan being pruned
    policy: PoolPolicy
    rendered_job: dict[str, Any]
    generation: int
    order: int  # first registration; the earlier of two pools with one prefix wins
    problem: tuple[str, str] | None = None
    breaker: breakers.BreakerState = field(default_factory=breakers.BreakerState)
    status: PoolStatus | None = None
    status_written_at: datetime | None = None
    runners: tuple[Runner, ...] = ()
    observation: PoolObservation | None = None
    observed: bool = False
    observation_started: float = 0.0  # time.monotonic() when the last observation began
    classified_policy: PoolPolicy | None = None  # the policy `runners` were classified with

    @property
    def key(self) -> str:
        return self.policy.key


@dataclass(frozen=True)
class Applied:
    created: int = 0
    create_errors: int = 0
    destroyed: int = 0
    errors: int = 0


@dataclass(frozen=True)
class PassResult:
    namespace: str
    seconds: float
    created: int
    destroyed: int
    errors: int


class Engine:
    def __init__(
        self,
        client: NomadClient,
        metrics: Metrics,
        *,
        resync_seconds: float = 10.0,
        clock: Clock = utcnow,
        rng: random.Random | None = None,
        on_status: StatusSink | None = None,
        surge: int = 20,
        reconcile: bool = True,
        home_namespace: str = "default",
        prune: bool = False,
    ) -> None:
        self.client = client
        self.metrics = metrics
        self.resync_seconds = resync_seconds
        self.clock = clock
        self.rng = rng
        self.on_status = on_status
        self.surge = surge
        self.reconcile = reconcile
        self.home_namespace = home_namespace
        self.prune = prune
        # Keys of pools defined somewhere but not valid now: never orphans, never pruned.
        self.protected: set[str] = set()
        self._drain_records: dict[str, int] = {}  # pool key -> ModifyIndex of its record
        self._cancelled_drains: set[str] = set()
        self._requests_collected: dict[str, float] = {}  # namespace -> time.monotonic()
        self._reported_orphans: set[str] = set()
        self.pools: dict[str, ManagedPool] = {}
        self._order = itertools.count()
        self._caches: dict[str, ClaimCache] = {}
        # namespace -> (policies, observation, split) of the last pass, see _split.
        self._splits: dict[
            str,
            tuple[
                list[PoolPolicy],
                NamespaceObservation,
                dict[str, PoolObservation],
                list[JobView],
            ],
        ] = {}
        self._wake: dict[str, asyncio.Event] = {}
        self._loops: dict[str, asyncio.Task[None]] = {}
        self._pass_lock: dict[str, asyncio.Lock] = {}
        self._running = False
        self._apply_slots = asyncio.Semaphore(APPLY_CONCURRENCY)
        self._observed: dict[str, asyncio.Event] = {}
        self._deadlines: dict[str, datetime] = {}
        self.passes: dict[str, PassResult] = {}

    # ---- pools -------------------------------------------------------------------------

    def upsert_pool(
        self, pool: RunnerPool, generation: int = 0, problem: tuple[str, str] | None = None
    ) -> None:
        """Register a new pool or replace the spec of a known one (immutable fields are the
        caller's to check)."""
        rendered = render_job(pool)
        existing = self.pools.get(pool.key)
        policy = PoolPolicy(
            key=pool.key,
            nomad_namespace=pool.spec.nomad.namespace,
            job_prefix=pool.job_prefix,
            desired_idle=pool.spec.idle_runners,
            max_runners=pool.spec.max_runners,
            startup_timeout_seconds=pool.spec.startup_timeout_seconds,
            template_hash=template_hash(rendered),
            surge=self.surge,
        )
        if existing is None:
            self.pools[pool.key] = ManagedPool(
                pool, policy, rendered, generation, next(self._order), problem
            )
        else:
            existing.pool, existing.policy, existing.rendered_job = pool, policy, rendered
            existing.generation, existing.problem = generation, problem
        self._resolve_prefix_conflicts()
        self._ensure_loop(policy.nomad_namespace)
        self.hint_namespace(policy.nomad_namespace)

    def remove_pool(self, key: str, mode: PoolMode | None, drain_seconds: float = 0) -> None:
        """Stop managing a pool. With a mode (drain/delete) its runners are still destroyed
        as that mode says; with None (Orphan) Nomad is left alone."""
        managed = self.pools.get(key)
        if managed is None:
            return
        if mode is None or mode is PoolMode.ACTIVE or not self.reconcile:
            del self.pools[key]
            self.metrics.forget_pool(key)
            # Orphan after a drain began (the escape from a stuck drain): a restarted
            # controller must not resume the drain from its record.
            self._cancelled_drains.add(key)
        else:
            deadline = self.clock() + timedelta(seconds=drain_seconds)
            managed.policy = replace(managed.policy, mode=mode, drain_deadline=deadline)
        self._resolve_prefix_conflicts()
        self.hint_namespace(managed.policy.nomad_namespace)

    def forget_pools(self) -> None:
        """Drop every pool without touching Nomad or the drain records: another process
        owns them now (a passive operator replica)."""
        for key in list(self.pools):
            self.metrics.forget_pool(key)
        self.pools.clear()
        self._drain_records.clear()
        self._cancelled_drains.clear()

    def _add_draining(
        self, key: str, namespace: str, job_prefix: str, mode: PoolMode, deadline: datetime
    ) -> None:
        """Manage a pool known only by its runners: a resumed drain or a pruned orphan."""
        policy = PoolPolicy(
            key=key,
            nomad_namespace=namespace,
            job_prefix=job_prefix,
            desired_idle=0,
            max_runners=0,
            startup_timeout_seconds=1,
            template_hash="",
            mode=mode,
            drain_deadline=deadline,
        )
        self.pools[key] = ManagedPool(None, policy, {}, 0, next(self._order))
        self._resolve_prefix_conflicts()
        self._ensure_loop(namespace)
        self.hint_namespace(namespace)

    async def resume_drains(self) -> None:
        """Take up the drains a previous process recorded in Nomad and did not finish."""
        home = self.home_namespace
        for meta in await self.client.list_variables(DRAINS_PREFIX, home):
            variable = await self.client.read_variable(meta["Path"], home)
            if variable is None:
                continue
            items = variable.get("Items", {})
            try:
                key, mode = items["pool"], PoolMode(items["mode"])
                namespace, prefix = items["namespace"], items["jobPrefix"]
                deadline = parse_time(items["deadline"])
            except (KeyError, ValueError) as error:
                log.warning("ignoring malformed drain record %s: %s", meta["Path"], error)
                continue
            self._drain_records[key] = int(variable.get("ModifyIndex", 0))
            if key not in self.pools:
                log.info("resuming the %s of pool %s", mode.value, key)
                self._add_draining(key, namespace, prefix, mode, deadline)

    async def _sync_drain_record(self, managed: ManagedPool) -> None:
        """A pool being drained or deleted is recorded in Nomad so a restart resumes it;
        a pool defined again cancels its record."""
        key, policy = managed.key, managed.policy
        path = drain_path(key)
        if policy.mode is not PoolMode.ACTIVE and key not in self._drain_records:
            deadline = policy.drain_deadline or self.clock()
            items = {
                "pool": key,
                "namespace": policy.nomad_namespace,
                "jobPrefix": policy.job_prefix,
                "mode": policy.mode.value,
                "deadline": format_time(deadline),
            }
            try:
                stored = await self.client.put_variable(path, items, self.home_namespace, cas=0)
            except NomadConflict as conflict:
                stored = conflict.current or {}
            self._drain_records[key] = int(stored.get("ModifyIndex", 0))
        elif policy.mode is PoolMode.ACTIVE and key in self._drain_records:
            await self._drop_drain_record(key)

    async def _drop_drain_record(self, key: str) -> None:
        index = self._drain_records.pop(key, None)
        if index is not None:
            with contextlib.suppress(NomadConflict):
                await self.client.delete_variable(drain_path(key), self.home_namespace, cas=index)

    def _take_orphans(self, namespace: str, orphans: list[JobView]) -> None:
        """Report runner jobs of pools defined nowhere; with --prune, drain them."""
        for job in orphans:
            key = job.pool
            if key in self.pools or key in self.protected:
                continue
            prefix = runner_prefix(job.id)
            if self.prune and prefix is not None:
                log.warning("pruning orphaned runners of pool %s (--prune)", key)
                deadline = self.clock() + timedelta(seconds=DEFAULT_DRAIN_SECONDS)
                self._add_draining(key, namespace, prefix, PoolMode.DRAIN, deadline)
            elif key not in self._reported_orphans:
                self._reported_orphans.add(key)
                log.warning(
                    "namespace %s holds runner jobs of pool %s, which is not defined: "
                    "left alone (orphaned; --prune drains them)",
                    namespace,
                    key,
                )

    def _resolve_prefix_conflicts(self) -> None:
        owners: dict[tuple[str, str], ManagedPool] = {}
        for managed in sorted(self.pools.values(), key=lambda m: m.order):
            slot = (managed.policy.nomad_namespace, managed.policy.job_prefix)
            owner = owners.setdefault(slot, managed)
            if owner is not managed:
                managed.problem = (
                    "PrefixConflict",
                    f"job prefix {managed.policy.job_prefix!r} in Nomad namespace "
                    f"{slot[0]!r} is already used by pool {owner.key}",
                )
            elif managed.problem is not None and managed.problem[0] == "PrefixConflict":
                managed.problem = None

    def active_pools(self, namespace: str) -> list[ManagedPool]:
        return [
            m
            for m in self.pools.values()
            if m.policy.nomad_namespace == namespace and m.problem is None
        ]

    def namespaces(self) -> set[str]:
        return {m.policy.nomad_namespace for m in self.pools.values()}

    def ready(self) -> list[str]:
        """Keys of the valid pools not observed yet; empty when the engine is ready."""
        return [m.key for m in self.pools.values() if m.problem is None and not m.observed]

    # ---- hints and loops ---------------------------------------------------------------

    def hint_namespace(self, namespace: str) -> None:
        event = self._wake.get(namespace)
        if event is not None:
            event.set()

    def hint_job(self, namespace: str, job_id: str) -> None:
        """An event about a job: wake the namespace only if the job looks like a runner."""
        if any(is_runner_id(m.policy.job_prefix, job_id) for m in self.active_pools(namespace)):
            self.hint_namespace(namespace)

    def _ensure_loop(self, namespace: str) -> None:
        self._wake.setdefault(namespace, asyncio.Event())
        self._pass_lock.setdefault(namespace, asyncio.Lock())
        if self._running and namespace not in self._loops:
            self._loops[namespace] = asyncio.create_task(
                self._loop(namespace), name=f"reconcile:{namespace}"
            )

    async def start(self) -> None:
        self._running = True
        for namespace in self.namespaces():
            self._ensure_loop(namespace)

    async def stop(self) -> None:
        """Stop the loops. Stopping never destroys runners: Nomad keeps them."""
        self._running = False
        loops = list(self._loops.values())
        self._loops.clear()
        for task in loops:
            task.cancel()
        await asyncio.gather(*loops, return_exceptions=True)

    async def _loop(self, namespace: str) -> None:
        wake = self._wake[namespace]
        while self._running:
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for swallows a cancel that
            # arrives just as the hint it waits for is set (CPython gh-86296), and stop()
            # then waited for ever for a loop that kept running.
            try:
                async with asyncio.timeout(self._sleep_seconds(namespace)):
                    await wake.wait()
                await asyncio.sleep(self._coalesce_seconds(namespace))
            except TimeoutError:
                pass
            wake.clear()
            try:
                await self.reconcile_namespace(namespace)
            except NomadError as error:
                log.warning("reconcile of namespace %s failed: %s", namespace, error)
                await asyncio.sleep(min(1.0, self.resync_seconds))
            except Exception:
                log.exception("reconcile of namespace %s crashed; retrying", namespace)
                await asyncio.sleep(min(1.0, self.resync_seconds))

    def _coalesce_seconds(self, namespace: str) -> float:
        """How long hints are gathered before a pass: COALESCE_SECONDS, or twice as long as
        the last pass took (at most MAX_COALESCE_SECONDS). Under a stream of hints (a claim
        burst) passes then use at most about a third of the event loop, which the claim
        API shares, instead of running back to back; small namespaces, whose passes take
        a few milliseconds, keep the short window (and a quick refill)."""
        last = self.passes.get(namespace)
        if last is None:
            return COALESCE_SECONDS
        return min(MAX_COALESCE_SECONDS, max(COALESCE_SECONDS, 2 * last.seconds))

    def _sleep_seconds(self, namespace: str) -> float:
        """Until the resync, or until the next claim deadline if that comes first, so an
        expired claim is destroyed at its deadline rather than a resync later."""
        deadline = self._deadlines.get(namespace)
        if deadline is None:
            return self.resync_seconds
        until = (deadline - self.clock()).total_seconds() + COALESCE_SECONDS
        return max(COALESCE_SECONDS, min(self.resync_seconds, until))

    async def wait_for_observation(self, key: str, within: float) -> None:
        """Wait (at most `within` seconds) until the pool has been observed again."""
        event = self._observed.setdefault(key, asyncio.Event())
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(within):  # see _loop on wait_for
                await event.wait()

    async def read_claims(self, namespace: str) -> dict[str, ClaimRecord]:
        claims, _ = await read_claims(
            self.client, namespace, self._caches.setdefault(namespace, ClaimCache())
        )
        return claims

    def remember_claim(self, record: ClaimRecord) -> None:
        """A claim variable this process just wrote (the claim API): the next pass takes it
        from the cache instead of reading it back from Nomad."""
        self._caches.setdefault(record.namespace, ClaimCache()).remember(record)

    # ---- one pass ----------------------------------------------------------------------

    async def reconcile_namespace(self, namespace: str) -> PassResult:
        """One full pass over a Nomad namespace: every pool in it, one observation."""
        async with self._pass_lock.setdefault(namespace, asyncio.Lock()):
            started = time.perf_counter()
            try:
                with self.metrics.reconcile_duration.time():
                    result = await self._pass(namespace, started)
            except NomadError:
                for managed in self.active_pools(namespace):
                    self.metrics.reconcile_total.labels(pool=managed.key, result="error").inc()
                raise
            self.passes[namespace] = result
            return result

    async def _pass(self, namespace: str, started: float) -> PassResult:
        cache = self._caches.setdefault(namespace, ClaimCache())
        observation_started = time.monotonic()
        observed = await observe_namespace(self.client, namespace, cache)
        now = self.clock()
        upcoming = [
            c.expires_at
            for c in observed.claims.values()
            if not c.is_tombstone and c.expires_at > now
        ]
        self._deadlines[namespace] = min(upcoming, default=now + timedelta(days=1))
        pools = self.active_pools(namespace)
        by_pool, orphans = await self._split(namespace, [m.policy for m in pools], observed)
        if self.reconcile:
            self._take_orphans(namespace, orphans)
            for managed in pools:
                await self._sync_drain_record(managed)
            for key in self._cancelled_drains - set(self.pools):
                await self._drop_drain_record(key)
            self._cancelled_drains.clear()
        outcomes = await asyncio.gather(
            *(self._reconcile_pool(m, by_pool[m.key], now, observation_started) for m in pools)
        )
        for managed in self.pools.values():
            if managed.policy.nomad_namespace == namespace and managed.problem is not None:
                await self._publish(managed, [], now)
        await self._finish_drains(pools)
        if self.reconcile:
            await self._collect_requests(namespace, observed, now)
        return PassResult(
            namespace,
            time.perf_counter() - started,
            created=sum(o.created for o in outcomes),
            destroyed=sum(o.destroyed for o in outcomes),
            errors=sum(o.errors for o in outcomes),
        )

    async def _collect_requests(
        self, namespace: str, observed: NamespaceObservation, now: datetime
    ) -> None:
        """Every REQUEST_GC_SECONDS: delete request records no claim carries any more
        (a claimer died between the record and the claim). Never fails the pass."""
        due = self._requests_collected.get(namespace, -REQUEST_GC_SECONDS) + REQUEST_GC_SECONDS
        if time.monotonic() < due:
            return
        self._requests_collected[namespace] = time.monotonic()
        try:
            await collect_abandoned_requests(self.client, namespace, observed.claims.values(), now)
        except NomadError as error:
            log.warning("collecting abandoned request records in %s: %s", namespace, error)

    async def _split(
        self, namespace: str, policies: list[PoolPolicy], observed: NamespaceObservation
    ) -> tuple[dict[str, PoolObservation], list[JobView]]:
        """Share the observation among the pools; when neither the policies nor anything
        observed changed since the last pass (the usual steady state), the last split is
        reused. The comparison is cheap: unchanged views are the same objects."""
        cached = self._splits.get(namespace)
        if (
            cached is not None
            and len(cached[0]) == len(policies)
            and all(a is b for a, b in zip(cached[0], policies, strict=True))
            and cached[1] == observed
        ):
            return cached[2], cached[3]
        by_pool, orphans = await compute(
            len(observed.jobs),
            split_observation,
            policies,
            observed.jobs,
            observed.allocations,
            observed.claims,
            observed.malformed_claims,
        )
        self._splits[namespace] = (policies, observed, by_pool, orphans)
        return by_pool, orphans

    async def _reconcile_pool(
        self,
        managed: ManagedPool,
        observation: PoolObservation,
        now: datetime,
        observation_started: float,
    ) -> Applied:
        policy = managed.policy
        runners = await compute(
            len(observation.jobs), self._classify, managed, policy, observation, now
        )
        managed.classified_policy = policy
        started = breakers.count_started(managed.runners, runners)
        managed.runners, managed.observation, managed.observed = tuple(runners), observation, True
        managed.observation_started = observation_started
        self._observed.pop(managed.key, asyncio.Event()).set()
        if not self.reconcile:  # a claims-only replica observes, never acts
            await self._publish(managed, runners, now)
            return Applied()
        todo = await compute(
            len(runners),
            plan,
            policy,
            observation,
            runners,
            now,
            creation_allowed=breakers.creation_allowed(managed.breaker, now),
        )
        applied = await self._apply(managed, todo, runners, now)
        # A registration Nomad accepted says nothing about whether the image starts: the
        # breaker counts runners that reached running as successes, and failed
        # registrations, failed starts and startup timeouts as failures.
        start_failures = sum(
            1
            for d in todo.destroy
            if d.reason in (DestroyReason.STARTUP_TIMEOUT, DestroyReason.FAILED)
        )
        managed.breaker = breakers.record(
            managed.breaker, started, applied.create_errors + start_failures, now
        )
        self.metrics.reconcile_total.labels(
            pool=policy.key, result="error" if applied.errors else "success"
        ).inc()
        await self._publish(managed, runners, now)
        return applied

    @staticmethod
    def _classify(
        managed: ManagedPool, policy: PoolPolicy, observation: PoolObservation, now: datetime
    ) -> list[Runner]:
        """Classify the pool's runners, or reuse the last pass's result when nothing the
        classification reads has changed: the same policy, an equal observation (the views
        are the very objects of the last pass unless Nomad changed them, so this is
        cheap), and only states that do not depend on the clock (a starting runner can
        time out and a claim can expire, so those are always classified again).
        Runs in a worker thread, so it only reads: the caller stores the result."""
        previous = managed.observation
        if (
            previous is not None
            and managed.classified_policy is policy
            and all(r.state in _CLOCK_FREE_STATES for r in managed.runners)
            and observation == previous
        ):
            return list(managed.runners)
        return classify(policy, observation, now)

    async def _publish(self, managed: ManagedPool, runners: list[Runner], now: datetime) -> None:
        status = compute_status(
            managed.policy,
            runners,
            now=now,
            previous=managed.status,
            observed_generation=managed.generation,
            breaker_open=breakers.degraded(managed.breaker),
            problem=managed.problem,
        )
        counts = count(runners)
        self.metrics.set_runner_counts(
            managed.key,
            {
                "idle": counts.idle - counts.outdated,
                "starting": counts.starting,
                "claimed": counts.claimed,
                "outdated": counts.outdated,
                "terminating": counts.terminating,
            },
            managed.policy.desired_idle,
        )
        if managed.status is not None and not needs_write(managed.status, status, now):
            return
        managed.status, managed.status_written_at = status, now
        if self.on_status is not None:
            written = self.on_status(managed.key, status)
            if written is not None:
                await written

    async def _finish_drains(self, pools: Iterable[ManagedPool]) -> None:
        """A removed pool is forgotten once Nomad holds nothing of it: no runner job and no
        claim variable (its tombstones are forgotten by the plan after ten minutes)."""
        for managed in list(pools):
            if managed.policy.mode is PoolMode.ACTIVE or managed.observation is None:
                continue
            if not managed.runners and not managed.observation.claims:
                log.info("pool %s drained; forgetting it", managed.key)
                del self.pools[managed.key]
                self.metrics.forget_pool(managed.key)
                await self._drop_drain_record(managed.key)

    # ---- apply -------------------------------------------------------------------------

    async def _apply(
        self, managed: ManagedPool, todo: Plan, runners: list[Runner], now: datetime
    ) -> Applied:
        """Run every action of the plan concurrently; one failure never blocks the others."""
        by_id = {r.id: r for r in runners}
        creations = await asyncio.gather(
            *(self._create(managed) for _ in range(todo.create)),
            return_exceptions=True,
        )
        others: list[Awaitable[bool]] = [
            self._destroy(managed, d, by_id.get(d.runner_id), now) for d in todo.destroy
        ]
        others += [self._mark_lost(managed, claim) for claim in todo.lose]
        others += [self._forget(managed, claim) for claim in todo.forget]
        outcomes = await asyncio.gather(*others, return_exceptions=True)
        for outcome in (*creations, *outcomes):
            if isinstance(outcome, NomadError):
                log.warning("pool %s: %s", managed.key, outcome)
            elif isinstance(outcome, BaseException):
                log.error("pool %s: action failed", managed.key, exc_info=outcome)
        return Applied(
            created=sum(1 for c in creations if c is True),
            create_errors=sum(1 for c in creations if isinstance(c, BaseException)),
            destroyed=sum(1 for o in outcomes[: len(todo.destroy)] if o is True),
            errors=sum(1 for o in (*creations, *outcomes) if isinstance(o, BaseException)),
        )

    async def _create(self, managed: ManagedPool) -> bool:
        policy = managed.policy
        runner_id = new_runner_id(policy.job_prefix, self.rng)
        job = runner_job(
            managed.rendered_job,
            runner_id,
            policy.key,
            policy.template_hash,
            policy.nomad_namespace,
        )
        async with self._apply_slots:
            # enforce_index=0: a retried or duplicated registration can never overwrite a job.
            await self.client.register_job(job, enforce_index=0)
        self.metrics.runners_created.labels(pool=policy.key).inc()
        return True

    async def _destroy(
        self, managed: ManagedPool, destroy: Destroy, runner: Runner | None, now: datetime
    ) -> bool:
        """Take the runner's claim variable first, then purge its job (CONTRACT.md §5)."""
        policy = managed.policy
        async with self._apply_slots:
            if destroy.claim is None:
                allocation = runner.allocation.id if runner and runner.allocation else ""
                tombstone = ClaimRecord(
                    runner_id=destroy.runner_id,
                    namespace=policy.nomad_namespace,
                    modify_index=0,
                    modify_time_ns=0,
                    pool=policy.key,
                    allocation_id=allocation,
                    claimed_at=now,
                    expires_at=now,
                    inactivity_timeout_seconds=0,
                    request_id=None,
                    state=destroy.tombstone_state,
                    allocation_restarts=None,
                    extra={},
                )
                if not await self._write_claim(tombstone, cas=0):
                    return False  # a client claimed it first: it stays claimed
            elif not destroy.claim.is_tombstone:
                ended = destroy.claim.with_state(destroy.tombstone_state)
                if not await self._write_claim(ended, cas=destroy.claim.modify_index):
                    return False  # a keepalive or release won; the next pass decides again
            await self.client.purge_job(destroy.runner_id, policy.nomad_namespace)
        self.metrics.runners_destroyed.labels(pool=policy.key, reason=destroy.reason.value).inc()
        return True

    async def _mark_lost(self, managed: ManagedPool, claim: ClaimRecord) -> bool:
        async with self._apply_slots:
            return await self._write_claim(
                claim.with_state(ClaimState.LOST), cas=claim.modify_index
            )

    async def _forget(self, managed: ManagedPool, claim: ClaimRecord) -> bool:
        async with self._apply_slots:
            try:
                await self.client.delete_variable(
                    claim_path(claim.runner_id), claim.namespace, cas=claim.modify_index
                )
            except NomadConflict:
                return False
            if claim.request_id:
                await self.client.delete_variable(request_path(claim.request_id), claim.namespace)
        return True

    async def _write_claim(self, record: ClaimRecord, *, cas: int) -> bool:
        try:
            stored = await self.client.put_variable(
                claim_path(record.runner_id), record.to_items(), record.namespace, cas=cas
            )
        except NomadConflict:
            return False
        self.remember_claim(ClaimRecord.from_variable(stored))
        return True
