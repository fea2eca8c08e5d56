"""Nodes as Nomad shows them: their fields, a drain's LastDrain, purge, client stats."""

from __future__ import annotations

from controller.lab.simulator import Simulator
from tests.simulator.conftest import Client, service_job
from tests.support.waiting import wait_until


async def test_a_node_as_nomad_shows_it(client: Client, sim: Simulator) -> None:
    node_id = sim.node_id("sim-node-1")
    status, node, _ = await client.get(f"/v1/node/{node_id}")
    assert status == 200
    assert node["SecretID"] == ""  # Nomad never shows it
    assert node["LastDrain"] is None
    assert [e["Message"] for e in node["Events"]] == ["Node registered"]
    resources = node["NodeResources"]
    assert (resources["MinDynamicPort"], resources["MaxDynamicPort"]) == (20000, 32000)
    assert node["ReservedResources"]["Cpu"] == {"CpuShares": 0}
    _, stubs, _ = await client.get("/v1/nodes", resources="true")
    assert {"NodeResources", "ReservedResources"} <= set(stubs[0])


async def test_a_drain_writes_last_drain(client: Client, sim: Simulator) -> None:
    await client.register(service_job("d", count=1))
    await wait_until(lambda: [a["ClientStatus"] for a in sim.allocations("d")] == ["running"])
    node_id = sim.allocations("d")[0]["NodeID"]
    spec = {"DrainSpec": {"Deadline": 60 * 10**9}, "Meta": {"reason": "kernel"}}
    assert (await client.put(f"/v1/node/{node_id}/drain", spec))[0] == 200
    draining = sim.nodes[node_id]["LastDrain"]
    assert (draining["Status"], draining["Meta"]) == ("draining", {"reason": "kernel"})
    # The service alloc migrates; once nothing is left the drain is complete.
    await wait_until(lambda: sim.nodes[node_id]["DrainStrategy"] is None)
    done = sim.nodes[node_id]["LastDrain"]
    assert (done["Status"], done["Meta"], done["StartedAt"]) == (
        "complete",
        {"reason": "kernel"},
        draining["StartedAt"],
    )
    assert done["UpdatedAt"] >= done["StartedAt"]
    messages = [e["Message"] for e in sim.nodes[node_id]["Events"]]
    assert messages[-2:] == ["Node drain strategy set", "Node drain complete"]


async def test_a_drain_the_operator_stops_is_canceled(client: Client, sim: Simulator) -> None:
    # A batch allocation is left to finish until the deadline: the drain is still on.
    await client.register(service_job("b", count=1, Type="batch"))
    await wait_until(lambda: [a["ClientStatus"] for a in sim.allocations("b")] == ["running"])
    node_id = sim.allocations("b")[0]["NodeID"]
    await client.put(f"/v1/node/{node_id}/drain", {"DrainSpec": {"Deadline": 3600 * 10**9}})
    assert sim.nodes[node_id]["LastDrain"]["Status"] == "draining"
    await client.put(f"/v1/node/{node_id}/drain", {"DrainSpec": None, "MarkEligible": True})
    node = sim.nodes[node_id]
    assert (node["LastDrain"]["Status"], node["Events"][-1]["Message"]) == (
        "canceled",
        "Node drain disabled",
    )


async def test_purge_and_the_client_registering_again(client: Client, sim: Simulator) -> None:
    assert (await client.put("/v1/node/12345678-abcd-efab-cdef-123456789abc/purge"))[:2] == (
        500,
        "node not found",
    )
    await client.register(service_job("p", count=1))
    await wait_until(lambda: [a["ClientStatus"] for a in sim.allocations("p")] == ["running"])
    node_id = sim.allocations("p")[0]["NodeID"]
    status, out, _ = await client.put(f"/v1/node/{node_id}/purge")
    assert status == 200 and out["EvalIDs"] and out["NodeModifyIndex"] == out["Index"]
    # Its allocation is lost and replaced; its client registers the node again.
    await wait_until(lambda: sim.allocations("p")[0]["ClientStatus"] == "lost")
    await wait_until(lambda: sim.nodes[node_id]["Status"] == "ready")
    assert sim.nodes[node_id]["CreateIndex"] > out["Index"]


async def test_client_stats_are_this_hosts(client: Client, sim: Simulator) -> None:
    node_id = sim.node_id("sim-node-2")
    status, stats, _ = await client.get("/v1/client/stats", node_id=node_id)
    assert status == 200
    assert stats["Memory"]["Total"] >= stats["Memory"]["Available"] > 0
    assert stats["AllocDirStats"]["Size"] > 0
    assert (await client.get("/v1/client/stats", node_id="nope"))[:2] == (404, "Unknown node nope")
    assert (await client.get("/v1/client/stats"))[0] == 400
