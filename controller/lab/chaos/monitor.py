"""The continuous checks of a soak, on what Nomad holds, several times a second."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from controller.lab.chaos.clients import Clients
from controller.lab.chaos.faults import FaultedRunners
from controller.lab.chaos.processes import ControllerProcess
from controller.lab.chaos.violations import Violations
from controller.lab.chaos.world import World

SURGE = 20  # the engine's per-pass creation surge (Engine(surge=20))
RESTART_GRACE_SECONDS = 10.0
MONITOR_INTERVAL = 0.2


@dataclass
class Monitor:
    """`maxRunners` on every sample, and that no claimed runner's job is purged before
    its claim became a tombstone whose reason fits."""

    world: World
    controllers: Sequence[ControllerProcess]  # those that reconcile
    clients: Clients
    faulted: FaultedRunners
    violations: Violations
    max_excess: dict[str, int] = field(init=False)

    def __post_init__(self) -> None:
        self.max_excess = {p.key: 0 for p in self.world.pools}

    async def run(self) -> None:
        """Until cancelled."""
        while True:
            self.check_once()
            await asyncio.sleep(MONITOR_INTERVAL)

    def check_once(self) -> None:
        claims = self.world.claims()
        # The one tolerance: for a while after a controller start, an excess of up to one
        # pass's surge is not a violation (it still counts in max_excess).
        last_start = max(c.started_at for c in self.controllers)
        grace = time.monotonic() - last_start < RESTART_GRACE_SECONDS
        for pool in self.world.pools:
            total = self.world.runners(pool)
            excess = total - pool.max_runners
            if excess > 0:
                self.max_excess[pool.key] = max(self.max_excess[pool.key], excess)
                if not grace or excess > SURGE:
                    self.violations.add_once(
                        f"max:{pool.key}:{total}",
                        f"pool {pool.key} has {total} runners, more than maxRunners "
                        f"{pool.max_runners}",
                    )
        unstopped = self.world.unstopped_job_ids()
        for held in list(self.clients.held.values()):
            if held.done or held.runner_id in unstopped:
                continue
            claim = claims.get(held.runner_id)
            state = None if claim is None else claim.get("state", "claimed")
            if state in (None, "claimed"):
                if held.runner_id not in self.faulted.removed:
                    self.violations.add_once(
                        f"purged:{held.runner_id}",
                        f"claimed runner {held.runner_id} was destroyed while its claim "
                        f"variable was {'absent' if claim is None else 'live'}",
                    )
                continue
            assert claim is not None
            modified = int(claim["_modify_time"]) / 1e9
            self.clients.check_reason(held, str(state), modified, source="tombstone")
