"""The doorbell (core/catalog.py): how a process that serves claims tells the reconcilers
to look now rather than at their next resync, through Nomad alone.

Ringing writes the doorbell variable: the first ring at once, later ones at most every
RING_SECONDS, carrying what changed since (the pools, and why). Reconcilers follow the
variable with blocking reads (one connection, no polling) and look at once when it moves.
Two replicas' writes may overwrite each other's details; a reconciler therefore takes any
ring as a reason to look at everything the ring could concern.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Final

from controller.core.catalog import Ring
from controller.core.paths import DOORBELL_PATH
from controller.nomad.errors import NomadError
from controller.nomad.port import Variables, VariableWatch
from controller.tasks import Background

log = logging.getLogger(__name__)

RING_SECONDS: Final = 0.05
# The longest blocking read of the doorbell (the watch session's read timeout is longer).
WAIT_SECONDS: Final = 8.0
RETRY_SECONDS: Final = (1.0, 30.0)  # the first and the longest pause after a failed read


class Doorbell:
    def __init__(
        self,
        port: Variables,
        home_namespace: str,
        replica: str,
        clock: Callable[[], datetime],
    ) -> None:
        self._port = port
        self._home = home_namespace
        self._replica = replica
        self._clock = clock
        self._pools: set[str] = set()
        self._reasons: set[str] = set()
        self._task: asyncio.Task[None] | None = None
        self.rings = 0  # writes made (tests, metrics)

    def ring(self, reason: str, pool: str | None = None) -> None:
        """Tell the reconcilers (soon, without waiting for the write)."""
        self._reasons.add(reason)
        if pool is not None:
            self._pools.add(pool)
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._write())

    async def close(self) -> None:
        """Write what is still due, then stop."""
        if self._task is not None:
            with contextlib.suppress(Exception):
                await self._task

    async def _write(self) -> None:
        try:
            while self._reasons:
                ring = Ring(
                    self._replica, self._clock(), frozenset(self._reasons), frozenset(self._pools)
                )
                self._pools, self._reasons = set(), set()
                try:
                    await self._port.put_variable(
                        DOORBELL_PATH, ring.to_items(), self._home, cas=None
                    )
                    self.rings += 1
                except NomadError as error:
                    # The reconcilers still look at their next resync.
                    log.warning("could not ring the reconcilers' doorbell: %s", error)
                await asyncio.sleep(RING_SECONDS)
        finally:
            self._task = None


class DoorbellWatch:
    """Follows the doorbell and awaits `on_ring` with the reasons of each ring."""

    def __init__(
        self,
        watcher: VariableWatch,
        home_namespace: str,
        on_ring: Callable[[frozenset[str]], Awaitable[None]],
    ) -> None:
        self._watcher = watcher
        self._home = home_namespace
        self._on_ring = on_ring
        self._following = Background("doorbell", self._follow)
        self.start, self.stop = self._following.start, self._following.stop

    async def _follow(self) -> None:
        index, seen, first, pause = 0, None, True, RETRY_SECONDS[0]
        while True:
            try:
                variable, index = await self._watcher.wait_variable(
                    DOORBELL_PATH, self._home, index, WAIT_SECONDS
                )
            except NomadError as error:
                log.debug("watching the doorbell: %s", error)
                await asyncio.sleep(pause)
                pause = min(pause * 2, RETRY_SECONDS[1])
                continue
            pause = RETRY_SECONDS[0]
            modified = variable.get("ModifyIndex") if variable is not None else None
            if variable is not None and modified != seen and not first:
                try:
                    await self._on_ring(Ring.reasons_in(variable.get("Items") or {}))
                except Exception:
                    log.exception("answering the doorbell failed")
            seen, first = modified, False
            if variable is None:
                # A blocking read of a missing variable wakes on any variable's change.
                await asyncio.sleep(RING_SECONDS)
