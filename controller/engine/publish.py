"""Publishing what a pass saw: a pool's status (through the front door's status sink, only
when it changed or is a minute old) and its metrics. A process that does not hold a pool's
lease exports no series of the pool (its holder does, so reconcilers sharing the pools
never count a pool twice in a sum); whether it writes the status is the front door's to
decide (Engine.speaks_for)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime

from controller.core.status import PoolStatus, compute_status, count, needs_write
from controller.core.views import Runner
from controller.engine.observe import NodeAccess
from controller.engine.registry import ManagedPool
from controller.metrics import Metrics

StatusSink = Callable[[str, PoolStatus], Awaitable[None] | None]


class Publisher:
    def __init__(
        self, metrics: Metrics, on_status: StatusSink | None, node_access: NodeAccess
    ) -> None:
        self._metrics = metrics
        self._on_status = on_status
        self._node_access = node_access

    async def publish(
        self,
        managed: ManagedPool,
        runners: Sequence[Runner],
        now: datetime,
        *,
        exports: bool = True,
    ) -> None:
        status = compute_status(
            managed.policy,
            runners,
            now=now,
            previous=managed.status,
            observed_generation=managed.generation,
            breaker=managed.breaker,
            blocked=managed.conflict,
            refusal=managed.refusal,
            lease=managed.lease,
            spec_hash=managed.spec_hash,
            target=managed.idle_target,
            drain_aware=self._node_access.readable,
        )
        if exports:
            self._export(managed.key, runners, status)
        else:
            self._metrics.forget_pool(managed.key, lease=False)
        if managed.status is not None and not needs_write(managed.status, status, now):
            return
        managed.status = status
        if self._on_status is not None:
            written = self._on_status(managed.key, status)
            if written is not None:
                await written

    def _export(self, key: str, runners: Sequence[Runner], status: PoolStatus) -> None:
        counts = count(runners)
        self._metrics.set_runner_counts(
            key,
            {
                "idle": counts.current_idle,
                "starting": counts.starting,
                "claimed": counts.claimed,
                "outdated": counts.outdated,
                "terminating": counts.terminating,
            },
            status.target.idle_runners,
        )
        self._metrics.set_conditions(key, {c.type: c.status == "True" for c in status.conditions})

    def forget(self, key: str) -> None:
        self._metrics.forget_pool(key)
