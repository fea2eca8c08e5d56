"""Reconcilers sharing pools by lease (the `shared.*` keys of `poolkeeper bench`).

Pools of idle runners in one namespace, filled once; then the real standalone controller
(`poolkeeper run`: loops, event-stream watcher, leases) in child processes on one pool
file: first one alone until it holds every lease, then three until the leases are spread
evenly. In each shape, windows of steady state (no claims, nothing to create) in which
every reconciler's mean pass time (its `poolkeeper_reconcile_duration_seconds` sum ÷
count over the window) and CPU are taken. `shared.pass_ratio` is the slowest of the three
against the one alone, per window pair; each reconciler lists only the pools it holds
(engine/observe.py), with a whole listing now and then.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from controller.lab import bench
from controller.lab.bench import Child, PassiveController, Run, ratio, repeated
from controller.tasks import freeze_startup_heap

STATS = "stats"
START_SECONDS = 120.0
SETTLE_SECONDS = 300.0
SHARED_RECONCILERS = 3


@dataclass(frozen=True)
class Stats:
    """One reconciler's counters at one moment."""

    pass_seconds: float  # sum over its passes so far
    passes: int
    cpu_seconds: float
    holds: int  # leases held
    ready: bool
    at: float  # time.monotonic()


def _reconciler_child(
    conn: Connection, sim_url: str, documents: list[dict[str, Any]], resync: float
) -> None:
    logging.basicConfig(level=logging.WARNING)
    asyncio.run(_reconcile(conn, sim_url, documents, resync))


async def _reconcile(
    conn: Connection, sim_url: str, documents: list[dict[str, Any]], resync: float
) -> None:
    loop = asyncio.get_running_loop()
    async with bench.standalone(sim_url, documents, resync_seconds=resync) as controller:
        registry = controller.metrics.registry
        freeze_startup_heap()  # as `poolkeeper run` does once started
        conn.send("ready")
        while await loop.run_in_executor(None, bench.receive, conn) == STATS:
            readiness = controller.readiness()
            conn.send(
                Stats(
                    registry.get_sample_value("poolkeeper_reconcile_duration_seconds_sum") or 0.0,
                    int(
                        registry.get_sample_value("poolkeeper_reconcile_duration_seconds_count")
                        or 0
                    ),
                    time.process_time(),
                    len(readiness.reconciles),
                    readiness.ready,
                    time.monotonic(),
                )
            )


class Reconcilers:
    def __init__(self, sim_url: str, documents: list[dict[str, Any]], resync: float) -> None:
        self._args = (sim_url, documents, resync)
        self.children: list[Child] = []

    async def add(self) -> None:
        child = Child(_reconciler_child, *self._args, name=f"bench-shared-{len(self.children)}")
        self.children.append(child)
        if await child.receive(START_SECONDS) != "ready":
            raise RuntimeError("a reconciler did not start")

    async def stats(self) -> list[Stats]:
        answers = []
        for child in self.children:
            child.send(STATS)
            answers.append(await child.receive(SETTLE_SECONDS))
        return answers

    async def settled(self, pools: int, passes: int) -> None:
        """Until the leases are spread evenly (each holds ⌈P/N⌉ or ⌊P/N⌋, all of them held),
        every one is ready, and each has passed `passes` more times since."""
        deadline = time.monotonic() + SETTLE_SECONDS
        count = len(self.children)
        while True:
            now = await self.stats()
            held = [s.holds for s in now]
            if sum(held) == pools and max(held) - min(held) <= 1 and all(s.ready for s in now):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"leases not spread over {count} reconcilers: {held}")
            await asyncio.sleep(0.2)
        while any(
            a.passes < b.passes + passes for a, b in zip(await self.stats(), now, strict=True)
        ):
            if time.monotonic() > deadline:
                raise RuntimeError("the reconcilers stopped passing")
            await asyncio.sleep(0.2)

    async def window(self, seconds: float) -> list[tuple[float, float]]:
        """Each reconciler's mean pass seconds and CPU share (of one core) over a window."""
        before = await self.stats()
        await asyncio.sleep(seconds)
        after = await self.stats()
        result = []
        for a, b in zip(after, before, strict=True):
            if a.passes <= b.passes:
                raise RuntimeError(f"no pass in a window of {seconds:g} s")
            result.append(
                (
                    (a.pass_seconds - b.pass_seconds) / (a.passes - b.passes),
                    (a.cpu_seconds - b.cpu_seconds) / (a.at - b.at),
                )
            )
        return result

    async def stop(self) -> None:
        for child in self.children:
            await child.stop()


async def bench_shared(run: Run) -> None:
    sizes, out, say = run.sizes, run.out, run.say
    pools, per_pool = sizes.shared_pools, sizes.shared_runners_per_pool
    documents = [bench.pool_doc(f"s{i:02d}", per_pool, per_pool * 3) for i in range(pools)]
    async with bench.simulator(bench.SimOptions(start_delay=0.01)) as sim:
        say(f"shared: filling {pools} pools x {per_pool} runners")
        passive = PassiveController(sim.url, surge=per_pool)
        try:
            await passive.start(documents)
            await bench.fill(passive, START_SECONDS + pools * per_pool / 50)
        finally:
            await passive.stop()
        reconcilers = Reconcilers(sim.url, documents, sizes.shared_resync_seconds)
        try:
            await reconcilers.add()
            await reconcilers.settled(pools, passes=2)
            windows = range(sizes.repetitions)
            say(f"shared: one reconciler, {len(windows)} windows of {sizes.shared_window:g} s")
            alone = [await reconcilers.window(sizes.shared_window) for _ in windows]
            for _ in range(SHARED_RECONCILERS - 1):
                await reconcilers.add()
            await reconcilers.settled(pools, passes=2)
            say(f"shared: {SHARED_RECONCILERS} reconcilers, the leases spread")
            together = [await reconcilers.window(sizes.shared_window) for _ in windows]
        finally:
            await reconcilers.stop()
    single = [window[0] for window in alone]
    slowest = [max(each) for each in together]
    out["shared.pools"], out["shared.runners"] = float(pools), float(pools * per_pool)
    repeated(out, "shared.single.pass_ms", [1000 * s[0] for s in single])
    repeated(out, "shared.each.pass_ms", [1000 * s[0] for s in slowest])
    repeated(out, "shared.single.cpu_share", [s[1] for s in single])
    repeated(out, "shared.each.cpu_share", [max(e[1] for e in each) for each in together])
    repeated(
        out,
        "shared.pass_ratio",
        [ratio(s[0], w[0]) for s, w in zip(slowest, single, strict=True)],
    )
