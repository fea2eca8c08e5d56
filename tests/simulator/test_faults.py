"""Fault injection: each fault reproduces Nomad's real sequence (reference section 5)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest

from controller.lab.simulator import Simulator, start_sim
from controller.lab.simulator.util import ApiError
from tests.simulator.conftest import Client, Stream, service_job
from tests.support.waiting import wait_until


async def _running(client: Client, sim: Simulator, job: dict[str, Any]) -> list[dict[str, Any]]:
    await client.register(job)
    count = job["TaskGroups"][0]["Count"]
    await wait_until(
        lambda: [a["ClientStatus"] for a in sim.allocations(job["ID"])] == ["running"] * count
    )
    # Its deployment completes in a commit of its own, after the allocations run: wait for
    # it too, so that a stream opened now sees only what the test does next.
    await wait_until(
        lambda: all(
            d["Status"] != "running" for d in sim.deployments.values() if d["JobID"] == job["ID"]
        )
    )
    return sim.allocations(job["ID"])


async def _alloc_events(stream: Stream, count: int) -> list[tuple[int, str, dict[str, Any]]]:
    """(frame index, type, alloc payload) for the next `count` Allocation events."""
    out: list[tuple[int, str, dict[str, Any]]] = []
    while len(out) < count:
        frame = await stream.next()
        out.extend(
            (frame["Index"], e["Type"], e["Payload"]["Allocation"])
            for e in frame["Events"]
            if e["Topic"] == "Allocation"
        )
    return out


async def _seed_sequence(seed: int) -> list[tuple[int, str, str, str, str]]:
    sim = Simulator(nodes=["n1", "n2"], seed=seed, start_delay=0.01)
    server = await start_sim(sim)
    try:
        async with aiohttp.ClientSession() as session:
            client = Client(session, server.url)
            (old,) = await _running(client, sim, service_job("runner-1"))
            after = sim.index
            resp = await session.get(
                server.url + "/v1/event/stream", params={"topic": "Allocation", "index": after + 1}
            )
            stream = Stream(resp, after)
            new_id = await sim.reschedule_allocation(old["ID"])
            events = await _alloc_events(stream, 4)
            resp.close()
    finally:
        await server.stop()
    names = {old["ID"]: "O", new_id: "N"}
    return [(i, t, names[a["ID"]], a["ClientStatus"], a["DesiredStatus"]) for i, t, a in events]


async def test_seed_reschedule_frame_order() -> None:
    seq = await _seed_sequence(seed=3)
    plan = [s for s in seq if s[1] == "PlanResult"]
    # One PlanResult frame: the new alloc before the old alloc's stop.
    assert [(n, c, d) for _, _, n, c, d in plan] == [
        ("N", "pending", "run"),
        ("O", "running", "stop"),
    ]
    assert plan[0][0] == plan[1][0]
    updates = [s for s in seq if s[1] == "AllocationUpdated"]
    assert sorted((n, c) for _, _, n, c, _ in updates) == [("N", "running"), ("O", "complete")]
    assert updates[0][0] != updates[1][0]  # two separate client frames
    # Deterministic under a seed; some seed reports the other order.
    assert await _seed_sequence(seed=3) == seq
    orders = set()
    for seed in range(6):
        orders.add(
            tuple(n for _, t, n, _, _ in await _seed_sequence(seed) if t == "AllocationUpdated")
        )
    assert orders == {("N", "O"), ("O", "N")}


async def test_seed_links_in_payloads(
    client: Client, sim: Simulator, open_stream: Callable[..., Any]
) -> None:
    (old,) = await _running(client, sim, service_job("r"))
    stream = await open_stream(topic="Allocation", after=sim.index)
    new_id = await sim.reschedule_allocation(old["ID"])
    (_, _, new), (_, _, stopped) = await _alloc_events(stream, 2)
    assert new["ID"] == new_id and new["PreviousAllocation"] == old["ID"]
    assert stopped["ID"] == old["ID"] and stopped["NextAllocation"] == new_id
    assert stopped["DesiredDescription"] == "alloc is being migrated"
    _, stub, _ = await client.get(f"/v1/allocation/{new_id}")
    assert stub["PreviousAllocation"] == old["ID"]


async def test_node_down_allocs_lost_and_replaced(
    client: Client, sim: Simulator, open_stream: Callable[..., Any]
) -> None:
    allocs = await _running(client, sim, service_job("nd", count=3))
    victim = allocs[0]
    stream = await open_stream(topic=["Allocation", "Node"], after=sim.index)
    await sim.node_down(victim["NodeName"])
    node_frame = await stream.next()
    assert [(e["Topic"], e["Type"]) for e in node_frame["Events"]] == [("Node", "NodeStreamEvent")]
    assert node_frame["Events"][0]["Payload"]["Node"]["Status"] == "down"
    on_node = {a["ID"] for a in allocs if a["NodeName"] == victim["NodeName"]}
    frame = await stream.next()
    assert {e["Type"] for e in frame["Events"]} == {"PlanResult"}
    payloads = [e["Payload"]["Allocation"] for e in frame["Events"] if e["Topic"] == "Allocation"]
    n = len(on_node)
    new, lost = payloads[:n], payloads[n:]  # placements before the stops, in one frame
    assert {a["ID"] for a in lost} == on_node
    for a in lost:
        assert a["ClientStatus"] == "lost" and a["DesiredStatus"] == "stop"
        assert a["DesiredDescription"] == "alloc is lost since its node is down"
    assert {a["PreviousAllocation"] for a in new} == on_node
    assert all(a["ClientStatus"] == "pending" and a["NodeName"] != victim["NodeName"] for a in new)
    await wait_until(lambda: all(sim.alloc(a["ID"])["ClientStatus"] == "running" for a in new))
    assert {sim.alloc(i)["ClientStatus"] for i in on_node} == {"lost"}  # no client update for O


async def test_drain_migrates_service_and_waits_for_batch(
    client: Client, sim: Simulator, open_stream: Callable[..., Any]
) -> None:
    sim.algorithm = "spread"
    (svc,) = await _running(client, sim, service_job("svc"))
    batch_job = service_job("bat", Type="batch")
    await client.register(batch_job)
    await wait_until(lambda: [a["ClientStatus"] for a in sim.allocations("bat")] == ["running"])
    node = svc["NodeName"]
    stream = await open_stream(topic=["Allocation", "Node"], after=sim.index)
    await sim.drain_node(node, deadline_seconds=0.3)
    first = await stream.next()
    assert first["Events"][0]["Type"] == "NodeDrain"
    assert first["Events"][0]["Payload"]["Node"]["DrainStrategy"] is not None
    marked = await stream.next()
    assert [(e["Type"], e["Key"]) for e in marked["Events"]] == [
        ("AllocationUpdateDesiredStatus", svc["ID"])
    ]
    assert marked["Events"][0]["Payload"]["Allocation"]["DesiredTransition"]["Migrate"] is True
    await wait_until(lambda: len(sim.allocations("svc")) == 2)
    replacement = sim.allocations("svc")[1]
    assert replacement["PreviousAllocation"] == svc["ID"] and replacement["NodeName"] != node
    await wait_until(lambda: not sim.nodes[sim.node_id(node)]["Drain"])
    assert sim.nodes[sim.node_id(node)]["SchedulingEligibility"] == "ineligible"


async def test_drain_batch_alloc_at_deadline(client: Client, sim: Simulator) -> None:
    job = service_job("only-batch", Type="batch")
    await client.register(job)
    await wait_until(
        lambda: [a["ClientStatus"] for a in sim.allocations("only-batch")] == ["running"]
    )
    alloc = sim.allocations("only-batch")[0]
    await sim.drain_node(alloc["NodeName"], deadline_seconds=0.2)
    await asyncio.sleep(0.1)
    assert sim.alloc(alloc["ID"])["DesiredStatus"] == "run"
    await wait_until(lambda: sim.alloc(alloc["ID"])["ClientStatus"] == "complete")
    assert len(sim.allocations("only-batch")) == 1


async def test_oom_restart_in_place(
    client: Client, sim: Simulator, open_stream: Callable[..., Any]
) -> None:
    (alloc,) = await _running(client, sim, service_job("oom"))
    stream = await open_stream(topic="Allocation", after=sim.index)
    await sim.oom_restart(alloc["ID"])
    ((_, etype, payload),) = await _alloc_events(stream, 1)
    assert etype == "AllocationUpdated" and payload["ID"] == alloc["ID"]
    state = payload["TaskStates"]["main"]
    assert state["Restarts"] == 1 and state["State"] == "running"
    assert any(e["Details"].get("oom_killed") == "true" for e in state["Events"])
    assert len(sim.allocations("oom")) == 1


async def test_reannounce_sends_unchanged_alloc(
    client: Client, sim: Simulator, open_stream: Callable[..., Any]
) -> None:
    (alloc,) = await _running(client, sim, service_job("re"))
    _, before, _ = await client.get(f"/v1/allocation/{alloc['ID']}")
    stream = await open_stream(topic="Allocation", after=sim.index)
    await sim.reannounce_allocation(alloc["ID"])
    ((_, etype, payload),) = await _alloc_events(stream, 1)
    assert etype == "AllocationUpdated"
    strip = ("ModifyIndex", "ModifyTime", "Job")
    assert {k: v for k, v in payload.items() if k not in strip} == {
        k: v for k, v in before.items() if k not in strip
    }


async def test_remove_job_silently(
    client: Client, sim: Simulator, open_stream: Callable[..., Any]
) -> None:
    await _running(client, sim, service_job("ghost", count=2))
    stream = await open_stream(after=sim.index)
    await sim.remove_job_silently("ghost")
    frame = await stream.next()
    assert [(e["Topic"], e["Type"]) for e in frame["Events"]] == [("Job", "JobDeregistered")]
    assert (await client.get("/v1/job/ghost"))[0] == 404
    assert (await client.get("/v1/job/ghost/allocations"))[1] == []
    with pytest.raises(asyncio.TimeoutError):
        await stream.next(limit=0.1)


async def test_disconnect_event_streams(sim: Simulator, open_stream: Callable[..., Any]) -> None:
    stream = await open_stream(topic="Job", after=sim.index)
    assert await stream.next(heartbeats=True) == {}
    sim.disconnect_event_streams()
    with pytest.raises((EOFError, aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError)):
        await stream.next(limit=2)


async def test_event_faults(
    client: Client, sim: Simulator, open_stream: Callable[..., Any]
) -> None:
    stream = await open_stream(topic="Variables", after=sim.index)
    sim.event_fault("drop", seconds=60)
    await client.put("/v1/var/dropped", {"Items": {"a": "b"}})
    sim.event_fault("drop", seconds=0)
    sim.event_fault("duplicate", seconds=60)
    await client.put("/v1/var/twice", {"Items": {"a": "b"}})
    sim.event_fault("duplicate", seconds=0)
    first, second = await stream.next(), await stream.next()
    assert first == second and first["Events"][0]["Key"] == "twice"
    sim.event_fault("delay", seconds=60, delay_ms=150)
    loop = asyncio.get_running_loop()
    started = loop.time()
    await client.put("/v1/var/late", {"Items": {"a": "b"}})
    sim.event_fault("delay", seconds=0)
    await client.put("/v1/var/after", {"Items": {"a": "b"}})
    late, after = await stream.next(), await stream.next()
    assert loop.time() - started >= 0.14
    assert [late["Events"][0]["Key"], after["Events"][0]["Key"]] == ["late", "after"]
    with pytest.raises(ApiError):
        sim.event_fault("scramble", seconds=1)


async def test_api_faults(client: Client, sim: Simulator) -> None:
    sim.api_fault("no_leader", seconds=60)
    status, text, _ = await client.get("/v1/jobs")
    assert (status, text) == (500, "No cluster leader")
    sim.api_fault("slow", seconds=60, slow_ms=120)
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert (await client.get("/v1/jobs"))[0] == 200
    assert loop.time() - started >= 0.11
    sim.api_fault("refuse", seconds=60)
    with pytest.raises(aiohttp.ClientError):
        await client.get("/v1/jobs")
    status, _, _ = await client.get("/_sim/state")  # the control routes stay reachable
    assert status == 200
    sim.api_fault("none", seconds=0)
    assert (await client.get("/v1/jobs"))[0] == 200


async def test_api_fault_expires(client: Client, sim: Simulator) -> None:
    sim.api_fault("no_leader", seconds=0.05)
    assert (await client.get("/v1/jobs"))[0] == 500
    await asyncio.sleep(0.06)
    assert (await client.get("/v1/jobs"))[0] == 200


async def test_no_capacity_blocks_until_off(client: Client, sim: Simulator) -> None:
    sim.no_capacity(True)
    out = await client.register(service_job("cap"))
    await wait_until(lambda: sim.evals[out["EvalID"]]["Status"] == "complete")
    assert sim.allocations("cap") == []
    blocked = sim.evals[sim.evals[out["EvalID"]]["BlockedEval"]]
    assert blocked["Status"] == "blocked"
    _, job, _ = await client.get("/v1/job/cap")
    assert job["Status"] == "pending"
    sim.no_capacity(False)
    await wait_until(lambda: len(sim.allocations("cap")) == 1)
    assert blocked["Status"] == "complete"


async def test_fail_starts_then_reschedule(client: Client, sim: Simulator) -> None:
    job = service_job("flaky", image="broken:1", Type="batch")
    job["TaskGroups"][0]["ReschedulePolicy"] = {
        "Attempts": 1,
        "Interval": 3600 * 10**9,
        "Delay": 50_000_000,
        "DelayFunction": "constant",
    }
    sim.fail_starts("broken:1")
    await client.register(job)
    await wait_until(lambda: len(sim.allocations("flaky")) == 2, within=3)
    first, second = sim.allocations("flaky")
    assert first["ClientStatus"] == "failed" and first["ClientDescription"] == "Failed tasks"
    # Nomad's events of a start that failed: the driver's error, then the final verdict.
    task = first["TaskStates"]["main"]
    assert (task["State"], task["Failed"]) == ("dead", True)
    assert [(e["Type"], e["DisplayMessage"], e["FailsTask"]) for e in task["Events"]] == [
        ("Received", "Task received by client", False),
        ("Task Setup", "Building Task Directory", False),
        ("Driver", "Downloading image", False),
        ("Driver Failure", "Failed to pull `broken:1`: simulated start failure", False),
        ("Not Restarting", "Error was unrecoverable", True),
    ]
    assert task["Events"][3]["Details"] == {"driver_error": task["Events"][3]["DriverError"]}
    assert first["FollowupEvalID"] and sim.evals[first["FollowupEvalID"]].get("WaitUntil")
    assert first["DesiredDescription"] == "alloc was rescheduled because it failed"
    assert second["PreviousAllocation"] == first["ID"]
    assert second["RescheduleTracker"]["Events"][0]["PrevAllocID"] == first["ID"]
    await wait_until(lambda: sim.alloc(second["ID"])["ClientStatus"] == "failed")
    await asyncio.sleep(0.1)
    assert len(sim.allocations("flaky")) == 2  # one attempt only
    sim.fail_starts("broken:1", on=False)
    assert not sim.fail_images


async def test_lose_state_forgets_jobs_and_variables_and_restarts_the_index(
    client: Client, sim: Simulator, open_stream: Callable[..., Any]
) -> None:
    await _running(client, sim, service_job("kept-nowhere", count=2))
    await sim.drain_node("sim-node-1", deadline_seconds=0)
    lease = "/v1/var/poolkeeper/leases/x"
    lock = {"TTL": "10s", "LockDelay": "5s"}
    _, held, _ = await client.put(
        lease, {"Items": {"holder": "a"}, "Lock": lock}, **{"lock-acquire": ""}
    )
    stream = await open_stream(after=sim.index)
    before = sim.index

    status, _, _ = await client.post("/_sim/lose_state")

    assert status == 200
    assert (await client.get("/v1/jobs"))[1] == []
    assert (await client.get("/v1/allocations"))[1] == []
    assert (await client.get("/v1/vars"))[1] == []
    renewed = await client.put(lease, {"Lock": {"ID": held["Lock"]["ID"]}}, **{"lock-renew": ""})
    assert renewed[:2] == (404, "variable doesn't exist")
    # The default namespace is written again, then each client registers its node, at the
    # restarted index, with no drain.
    _, nodes, headers = await client.get("/v1/nodes")
    assert sim.index == len(nodes) + 1 == 4 < before and int(headers["X-Nomad-Index"]) == 4
    assert {(n["Drain"], n["SchedulingEligibility"]) for n in nodes} == {(False, "eligible")}
    with pytest.raises((EOFError, aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError)):
        await stream.next(limit=2)
    # The cluster works on: a lock is taken afresh, a job is placed and runs.
    status, _, _ = await client.put(
        lease, {"Items": {"holder": "b"}, "Lock": lock}, **{"lock-acquire": ""}
    )
    assert status == 200
    await _running(client, sim, service_job("after", count=3))


async def test_sim_http_routes(client: Client, sim: Simulator) -> None:
    (alloc,) = await _running(client, sim, service_job("h"))
    status, out, _ = await client.post("/_sim/reschedule_allocation", {"alloc_id": alloc["ID"]})
    assert status == 200 and out["Result"] in sim.allocs
    status, out, _ = await client.post("/_sim/set_start_delay", {"seconds": 0.02})
    assert status == 200 and sim.start_delay == 0.02
    status, text, _ = await client.post("/_sim/node_down", {"nope": 1})
    assert status == 400 and "node_down" in text
    status, text, _ = await client.post("/_sim/oom_restart", {"alloc_id": "missing"})
    assert (status, text) == (404, "alloc not found")
    assert (await client.get("/_sim/nonexistent"))[0] == 404
    status, state, _ = await client.get("/_sim/state")
    assert state["Counters"]["jobs_created"] == 1 and state["Jobs"] == 1
