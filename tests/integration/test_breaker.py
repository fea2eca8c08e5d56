"""The creation breaker counts failed starts only: Nomad's routine work on healthy runners
(drains, lost nodes, reschedules, restarts) never raises Degraded; failing starts open it,
with Nomad's reason, and it closes once starts succeed again."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from controller.core.views import RunnerState
from controller.lab.simulator import Simulator
from controller.standalone import Controller
from tests.support.documents import pool_doc
from tests.support.waiting import wait_until

from .conftest import Harness, write_pools

KEY = "default/py"
IDLE = 4


def degraded(controller: Controller) -> tuple[str, str, str]:
    view = controller.engine.pools[KEY]
    condition = view.status.condition("Degraded") if view.status else None
    assert condition is not None
    return condition.status, condition.reason, condition.message


async def opened_breaker(controller: Controller, namespace: str) -> str:
    """Reconcile the namespace until its pool's breaker opens; the condition's message."""

    async def is_open() -> bool:
        await controller.engine.reconcile_namespace(namespace)
        return degraded(controller)[:2] == ("True", "CircuitOpen")

    await wait_until(is_open, what="the breaker to open")
    return degraded(controller)[2]


def destroyed(controller: Controller, reason: str) -> float:
    labels = {"pool": KEY, "reason": reason}
    value = controller.metrics.registry.get_sample_value(
        "poolkeeper_runners_destroyed_total", labels
    )
    return value or 0.0


def idle_allocations(controller: Controller) -> list[str]:
    return [
        r.allocation.id
        for r in controller.engine.pools[KEY].runners
        if r.state is RunnerState.IDLE and r.allocation is not None
    ]


async def drain(sim: Simulator, controller: Controller) -> None:
    # Batch allocations are left to finish until the deadline, then stopped unreplaced.
    await sim.drain_node(sim.node_names()[0], deadline_seconds=0.5)


async def node_down(sim: Simulator, controller: Controller) -> None:
    await sim.node_down(sim.node_names()[0])


async def reschedule(sim: Simulator, controller: Controller) -> None:
    for alloc_id in idle_allocations(controller)[:2]:
        await sim.reschedule_allocation(alloc_id)


async def oom_restart(sim: Simulator, controller: Controller) -> None:
    for alloc_id in idle_allocations(controller)[:2]:
        await sim.oom_restart(alloc_id)


async def reannounce(sim: Simulator, controller: Controller) -> None:
    for alloc_id in idle_allocations(controller):
        await sim.reannounce_allocation(alloc_id)


Fault = Callable[[Simulator, Controller], Awaitable[None]]


@pytest.mark.parametrize(
    "fault",
    [drain, node_down, reschedule, oom_restart, reannounce],
    ids=lambda fault: fault.__name__,
)
async def test_routine_nomad_work_never_degrades_a_pool(
    harness: Harness, tmp_path: Path, fault: Fault
) -> None:
    pools = write_pools(tmp_path / "p.yaml", pool_doc("py", idle=IDLE, maxRunners=12))
    controller = await harness.start(pools, resync_seconds=0.5)
    await harness.settled(controller)
    await fault(harness.sim, controller)
    seen: set[str] = set()
    # Sample through the fault and its repair: Degraded must stay False throughout.
    for _ in range(40):
        await asyncio.sleep(0.1)
        seen.add(degraded(controller)[0])
    await harness.settled(controller)
    seen.add(degraded(controller)[0])
    assert seen == {"False"}, degraded(controller)
    assert destroyed(controller, "failed") == destroyed(controller, "startup_timeout") == 0


async def test_failing_starts_open_the_breaker_with_nomads_reason_and_it_closes(
    harness: Harness, tmp_path: Path
) -> None:
    harness.sim.fail_starts("*", on=True)
    pools = write_pools(tmp_path / "p.yaml", pool_doc("py", idle=2, maxRunners=12))
    controller = await harness.start(pools, resync_seconds=0.5)
    message = await opened_breaker(controller, "default")
    assert "failed starts in a row" in message
    assert "Driver Failure: Failed to pull `python:3.12-slim`" in message, message
    harness.sim.fail_starts("*", on=False)

    async def closed() -> bool:
        return degraded(controller)[0] == "False"

    # The next probe, at most the breaker's pause later, starts and closes it.
    await wait_until(closed, within=30, what="the breaker to close once starts succeed")
    await harness.settled(controller)


async def test_a_pool_in_a_nomad_namespace_that_does_not_exist_says_so(
    harness: Harness, tmp_path: Path
) -> None:
    # Nomad refuses a job in a namespace it does not have (500 `job "…" is in
    # nonexistent namespace "…"`), and so does the simulator: the pool's registrations
    # are refused, which opens its breaker with Nomad's words, until the namespace exists.
    nomad = {"namespace": "nowhere"}
    pools = write_pools(tmp_path / "p.yaml", pool_doc("py", idle=2, maxRunners=12, nomad=nomad))
    controller = await harness.start(pools, resync_seconds=0.5)
    message = await opened_breaker(controller, "nowhere")
    assert 'is in nonexistent namespace "nowhere"' in message, message
    assert harness.sim.job_list("nowhere") == []
    harness.sim.namespace_registry.upsert({"Name": "nowhere"})

    async def filled() -> bool:
        await controller.engine.reconcile_namespace("nowhere")
        idle = [r for r in controller.engine.pools[KEY].runners if r.state is RunnerState.IDLE]
        return degraded(controller)[0] == "False" and len(idle) == 2

    await wait_until(filled, within=30, what="the pool to fill once the namespace exists")
