"""Two replicas configured as the chart configures them with peering.enabled: --peering,
random priorities (active/passive)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from tests.operator.conftest import PEERING, PEERING_ON, Cluster, Replica, chart_operator_args
from tests.support.documents import pool_doc
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow

LIFETIME = 3  # seconds; the chart's replicas use controller.operator.PEERING_LIFETIME_SECONDS


async def start_pair(cluster: Cluster, tmp_path: Path) -> tuple[Replica, Replica]:
    args = chart_operator_args(*PEERING_ON, namespace=cluster.namespace)
    assert "--peering" in args and "--priority" not in args  # random, distinct priorities
    first = await cluster.start_chart_replica("a", tmp_path, LIFETIME, *PEERING_ON)
    second = await cluster.start_chart_replica("b", tmp_path, LIFETIME, *PEERING_ON)
    assert first.controller.options.priority != second.controller.options.priority
    active, passive = sorted((first, second), key=lambda r: -r.controller.options.priority)
    # The higher priority wins (the first replica may be active alone until it sees the
    # second one's peering record, then pauses in its favour).
    await wait_until(
        lambda: active.active and not passive.active, what="the higher priority to win"
    )
    return active, passive


async def pair_with_pool(
    cluster: Cluster, tmp_path: Path, pool: str, idle: int
) -> tuple[Replica, Replica]:
    """The pair, once the active replica has filled a new pool with `idle` runners."""
    active, passive = await start_pair(cluster, tmp_path)
    await cluster.create_pool(pool_doc(pool, idle=idle))
    await wait_until(
        lambda: len(cluster.jobs(pool)) == idle, what=f"the {idle} runners of pool {pool}"
    )
    return active, passive


async def start_with_priority(cluster: Cluster, name: str, priority: int) -> Replica:
    """A replica peering with a fixed priority instead of the chart's random one."""
    if cluster.chart_values != PEERING_ON:
        cluster.install_chart(*PEERING_ON)  # the peering object and its RBAC
    return await cluster.start_operator(
        "--namespace",
        cluster.namespace,
        "--peering",
        PEERING,
        "--priority",
        str(priority),
        name=name,
        lifetime=LIFETIME,
    )


async def test_only_the_active_replica_reconciles_and_is_ready(
    cluster: Cluster, tmp_path: Path
) -> None:
    active, passive = await pair_with_pool(cluster, tmp_path, "ha", idle=3)
    await wait_until(lambda: cluster.condition("ha", "Ready") is not None, what="a status")

    async def active_ready() -> bool:
        return await cluster.ready(active) == 200

    await wait_until(active_ready, what="the active replica to be ready")
    assert await cluster.ready(passive) == 503
    for replica in (active, passive):  # kopf's liveness endpoint: both are alive
        async with cluster.http.get(replica.liveness) as response:
            assert response.status == 200
    assert not passive.active
    assert passive.controller.engine.pools == {}
    created = passive.controller.metrics.registry.get_sample_value(
        "poolkeeper_runners_created_total", {"pool": f"{cluster.namespace}/ha"}
    )
    assert created is None
    assert len(cluster.jobs("ha", live_only=False)) == 3  # nobody created twice


async def test_the_passive_replica_takes_over_when_the_active_one_stops(
    cluster: Cluster, tmp_path: Path
) -> None:
    active, passive = await pair_with_pool(cluster, tmp_path, "ha", idle=2)

    started = time.monotonic()
    await active.stop()  # graceful: kopf removes its peering record on the way out
    await wait_until(lambda: passive.active, within=LIFETIME + 2, what="the takeover")
    assert time.monotonic() - started < LIFETIME + 2

    async def ready() -> bool:
        return await cluster.ready(passive) == 200

    await wait_until(ready, what="the new active replica to be ready")
    code, _ = await cluster.patch_pool("ha", {"spec": {"idleRunners": 4}})
    assert code == 200
    await wait_until(lambda: len(cluster.jobs("ha")) == 4, what="the new active replica to scale")


async def test_takeover_after_a_crash_within_the_peering_lifetime(
    cluster: Cluster, tmp_path: Path
) -> None:
    active, passive = await pair_with_pool(cluster, tmp_path, "ha", idle=1)
    # A crash: the replica disappears without removing its peering record.
    crashed = time.monotonic()
    await cluster.crash(active)
    await wait_until(lambda: passive.active, within=LIFETIME + 5, what="the takeover")
    took = time.monotonic() - crashed
    assert took <= LIFETIME + 3, took
    code, _ = await cluster.patch_pool("ha", {"spec": {"idleRunners": 2}})
    assert code == 200
    await wait_until(lambda: len(cluster.jobs("ha")) == 2, what="the new active replica to scale")


async def test_a_replica_that_loses_the_lead_stops_reconciling(cluster: Cluster) -> None:
    low = await start_with_priority(cluster, "low", 10)
    await wait_until(lambda: low.active, what="the only replica to be active")
    await cluster.create_pool(pool_doc("lead", idle=2))
    await wait_until(lambda: len(cluster.jobs("lead")) == 2, what="2 runners")
    high = await start_with_priority(cluster, "high", 20)
    await wait_until(lambda: high.active and not low.active, what="the higher priority to lead")
    assert low.controller.engine.pools == {}  # forgot its pools: the leader owns them now
    assert await cluster.ready(low) == 503
    code, _ = await cluster.patch_pool("lead", {"spec": {"idleRunners": 3}})
    assert code == 200
    await wait_until(lambda: len(cluster.jobs("lead")) == 3, what="the new leader to scale")
    assert not low.active


async def test_a_drain_goes_on_after_a_failover(cluster: Cluster, tmp_path: Path) -> None:
    active, passive = await pair_with_pool(cluster, tmp_path, "moving", idle=2)
    await wait_until(
        lambda: ((cluster.pool("moving") or {}).get("status") or {}).get("idleRunners") == 2,
        what="2 idle runners",
    )
    url = f"{active.controller.url}/v1/pools/{cluster.namespace}/moving/claims"
    headers = {"Authorization": "Bearer api-token"}
    async with cluster.http.post(url, json={}, headers=headers) as response:
        assert response.status == 201
        runner = (await response.json())["runnerId"]
    await cluster.delete_pool("moving")
    await wait_until(
        lambda: [j["ID"] for j in cluster.jobs("moving")] == [runner], what="idle runners gone"
    )
    await active.stop()
    await wait_until(lambda: passive.active, what="the takeover")
    await asyncio.sleep(1.0)
    assert cluster.pool("moving") is not None  # the claimed runner still holds it
    release = f"{passive.controller.url}/v1/runners/{runner}"
    async with cluster.http.delete(release, headers=headers) as response:
        assert response.status == 204
    await wait_until(lambda: cluster.pool("moving") is None, what="the drain to finish")
    assert cluster.jobs("moving") == []
