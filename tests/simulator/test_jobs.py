"""Jobs: register, list, read, CAS, deregister and the errors Nomad gives."""

from __future__ import annotations

from typing import Any

from controller.lab.simulator import Simulator
from controller.lab.simulator.jobspec import multierror, validation_errors
from tests.simulator.conftest import Client, service_job
from tests.support.waiting import wait_until


def _status(sim: Simulator, job_id: str) -> str | None:
    job = sim.get_job(job_id)
    return None if job is None else str(job["Status"])


async def test_register_read_and_status(client: Client, sim: Simulator) -> None:
    out = await client.register(service_job("web", count=2))
    assert set(out) >= {"EvalID", "EvalCreateIndex", "JobModifyIndex", "Index", "KnownLeader"}
    assert out["EvalCreateIndex"] == out["JobModifyIndex"] == out["Index"]
    status, job, headers = await client.get("/v1/job/web")
    assert status == 200
    assert job["Version"] == 0 and job["Type"] == "service" and job["Namespace"] == "default"
    assert job["TaskGroups"][0]["RestartPolicy"]["Attempts"] == 2  # service default
    assert int(headers["X-Nomad-Index"]) == job["ModifyIndex"]
    await wait_until(lambda: _status(sim, "web") == "running")
    assert sim.counters["jobs_created"] == 1


async def test_list_meta_only_when_asked(client: Client) -> None:
    await client.register(service_job("a-1", Meta={"pool": "p1"}))
    await client.register(service_job("b-1"))
    _, plain, headers = await client.get("/v1/jobs")
    assert [j["ID"] for j in plain] == ["a-1", "b-1"]
    assert all("Meta" not in j for j in plain)
    assert "X-Nomad-Index" in headers
    _, with_meta, _ = await client.get("/v1/jobs", meta="true")
    assert with_meta[0]["Meta"] == {"pool": "p1"}
    _, prefixed, _ = await client.get("/v1/jobs", prefix="b-")
    assert [j["ID"] for j in prefixed] == ["b-1"]
    _, filtered, _ = await client.get("/v1/jobs", filter='Meta.pool == "p1"')
    assert [j["ID"] for j in filtered] == ["a-1"]


async def test_list_pagination_and_namespaces(client: Client) -> None:
    for name in ("j1", "j2", "j3"):
        await client.register(service_job(name))
    await client.register(
        service_job("other"),
    )
    # As in Nomad, a job goes only into a namespace that exists.
    status, text, _ = await client.call(
        "PUT", "/v1/jobs", {"Job": service_job("x1")}, namespace="team"
    )
    assert (status, text) == (500, 'job "x1" is in nonexistent namespace "team"')
    assert (await client.put("/v1/namespace/team", {"Name": "team"}))[0] == 200
    await client.call("PUT", "/v1/jobs", {"Job": service_job("x1")}, namespace="team")
    _, page, headers = await client.get("/v1/jobs", per_page=2)
    assert [j["ID"] for j in page] == ["j1", "j2"]
    assert headers["X-Nomad-NextToken"] == "default.j3"
    _, rest, headers = await client.get("/v1/jobs", per_page=2, next_token="default.j3")
    assert [j["ID"] for j in rest] == ["j3", "other"]
    assert "X-Nomad-NextToken" not in headers
    _, team, _ = await client.get("/v1/jobs", namespace="team")
    assert [j["ID"] for j in team] == ["x1"]
    _, everything, _ = await client.get("/v1/jobs", namespace="*")
    assert len(everything) == 5


async def test_enforce_index_conflicts(client: Client) -> None:
    first = await client.register(service_job("cas"), EnforceIndex=True, JobModifyIndex=0)
    body = {"Job": service_job("cas", count=2), "EnforceIndex": True, "JobModifyIndex": 0}
    status, text, headers = await client.put("/v1/jobs", body)
    assert status == 500
    assert headers["Content-Type"].startswith("text/plain")
    assert text == "Enforcing job modify index 0: job already exists"
    body["JobModifyIndex"] = first["JobModifyIndex"] + 100
    status, text, _ = await client.put("/v1/job/cas", body)
    assert status == 500
    assert text == (
        f"Enforcing job modify index {first['JobModifyIndex'] + 100}: "
        f"job exists with conflicting job modify index: {first['JobModifyIndex']}"
    )
    body["JobModifyIndex"] = 5
    body["Job"] = service_job("missing")
    status, text, _ = await client.put("/v1/jobs", body)
    assert (status, text) == (500, "Enforcing job modify index 5: job does not exist")
    body["Job"] = service_job("cas", count=2)
    body["JobModifyIndex"] = first["JobModifyIndex"]
    status, out, _ = await client.put("/v1/jobs", body)
    assert status == 200 and out["JobModifyIndex"] > first["JobModifyIndex"]


async def test_unchanged_spec_creates_only_an_eval(client: Client, sim: Simulator) -> None:
    first = await client.register(service_job("same"))
    await wait_until(lambda: _status(sim, "same") == "running")
    again = await client.register(service_job("same"))
    _, job, _ = await client.get("/v1/job/same")
    assert job["Version"] == 0
    assert job["JobModifyIndex"] == first["JobModifyIndex"]
    assert again["JobModifyIndex"] == job["ModifyIndex"] > job["JobModifyIndex"]
    assert again["EvalID"] != first["EvalID"]
    assert sim.counters["jobs_created"] == 1


async def test_meta_change_is_destructive(client: Client, sim: Simulator) -> None:
    await client.register(service_job("meta", Meta={"v": "1"}))
    await wait_until(lambda: [a["ClientStatus"] for a in sim.allocations("meta")] == ["running"])
    old_id = sim.allocations("meta")[0]["ID"]
    await client.register(service_job("meta", Meta={"v": "2"}))
    await wait_until(lambda: len(sim.allocations("meta")) == 2)
    old = sim.allocations("meta")[0]
    new = sim.allocations("meta")[1]
    assert old["ID"] == old_id
    assert old["DesiredStatus"] == "stop"
    assert old["DesiredDescription"] == "alloc is being updated due to job update"
    assert old["NextAllocation"] == new["ID"] and new["PreviousAllocation"] == old_id
    assert new["Name"] == old["Name"]


async def test_scale_is_in_place(client: Client, sim: Simulator) -> None:
    await client.register(service_job("sc", count=1))
    up = {"Count": 3, "Target": {"Group": "g"}, "Message": "up"}
    # As in Nomad, not while the job's deployment is active.
    assert (await client.post("/v1/job/sc/scale", up))[:2] == (
        400,
        "job scaling blocked due to active deployment",
    )
    await wait_until(lambda: [d["Status"] for d in sim.deployments.values()] == ["successful"])
    status, out, _ = await client.post("/v1/job/sc/scale", up)
    assert status == 200 and "EvalID" in out
    await wait_until(lambda: len(sim.allocations("sc")) == 3)
    names = sorted(a["Name"] for a in sim.allocations("sc"))
    assert names == ["sc.g[0]", "sc.g[1]", "sc.g[2]"]
    assert all(a["PreviousAllocation"] == "" for a in sim.allocations("sc"))
    status, scale, _ = await client.get("/v1/job/sc/scale")
    assert status == 200 and scale["TaskGroups"]["g"]["Desired"] == 3
    status, text, _ = await client.post(
        "/v1/job/nope/scale", {"Count": 1, "Target": {"Group": "g"}}
    )
    assert (status, text) == (404, 'job "nope" not found')


async def test_deregister_stop_then_purge(client: Client, sim: Simulator) -> None:
    await client.register(service_job("gone", count=2))
    await wait_until(
        lambda: [a["ClientStatus"] for a in sim.allocations("gone")] == ["running"] * 2
    )
    status, out, _ = await client.delete("/v1/job/gone")
    assert status == 200 and out["EvalID"]
    _, job, _ = await client.get("/v1/job/gone")
    assert job["Stop"] is True and job["Version"] == 1
    await wait_until(lambda: all(a["ClientStatus"] == "complete" for a in sim.allocations("gone")))
    assert all(a["DesiredStatus"] == "stop" for a in sim.allocations("gone"))
    assert _status(sim, "gone") == "dead"
    status, out, _ = await client.delete("/v1/job/gone", purge="true")
    assert status == 200
    status, text, _ = await client.get("/v1/job/gone")
    assert (status, text) == (404, "job not found")
    status, out, _ = await client.delete("/v1/job/never-existed")
    assert status == 200 and out["EvalID"] == "" and out["JobModifyIndex"] == 0


async def test_bad_requests_get_nomad_errors(client: Client) -> None:
    cases: list[tuple[tuple[str, str], dict[str, Any], int, str]] = [
        (("PUT", "/v1/jobs"), {"raw": b"{not json"}, 400, "Failed to decode request body"),
        (("PUT", "/v1/jobs"), {"body": {"NoJob": 1}}, 400, "Job must be specified"),
        (("PUT", "/v1/jobs"), {"body": {"Job": {"Name": "x"}}}, 400, "Job ID hasn't been provided"),
        (("PUT", "/v1/job/a"), {"body": {"Job": {"ID": "b"}}}, 400, "Job ID does not match name"),
        (("GET", "/v1/nonsense"), {}, 404, "404 page not found"),
        (("PATCH", "/v1/jobs"), {}, 405, "Invalid method"),
        (("GET", "/v1/job/none"), {}, 404, "job not found"),
        (("GET", "/v1/allocation/none"), {}, 404, "alloc not found"),
        (("DELETE", "/v1/job/x?purge=maybe"), {}, 400, 'Failed to parse value of "purge"'),
        # Lists of the wrong JSON type fail Nomad's decoding of the body.
        (
            ("PUT", "/v1/jobs"),
            {"body": {"Job": {"ID": "a", "TaskGroups": [{"Name": "g", "Tasks": False}]}}},
            400,
            "Failed to decode request body",
        ),
        (
            ("PUT", "/v1/jobs"),
            {"body": {"Job": {"ID": "a", "TaskGroups": 5}}},
            400,
            "Failed to decode request body",
        ),
    ]
    for (method, path), kwargs, code, message in cases:
        status, text, headers = await client.call(method, path, **kwargs)
        assert status == code, (method, path, text)
        assert isinstance(text, str) and text.startswith(message), (path, text)
        assert headers["Content-Type"].startswith("text/plain")


async def test_type_defaults_follow_the_reference(client: Client) -> None:
    await client.register(service_job("svc"))
    await client.register(service_job("bat", Type="batch"))
    _, svc, _ = await client.get("/v1/job/svc")
    _, bat, _ = await client.get("/v1/job/bat")
    svc_group, bat_group = svc["TaskGroups"][0], bat["TaskGroups"][0]
    assert svc_group["RestartPolicy"] == {
        "Attempts": 2,
        "Interval": 1_800_000_000_000,
        "Delay": 15_000_000_000,
        "Mode": "fail",
    }
    assert bat_group["RestartPolicy"]["Attempts"] == 3
    assert svc_group["ReschedulePolicy"]["Unlimited"] is True
    assert svc_group["ReschedulePolicy"]["DelayFunction"] == "exponential"
    assert bat_group["ReschedulePolicy"]["Attempts"] == 1
    assert bat_group["ReschedulePolicy"]["Delay"] == 5_000_000_000
    assert svc["Update"]["MaxParallel"] == 1 and bat.get("Update") is None


async def test_dispatch_plan_revert_and_versions(client: Client, sim: Simulator) -> None:
    parent = service_job("param", Type="batch", ParameterizedJob={"MetaRequired": ["time"]})
    out = await client.register(parent)
    assert out["EvalID"] == ""  # parameterized jobs get no eval
    status, text, _ = await client.post("/v1/job/param/dispatch", {"Meta": {}})
    assert status == 400 and "time" in text
    status, text, _ = await client.post("/v1/job/param/dispatch", {"Meta": {"time": "1", "x": "y"}})
    assert status == 400 and "x" in text
    status, child, _ = await client.post("/v1/job/param/dispatch", {"Meta": {"time": "1"}})
    assert status == 200 and child["DispatchedJobID"].startswith("param/dispatch-")
    await wait_until(lambda: len(sim.allocations(child["DispatchedJobID"])) == 1)
    _, read, _ = await client.get("/v1/job/" + child["DispatchedJobID"].replace("/", "%2F"))
    assert read["ParentID"] == "param" and read["Meta"] == {"time": "1"}
    status, text, _ = await client.post("/v1/job/svc/dispatch", {})
    assert (status, text) == (404, "job not found")

    await client.register(service_job("rv", count=1))
    await client.register(service_job("rv", count=2))
    await wait_until(lambda: len(sim.allocations("rv")) == 2)
    status, plan, _ = await client.post("/v1/job/rv/plan", {"Job": service_job("rv", count=3)})
    # The two there are kept, one more is placed; it fits, so no eval would be blocked.
    updates = plan["Annotations"]["DesiredTGUpdates"]["g"]
    assert status == 200 and (updates["Place"], updates["Ignore"]) == (1, 2)
    assert (plan["FailedTGAllocs"], plan["CreatedEvals"]) == (None, None)
    sim.no_capacity(True)
    _, plan, _ = await client.post("/v1/job/rv/plan", {"Job": service_job("rv", count=3)})
    assert plan["FailedTGAllocs"]["g"]["CoalescedFailures"] == 0
    assert [e["Status"] for e in plan["CreatedEvals"]] == ["blocked"]
    sim.no_capacity(False)
    status, text, _ = await client.post(
        "/v1/job/rv/revert", {"JobVersion": 0, "EnforcePriorVersion": 0}
    )
    assert status == 400 and text.startswith("Current job has version 1")
    status, _, _ = await client.post(
        "/v1/job/rv/revert", {"JobVersion": 0, "EnforcePriorVersion": 1}
    )
    assert status == 200
    _, versions, _ = await client.get("/v1/job/rv/versions")
    counts = [v["TaskGroups"][0]["Count"] for v in versions["Versions"]]
    assert counts == [1, 2, 1]  # newest first: the revert is version 2
    assert (await client.post("/v1/job/rv/stable", {"JobVersion": 2, "Stable": True}))[0] == 200
    assert sim.get_job("rv")["Stable"] is True  # type: ignore[index]


async def test_an_unclean_path_is_sent_to_its_clean_form(client: Client) -> None:
    # As Go's ServeMux does for Nomad's agent: 307, so that a write is sent again as it is.
    async with client.session.put(
        client.url + "/v1/job//scale", json={"Count": 1}, allow_redirects=False
    ) as resp:
        assert (resp.status, resp.headers["Location"]) == (307, "/v1/job/scale")
    # Followed, it is a registration of a job named "scale", without a Job: 400.
    assert (await client.put("/v1/job//scale", {"Count": 1}))[:2] == (400, "Job must be specified")


async def test_registration_options(client: Client, sim: Simulator) -> None:
    job = service_job("opt", count=2, Type="batch")
    source = {"Source": 'job "opt" {}', "Format": "hcl2", "VariableFlags": {"x": "1"}}
    out = await client.register(job, EvalPriority=77, Submission=source)
    assert sim.evals[out["EvalID"]]["Priority"] == 77
    status, sub, headers = await client.get("/v1/job/opt/submission", version=0)
    assert status == 200 and (sub["Source"], sub["Version"]) == ('job "opt" {}', 0)
    assert headers["X-Nomad-Index"] == str(sub["JobModifyIndex"])
    assert (await client.get("/v1/job/opt/submission", version=1))[:2] == (
        404,
        "job source not found",
    )
    # PreserveCounts keeps the counts of the groups the job has.
    await client.register(service_job("opt", count=5, Type="batch"), PreserveCounts=True)
    assert sim.get_job("opt")["TaskGroups"][0]["Count"] == 2  # type: ignore[index]
    assert (await client.put("/v1/jobs", {"Job": job, "EvalPriority": 101}))[:2] == (
        400,
        "Eval priority must be between 1 and 100 inclusively",
    )


async def test_scaling_events(client: Client, sim: Simulator) -> None:
    await client.register(service_job("ev", count=1, Type="batch"))
    target = {"Group": "g"}
    out = (await client.post("/v1/job/ev/scale", {"Count": 2, "Target": target}))[1]
    assert out["EvalID"]
    noted = {"Target": target, "Message": "only a note", "Meta": {"k": "v"}}
    assert (await client.post("/v1/job/ev/scale", noted))[1]["EvalID"] == ""
    failed = {"Target": target, "Error": True, "Message": "could not"}
    assert (await client.post("/v1/job/ev/scale", failed))[0] == 200
    _, status, _ = await client.get("/v1/job/ev/scale")
    events = status["TaskGroups"]["g"]["Events"]
    assert [(e["Message"], e["Error"], e["Count"]) for e in events] == [
        ("could not", True, None),
        ("only a note", False, None),
        ("", False, 2),
    ]
    assert events[2]["EvalID"] == out["EvalID"] and events[2]["PreviousCount"] == 1
    assert (await client.post("/v1/job/ev/scale", {"Count": 1, "Error": True, "Target": target}))[
        :2
    ] == (400, "scaling action should not contain count if error is true")


def test_group_and_task_names_are_checked_in_nomads_order() -> None:
    def task(name: str) -> dict[str, Any]:
        return {"Name": name, "Driver": "docker"}

    job = {
        "Region": "global",
        "ID": "j",
        "Name": "j",
        "Namespace": "default",
        "Type": "system",
        "Datacenters": ["dc1"],
        "TaskGroups": [
            {"Name": "g", "Count": 1, "Tasks": [task("t"), task(""), task("t")]},
            {"Name": "", "Count": 2, "Tasks": [task("t")]},
            {"Name": "g", "Count": 3, "Tasks": [task("t")]},
        ],
    }
    # A group's name, then its count; then each group's tasks.
    assert validation_errors(job) == [
        "Job task group 2 missing name",
        "Job task group  has count 2. Count cannot exceed 1 with system scheduler",
        "Job task group 3 redefines 'g' from group 1",
        "Job task group g has count 3. Count cannot exceed 1 with system scheduler",
        "Task group g validation failed: "
        + multierror(["Task 2 missing name", "Task 3 redefines 't' from task 1"]),
    ]
