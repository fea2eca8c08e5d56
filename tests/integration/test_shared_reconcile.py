"""Reconcilers that share the work: three `poolkeeper run` processes on one pool file of 30
pools spread the pools' leases evenly (at most ⌈P/N⌉ each), take a newcomer's share from
those holding more, hand a stopped one's pools over at once and a killed one's within the
lock's bound; and no pool is ever written by two holders."""

from __future__ import annotations

import asyncio
import signal
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from controller.core.leases import LOCK_DELAY_SECONDS, takeover_seconds
from controller.core.paths import LEASES_PREFIX
from controller.lab.simulator import SimServer, Simulator
from tests.support.documents import pool_doc
from tests.support.waiting import wait_until

from .conftest import write_pools
from .test_process import Process

pytestmark = pytest.mark.slow

POOLS = 30
TTL = 10.0


def held(sim: Simulator) -> Counter[str]:
    """Leases held now (a live lock), by holder."""
    return Counter(
        str(variable["Items"]["holder"])
        for path, variable in sim.variables().items()
        if path.startswith(LEASES_PREFIX) and variable.get("Lock")
    )


def holder_of(sim: Simulator, process: Process) -> str:
    assert process.proc is not None
    return next(h for h in held(sim) if h.endswith(f"/{process.proc.pid}"))


async def first_moment(check: Callable[[], bool], within: float) -> float:
    """When `check` first held, polled every 10 ms (wait_until's pauses grow)."""
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)
    return time.monotonic()


async def spread(sim: Simulator, counts: list[int], within: float, what: str) -> float:
    """Wait until the leases are held in exactly these numbers; the seconds it took."""
    started = time.monotonic()

    def settled() -> bool:
        return sorted(held(sim).values()) == sorted(counts)

    await wait_until(settled, within=within, what=f"{what}: {counts} (now {held(sim)})")
    return time.monotonic() - started


async def test_three_reconcilers_spread_thirty_pools_and_take_over_each_others(
    sim: Simulator, sim_server: SimServer, tmp_path: Path
) -> None:
    pools = write_pools(
        tmp_path / "pools.yaml", *(pool_doc(f"p{i:02d}", idle=1) for i in range(POOLS))
    )
    processes = [Process(pools, sim_server.url, tmp_path) for _ in range(3)]
    a, b, c = processes
    try:
        a.start()
        await spread(sim, [30], 60, "one reconciler holds every pool")
        b.start()
        joined = await spread(sim, [15, 15], TTL + 20, "a second reconciler takes its share")
        c.start()
        await spread(sim, [10, 10, 10], TTL + 20, "a third takes its share")
        assert max(held(sim).values()) <= -(-POOLS // 3)
        # A graceful stop: its pools are taken at once.
        c_holds = holder_of(sim, c)
        assert c.proc is not None
        c.proc.send_signal(signal.SIGTERM)
        released = await first_moment(lambda: held(sim)[c_holds] < 10, within=20)
        taken = await first_moment(lambda: sorted(held(sim).values()) == [15, 15], within=10)
        handover = taken - released  # from its first lease given back to the last taken
        assert await asyncio.to_thread(c.proc.wait, 20) == 0
        assert handover < 1.0, handover  # a release, taken at once: no lock expires
        # A crash: its pools are taken once Nomad frees its locks.
        killed = time.monotonic()
        assert await b.signal(signal.SIGKILL) == -signal.SIGKILL
        bound = takeover_seconds(TTL) + 5.0  # + a pass, on a shared machine
        await spread(sim, [30], bound + 10, "the killed one's pools taken over")
        takeover = time.monotonic() - killed
        assert takeover <= bound, takeover
        assert takeover >= 2 * TTL - TTL / 3  # Nomad keeps an unrenewed lock that long
        # Nobody but a pool's holder wrote its jobs.
        assert sim.audit.by_non_holders() == []
        print(
            f"second joined within {joined:.1f} s, SIGTERM handover {handover:.2f} s, "
            f"SIGKILL takeover {takeover:.1f} s (bound 2 x TTL + {LOCK_DELAY_SECONDS:g} s + a pass)"
        )
    finally:
        for process in processes:
            if process.proc is not None and process.proc.poll() is None:
                await process.signal(signal.SIGTERM)
    for process in processes:
        assert "Traceback" not in process.output()
