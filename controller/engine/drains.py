"""Removed pools: drain records in Nomad, resumed drains, finished drains, and orphans.

A pool removed with deletionPolicy Drain or Delete is recorded in the variable
`poolkeeper/pools/<namespace>/<name>` (records/drains.py) so that
a restarted controller resumes the removal; a pool defined again cancels its record.
Runner jobs of pools defined nowhere are orphans: reported once, left alone, drained
with `prune` (`poolkeeper run --prune`). A pool whose lease a live process holds is
defined there (another controller sharing the Nomad namespace): no orphan.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from controller.core.drains import DrainRecord
from controller.core.runner_ids import runner_prefix
from controller.core.views import JobView, PoolMode
from controller.engine.leases import Leases
from controller.engine.registry import ManagedPool, PoolRegistry
from controller.records.drains import DrainRecords

log = logging.getLogger(__name__)

DEFAULT_DRAIN_SECONDS = 3600
# A pool found held by another process is asked about again this often: the holder may
# have gone for good (each question takes the lease and gives it back, two writes).
ORPHAN_RECHECK_SECONDS = 60.0


@dataclass
class Drains:
    records: DrainRecords
    registry: PoolRegistry
    clock: Callable[[], datetime]
    prune: bool
    on_new_pool: Callable[[str], None]  # a namespace got a pool to reconcile
    # How the front door would remove orphans, said in their report ("" for nothing).
    orphan_advice: str = ""
    # With leases, a pool whose lease another live process holds is no orphan.
    leases: Leases | None = None
    _records: dict[str, int] = field(default_factory=dict, init=False)  # key -> ModifyIndex
    _cancelled: set[str] = field(default_factory=set, init=False)  # records to drop
    _reported_orphans: set[str] = field(default_factory=set, init=False)
    # key -> time.monotonic() until which the pool counts as another process's
    _held_elsewhere: dict[str, float] = field(default_factory=dict, init=False)

    def cancel(self, key: str) -> None:
        """An Orphan removal after a drain began (the escape from a stuck drain): a
        restarted controller must not resume the drain from its record."""
        self._cancelled.add(key)

    async def resume(self) -> None:
        """Take up the drains a previous process recorded in Nomad and did not finish."""
        for hit in await self.records.read():
            drain = hit.value
            self._records[drain.key] = hit.index
            if drain.key not in self.registry:
                log.info("resuming the %s of pool %s", drain.mode.value, drain.key)
                self.registry.add_draining(
                    drain.key, drain.namespace, drain.job_prefix, drain.mode, drain.deadline
                )
                self.on_new_pool(drain.namespace)

    async def sync(self, pools: Iterable[ManagedPool]) -> None:
        """Record the removals that began, and drop the records of pools defined again
        or let go (Orphan)."""
        for managed in pools:
            key, policy = managed.key, managed.policy
            if policy.mode is not PoolMode.ACTIVE and key not in self._records:
                drain = DrainRecord(
                    key,
                    policy.nomad_namespace,
                    policy.job_prefix,
                    policy.mode,
                    policy.drain_deadline or self.clock(),
                )
                self._records[key] = await self.records.record(drain)
            elif policy.mode is PoolMode.ACTIVE and key in self._records:
                await self._drop(key)
        for key in [k for k in self._cancelled if k not in self.registry]:
            await self._drop(key)
        self._cancelled.clear()

    async def finish(self, pools: Iterable[ManagedPool]) -> list[str]:
        """Forget the removed pools of which Nomad holds nothing any more (no runner job,
        no claim variable: their tombstones are forgotten by the plan after ten minutes);
        returns their keys. Only a pass that observed the pool removed can tell: one that
        began before the removal may have created runners after its observation."""
        finished = []
        for managed in pools:
            classified = managed.classified_policy
            removed = managed.policy.mode is not PoolMode.ACTIVE
            observed_removed = classified is not None and classified.mode is not PoolMode.ACTIVE
            if not (removed and observed_removed) or managed.observation is None:
                continue
            if not managed.runners and not managed.observation.claims:
                log.info("pool %s drained; forgetting it", managed.key)
                self.registry.remove(managed.key)
                await self._drop(managed.key)
                finished.append(managed.key)
        return finished

    async def take_orphans(self, namespace: str, orphans: Iterable[JobView]) -> None:
        """Report runner jobs of pools defined nowhere; with `prune`, drain them."""
        prefixes: dict[str, str | None] = {}
        for job in orphans:
            key = job.pool
            if key not in self.registry and key not in self.registry.protected:
                prefixes.setdefault(key, runner_prefix(job.id))
        for key, prefix in prefixes.items():
            if key in self._reported_orphans and not self.prune:
                continue
            if await self._held_elsewhere_now(key, namespace):
                continue
            if self.prune and prefix is not None:
                log.warning("pruning orphaned runners of pool %s (--prune)", key)
                deadline = self.clock() + timedelta(seconds=DEFAULT_DRAIN_SECONDS)
                self.registry.add_draining(key, namespace, prefix, PoolMode.DRAIN, deadline)
                self.on_new_pool(namespace)
            elif key not in self._reported_orphans:
                self._reported_orphans.add(key)
                advice = f"; {self.orphan_advice}" if self.orphan_advice else ""
                log.warning(
                    "namespace %s holds runner jobs of pool %s, which is not defined: "
                    "left alone (orphaned%s)",
                    namespace,
                    key,
                    advice,
                )

    async def _held_elsewhere_now(self, key: str, namespace: str) -> bool:
        """Whether another live process holds the pool's lease (it defines the pool), as
        last asked within ORPHAN_RECHECK_SECONDS; a pruner keeps a free lease it gets."""
        if self.leases is None:
            return False
        if time.monotonic() < self._held_elsewhere.get(key, 0.0):
            return True
        if not await self.leases.held_elsewhere(key, namespace, take=self.prune):
            self._held_elsewhere.pop(key, None)
            return False
        self._held_elsewhere[key] = time.monotonic() + ORPHAN_RECHECK_SECONDS
        return True

    async def _drop(self, key: str) -> None:
        index = self._records.pop(key, None)
        if index is not None:
            await self.records.drop(key, index)
