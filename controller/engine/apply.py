"""Apply: carry out one pool's plan in Nomad.

Every action runs concurrently (at most APPLY_CONCURRENCY Nomad calls at once across all
pools); one failing action never blocks the others. A runner is destroyed only by whoever
holds its claim variable: an unclaimed runner is first taken with a `retired` tombstone
(cas=0, so a client's concurrent claim wins and the runner stays claimed), a claimed one
has its claim turned into a tombstone by check-and-set; then the job is purged.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from datetime import datetime

from controller.core.claims import ClaimRecord, ClaimState
from controller.core.events import EventSink, allocation_lost, runner_replaced
from controller.core.plan import Destroy, DestroyReason, Plan
from controller.core.runner_ids import new_runner_id
from controller.core.views import Runner
from controller.engine.registry import ManagedPool
from controller.metrics import Metrics
from controller.nomad.errors import NomadError
from controller.nomad.jobs import runner_job
from controller.nomad.port import JobWriter
from controller.records.claims import ClaimStore

log = logging.getLogger(__name__)

APPLY_CONCURRENCY = 32

_REPLACED_BECAUSE = {
    DestroyReason.STARTUP_TIMEOUT: "did not start within startupTimeoutSeconds",
    DestroyReason.FAILED: "failed to start",
}


@dataclass(frozen=True)
class Applied:
    created: int = 0
    destroyed: int = 0
    errors: int = 0
    # Nomad's answers to the registrations it refused (failed starts for the breaker).
    refused: tuple[str, ...] = ()


@dataclass
class Applier:
    port: JobWriter
    store: ClaimStore
    metrics: Metrics
    events: EventSink
    rng: random.Random | None = None  # runner IDs; seeded for reproducible tests
    # Whether this process may still write the pool (fencing by its lease), entered again
    # around every write: a lease can run out while a plan is applied, and is not given
    # back while a write sent under it is in flight.
    fence: Callable[[str], AbstractContextManager[bool]] = lambda key: nullcontext(True)
    # Whether this process is using the runner now (an execution runs on it): such a
    # claim is renewed when its deadline passes, not expired. Activity keeps it alive.
    in_use: Callable[[str], bool] = lambda runner_id: False
    _slots: asyncio.Semaphore = field(
        default_factory=lambda: asyncio.Semaphore(APPLY_CONCURRENCY), init=False
    )

    async def apply(
        self, managed: ManagedPool, todo: Plan, runners: Sequence[Runner], now: datetime
    ) -> Applied:
        by_id = {r.id: r for r in runners}
        creations = await asyncio.gather(
            *(self._create(managed) for _ in range(todo.create)), return_exceptions=True
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
            refused=tuple(
                f"registration refused: {c}" for c in creations if isinstance(c, NomadError)
            ),
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
        async with self._slots:
            with self.fence(policy.key) as allowed:
                if not allowed:
                    return False
                # enforce_index=0: a retried or duplicated registration never overwrites a job.
                await self.port.register_job(job, enforce_index=0)
        self.metrics.runners_created.labels(pool=policy.key).inc()
        return True

    async def _destroy(
        self, managed: ManagedPool, destroy: Destroy, runner: Runner | None, now: datetime
    ) -> bool:
        policy = managed.policy
        async with self._slots:
            with self.fence(policy.key) as allowed:
                if not allowed or not await self._end_claim(managed, destroy, runner, now):
                    return False
            # The lease may have run out meanwhile: the tombstone holds the runner then,
            # and whoever holds the pool purges it.
            with self.fence(policy.key) as allowed:
                if not allowed:
                    return False
                await self.port.purge_job(destroy.runner_id, policy.nomad_namespace)
        self.metrics.runners_destroyed.labels(pool=policy.key, reason=destroy.reason.value).inc()
        why = _REPLACED_BECAUSE.get(destroy.reason)
        if why is not None:
            self.events(runner_replaced(policy.key, destroy.runner_id, why))
        return True

    async def _end_claim(
        self, managed: ManagedPool, destroy: Destroy, runner: Runner | None, now: datetime
    ) -> bool:
        """Hold the runner with a tombstone before its job is purged; whether it is held."""
        policy = managed.policy
        if destroy.claim is None:
            allocation = runner.allocation.id if runner and runner.allocation else ""
            # Created with cas=0, so a client's concurrent claim wins; a runner retired
            # before it was ever placed names no allocation.
            tombstone = ClaimRecord.new(
                runner_id=destroy.runner_id,
                namespace=policy.nomad_namespace,
                pool=policy.key,
                allocation_id=allocation,
                now=now,
                inactivity_timeout_seconds=0,
            ).with_state(destroy.tombstone_state)
            return await self.store.create(tombstone) is not None  # else a client won
        if destroy.claim.is_tombstone:
            return True
        if destroy.reason is DestroyReason.EXPIRED and self.in_use(destroy.runner_id):
            claim = destroy.claim
            await self.store.update(claim.kept_alive(now), cas=claim.modify_index)
            return False  # a lost check-and-set: the next pass decides again
        ended = destroy.claim.with_state(destroy.tombstone_state)
        if await self.store.update(ended, cas=destroy.claim.modify_index) is None:
            return False  # a keepalive or release won; the next pass decides again
        if destroy.reason is DestroyReason.LOST and runner is not None:
            self.events(allocation_lost(policy.key, destroy.runner_id, runner.reason))
        return True

    async def _mark_lost(self, managed: ManagedPool, claim: ClaimRecord) -> bool:
        async with self._slots:
            with self.fence(managed.key) as allowed:
                if not allowed:
                    return False
                lost = await self.store.update(
                    claim.with_state(ClaimState.LOST), cas=claim.modify_index
                )
        if lost is not None:
            self.events(allocation_lost(managed.key, claim.runner_id, "its job vanished"))
        return lost is not None

    async def _forget(self, managed: ManagedPool, claim: ClaimRecord) -> bool:
        async with self._slots:
            with self.fence(managed.key) as allowed:
                return allowed and await self.store.delete(claim)
