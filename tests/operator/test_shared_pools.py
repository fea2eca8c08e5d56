"""Two operator replicas as the chart runs them: both active and ready, the pools' leases
spread over them, each pool's status and Events written by its lease holder only (the API
server's audit log names the writing replica in its User-Agent), a replica that stops or
crashes hands its pools to the other (a drain going on), and one that gives a pool's lease
to a newcomer stops writing it. What kopf peering promised of active/passive replicas,
the leases keep (docs/operator.md, "High availability")."""

from __future__ import annotations

import asyncio
import re
import time
from collections import Counter
from pathlib import Path
from typing import Any, Final

import pytest

from controller.core.leases import DEFAULT_TTL_SECONDS, takeover_seconds
from controller.core.paths import lease_path
from tests.operator.conftest import NOMAD_NAMESPACE, Cluster, Replica
from tests.support.documents import pool_doc
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow

POOLS: Final = ("p0", "p1", "p2", "p3")
USER_AGENT: Final = re.compile(r"poolkeeper-operator \((?P<identity>[^)]*)\)")
HEADERS: Final = {"Authorization": "Bearer api-token"}  # start_chart_replica's token file


def lease_holders(cluster: Cluster) -> dict[str, str]:
    """pool -> the identity holding its lease now (a live lock in the simulator)."""
    variables = cluster.sim.variables(NOMAD_NAMESPACE)
    holders = {}
    for pool in POOLS:
        lease = variables.get(lease_path(f"{cluster.namespace}/{pool}")) or {}
        if lease.get("Lock"):
            holders[pool] = str((lease.get("Items") or {}).get("holder", ""))
    return holders


def status_writes(cluster: Cluster) -> list[tuple[str, str]]:
    """(pool, writing replica) of every status write the server logged, in order."""
    writes = []
    for event in cluster.requests():
        ref = event.get("objectRef") or {}
        if event["verb"] == "patch" and ref.get("subresource") == "status":
            agent = str(event.get("userAgent", ""))
            found = USER_AGENT.fullmatch(agent)
            writes.append((str(ref["name"]), found["identity"] if found else agent))
    return writes


def status(cluster: Cluster, pool: str) -> dict[str, Any]:
    return dict((cluster.pool(pool) or {}).get("status") or {})


def identity(replica: Replica) -> str:
    return replica.controller.identity()


async def scale_all(cluster: Cluster, pools: list[str], idle: int) -> None:
    """Scale the pools and wait until each one's status shows it."""
    for pool in pools:
        code, body = await cluster.patch_pool(pool, {"spec": {"idleRunners": idle}})
        assert code == 200, body
    await wait_until(
        lambda: all(status(cluster, p).get("idleRunners") == idle for p in pools),
        within=30,
        what=f"{pools}: {idle} idle runners in their status",
    )


async def spread_pair(
    cluster: Cluster, tmp_path: Path, *, nomad_relay: bool = False
) -> tuple[Replica, Replica, dict[str, str]]:
    """Two replicas as the chart runs them and the 4 pools, once the leases are spread (two
    each) and each pool's status names its holder; the pools' holders."""
    a = await cluster.start_chart_replica("a", tmp_path, nomad_relay=nomad_relay)
    b = await cluster.start_chart_replica("b", tmp_path, nomad_relay=nomad_relay)
    assert identity(a) != identity(b)
    for pool in POOLS:
        await cluster.create_pool(pool_doc(pool, idle=1))
    return a, b, await spread(cluster, a, b)


async def spread(cluster: Cluster, a: Replica, b: Replica) -> dict[str, str]:
    """The pools' holders, once the leases are spread over the two replicas (two each) and
    each pool's status names its holder."""
    await wait_until(
        lambda: Counter(lease_holders(cluster).values()) == {identity(a): 2, identity(b): 2},
        within=40,
        what=f"two leases each (now {lease_holders(cluster)})",
    )
    holders = lease_holders(cluster)
    await wait_until(
        lambda: all(status(cluster, p).get("reconciledBy") == holders[p] for p in POOLS),
        what="every status naming its lease holder",
    )
    return holders


async def test_two_active_replicas_share_the_pools_and_only_holders_write(
    cluster: Cluster, tmp_path: Path
) -> None:
    a, b, holders = await spread_pair(cluster, tmp_path)
    # Both replicas are ready, each holding its share and knowing who holds the rest.
    for replica, other in ((a, b), (b, a)):

        async def ready(replica: Replica = replica) -> bool:
            return await cluster.ready(replica) == 200

        await wait_until(ready, what=f"replica {replica.name} to be ready")
        async with cluster.http.get(replica.controller.url + "/readyz") as response:
            body = await response.json()
        mine = sorted(p for p, h in holders.items() if h == identity(replica))
        assert sorted(k.split("/")[1] for k in body["reconciles"]) == mine
        assert set(body["reconciledElsewhere"].values()) == {identity(other)}

    # Either replica serves claims of any pool: one of a's pools, claimed through b.
    a_pools = sorted(p for p, h in holders.items() if h == identity(a))
    url = f"{b.controller.url}/v1/pools/{cluster.namespace}/{a_pools[0]}/claims"
    # b may not have seen a's runner start yet (the statuses name their holders before
    # every pool is full): the claim waits for one.
    async with cluster.http.post(url, json={"waitSeconds": 20}, headers=HEADERS) as response:
        assert response.status == 201, await response.text()

    # A change to every pool: each status is written, by its holder only.
    before = len(status_writes(cluster))
    await scale_all(cluster, list(POOLS), 2)
    writes = status_writes(cluster)[before:]
    assert lease_holders(cluster) == holders  # nothing moved meanwhile
    assert {pool for pool, _ in writes} == set(POOLS)
    assert [(p, w) for p, w in writes if w != holders[p]] == []
    # Events too: each LeaseAcquired is posted by the replica it names.
    acquired = cluster.events("LeaseAcquired")
    assert {e["involvedObject"]["name"] for e in acquired} == set(POOLS)
    for event in acquired:
        assert event["message"].startswith(f"{event['reportingInstance']} holds"), event

    # A graceful stop (a rolling update, a drain): the other replica takes its pools.
    started = time.monotonic()
    await a.stop()
    await wait_until(
        lambda: (
            set(lease_holders(cluster).values()) == {identity(b)}
            and len(lease_holders(cluster)) == len(POOLS)
        ),
        within=20,
        what="the remaining replica to hold every lease",
    )
    handover = time.monotonic() - started
    assert handover < 5.0, handover  # released on the way out: no lock has to expire
    await wait_until(
        lambda: all(status(cluster, p).get("reconciledBy") == identity(b) for p in POOLS),
        what="every status naming the remaining replica",
    )
    before = len(status_writes(cluster))
    await scale_all(cluster, a_pools, 3)
    assert {w for _, w in status_writes(cluster)[before:]} == {identity(b)}
    taken = [
        e["involvedObject"]["name"]
        for e in cluster.events("LeaseAcquired")
        if e["reportingInstance"] == identity(b)
    ]
    assert set(a_pools) <= set(taken)
    assert await cluster.ready(b) == 200
    print(f"graceful stop: the other replica held every lease {handover:.2f} s later")


async def test_a_crashed_replicas_pools_are_taken_once_nomad_frees_its_locks(
    cluster: Cluster, tmp_path: Path
) -> None:
    a, b, holders = await spread_pair(cluster, tmp_path, nomad_relay=True)
    a_pools = sorted(p for p, h in holders.items() if h == identity(a))
    # Killed: it neither deletes its member record nor gives its leases back.
    crashed = time.monotonic()
    await cluster.crash(a)
    assert lease_holders(cluster) == holders
    bound = takeover_seconds(DEFAULT_TTL_SECONDS) + 5.0  # + a pass, on a shared machine
    await wait_until(
        lambda: (
            set(lease_holders(cluster).values()) == {identity(b)}
            and len(lease_holders(cluster)) == len(POOLS)
        ),
        within=bound + 10,
        what="the remaining replica to hold every lease",
    )
    takeover = time.monotonic() - crashed
    assert takeover <= bound, takeover
    await wait_until(
        lambda: all(status(cluster, p).get("reconciledBy") == identity(b) for p in POOLS),
        what="every status naming the remaining replica",
    )
    await scale_all(cluster, a_pools, 2)
    assert await cluster.ready(b) == 200
    print(f"crash: the other replica held every lease {takeover:.1f} s later")


async def test_a_replica_that_gives_a_lease_away_stops_writing_the_pool(
    cluster: Cluster, tmp_path: Path
) -> None:
    """A replica started later takes its share of the leases from the first, which then
    writes none of the pools it gave away; nobody creates a runner twice."""
    a = await cluster.start_chart_replica("a", tmp_path)
    for pool in POOLS:
        await cluster.create_pool(pool_doc(pool, idle=1))
    await wait_until(
        lambda: lease_holders(cluster) == dict.fromkeys(POOLS, identity(a)),
        within=30,
        what="the only replica to hold every lease",
    )
    await wait_until(lambda: all(len(cluster.jobs(p)) == 1 for p in POOLS), what="a runner each")

    b = await cluster.start_chart_replica("b", tmp_path)
    holders = await spread(cluster, a, b)
    # The handover created nothing: one runner job per pool, ever.
    assert {p: len(cluster.jobs(p, live_only=False)) for p in POOLS} == dict.fromkeys(POOLS, 1)
    before = len(status_writes(cluster))
    await scale_all(cluster, list(POOLS), 2)
    writes = status_writes(cluster)[before:]
    assert lease_holders(cluster) == holders
    assert [(p, w) for p, w in writes if w != holders[p]] == []  # a wrote none of b's pools
    assert {p: len(cluster.jobs(p, live_only=False)) for p in POOLS} == dict.fromkeys(POOLS, 2)


async def test_a_drain_goes_on_when_its_lease_holder_stops(
    cluster: Cluster, tmp_path: Path
) -> None:
    """A pool deleted while a runner of it is claimed drains (Drain, the default); its
    lease holder stops meanwhile; the other replica takes the lease and finishes the drain
    when the runner is released, and only then is the finalizer removed."""
    a, b, holders = await spread_pair(cluster, tmp_path)
    pool = next(p for p in POOLS if holders[p] == identity(a))
    await wait_until(lambda: status(cluster, pool).get("idleRunners") == 1, what="an idle runner")
    url = f"{a.controller.url}/v1/pools/{cluster.namespace}/{pool}/claims"
    async with cluster.http.post(url, json={}, headers=HEADERS) as response:
        assert response.status == 201, await response.text()
        runner = (await response.json())["runnerId"]
    await cluster.delete_pool(pool)
    await wait_until(
        lambda: [j["ID"] for j in cluster.jobs(pool)] == [runner], what="the idle runners gone"
    )

    await a.stop()
    await wait_until(
        lambda: lease_holders(cluster).get(pool) == identity(b), what="b to take the lease"
    )
    await asyncio.sleep(1.0)
    assert cluster.pool(pool) is not None  # the claimed runner still holds it
    async with cluster.http.delete(
        f"{b.controller.url}/v1/runners/{runner}", headers=HEADERS
    ) as response:
        assert response.status == 204, await response.text()
    await wait_until(lambda: cluster.pool(pool) is None, what="the drain to finish")
    assert cluster.jobs(pool) == []
