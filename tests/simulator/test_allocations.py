"""Allocations: scheduling, start delay, stubs vs full objects, filters, blocking queries."""

from __future__ import annotations

import asyncio

import pytest

from controller.lab.simulator import Simulator
from tests.simulator.conftest import Client, service_job
from tests.support.waiting import wait_until


async def test_placed_pending_then_running(client: Client, sim: Simulator) -> None:
    sim.set_start_delay(0.2)
    await client.register(service_job("web", count=3))
    await wait_until(lambda: len(sim.allocations("web")) == 3)
    _, stubs, _ = await client.get("/v1/allocations")
    assert {a["ClientStatus"] for a in stubs} == {"pending"}
    assert {a["NodeName"] for a in stubs} <= {"sim-node-1", "sim-node-2", "sim-node-3"}
    await wait_until(lambda: {a["ClientStatus"] for a in sim.allocations("web")} == {"running"})
    _, stubs, _ = await client.get("/v1/job/web/allocations")
    assert [a["ID"] for a in stubs] == sorted(a["ID"] for a in stubs)
    assert {a["ClientDescription"] for a in stubs} == {"Tasks are running"}
    assert stubs[0]["TaskStates"]["main"]["State"] == "running"


async def test_stub_and_full_fields(client: Client, sim: Simulator) -> None:
    await client.register(service_job("f"))
    await wait_until(lambda: len(sim.allocations("f")) == 1)
    alloc_id = sim.allocations("f")[0]["ID"]
    _, stubs, _ = await client.get("/v1/allocations")
    stub = stubs[0]
    assert "PreviousAllocation" not in stub and "Job" not in stub
    assert stub["NextAllocation"] == "" and stub["RescheduleTracker"] is None  # no omitempty
    assert "AllocatedResources" not in stub
    _, with_res, _ = await client.get("/v1/allocations", resources="true", task_states="false")
    assert "AllocatedResources" in with_res[0] and "TaskStates" not in with_res[0]
    status, full, headers = await client.get(f"/v1/allocation/{alloc_id}")
    assert status == 200
    assert full["Job"]["ID"] == "f"
    assert int(headers["X-Nomad-Index"]) == full["ModifyIndex"]
    # omitempty on the full object: empty strings / nil are absent, DesiredTransition stays
    for absent in (
        "PreviousAllocation",
        "NextAllocation",
        "DesiredDescription",
        "RescheduleTracker",
        "FollowupEvalID",
        "PreemptedAllocations",
    ):
        assert absent not in full, absent
    assert full["DesiredTransition"] == {}


async def test_filters_and_bad_filter(client: Client, sim: Simulator) -> None:
    await client.register(service_job("a", count=2, Meta={"pool": "x"}))
    await client.register(service_job("b", count=1))
    await wait_until(lambda: len(sim.allocs) == 3)
    _, got, _ = await client.get("/v1/allocations", filter='JobID == "a"')
    assert len(got) == 2
    _, got, _ = await client.get(
        "/v1/allocations", filter='Job.Meta.pool == "x" and not (JobID != "a")'
    )
    assert len(got) == 2
    _, got, _ = await client.get(
        "/v1/allocations", filter='Name matches "^b\\\\." or JobID contains "zz"'
    )
    assert [a["JobID"] for a in got] == ["b"]
    _, got, _ = await client.get("/v1/allocations", filter='"b" in JobID')
    assert [a["JobID"] for a in got] == ["b"]
    status, text, _ = await client.get("/v1/allocations", filter='JobID === "a"')
    assert status == 400
    assert text.startswith("failed to create result paginator: failed to read filter expression: ")


async def test_pagination_prefix_and_namespace(client: Client, sim: Simulator) -> None:
    await client.register(service_job("p", count=3))
    await wait_until(lambda: len(sim.allocs) == 3)
    _, first, headers = await client.get("/v1/allocations", per_page=2)
    token = headers["X-Nomad-NextToken"]
    rest_id = token.split(".", 1)[1]
    assert token == f"{first[0]['CreateIndex']}.{rest_id}"
    _, rest, headers = await client.get("/v1/allocations", per_page=2, next_token=token)
    assert [a["ID"] for a in rest] == [rest_id] and "X-Nomad-NextToken" not in headers
    prefix = rest_id[:6]
    _, by_prefix, _ = await client.get("/v1/allocations", prefix=prefix)
    assert [a["ID"] for a in by_prefix] == [rest_id]
    _, other_ns, _ = await client.get("/v1/allocations", namespace="elsewhere")
    assert other_ns == []
    _, all_ns, _ = await client.get("/v1/allocations", namespace="*")
    assert len(all_ns) == 3


async def _pages(client: Client, path: str, **params: object) -> list[list[str]]:
    """The IDs of each page of a list, per_page 2, following X-Nomad-NextToken."""
    pages: list[list[str]] = []
    token = None
    while True:
        query = {**params, "per_page": 2} | ({"next_token": token} if token else {})
        status, page, headers = await client.get(path, **query)
        assert status == 200, page
        pages.append([item["ID"] for item in page])
        token = headers.get("X-Nomad-NextToken")
        if token is None:
            return pages


@pytest.mark.parametrize("path", ["/v1/allocations", "/v1/evaluations"])
async def test_pages_oldest_first_by_id_with_a_prefix_and_reversed(
    client: Client, sim: Simulator, path: str
) -> None:
    for name in ("a", "b", "c"):
        await client.register(service_job(name, count=2))
    await wait_until(lambda: len(sim.allocs) == 6)
    _, everything, _ = await client.get(path)
    by_age = [i["ID"] for i in sorted(everything, key=lambda i: (i["CreateIndex"], i["ID"]))]
    pages = await _pages(client, path)
    assert [i for page in pages for i in page] == by_age
    assert all(len(page) == 2 for page in pages[:-1])
    reversed_pages = await _pages(client, path, reverse="true")
    assert [i for page in reversed_pages for i in page] == by_age[::-1]
    prefix = by_age[0][0]
    with_prefix = sorted(i for i in by_age if i.startswith(prefix))
    assert [i for page in await _pages(client, path, prefix=prefix) for i in page] == with_prefix
    got = [i for page in await _pages(client, path, prefix=prefix, reverse="true") for i in page]
    assert got == with_prefix[::-1]


async def test_a_table_never_written_answers_index_0(client: Client) -> None:
    # As Nomad's state store: the index of what was read, 0 before the first write, and a
    # query with index=0 does not block.
    for path in ("/v1/allocations", "/v1/evaluations", "/v1/jobs", "/v1/deployments"):
        status, body, headers = await client.get(path, index=0, wait="5s")
        assert (status, body, headers["X-Nomad-Index"]) == (200, [], "0"), path
    for path in ("/v1/job/nope/allocations", "/v1/job/nope/evaluations"):
        assert (await client.get(path))[2]["X-Nomad-Index"] == "0", path
    assert (await client.get("/v1/evaluation/nope/allocations"))[2]["X-Nomad-Index"] == "0"


async def test_blocking_query_wakes_on_change(client: Client, sim: Simulator) -> None:
    await client.register(service_job("first"))
    await wait_until(lambda: [a["ClientStatus"] for a in sim.allocs.values()] == ["running"])
    _, _, headers = await client.get("/v1/allocations")
    index = int(headers["X-Nomad-Index"])
    loop = asyncio.get_running_loop()
    started = loop.time()
    waiter = asyncio.create_task(client.get("/v1/allocations", index=index, wait="10s"))
    await asyncio.sleep(0.05)
    assert not waiter.done()
    await client.register(service_job("wake"))
    status, allocs, headers = await asyncio.wait_for(waiter, 3)
    assert status == 200 and len(allocs) == 2
    assert int(headers["X-Nomad-Index"]) > index
    assert loop.time() - started < 2


async def test_blocking_query_times_out_with_current_index(client: Client, sim: Simulator) -> None:
    await client.register(service_job("only"))
    await wait_until(lambda: [a["ClientStatus"] for a in sim.allocs.values()] == ["running"])
    _, _, headers = await client.get("/v1/jobs")
    index = int(headers["X-Nomad-Index"])
    assert index > 0
    status, body, headers = await client.get("/v1/jobs", index=index, wait="50ms")
    assert status == 200 and len(body) == 1 and int(headers["X-Nomad-Index"]) == index


async def test_bad_index_and_wait(client: Client) -> None:
    assert (await client.get("/v1/jobs", index="abc"))[:2] == (400, "Invalid index")
    assert (await client.get("/v1/jobs", index=1, wait="5 parsecs"))[:2] == (
        400,
        "Invalid wait time",
    )
    assert (await client.get("/v1/jobs", index=1, wait="10"))[:2] == (400, "Invalid wait time")
    assert (await client.get("/v1/jobs", stale="maybe"))[0] == 400
    assert (await client.get("/v1/jobs", stale=""))[0] == 200


async def test_node_allocations_are_full(client: Client, sim: Simulator) -> None:
    await client.register(service_job("n"))
    await wait_until(lambda: len(sim.allocations("n")) == 1)
    node_id = sim.allocations("n")[0]["NodeID"]
    status, allocs, _ = await client.get(f"/v1/node/{node_id}/allocations")
    assert status == 200 and allocs[0]["Job"]["ID"] == "n" and "NextAllocation" not in allocs[0]
    # Nomad lists an unknown node's allocations as those of a node without any.
    status, allocs, headers = await client.get("/v1/node/nope/allocations")
    assert (status, allocs) == (200, [])
    assert headers["X-Nomad-Index"] == str(sim.table_index["allocs"])


async def test_alloc_stop_migrates(client: Client, sim: Simulator) -> None:
    await client.register(service_job("st"))
    await wait_until(lambda: [a["ClientStatus"] for a in sim.allocations("st")] == ["running"])
    old_id = sim.allocations("st")[0]["ID"]
    status, out, _ = await client.post(f"/v1/allocation/{old_id}/stop")
    assert status == 200 and set(out) == {"EvalID", "Index"}
    await wait_until(lambda: len(sim.allocations("st")) == 2)
    old = sim.alloc(old_id)
    assert old["DesiredTransition"]["Migrate"] is True
    assert old["DesiredDescription"] == "alloc is being migrated"
    assert sim.evals[out["EvalID"]]["TriggeredBy"] == "alloc-stop"


async def test_no_fit_blocks_then_places(client: Client, sim: Simulator) -> None:
    hog = service_job("hog", count=1)
    hog["TaskGroups"][0]["Tasks"][0]["Resources"] = {"CPU": 60_000, "MemoryMB": 10}
    big = service_job("big", count=3)
    big["TaskGroups"][0]["Tasks"][0]["Resources"] = {"CPU": 60_000, "MemoryMB": 10}
    await client.register(hog)
    await wait_until(lambda: len(sim.allocations("hog")) == 1)
    await client.register(big)  # three nodes, each fits one such alloc: one stays queued
    await wait_until(lambda: len(sim.allocations("big")) == 2 and bool(sim.blocked))
    blocked = sim.evals[next(iter(sim.blocked.values()))]
    assert blocked["Status"] == "blocked" and blocked["TriggeredBy"] == "queued-allocs"
    _, summary, _ = await client.get("/v1/job/big/summary")
    assert summary["Summary"]["g"]["Queued"] == 1
    _, job, _ = await client.get("/v1/job/big")
    assert job["Status"] == "running"
    await client.delete("/v1/job/hog")  # frees a node: the blocked eval places the rest
    await wait_until(lambda: len(sim.allocations("big")) == 3)
    assert blocked["Status"] == "complete" and not sim.blocked
    _, summary, _ = await client.get("/v1/job/big/summary")
    assert summary["Summary"]["g"]["Queued"] == 0


async def test_a_paused_broker_holds_evals_and_lets_them_be_deleted(
    client: Client, sim: Simulator
) -> None:
    _, config, _ = await client.get("/v1/operator/scheduler/configuration")
    settings = {**config["SchedulerConfig"], "PauseEvalBroker": True}
    body = {"EvalIDs": ["8e231cf4-ca48-43ff-b694-5801e69e22fa"]}
    status, text, _ = await client.call("DELETE", "/v1/evaluations", body)
    assert (status, text) == (
        500,
        "eval broker is enabled; eval broker must be paused to delete evals",
    )
    stale = config["SchedulerConfig"]["ModifyIndex"] + 99
    assert (await client.put("/v1/operator/scheduler/configuration", settings, cas=stale))[1][
        "Updated"
    ] is False
    assert (await client.put("/v1/operator/scheduler/configuration", settings))[1]["Updated"]
    out = await client.register(service_job("held"))
    await asyncio.sleep(0.05)
    assert sim.evals[out["EvalID"]]["Status"] == "pending" and sim.allocations("held") == []
    status, text, _ = await client.call("DELETE", "/v1/evaluations", body)
    assert (status, text) == (500, "eval not found")
    status, deleted, _ = await client.call(
        "DELETE", "/v1/evaluations", {"EvalIDs": [out["EvalID"]]}
    )
    assert status == 200 and deleted["Count"] == 1 and out["EvalID"] not in sim.evals
    # Resumed, the broker processes what waits in it.
    await client.register(service_job("held", count=2))
    settings["PauseEvalBroker"] = False
    await client.put("/v1/operator/scheduler/configuration", settings)
    await wait_until(lambda: len(sim.allocations("held")) == 2)


async def test_an_operator_fails_pauses_and_resumes_a_deployment(
    client: Client, sim: Simulator
) -> None:
    sim.no_capacity(True)  # the deployment stays running: nothing finds room
    await client.register(service_job("dep"))
    await wait_until(lambda: len(sim.deployments) == 1)
    (dep_id,) = sim.deployments
    pause = {"DeploymentID": dep_id, "Pause": True}
    status, out, _ = await client.post(f"/v1/deployment/pause/{dep_id}", pause)
    assert status == 200 and out["EvalID"] == ""  # a pause creates no eval
    assert sim.deployments[dep_id]["Status"] == "paused"
    status, out, _ = await client.post(f"/v1/deployment/pause/{dep_id}", {**pause, "Pause": False})
    assert out["EvalID"] and sim.deployments[dep_id]["Status"] == "running"
    assert (await client.post(f"/v1/deployment/fail/{dep_id}"))[0] == 200
    assert sim.deployments[dep_id]["StatusDescription"] == "Deployment marked as failed"
    assert (await client.post(f"/v1/deployment/fail/{dep_id}"))[:2] == (
        500,
        "can't fail terminal deployment",
    )
    assert (await client.post(f"/v1/deployment/pause/{dep_id}", {"DeploymentID": "x"}))[:2] == (
        400,
        "Deployment ID does not match",
    )


async def test_garbage_collection_reaps_what_nothing_runs_any_more(
    client: Client, sim: Simulator
) -> None:
    await client.register(service_job("kept", count=2))
    await client.register(service_job("purged"))
    await client.register(service_job("stopped"))
    await wait_until(lambda: {a["ClientStatus"] for a in sim.allocs.values()} == {"running"})
    kept = {a["ID"] for a in sim.allocations("kept")}
    assert (await client.delete("/v1/job/purged", purge="true"))[0] == 200
    assert (await client.delete("/v1/job/stopped"))[0] == 200
    await wait_until(
        lambda: (
            len(sim.allocs) == 4
            and all(
                a["ClientStatus"] == "complete" for a in sim.allocs.values() if a["ID"] not in kept
            )
        )
    )
    _, evals_before, _ = await client.get("/v1/evaluations")
    _, _, headers = await client.get("/v1/allocations")
    before = int(headers["X-Nomad-Index"])

    status, _, _ = await client.put("/v1/system/gc")
    assert status == 200
    _, allocs, headers = await client.get("/v1/allocations")
    assert {a["ID"] for a in allocs} == kept  # what runs stays
    assert int(headers["X-Nomad-Index"]) > before  # the reap moved the table's index
    _, jobs, _ = await client.get("/v1/jobs")
    assert [j["ID"] for j in jobs] == ["kept"]  # the stopped job was dead: reaped
    _, evals, _ = await client.get("/v1/evaluations")
    assert {e["JobID"] for e in evals} == {"kept"} and len(evals) < len(evals_before)
    assert (await client.put("/v1/system/reconcile/summaries"))[0] == 200
