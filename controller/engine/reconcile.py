"""One pass over a Nomad namespace: observe → split → classify → plan → apply → status.

One observation serves every pool of the namespace. The event loop also serves the claim
API, so a pass must not hold it: the CPU-heavy, pure steps (building views of Nomad's
lists, splitting them among pools, classifying, planning) run in a worker thread that
only computes, while the loop thread stores every result (engine/offload.py), so a pass
cancelled mid-way leaves nothing half-written.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from controller.core import breaker as breakers
from controller.core.catalog import WaitingTally
from controller.core.classify import classify
from controller.core.demand import pass_target
from controller.core.events import EventSink, breaker_closed, breaker_opened, spec_differs
from controller.core.leases import LeaseStanding, LeaseState
from controller.core.plan import DestroyReason, Plan, plan
from controller.core.split import split_observation
from controller.core.views import (
    JobView,
    NodeView,
    PoolObservation,
    PoolPolicy,
    Runner,
    RunnerState,
    placement_failure,
)
from controller.engine.apply import Applier
from controller.engine.catalog import CatalogPublisher
from controller.engine.drains import Drains
from controller.engine.leases import Leases
from controller.engine.observe import (
    NamespaceObservation,
    NodeAccess,
    ViewCache,
    observe_namespace,
)
from controller.engine.offload import compute
from controller.engine.publish import Publisher
from controller.engine.registry import ManagedPool, PoolRegistry
from controller.metrics import Metrics
from controller.nomad.errors import NomadError
from controller.nomad.port import NomadPort
from controller.records.claims import ClaimStore

log = logging.getLogger(__name__)

# Runner states whose classification does not depend on the clock (see _classify).
_CLOCK_FREE_STATES = frozenset({RunnerState.IDLE, RunnerState.OUTDATED, RunnerState.TERMINATING})
_FAILED_STARTS = frozenset({DestroyReason.STARTUP_TIMEOUT, DestroyReason.FAILED})
# Abandoned request records are looked for this often (one extra list call per namespace).
REQUEST_GC_SECONDS = 30.0
# A reconciler that lists only the pools it holds lists the whole namespace this often, to
# find orphans and request records no claim carries.
WHOLE_LISTING_SECONDS = 60.0


@dataclass(frozen=True)
class PassResult:
    namespace: str
    seconds: float
    created: int
    destroyed: int
    errors: int
    # The nearest deadline of a live claim, if any: the next pass should not come later.
    next_deadline: datetime | None = None


@dataclass(frozen=True)
class _Split:
    """The last pass's share-out of one namespace, reused while nothing changed."""

    policies: list[PoolPolicy]
    observation: NamespaceObservation
    by_pool: dict[str, PoolObservation]
    orphans: list[JobView]


@dataclass
class Reconciler:
    port: NomadPort
    store: ClaimStore
    registry: PoolRegistry
    drains: Drains
    applier: Applier
    publisher: Publisher
    metrics: Metrics
    events: EventSink
    clock: Callable[[], datetime]
    leases: Leases | None  # None: this process writes every pool it reconciles
    node_access: NodeAccess  # whether the token may read nodes (drain awareness)
    # Publishes what the API tier needs of the pools this process writes (None: nothing).
    catalog: CatalogPublisher | None = None
    # The claim requests API replicas hold waiting (their waiting records).
    waiting_elsewhere: WaitingTally = field(default_factory=WaitingTally)
    _locks: dict[str, asyncio.Lock] = field(default_factory=dict, init=False)
    _views: dict[str, ViewCache] = field(default_factory=dict, init=False)
    _splits: dict[str, _Split] = field(default_factory=dict, init=False)
    # namespace -> time.monotonic() of the last request record collection
    _requests_collected: dict[str, float] = field(default_factory=dict, init=False)
    # namespace -> time.monotonic() when its last whole listing began
    _whole_listed: dict[str, float] = field(default_factory=dict, init=False)
    # pool key -> set by the pool's next pass
    _observed: dict[str, asyncio.Event] = field(default_factory=dict, init=False)
    # The client nodes as the latest pass over any namespace saw them, by ID.
    nodes: dict[str, NodeView] = field(default_factory=dict, init=False)

    async def run(self, namespace: str) -> PassResult:
        """One full pass over a Nomad namespace: every pool in it, one observation. Passes
        over one namespace never overlap."""
        async with self._locks.setdefault(namespace, asyncio.Lock()):
            started = time.perf_counter()
            try:
                with self.metrics.reconcile_duration.time():
                    return await self._pass(namespace, started)
            except NomadError:
                failed = time.monotonic()
                for managed in self.registry.reconciled(namespace):
                    managed.failed_at = failed  # its view may be older than a recovery
                    self.metrics.reconcile_total.labels(pool=managed.key, result="error").inc()
                raise

    async def wait_for_observation(self, key: str, within: float) -> None:
        """Wait (at most `within` seconds) until the pool has been observed again."""
        event = self._observed.setdefault(key, asyncio.Event())
        try:
            async with asyncio.timeout(within):  # not wait_for: see scheduler._loop
                await event.wait()
        except TimeoutError:
            pass

    async def _pass(self, namespace: str, started: float) -> PassResult:
        pools = self.registry.reconciled(namespace)
        # The lists are narrowed to the pools this pass may act on as the leases stand now;
        # the leases are brought up to date after the observation, as the pass acts on them.
        scope = self._scope(pools, [m for m in pools if self._may_observe(m)])
        whole = scope is None or self._whole_listing_due(namespace)
        observation_started = time.monotonic()
        observed = await observe_namespace(
            self.port,
            self.store,
            namespace,
            self._views.setdefault(namespace, ViewCache()),
            self.node_access,
            scope,
            whole=whole,
        )
        if whole:
            self._whole_listed[namespace] = observation_started
        acting = await self._acting(namespace, pools)
        if scope is not None:  # a lease taken now whose pool was not listed: next pass
            acting = [m for m in acting if m.policy.job_prefix in scope]
        held = {m.key for m in acting}  # by key: comparing pools whole compares their specs
        watched = [
            m
            for m in pools
            if (m.key in held or self._speaks_unheld(m))
            and (scope is None or m.policy.job_prefix in scope)
        ]
        self.nodes = {node.id: node for node in observed.nodes}
        self.metrics.set_capability("node_read", self.node_access.readable)
        now = self.clock()
        upcoming = [
            c.expires_at
            for runner_id, c in observed.claims.items()
            if not c.is_tombstone
            and c.expires_at > now
            and (scope is None or runner_id.startswith(scope))
        ]
        by_pool, orphans = await self._split(namespace, [m.policy for m in pools], observed)
        if whole:  # a narrowed listing holds no orphans
            await self.drains.take_orphans(namespace, orphans)
        await self.drains.sync(acting)
        outcomes = await asyncio.gather(
            *(
                self._pool_pass(m, by_pool[m.key], now, observation_started, m.key in held)
                for m in watched
            )
        )
        observed_keys = {m.key for m in watched}
        for managed in pools:
            if managed.key not in observed_keys:
                await self._leave_unobserved(managed, now)
        for managed in self.registry.in_namespace(namespace):
            if managed.conflict is not None:
                await self.publisher.publish(managed, [], now)
        finished = await self.drains.finish(acting)
        for key in finished:
            self.publisher.forget(key)
        if self.catalog is not None:
            await self._publish_catalog(acting, finished)
        if whole:  # request records of every claim, seen only in a whole listing
            await self._collect_requests(namespace, observed, now)
            if self.leases is not None:
                await self.leases.collect_stale(namespace)
        return PassResult(
            namespace,
            time.perf_counter() - started,
            created=sum(o.created for o in outcomes),
            destroyed=sum(o.destroyed for o in outcomes),
            errors=sum(o.errors for o in outcomes),
            next_deadline=min(upcoming, default=None),
        )

    def watches(self, managed: ManagedPool) -> bool:
        """Whether passes observe the pool: this process writes it, or what its resource
        shows (while another process reconciles it)."""
        if self.leases is None or self.leases.holds(managed.key):
            return True
        return self._speaks_unheld(managed)

    def _may_observe(self, managed: ManagedPool) -> bool:
        """Whether this pass may need the pool's runners: it watches the pool, or no other
        process is known to hold its lease (this pass may take it: a new pool is acted on
        in its first pass)."""
        if self.watches(managed):
            return True
        assert self.leases is not None  # without leases every pool is watched
        return self.leases.state(managed.key).standing is not LeaseStanding.ELSEWHERE

    def _speaks_unheld(self, managed: ManagedPool) -> bool:
        """A RunnerPool whose status this process writes without holding its lease (its
        holder writes another resource's, or nobody holds it): its counts come from here."""
        if self.leases is None or not managed.resource:
            return False
        state = self.leases.state(managed.key)
        return not state.held and state.speaks_here(
            managed.resource, self.leases.speaker(managed.key)
        )

    def _scope(
        self, pools: list[ManagedPool], watched: list[ManagedPool]
    ) -> tuple[str, ...] | None:
        """The job prefixes this pass observes: those of the pools it watches, when that is
        not all of them (reconcilers share the namespace by lease); None: every pool."""
        if len(watched) == len(pools):
            return None
        return tuple(m.policy.job_prefix for m in watched)

    def _whole_listing_due(self, namespace: str) -> bool:
        """A narrowed pass lists the jobs and claims of the whole namespace every
        WHOLE_LISTING_SECONDS (orphans, request records no claim carries)."""
        listed = self._whole_listed.get(namespace)
        return listed is None or time.monotonic() - listed >= WHOLE_LISTING_SECONDS

    async def _leave_unobserved(self, managed: ManagedPool, now: datetime) -> None:
        """Another process reconciles the pool: forget what an earlier pass saw of it (its
        offer would go stale); its status here says only who reconciles it (the claim
        path shows the holder's, from the catalog), and its holder exports its series."""
        if managed.observed or managed.runners:
            managed.forget_observation()
        await self.publisher.publish(managed, [], now, exports=False)

    async def _acting(self, namespace: str, pools: list[ManagedPool]) -> list[ManagedPool]:
        """The pools this pass may write: all of them without leases, those whose lease
        this process holds with them. The namespace's leases are brought up to date first
        (a pool no longer reconciled here gives its lease back)."""
        if self.leases is None:
            return list(pools)
        for managed in pools:
            self.leases.want(managed.key, namespace, managed.spec_hash, managed.resource)
        for key in self.leases.wanted(namespace) - {m.key for m in pools}:
            await self.leases.drop(key)
        await self.leases.refresh([m.key for m in pools])
        for managed in pools:
            self._note_lease(managed, self.leases.state(managed.key))
        held = {m.key: self.leases.holds(m.key) for m in pools}
        self.metrics.set_lease_held(held)
        return [m for m in pools if held[m.key]]

    async def _publish_catalog(self, acting: list[ManagedPool], finished: list[str]) -> None:
        assert self.catalog is not None
        defined = {m.key for m in self.registry}
        records = self.catalog.records
        await self.catalog.publish([m for m in acting if m.key in defined], self.nodes)
        await records.withdraw([*finished, *(set(records.written) - defined)])
        await records.collect_stale(defined)

    def _note_lease(self, managed: ManagedPool, lease: LeaseState) -> None:
        """Keep the pool's lease state for its status; warn once per change when the
        holder reconciles another version of the spec than this process."""
        differs = lease.differs(managed.spec_hash)
        before = managed.lease
        managed.lease = lease
        was = before is not None and before.differs(managed.spec_hash)
        if differs and (not was or before != lease):
            self.events(spec_differs(managed.key, lease.holder))

    async def _collect_requests(
        self, namespace: str, observed: NamespaceObservation, now: datetime
    ) -> None:
        """Every REQUEST_GC_SECONDS: delete request records no claim carries any more.
        Never fails the pass."""
        due = self._requests_collected.get(namespace, -REQUEST_GC_SECONDS) + REQUEST_GC_SECONDS
        if time.monotonic() < due:
            return
        self._requests_collected[namespace] = time.monotonic()
        try:
            await self.store.collect_abandoned_requests(namespace, observed.claims.values(), now)
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
            and len(cached.policies) == len(policies)
            and all(a is b for a, b in zip(cached.policies, policies, strict=True))
            and cached.observation == observed
        ):
            return cached.by_pool, cached.orphans
        by_pool, orphans = await compute(
            len(observed.jobs),
            split_observation,
            policies,
            observed.jobs,
            observed.allocations,
            observed.claims,
            observed.malformed_claims,
            observed.leaving_nodes,
        )
        self._splits[namespace] = _Split(policies, observed, by_pool, orphans)
        return by_pool, orphans

    async def _pool_pass(
        self,
        managed: ManagedPool,
        observation: PoolObservation,
        now: datetime,
        observation_started: float,
        acting: bool,
    ) -> _Outcome:
        policy = managed.policy
        runners = await compute(len(observation.jobs), _classify, managed, policy, observation, now)
        managed.classified_policy = policy
        started, managed.seen_running = breakers.newly_running(managed.seen_running, runners)
        managed.runners, managed.observation, managed.observed = tuple(runners), observation, True
        managed.observation_started = observation_started
        managed.observed_jobs()
        # Only demand reads every job and claim; a thread hop would cost more than the rest.
        measured = len(observation.jobs) + len(observation.claims) if policy.demand else 0
        managed.target, managed.pacing = await compute(
            measured,
            pass_target,
            policy,
            observation,
            runners,
            managed.pacing,
            (*managed.waiting.arrivals, *self.waiting_elsewhere.arrivals.get(managed.key, ())),
            now,
            managed.waiting.take_abandoned() + self.waiting_elsewhere.take_abandoned(managed.key),
        )
        self._observed.pop(managed.key, asyncio.Event()).set()
        if not acting:  # observes, never writes: another process holds the lease
            await self.publisher.publish(managed, runners, now, exports=self.leases is None)
            return _Outcome()
        todo = await compute(
            len(runners),
            plan,
            policy,
            observation,
            runners,
            now,
            creation_allowed=breakers.creation_allowed(managed.breaker, now),
            target=managed.idle_target.idle_runners,
        )
        applied = await self.applier.apply(managed, todo, runners, now)
        failures = [*await self._failed_starts(managed, todo, runners), *applied.refused]
        self._record_breaker(managed, started, failures, now)
        self.metrics.reconcile_total.labels(
            pool=policy.key, result="error" if applied.errors else "success"
        ).inc()
        await self.publisher.publish(managed, runners, now)
        return _Outcome(applied.created, applied.destroyed, applied.errors)

    async def _failed_starts(
        self, managed: ManagedPool, todo: Plan, runners: Sequence[Runner]
    ) -> list[str]:
        """Nomad's reason for each runner the plan destroys as a failed start. A runner
        that never got an allocation failed in placement: its evaluations say why (read
        for the last one only, whose reason the Degraded message shows)."""
        by_id = {r.id: r for r in runners}
        failed = [by_id[d.runner_id] for d in todo.destroy if d.reason in _FAILED_STARTS]
        reasons = [runner.reason for runner in failed]
        if failed and failed[-1].allocation is None:
            placement = await self._placement_failure(failed[-1].id, managed.policy)
            if placement:
                reasons[-1] = f"{reasons[-1]}: {placement}"
        return reasons

    async def _placement_failure(self, job_id: str, policy: PoolPolicy) -> str:
        try:
            evaluations = await self.port.job_evaluations(job_id, policy.nomad_namespace)
        except NomadError as error:
            log.debug("reading the evaluations of %s: %s", job_id, error)
            return ""
        return placement_failure(evaluations)

    def _record_breaker(
        self, managed: ManagedPool, successes: int, failures: list[str], now: datetime
    ) -> None:
        before = managed.breaker
        after = breakers.record(before, successes, failures, now)
        managed.breaker = after
        if breakers.degraded(after) and after.open_until != before.open_until:
            pause = after.open_until - now if after.open_until else timedelta(0)
            opened = breaker_opened(
                managed.key, after.consecutive_failures, pause.total_seconds(), after.last_failure
            )
            self.events(opened)
        elif breakers.degraded(before) and not breakers.degraded(after):
            self.events(breaker_closed(managed.key))


@dataclass(frozen=True)
class _Outcome:
    created: int = 0
    destroyed: int = 0
    errors: int = 0


def _classify(
    managed: ManagedPool, policy: PoolPolicy, observation: PoolObservation, now: datetime
) -> list[Runner]:
    """Classify the pool's runners, or reuse the last pass's result when nothing the
    classification reads has changed: the same policy, an equal observation (the views
    are the very objects of the last pass unless Nomad changed them, so this is cheap),
    and only states that do not depend on the clock (a starting runner can time out and a
    claim can expire, so those are always classified again). Runs in a worker thread, so
    it only reads: the caller stores the result."""
    previous = managed.observation
    if (
        previous is not None
        and managed.classified_policy is policy
        and all(r.state in _CLOCK_FREE_STATES for r in managed.runners)
        and observation == previous
    ):
        return list(managed.runners)
    return classify(policy, observation, now)
