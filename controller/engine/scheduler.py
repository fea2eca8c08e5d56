"""When passes run: one loop per Nomad namespace, woken by hints, the resync period and
the nearest claim deadline.

A hint never changes state by itself; it only makes the loop look again soon. Hints
arriving within the coalescing window cost one pass.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import datetime

from controller.nomad.errors import NomadError

log = logging.getLogger(__name__)

COALESCE_SECONDS = 0.02
MAX_COALESCE_SECONDS = 0.25


class Scheduler:
    def __init__(
        self,
        run_pass: Callable[[str], Awaitable[float]],
        *,
        resync_seconds: float,
        clock: Callable[[], datetime],
    ) -> None:
        self._run_pass = run_pass  # returns how long the pass took, in seconds
        self.resync_seconds = resync_seconds
        self._clock = clock
        self._wake: dict[str, asyncio.Event] = {}
        self._loops: dict[str, asyncio.Task[None]] = {}
        self._deadlines: dict[str, datetime] = {}
        self._last_pass_seconds: dict[str, float] = {}
        self._passing: set[str] = set()  # namespaces whose pass runs now
        self._running = False

    def ensure(self, namespace: str) -> None:
        """A namespace with pools gets a loop (once the scheduler runs)."""
        self._wake.setdefault(namespace, asyncio.Event())
        if self._running and namespace not in self._loops:
            self._loops[namespace] = asyncio.create_task(
                self._loop(namespace), name=f"reconcile:{namespace}"
            )

    def hint(self, namespace: str) -> None:
        event = self._wake.get(namespace)
        if event is not None:
            event.set()

    def next_deadline(self, namespace: str, deadline: datetime) -> None:
        """The nearest claim deadline: the loop wakes for it rather than a resync later."""
        self._deadlines[namespace] = deadline

    def start(self, namespaces: set[str]) -> None:
        self._running = True
        for namespace in namespaces:
            self.ensure(namespace)

    async def stop(self, grace_seconds: float = 0.0) -> bool:
        """Stop the loops. A pass in flight may finish within `grace_seconds` (nothing it
        writes is then left in flight); one that does not is cancelled. Returns whether
        every loop ended without being cancelled."""
        self._running = False
        loops = dict(self._loops)
        self._loops.clear()
        passing = [task for namespace, task in loops.items() if namespace in self._passing]
        for namespace, task in loops.items():
            if namespace not in self._passing:
                task.cancel()  # waiting or coalescing: nothing in flight
        pending = set(passing)
        if passing and grace_seconds > 0:
            _, pending = await asyncio.wait(passing, timeout=grace_seconds)
        for task in pending:
            task.cancel()
        await asyncio.gather(*loops.values(), return_exceptions=True)
        return not pending

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
            if not self._running:
                return
            wake.clear()
            if not await self._pass(namespace):
                await asyncio.sleep(min(1.0, self.resync_seconds))

    async def _pass(self, namespace: str) -> bool:
        """Run one pass; whether it succeeded (a failure is logged)."""
        self._passing.add(namespace)
        try:
            self._last_pass_seconds[namespace] = await self._run_pass(namespace)
        except NomadError as error:
            log.warning("reconcile of namespace %s failed: %s", namespace, error)
            return False
        except Exception:
            log.exception("reconcile of namespace %s crashed; retrying", namespace)
            return False
        finally:
            self._passing.discard(namespace)
        return True

    def _coalesce_seconds(self, namespace: str) -> float:
        """How long hints are gathered before a pass: COALESCE_SECONDS, or twice as long as
        the last pass took (at most MAX_COALESCE_SECONDS). Under a stream of hints (a claim
        burst) passes then use at most about a third of the event loop, which the claim
        API shares, instead of running back to back; small namespaces, whose passes take
        a few milliseconds, keep the short window (and a quick refill)."""
        last = self._last_pass_seconds.get(namespace)
        if last is None:
            return COALESCE_SECONDS
        return min(MAX_COALESCE_SECONDS, max(COALESCE_SECONDS, 2 * last))

    def _sleep_seconds(self, namespace: str) -> float:
        """Until the resync, or until the next claim deadline if that comes first, so an
        expired claim is destroyed at its deadline rather than a resync later."""
        deadline = self._deadlines.get(namespace)
        if deadline is None:
            return self.resync_seconds
        until = (deadline - self._clock()).total_seconds() + COALESCE_SECONDS
        return max(COALESCE_SECONDS, min(self.resync_seconds, until))
