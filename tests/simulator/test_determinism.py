"""The same seed and the same calls give the same IDs, placements and event order."""

from __future__ import annotations

import asyncio

from controller.lab.simulator import Simulator
from tests.simulator.conftest import service_job
from tests.support.waiting import wait_until


async def _story(seed: int) -> list[tuple[str, str, str]]:
    sim = Simulator(seed=seed, start_delay=0.0, algorithm="spread")
    for i in range(4):
        sim.register_job(service_job(f"job-{i}", count=2), "default")
    await wait_until(lambda: sum(a["ClientStatus"] == "running" for a in sim.allocs.values()) == 8)
    first = sim.allocations("job-0")[0]["ID"]
    await sim.reschedule_allocation(first)
    await sim.node_down("sim-node-2")
    await asyncio.sleep(0.01)
    return [(a["ID"], a["NodeName"], a["ClientStatus"]) for a in sim.allocs.values()]


async def test_same_seed_same_story() -> None:
    story = await _story(11)
    assert story == await _story(11)
    assert story != await _story(12)
    assert len({node for _, node, _ in story}) == 3  # spread uses every node
