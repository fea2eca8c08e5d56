"""write_latency_ms: every write is applied and answered that much later, reads at once."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable
from typing import Any

import aiohttp
import pytest

from controller.lab.simulator import Simulator, start_sim
from tests.simulator.conftest import START_DELAY, Client, service_job

LATENCY = 0.3  # seconds


@pytest.fixture
async def slow_writes() -> AsyncIterator[tuple[Simulator, Client]]:
    sim = Simulator(nodes=["n"], seed=1, start_delay=START_DELAY, write_latency_ms=LATENCY * 1000)
    server = await start_sim(sim)
    async with aiohttp.ClientSession() as http:
        yield sim, Client(http, server.url)
    await server.stop()


async def timed(call: Awaitable[tuple[int, Any, Any]]) -> tuple[float, int]:
    """(seconds the call took, its status)."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    status, _, _ = await call
    return loop.time() - start, status


async def test_writes_are_answered_later_and_reads_at_once(
    slow_writes: tuple[Simulator, Client],
) -> None:
    _, client = slow_writes
    took, status = await timed(client.put("/v1/var/app/lock", {"Items": {"holder": "a"}}))
    assert status == 200 and took >= LATENCY
    took, status = await timed(client.get("/v1/var/app/lock"))
    assert status == 200 and took < LATENCY / 2
    took, status = await timed(client.put("/v1/jobs", {"Job": service_job("j")}))
    assert status == 200 and took >= LATENCY
    took, status = await timed(client.get("/v1/job/j"))
    assert status == 200 and took < LATENCY / 2
    # A plan is a write method that applies nothing: no commit to wait for.
    took, status = await timed(client.put("/v1/job/j/plan", {"Job": service_job("j")}))
    assert status == 200 and took < LATENCY / 2
    took, status = await timed(client.delete("/v1/job/j"))
    assert status == 200 and took >= LATENCY


async def test_nothing_sees_a_write_before_its_answer(
    slow_writes: tuple[Simulator, Client],
) -> None:
    _, client = slow_writes
    write = asyncio.create_task(client.put("/v1/var/app/lock", {"Items": {"holder": "a"}}))
    await asyncio.sleep(LATENCY / 3)
    assert (await client.get("/v1/var/app/lock"))[0] == 404
    assert (await write)[0] == 200
    assert (await client.get("/v1/var/app/lock"))[0] == 200


async def test_the_latency_is_a_knob(slow_writes: tuple[Simulator, Client]) -> None:
    sim, client = slow_writes
    status, _, _ = await client.post("/_sim/set_write_latency", {"ms": 0})
    assert status == 200 and sim.write_latency_ms == 0
    took, _ = await timed(client.put("/v1/var/x", {"Items": {"k": "v"}}))
    assert took < LATENCY / 2
    status, text, _ = await client.post("/_sim/set_write_latency", {"ms": -5})
    assert status == 400 and "-5" in text
    with pytest.raises(ValueError, match="latency"):
        Simulator(write_latency_ms=float("nan"))
