"""The event stream (reference section 2): framing, topics, index semantics."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from controller.lab.simulator import Simulator
from tests.simulator.conftest import Client, service_job
from tests.support.waiting import wait_until


async def test_heartbeat_on_connect_and_register_frames(
    client: Client, sim: Simulator, open_stream: Callable[..., Any]
) -> None:
    stream = await open_stream(topic=["Job", "Evaluation"], after=sim.index)
    assert await stream.next(heartbeats=True) == {}
    out = await client.register(service_job("ev"))
    job_frame = await stream.next()
    eval_frame = await stream.next()
    # Register writes the eval in a second transaction with the same index.
    assert job_frame["Index"] == eval_frame["Index"] == out["JobModifyIndex"]
    assert [(e["Topic"], e["Type"]) for e in job_frame["Events"]] == [("Job", "JobRegistered")]
    assert [(e["Topic"], e["Type"]) for e in eval_frame["Events"]] == [
        ("Evaluation", "JobRegistered")
    ]
    assert eval_frame["Events"][0]["FilterKeys"][0] == "ev"


async def test_deregister_frames_share_an_index(
    client: Client, sim: Simulator, open_stream: Callable[..., Any]
) -> None:
    await client.register(service_job("d"))
    stream = await open_stream(topic=["Job", "Evaluation"], after=sim.index)
    _, out, _ = await client.delete("/v1/job/d")
    job_frame, eval_frame = await stream.next(), await stream.next()
    assert job_frame["Index"] == eval_frame["Index"] == out["Index"]
    assert [(e["Topic"], e["Type"]) for e in job_frame["Events"] + eval_frame["Events"]] == [
        ("Job", "JobDeregistered"),
        ("Evaluation", "JobDeregistered"),
    ]
    assert job_frame["Events"][0]["Payload"]["Job"]["Stop"] is True


async def test_periodic_heartbeat(
    server: Any, sim: Simulator, open_stream: Callable[..., Any]
) -> None:
    sim.heartbeat_seconds = 0.05
    stream = await open_stream(topic="Job", after=sim.index)
    assert await stream.next(heartbeats=True) == {}
    assert await stream.next(heartbeats=True, limit=1) == {}


async def test_plan_and_client_update_types(
    client: Client, sim: Simulator, open_stream: Callable[..., Any]
) -> None:
    stream = await open_stream(topic="Allocation", after=sim.index)
    await client.register(service_job("t", count=1))
    plan = (await stream.next())["Events"]
    assert [(e["Type"], e["Payload"]["Allocation"]["ClientStatus"]) for e in plan] == [
        ("PlanResult", "pending")
    ]
    assert "Job" not in plan[0]["Payload"]["Allocation"]
    assert "PreviousAllocation" not in plan[0]["Payload"]["Allocation"]  # omitted when empty
    update = (await stream.next())["Events"]
    assert [(e["Type"], e["Payload"]["Allocation"]["ClientStatus"]) for e in update] == [
        ("AllocationUpdated", "running")
    ]


async def test_topic_keys_match_filter_keys(
    client: Client, sim: Simulator, open_stream: Callable[..., Any]
) -> None:
    stream = await open_stream(topic=["Allocation:mine", "Job:mine"], after=sim.index)
    await client.register(service_job("other"))
    await client.register(service_job("mine"))
    events = await stream.events(4)
    owners = {e["Key"] if e["Topic"] == "Job" else e["FilterKeys"][0] for e in events}
    assert owners == {"mine"}
    assert [(e["Topic"], e["Type"]) for e in events] == [
        ("Job", "JobRegistered"),
        ("Allocation", "PlanResult"),
        ("Job", "PlanResult"),  # its status turned running in the same plan
        ("Allocation", "AllocationUpdated"),
    ]


async def test_namespace_filter(
    client: Client, sim: Simulator, open_stream: Callable[..., Any]
) -> None:
    default_only = await open_stream(topic="Job", after=sim.index)
    every = await open_stream(topic="Job", namespace="*", after=sim.index)
    await client.put("/v1/namespace/team", {"Name": "team"})
    await client.call("PUT", "/v1/jobs", {"Job": service_job("x")}, namespace="team")
    await client.register(service_job("y"))
    seen: dict[str, str] = {}
    while "y" not in seen:
        seen.update({e["Key"]: e["Namespace"] for e in (await every.next())["Events"]})
    assert seen == {"x": "team", "y": "default"}
    assert [e["Key"] for e in await default_only.events(1)] == ["y"]


async def test_index_semantics(
    client: Client, sim: Simulator, open_stream: Callable[..., Any]
) -> None:
    for i in range(3):
        await client.register(service_job(f"i{i}", count=0))
    await wait_until(lambda: all(j["Status"] == "dead" for j in sim.job_list()))
    job_indexes = [j["JobModifyIndex"] for j in sim.job_list()]
    # index=0: the oldest buffered item (the node registrations at index 2..4, after the
    # default namespace, which has no event)
    frame = await (await open_stream(index=0)).next()
    assert frame["Index"] == 2
    # a buffered index starts inclusive of it
    frame = await (await open_stream(topic="Job", index=job_indexes[1])).next()
    assert frame["Index"] == job_indexes[1] and frame["Events"][0]["Key"] == "i1"
    # newer than the newest item: the newest item is replayed
    newest = sim.broker.buffer[-1]
    frame = await (await open_stream(index=sim.index + 50)).next()
    assert frame["Index"] == newest.index


async def test_index_older_than_buffer_starts_at_oldest(
    client: Client, open_stream: Callable[..., Any]
) -> None:
    for i in range(40):  # 2-3 buffer items each: more than the 100-item buffer
        await client.put(f"/v1/var/v{i}", {"Items": {"a": "b"}})
        await client.put(f"/v1/var/v{i}", {"Items": {"a": "c"}})
        await client.put(f"/v1/var/w{i}", {"Items": {"a": "c"}})
    stream = await open_stream(index=1)
    frame = await stream.next()
    assert frame["Index"] > 1
    events = frame["Events"]
    assert events[0]["Topic"] == "Variables" and "Items" not in events[0]["Payload"]["Variable"]


async def test_bad_topic_is_400(client: Client) -> None:
    status, text, _ = await client.get("/v1/event/stream", topic="Job:a:b")
    assert (status, text) == (
        400,
        "Invalid topic query: error parsing topics: "
        "Invalid key value pair for topic, topic: Job:a:b",
    )


async def test_a_first_eval_that_cannot_place_writes_three_frames(
    client: Client, sim: Simulator, open_stream: Callable[..., Any]
) -> None:
    # As Nomad's scheduler: the plan (here only the service job's deployment), then the
    # blocked eval (with the failed placements), then the eval's own completion.
    sim.no_capacity(True)
    stream = await open_stream(topic=["Evaluation", "Deployment"], after=sim.index)
    out = await client.register(service_job("full"))
    frames = [await stream.next() for _ in range(4)]
    kinds = [[(e["Topic"], e["Type"]) for e in f["Events"]] for f in frames]
    assert kinds == [
        [("Evaluation", "JobRegistered")],
        [("Deployment", "PlanResult")],
        [("Evaluation", "EvaluationUpdated")],
        [("Evaluation", "EvaluationUpdated")],
    ]
    blocked = frames[2]["Events"][0]["Payload"]["Evaluation"]
    first = frames[3]["Events"][0]["Payload"]["Evaluation"]
    assert (blocked["Status"], blocked["TriggeredBy"]) == ("blocked", "queued-allocs")
    assert blocked["FailedTGAllocs"]["g"]["CoalescedFailures"] == 0
    assert (first["ID"], first["Status"], first["BlockedEval"]) == (
        out["EvalID"],
        "complete",
        blocked["ID"],
    )
    assert [f["Index"] for f in frames[1:]] == sorted({f["Index"] for f in frames[1:]})


async def test_a_stopping_agent_ends_its_streams_cleanly(
    sim: Simulator, open_stream: Callable[..., Any], server: Any
) -> None:
    # The body ends (the client reads EOF), as when Nomad's agent shuts down; a cut
    # connection is the disconnect_event_streams fault.
    stream = await open_stream(after=sim.index)
    assert await stream.next(heartbeats=True) == {}
    sim.broker.close()
    # What is left is read to its end without a payload error (which a cut would raise).
    await asyncio.wait_for(stream.resp.content.read(), 3)
    assert stream.resp.content.at_eof()
