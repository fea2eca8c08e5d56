"""The engine: makes Nomad hold what the registered pools ask for, level-triggered.

It is wired from rooms of its own: the pool registry (registry.py), when passes run
(scheduler.py), one pass (reconcile.py: observe, split, classify, plan, apply.py,
publish.py), removed pools and orphans (drains.py). Code outside reads pools through
`PoolView`s and hears of what happens through the status and event sinks.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, nullcontext
from datetime import datetime, timedelta

from controller.core.catalog import WaitingRecord
from controller.core.events import EventSink, PoolEvent
from controller.core.leases import DEFAULT_TTL_SECONDS
from controller.core.problems import PoolProblem
from controller.core.readiness import Readiness, assess
from controller.core.runner_ids import is_runner_id
from controller.core.status import PoolStatus
from controller.core.times import utcnow
from controller.core.views import NodeView, PoolMode
from controller.engine.apply import Applier
from controller.engine.catalog import CatalogPublisher
from controller.engine.drains import Drains
from controller.engine.leases import Leases
from controller.engine.observe import NodeAccess
from controller.engine.publish import Publisher, StatusSink
from controller.engine.reconcile import PassResult, Reconciler
from controller.engine.registry import PoolRegistry, PoolView
from controller.engine.scheduler import Scheduler
from controller.metrics import Metrics
from controller.model import RunnerPool
from controller.nomad.port import NomadPort
from controller.records.shared import SharedRecords

Clock = Callable[[], datetime]

# With no live claim, the loop still wakes on the resync period; this only bounds the
# deadline handed to the scheduler.
_NO_DEADLINE = timedelta(days=1)
# How long stopping lets a pass in flight finish before it is cancelled.
STOP_GRACE_SECONDS = 5.0


def _ignore(_: PoolEvent) -> None:
    pass


def _always(_: str) -> bool:
    return True


def _unfenced(_: str) -> AbstractContextManager[bool]:
    return nullcontext(True)


class PoolViews(Mapping[str, PoolView]):
    """The registered pools by key, read-only."""

    def __init__(self, registry: PoolRegistry) -> None:
        self._registry = registry

    def __getitem__(self, key: str) -> PoolView:
        view = self._registry.view(key)
        if view is None:
            raise KeyError(key)
        return view

    def __iter__(self) -> Iterator[str]:
        return iter([m.key for m in self._registry])

    def __len__(self) -> int:
        return sum(1 for _ in self._registry)


class Engine:
    def __init__(
        self,
        port: NomadPort,
        metrics: Metrics,
        *,
        resync_seconds: float = 10.0,
        clock: Clock = utcnow,
        rng: random.Random | None = None,
        on_status: StatusSink | None = None,
        on_event: EventSink = _ignore,
        surge: int = 20,
        home_namespace: str = "default",
        prune: bool = False,
        orphan_advice: str = "",
        identity: str | None = None,
        lease_ttl_seconds: float = DEFAULT_TTL_SECONDS,
        records: SharedRecords | None = None,
        keeps_environments: bool = False,
    ) -> None:
        """With an `identity`, every pool is written only while this
        process holds its lease (core/leases.py); without one, this process writes every
        pool it reconciles (the lab's single-process tools). `records`: the process's
        shared records (its own on `port` without); `keeps_environments`: its member
        record says it registers the managed Poseidon environments' pools."""
        self.metrics = metrics
        self.clock = clock
        self._port = port
        records = records or SharedRecords(port, port, home_namespace, identity or "", clock)
        self.store = records.claims  # shared with the claim path: one cache
        self._registry = PoolRegistry(surge=surge, events=on_event)
        self.pools = PoolViews(self._registry)
        node_access = NodeAccess()
        self._publisher = Publisher(metrics, on_status, node_access)
        self.leases = (
            Leases(
                records.leases(lease_ttl_seconds),
                identity,
                on_event,
                on_change=self._lease_changed,
                members=records.members(lease_ttl_seconds, environments=keeps_environments),
            )
            if identity is not None
            else None
        )
        self._drains = Drains(
            records.drains,
            self._registry,
            clock=clock,
            prune=prune,
            on_new_pool=self._pool_added,
            orphan_advice=orphan_advice,
            leases=self.leases,
        )
        # Whether this process writes a pool's jobs now: it holds the pool's lease (every
        # pool, without leases); `fence` also keeps the lease while a write is in flight.
        self.writes: Callable[[str], bool] = (
            self.leases.holds if self.leases is not None else _always
        )
        self.fence: Callable[[str], AbstractContextManager[bool]] = (
            self.leases.writing if self.leases is not None else _unfenced
        )
        self._applier = Applier(port, self.store, metrics, on_event, rng, self.fence)
        self._reconciler = Reconciler(
            port,
            self.store,
            self._registry,
            self._drains,
            self._applier,
            self._publisher,
            metrics,
            on_event,
            clock,
            self.leases,
            node_access,
            CatalogPublisher(records.catalog, identity, clock) if identity is not None else None,
        )
        self._scheduler = Scheduler(self._run_scheduled, resync_seconds=resync_seconds, clock=clock)

    # ---- pools -------------------------------------------------------------------------

    def upsert_pool(
        self,
        pool: RunnerPool,
        generation: int = 0,
        refusal: PoolProblem | None = None,
        resource: str = "",
    ) -> None:
        """Register a pool or give it a new spec. `refusal` says why a newer spec was not
        taken (this one, its last valid version, runs on); `resource` names the resource
        its status is written to (a RunnerPool's UID), which its lease then names."""
        managed = self._registry.upsert(pool, generation, refusal, resource)
        self._pool_added(managed.policy.nomad_namespace)

    def remove_pool(
        self, key: str, mode: PoolMode | None, deadline: datetime | None = None
    ) -> None:
        """Stop managing a pool. With a mode (drain/delete) its runners are still destroyed
        as that mode says (claimed ones of a drain at `deadline`); with None (Orphan)
        Nomad is left alone."""
        managed = self._registry.get(key)
        if managed is None:
            return
        namespace = managed.policy.nomad_namespace
        if mode is None or mode is PoolMode.ACTIVE:
            self._registry.remove(key)
            self._publisher.forget(key)
            self._drains.cancel(key)
        else:
            managed.policy = managed.policy.removed(mode, deadline or self.clock())
        self._scheduler.hint(namespace)

    def restore_status(self, key: str, status: PoolStatus) -> None:
        """A status written by an earlier process (a custom resource's): keeps condition
        transition times, and nothing is written until something changes."""
        managed = self._registry.get(key)
        if managed is not None and managed.status is None:
            managed.status = status

    def set_protected(self, keys: set[str]) -> None:
        """Pools defined somewhere but not valid now: their runners are no orphans."""
        self._registry.protected = set(keys)

    def keep_claims_in_use(self, in_use: Callable[[str], bool]) -> None:
        """Claims of the runners `in_use` names (an execution of this process runs on
        them) are renewed at their deadline instead of expired."""
        self._applier.in_use = in_use

    def pool_for_runner(self, runner_id: str) -> PoolView | None:
        managed = self._registry.owner_of_runner(runner_id)
        return None if managed is None else self._registry.view(managed.key)

    def namespaces(self) -> set[str]:
        return self._registry.namespaces()

    def node(self, node_id: str) -> NodeView | None:
        """A client node as the latest pass saw it."""
        return self._reconciler.nodes.get(node_id)

    def node_named(self, name: str) -> NodeView | None:
        """A client node by name (claims written without the allocation observed yet)."""
        return next((n for n in self._reconciler.nodes.values() if n.name == name), None)

    def readiness(self) -> Readiness:
        """What this process does now, and whether that is all it is for (core/readiness)."""
        return assess(
            [key for key in self._registry.unready() if self._watches(key)],
            [m.key for m in self._registry if m.conflict is None],
            reconciler=True,
            lease=self.leases.state if self.leases is not None else None,
        )

    def _watches(self, key: str) -> bool:
        managed = self._registry.get(key)
        return managed is not None and self._reconciler.watches(managed)

    def speaks_for(self, key: str) -> bool:
        """Whether this process writes what a pool's resource shows (its status, Events):
        the holder of its lease, or anyone while the holder writes to another resource (a
        pool file's holder beside this RunnerPool says LeaseHeldElsewhere only here); for a
        pool without a lease (never valid), one reconciler."""
        if self.leases is None:
            return True
        managed = self._registry.get(key)
        if managed is None:
            return self.leases.speaker()
        return self.leases.state(key).speaks_here(managed.resource, self.leases.speaker(key))

    async def purge_ended(self, key: str, runner_id: str, namespace: str, state: str) -> None:
        """Purge the job of a runner whose claim just became a tombstone (`state`: why),
        now rather than on the next pass (the tombstone makes every pass purge it again
        until it is gone)."""
        with self.fence(key) as allowed:
            if not allowed:
                return
            await self._port.purge_job(runner_id, namespace)
        self.metrics.runners_destroyed.labels(pool=key, reason=state).inc()

    def waiting_elsewhere(self, records: list[WaitingRecord]) -> None:
        """The claim requests API replicas hold waiting, as their records say now."""
        self._reconciler.waiting_elsewhere.update(records, self.clock())

    async def resume_drains(self) -> None:
        await self._drains.resume()

    # ---- hints and passes --------------------------------------------------------------

    def hint_namespace(self, namespace: str) -> None:
        self._scheduler.hint(namespace)

    def hint_job(self, namespace: str, job_id: str) -> None:
        """An event about a job: wake the namespace only if the job is a pool's runner,
        which claims leave alone until a pass has seen its job again."""
        for managed in self._registry.reconciled(namespace):
            if is_runner_id(managed.policy.job_prefix, job_id):
                if managed.observed:  # what a pass here offers
                    managed.job_events[job_id] = time.monotonic()
                self._scheduler.hint(namespace)
                return

    async def start(self) -> None:
        if self.leases is not None:
            self.leases.start()
        self._scheduler.start(self.namespaces())

    async def stop(self) -> None:
        """Stop the loops, then give the leases back, so that another process takes the
        pools over at once. Stopping never destroys runners: Nomad keeps them."""
        # The passes first: one still running would publish the status of pools given back.
        # A pass cancelled under a write in flight could not say when that write lands:
        # then the leases are left to expire rather than given back before it.
        finished = await self._scheduler.stop(grace_seconds=STOP_GRACE_SECONDS)
        if self.leases is not None:
            await self.leases.stop(release=finished)

    async def reconcile_namespace(self, namespace: str) -> PassResult:
        result = await self._reconciler.run(namespace)
        deadline = result.next_deadline or self.clock() + _NO_DEADLINE
        self._scheduler.next_deadline(namespace, deadline)
        return result

    async def wait_for_observation(self, key: str, within: float) -> None:
        """Wait (at most `within` seconds) until the pool has been observed again."""
        await self._reconciler.wait_for_observation(key, within)

    async def _run_scheduled(self, namespace: str) -> float:
        return (await self.reconcile_namespace(namespace)).seconds

    def _lease_changed(self, namespace: str) -> None:
        self._scheduler.hint(namespace)

    def _pool_added(self, namespace: str) -> None:
        self._scheduler.ensure(namespace)
        self._scheduler.hint(namespace)
