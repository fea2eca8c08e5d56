"""The pools the engine keeps: registration, removal, prefix conflicts, and the read-only
view of a pool that code outside the engine gets.

Two pools with the same job prefix in the same Nomad namespace conflict: the one
registered first keeps the prefix, the other is not reconciled and hands out nothing
until the conflict goes (`Problem.PREFIX_CONFLICT`). A pool whose newest spec was refused
(invalid, or an immutable field changed) keeps running its last valid version; the
refusal is reported in its status (`refusal`).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol
from zoneinfo import ZoneInfo

from controller.core import breaker as breakers
from controller.core.demand import IdleTarget, Pacing
from controller.core.events import EventSink, prefix_conflict
from controller.core.leases import LeaseState
from controller.core.offers import EMPTY, Offer, offer_of
from controller.core.problems import PoolProblem, Problem, prefix_owners
from controller.core.runner_ids import is_runner_id
from controller.core.schedule import ScheduleWindow
from controller.core.status import PoolStatus
from controller.core.views import DemandPolicy, PoolMode, PoolObservation, PoolPolicy, Runner
from controller.core.waiting import WaitingClaims
from controller.model import RunnerPool, RunnerPoolSpec
from controller.nomad.jobs import render_job, template_hash


@dataclass
class ManagedPool:
    """A pool the engine keeps, with what it learnt on the last pass. Engine-internal:
    everything else reads it through a PoolView."""

    pool: RunnerPool | None  # None: a drain resumed from Nomad or an orphan being pruned
    policy: PoolPolicy
    rendered_job: dict[str, Any]
    generation: int
    order: int  # first registration; the earlier of two pools with one prefix wins
    conflict: PoolProblem | None = None
    refusal: PoolProblem | None = None
    breaker: breakers.BreakerState = field(default_factory=breakers.BreakerState)
    status: PoolStatus | None = None
    runners: tuple[Runner, ...] = ()
    observation: PoolObservation | None = None
    observed: bool = False
    observation_started: float = 0.0  # time.monotonic() when the last observation began
    # time.monotonic() when a pass of its namespace last failed: a view observed before it
    # may be older than Nomad's recovery (not `current`).
    failed_at: float = -1.0
    # Runner job ID -> time.monotonic() of the last event Nomad sent about the job.
    job_events: dict[str, float] = field(default_factory=dict)
    classified_policy: PoolPolicy | None = None  # the policy `runners` were classified with
    seen_running: frozenset[str] = frozenset()  # runners seen running (breaker successes)
    lease: LeaseState | None = None  # who reconciles it; None where leases do not apply
    resource: str = ""  # the resource its status is written to (a RunnerPool's UID)
    target: IdleTarget | None = None  # the last pass's idle target
    # Where the shrink of the demand part stands; the one thing a restart may lose
    # (core/demand.py says how it degrades).
    pacing: Pacing | None = None
    # Claim requests waiting for its runners, which the claim service keeps up to date.
    waiting: WaitingClaims = field(default_factory=WaitingClaims)
    # The offer made of `runners` (computed when first asked for after a pass).
    _offered: tuple[tuple[Runner, ...], Offer] = ((), EMPTY)

    @property
    def spec_hash(self) -> str:
        return self.pool.spec_hash if self.pool is not None else ""

    @property
    def key(self) -> str:
        return self.policy.key

    @property
    def idle_target(self) -> IdleTarget:
        """The last pass's idle target; idleRunners before the first pass."""
        return (
            self.target if self.target is not None else IdleTarget.fixed(self.policy.desired_idle)
        )

    @property
    def active(self) -> bool:
        """Defined (in the files or the cluster) and not being removed."""
        return self.pool is not None and self.policy.mode is PoolMode.ACTIVE

    @property
    def current(self) -> bool:
        """Observed since the last failed pass of its namespace."""
        return self.observed and self.observation_started > self.failed_at

    @property
    def unsettled(self) -> frozenset[str]:
        """Runners whose job Nomad said changed after the last observation began: the
        offer (made of that observation) may list one whose job is gone."""
        started = self.observation_started
        return frozenset(job for job, at in self.job_events.items() if at >= started)

    def observed_jobs(self) -> None:
        """An observation that began after these events saw their jobs as they are."""
        started = self.observation_started
        self.job_events = {job: at for job, at in self.job_events.items() if at >= started}

    def forget_observation(self) -> None:
        """Another process observes the pool now: nothing seen here stays to be offered."""
        self.runners, self.observation, self.observed = (), None, False
        self.classified_policy = None
        self.job_events.clear()

    @property
    def offer(self) -> Offer:
        """The claimable runners of the last pass, in the order claims try them."""
        runners, offer = self._offered
        if runners is not self.runners:
            observation = self.observation
            offer = (
                offer_of(
                    self.runners,
                    observation.allocations,
                    observation.leaving_nodes,
                    with_start=self.policy.demand is not None,
                )
                if observation is not None
                else EMPTY
            )
            self._offered = (self.runners, offer)
        return offer


class PoolView(Protocol):
    """A read-only window on one pool: what the API, the claim service and the front
    doors may know of it. The registry hands out its ManagedPools typed as this, so the
    view follows the pool (it is not a copy) and type checking keeps it read-only."""

    @property
    def key(self) -> str: ...
    @property
    def pool(self) -> RunnerPool | None:
        """The spec that runs: the last valid version, None for a pool only being drained."""

    @property
    def policy(self) -> PoolPolicy: ...
    @property
    def generation(self) -> int: ...
    @property
    def runners(self) -> tuple[Runner, ...]:
        """The pool's runners as the last pass classified them."""

    @property
    def observation(self) -> PoolObservation | None: ...
    @property
    def observed(self) -> bool: ...
    @property
    def observation_started(self) -> float: ...
    @property
    def current(self) -> bool:
        """Observed since the last failed pass of its namespace."""

    @property
    def unsettled(self) -> frozenset[str]:
        """Runners whose job changed after the last observation began."""

    @property
    def idle_target(self) -> IdleTarget:
        """How many idle runners the pool wants now, and why (the last pass's)."""

    @property
    def pacing(self) -> Pacing | None:
        """Where the shrink of its demand part stands (pools with spec.demand)."""

    @property
    def status(self) -> PoolStatus | None: ...
    @property
    def conflict(self) -> PoolProblem | None: ...
    @property
    def refusal(self) -> PoolProblem | None: ...
    @property
    def active(self) -> bool: ...
    @property
    def lease(self) -> LeaseState | None: ...
    @property
    def waiting(self) -> WaitingClaims:
        """Where a claim request that waits for the pool's runners says so."""

    @property
    def offer(self) -> Offer:
        """The claimable runners of the last pass, in the order claims try them."""


class PoolRegistry:
    def __init__(self, *, surge: int, events: EventSink) -> None:
        self._surge = surge
        self._events = events
        self._pools: dict[str, ManagedPool] = {}
        self._order = itertools.count()
        # Keys of pools defined somewhere but not valid now: never orphans, never pruned.
        self.protected: set[str] = set()

    def __contains__(self, key: object) -> bool:
        return key in self._pools

    def __iter__(self) -> Iterator[ManagedPool]:
        return iter(list(self._pools.values()))

    def get(self, key: str) -> ManagedPool | None:
        return self._pools.get(key)

    def view(self, key: str) -> PoolView | None:
        return self._pools.get(key)

    def upsert(
        self, pool: RunnerPool, generation: int, refusal: PoolProblem | None, resource: str = ""
    ) -> ManagedPool:
        """Register a new pool or give a known one its new spec (immutable fields are the
        caller's to check, see controller.sources.registration)."""
        rendered = render_job(pool)
        policy = PoolPolicy(
            key=pool.key,
            nomad_namespace=pool.spec.nomad.namespace,
            job_prefix=pool.job_prefix,
            desired_idle=pool.spec.idle_runners,
            max_runners=pool.spec.max_runners,
            startup_timeout_seconds=pool.spec.startup_timeout_seconds,
            template_hash=template_hash(rendered),
            surge=self._surge,
            demand=_demand_policy(pool.spec),
            schedule=_schedule(pool.spec),
        )
        managed = self._pools.get(pool.key)
        if managed is None:
            managed = ManagedPool(pool, policy, rendered, generation, next(self._order))
            self._pools[pool.key] = managed
        else:
            managed.pool, managed.policy, managed.rendered_job = pool, policy, rendered
            managed.generation = generation
        managed.refusal, managed.resource = refusal, resource
        self._resolve_conflicts()
        return managed

    def add_draining(
        self, key: str, namespace: str, job_prefix: str, mode: PoolMode, deadline: datetime
    ) -> ManagedPool:
        """Manage a pool known only by its runners: a resumed drain or a pruned orphan."""
        policy = PoolPolicy.without_spec(key, namespace, job_prefix).removed(mode, deadline)
        managed = ManagedPool(None, policy, {}, 0, next(self._order))
        self._pools[key] = managed
        self._resolve_conflicts()
        return managed

    def remove(self, key: str) -> ManagedPool | None:
        managed = self._pools.pop(key, None)
        self._resolve_conflicts()
        return managed

    def clear(self) -> None:
        self._pools.clear()

    def namespaces(self) -> set[str]:
        return {m.policy.nomad_namespace for m in self._pools.values()}

    def in_namespace(self, namespace: str) -> list[ManagedPool]:
        return [m for m in self._pools.values() if m.policy.nomad_namespace == namespace]

    def reconciled(self, namespace: str) -> list[ManagedPool]:
        """The namespace's pools that are reconciled: every one without a prefix conflict."""
        return [m for m in self.in_namespace(namespace) if m.conflict is None]

    def unready(self) -> list[str]:
        """Keys of the reconciled pools not observed yet."""
        return [m.key for m in self._pools.values() if m.conflict is None and not m.observed]

    def owner_of_runner(self, runner_id: str) -> ManagedPool | None:
        """The pool whose job prefix the runner ID carries (the prefix's owner when two
        pools conflict over it)."""
        matching = [m for m in self._pools.values() if is_runner_id(m.policy.job_prefix, runner_id)]
        return min(matching, key=lambda m: (m.conflict is not None, m.order), default=None)

    def _resolve_conflicts(self) -> None:
        in_order = sorted(self._pools.values(), key=lambda m: m.order)
        owners = prefix_owners(
            (m.key, m.policy.nomad_namespace, m.policy.job_prefix) for m in in_order
        )
        for managed in in_order:
            owner = owners.get(managed.key)
            if owner is None:
                managed.conflict = None
                continue
            policy = managed.policy
            found = prefix_conflict(managed.key, owner, policy.job_prefix, policy.nomad_namespace)
            if managed.conflict is None:
                self._events(found)
            managed.conflict = PoolProblem(Problem.PREFIX_CONFLICT, found.message)


def _demand_policy(spec: RunnerPoolSpec) -> DemandPolicy | None:
    demand = spec.demand
    if demand is None:
        return None
    return DemandPolicy(demand.max_idle_runners, demand.window_seconds, demand.cover_seconds)


def _schedule(spec: RunnerPoolSpec) -> tuple[ScheduleWindow, ...]:
    return tuple(
        ScheduleWindow(
            window.cron,
            timedelta(minutes=window.duration_minutes),
            window.idle_runners,
            ZoneInfo(window.time_zone),
        )
        for window in spec.schedule
    )
