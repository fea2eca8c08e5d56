"""A node drain on the simulator: idle runners are replaced before Nomad moves them."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from controller.core.status import count
from controller.core.times import parse_time, utcnow
from controller.core.views import RunnerState
from tests.integration.conftest import Harness, write_pools
from tests.support.documents import pool_doc
from tests.support.waiting import wait_until

IDLE = 6


async def test_a_drain_never_takes_the_idle_count_below_the_target(harness: Harness, tmp_path):
    controller = await harness.start(
        write_pools(tmp_path / "p.yaml", pool_doc("py", idle=IDLE, maxRunners=20)),
        resync_seconds=0.5,
    )
    await harness.settled(controller)
    view = controller.engine.pools["default/py"]
    status, claimed = await harness.api(controller, "POST", "/v1/pools/default/py/claims", {})
    assert status == 201
    await harness.settled(controller)
    node = claimed["nodeName"]
    on_node = [
        r.id
        for r in view.runners
        if r.state is RunnerState.IDLE and r.allocation and r.allocation.node_name == node
    ]
    assert on_node, "the spread placement put idle runners beside the claimed one"

    samples: list[int] = []
    sampling = True

    async def sample() -> None:
        while sampling:
            samples.append(count(view.runners).idle)
            await asyncio.sleep(0.01)

    sampler = asyncio.create_task(sample())
    await harness.sim.drain_node(node, deadline_seconds=120)

    async def moved() -> bool:
        idle = [r for r in view.runners if r.state is RunnerState.IDLE]
        return len(idle) == IDLE and all(
            r.allocation is not None and r.allocation.node_name != node for r in idle
        )

    await wait_until(moved, what="the idle runners to leave the draining node")
    sampling = False
    await sampler
    assert min(samples) >= IDLE, samples
    # The idle runners that were on the node were retired by poolkeeper, not migrated.
    jobs = {job["ID"] for job in harness.sim.job_list("default")}
    assert not jobs & set(on_node)

    # The claimed runner stays claimed, and its claim says the node drains and until when.
    status, body = await harness.api(controller, "GET", f"/v1/runners/{claimed['runnerId']}")
    assert status == 200
    assert body["nodeDraining"] is True
    deadline = parse_time(body["drainDeadline"])
    assert utcnow() < deadline <= utcnow() + timedelta(seconds=121)
    _, listed = await harness.api(controller, "GET", "/v1/pools/default/py/claims")
    assert listed["claims"][0]["nodeDraining"] is True


async def test_idle_runners_on_an_ineligible_node_are_replaced_too(harness: Harness, tmp_path):
    controller = await harness.start(
        write_pools(tmp_path / "p.yaml", pool_doc("py", idle=IDLE, maxRunners=20))
    )
    await harness.settled(controller)
    view = controller.engine.pools["default/py"]
    node = next(r.allocation for r in view.runners if r.allocation is not None)
    assert node is not None
    harness.sim.set_eligibility(node.node_id, False)

    async def moved() -> bool:
        await controller.engine.reconcile_namespace("default")
        idle = [r for r in view.runners if r.state is RunnerState.IDLE]
        return len(idle) == IDLE and all(
            r.allocation is not None and r.allocation.node_id != node.node_id for r in idle
        )

    await wait_until(moved, what="the idle runners to leave the ineligible node")
    await harness.settled(controller)
