"""End to end: real kopf against a real kube-apiserver, the simulator as Nomad."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Final

import pytest

from tests.operator.conftest import CRD_FILE, CRD_NAME, VERSION, Cluster, Replica
from tests.support.documents import pool_doc
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow

CRD_PATH: Final = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{CRD_NAME}"
RULES: Final = "x-kubernetes-validations"


async def test_pool_follows_its_resource(cluster: Cluster) -> None:
    replica = await cluster.start_operator("--namespace", cluster.namespace)
    created = await cluster.create_pool(pool_doc("py", idle=2))
    await wait_until(lambda: len(cluster.jobs("py")) == 2, what="2 runner jobs")

    def ready_with(idle: int) -> bool:
        pool = cluster.pool("py") or {}
        status = pool.get("status") or {}
        ready = cluster.condition("py", "Ready") or {}
        return (
            ready.get("status") == "True"
            and status.get("idleRunners") == idle
            and status.get("observedGeneration") == pool["metadata"]["generation"]
        )

    await wait_until(lambda: ready_with(2), what="Ready=True with 2 idle")
    status = (cluster.pool("py") or {})["status"]
    assert status["totalRunners"] == 2
    assert status["selector"] == "poolkeeper.dev/pool=py"
    assert await cluster.ready(replica) == 200
    # The operator never writes the spec (GitOps: nothing to fight over).
    assert (cluster.pool("py") or {})["spec"] == created["spec"]

    code, _ = await cluster.patch_pool("py", {"spec": {"idleRunners": 4}})
    assert code == 200
    await wait_until(lambda: ready_with(4), what="4 idle after patching spec.idleRunners")
    assert len(cluster.jobs("py")) == 4

    code, scale = await cluster.patch_pool("py", {"spec": {"replicas": 1}}, sub="scale")
    assert code == 200 and scale["spec"]["replicas"] == 1
    await wait_until(lambda: ready_with(1), what="1 idle after scaling")
    await wait_until(lambda: len(cluster.jobs("py")) == 1, what="surplus runners destroyed")
    assert (cluster.pool("py") or {})["metadata"]["generation"] == 3


async def test_invalid_spec_is_reported_and_nothing_runs(cluster: Cluster) -> None:
    await cluster.start_operator("--namespace", cluster.namespace)
    # jobTemplate is opaque to the CRD: the controller refuses the reserved ID key.
    doc = pool_doc("bad", idle=2, nomad={"jobTemplate": {"ID": "mine"}})
    await cluster.create_pool(doc)

    def invalid() -> bool:
        ready = cluster.condition("bad", "Ready") or {}
        return ready.get("status") == "False" and ready.get("reason") == "InvalidSpec"

    await wait_until(invalid, what="Ready=False InvalidSpec")
    assert "jobTemplate" in (cluster.condition("bad", "Ready") or {})["message"]
    await wait_until(lambda: bool(cluster.events("InvalidSpec")), what="an InvalidSpec Event")
    assert cluster.events("InvalidSpec")[0]["type"] == "Warning"
    assert cluster.jobs("bad", live_only=False) == []

    # Fixing the spec makes the pool run.
    code, _ = await cluster.patch_pool("bad", {"spec": {"nomad": {"jobTemplate": None}}})
    assert code == 200
    await wait_until(lambda: len(cluster.jobs("bad")) == 2, what="runners once the spec is valid")


async def claim(cluster: Cluster, replica: Replica, pool: str) -> str:
    url = f"{replica.controller.url}/v1/pools/{cluster.namespace}/{pool}/claims"
    async with cluster.http.post(url, json={"waitSeconds": 10}) as response:
        body = await response.json()
        assert response.status == 201, body
        return str(body["runnerId"])


async def test_delete_policy_delete_destroys_everything(cluster: Cluster) -> None:
    replica = await cluster.start_operator("--namespace", cluster.namespace)
    await cluster.create_pool(pool_doc("gone", idle=2, deletionPolicy="Delete"))
    await wait_until(lambda: len(cluster.jobs("gone")) == 2, what="2 runners")
    await claim(cluster, replica, "gone")
    await cluster.delete_pool("gone")
    await wait_until(lambda: cluster.pool("gone") is None, what="the object to go")
    assert cluster.jobs("gone") == []  # claimed runners too
    assert cluster.events("Finalized")


async def test_delete_policy_orphan_leaves_nomad_alone(cluster: Cluster) -> None:
    await cluster.start_operator("--namespace", cluster.namespace)
    await cluster.create_pool(pool_doc("kept", idle=2, deletionPolicy="Orphan"))
    await wait_until(lambda: len(cluster.jobs("kept")) == 2, what="2 runners")
    await wait_until(lambda: cluster.condition("kept", "Ready") is not None, what="a status")
    await cluster.delete_pool("kept")
    await wait_until(lambda: cluster.pool("kept") is None, what="the object to go")
    assert len(cluster.jobs("kept")) == 2


async def test_orphans_are_reported_with_what_the_operator_can_do_about_them(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="controller.engine.drains")
    await cluster.start_operator("--namespace", cluster.namespace)
    await cluster.create_pool(pool_doc("kept", idle=1, deletionPolicy="Orphan"))
    await cluster.create_pool(pool_doc("stays", idle=1))  # the namespace is still reconciled
    await wait_until(lambda: len(cluster.jobs("kept")) == 1, what="a runner")
    await cluster.delete_pool("kept")
    report = (
        f"namespace default holds runner jobs of pool {cluster.namespace}/kept, which is not "
        "defined: "
        "left alone (orphaned; a RunnerPool of that namespace, name and job prefix adopts "
        "them, and deleting it drains them)"
    )
    await wait_until(lambda: report in caplog.messages, what="the orphans' report")
    assert not [m for m in caplog.messages if "--prune" in m]  # the operator has none


async def test_drain_waits_for_claimed_runners(cluster: Cluster) -> None:
    replica = await cluster.start_operator("--namespace", cluster.namespace)
    await cluster.create_pool(pool_doc("drain", idle=3))
    await wait_until(lambda: len(cluster.jobs("drain")) == 3, what="3 runners")
    await wait_until(
        lambda: ((cluster.pool("drain") or {}).get("status") or {}).get("idleRunners") == 3,
        what="3 idle runners",
    )
    runner = await claim(cluster, replica, "drain")
    await cluster.delete_pool("drain")
    # Idle runners go at once; the claimed one keeps the object (the finalizer) alive.
    await wait_until(
        lambda: [j["ID"] for j in cluster.jobs("drain")] == [runner], what="only the claim left"
    )
    await cluster.until_condition("drain", "Terminating", reason="Drain")
    pool = cluster.pool("drain")
    assert pool is not None and pool["metadata"]["deletionTimestamp"]
    assert "poolkeeper.dev/finalizer" in pool["metadata"]["finalizers"]

    async with cluster.http.delete(f"{replica.controller.url}/v1/runners/{runner}") as response:
        assert response.status == 204
    await wait_until(lambda: cluster.pool("drain") is None, what="the drained object to go")
    assert cluster.jobs("drain") == []


async def test_drain_timeout_retires_claimed_runners(cluster: Cluster) -> None:
    replica = await cluster.start_operator("--namespace", cluster.namespace)
    await cluster.create_pool(pool_doc("short", idle=1, drainTimeoutSeconds=2))
    await wait_until(lambda: len(cluster.jobs("short")) == 1, what="a runner")
    await claim(cluster, replica, "short")
    await cluster.delete_pool("short")
    await asyncio.sleep(1.0)
    assert cluster.pool("short") is not None  # still draining: the claim is alive
    await wait_until(lambda: cluster.pool("short") is None, within=10, what="the drain timeout")
    assert cluster.jobs("short") == []


async def test_finalizer_waits_while_nomad_is_unreachable(cluster: Cluster) -> None:
    await cluster.start_operator("--namespace", cluster.namespace)
    await cluster.create_pool(pool_doc("cut", idle=1))
    await wait_until(lambda: len(cluster.jobs("cut")) == 1, what="a runner")
    cluster.sim.api_fault("refuse", seconds=4.0)
    await cluster.delete_pool("cut")

    def reported() -> bool:  # the Event and the status are two writes, in either order
        terminating = cluster.condition("cut", "Terminating") or {}
        unreachable = "unreachable" in terminating.get("message", "")
        return unreachable and bool(cluster.events("NomadUnavailable"))

    await wait_until(reported, what="a NomadUnavailable Event and the Terminating condition")
    assert cluster.pool("cut") is not None
    # Nomad is back: the drain finishes.
    await wait_until(
        lambda: cluster.pool("cut") is None, within=15, what="the drain after the outage"
    )
    assert cluster.jobs("cut") == []


@contextlib.asynccontextmanager
async def transition_rules_removed(cluster: Cluster, pool: str) -> AsyncIterator[None]:
    """The session's RunnerPool CRD without its immutability rules, then as the file has it
    again (each change is in effect once a dry-run patch of ``pool`` says so)."""
    rules = f"/spec/versions/0/schema/openAPIV3Schema/properties/spec/properties/nomad/{RULES}"
    removal = [{"op": "test", "path": "/spec/versions/0/name", "value": VERSION}]
    removal.append({"op": "remove", "path": rules})
    status, body = await cluster.k8s("PATCH", CRD_PATH, removal, "application/json-patch+json")
    assert status == 200, body

    async def prefix_change_answers(code: int) -> bool:
        patch = {"spec": {"nomad": {"jobPrefix": f"probe-{code}-"}}}
        path = cluster.pool_path(pool) + "?dryRun=All"
        answer, _ = await cluster.k8s("PATCH", path, patch, "application/merge-patch+json")
        return answer == code

    await wait_until(lambda: prefix_change_answers(200), what="the CRD without its rules")
    try:
        yield
    finally:
        cluster.kube.kubectl("apply", "-f", str(CRD_FILE))
        await wait_until(lambda: prefix_change_answers(422), what="the CRD's rules back")


async def test_immutable_change_is_refused_and_the_old_spec_keeps_running(
    cluster: Cluster,
) -> None:
    await cluster.start_operator("--namespace", cluster.namespace)
    await cluster.create_pool(pool_doc("fixed", idle=1))
    await wait_until(lambda: len(cluster.jobs("fixed")) == 1, what="a runner")
    # The CRD's CEL transition rule refuses the change...
    code, body = await cluster.patch_pool("fixed", {"spec": {"nomad": {"namespace": "other"}}})
    assert code == 422 and "nomad.namespace is immutable" in body["message"]
    # ...and where the API server lets it through (a CRD without the rule), the operator
    # refuses it too.
    async with transition_rules_removed(cluster, "fixed"):
        code, _ = await cluster.patch_pool("fixed", {"spec": {"nomad": {"jobPrefix": "moved-"}}})
        assert code == 200

    def refused() -> bool:
        accepted = cluster.condition("fixed", "SpecAccepted") or {}
        return accepted.get("reason") == "ImmutableFieldChanged"

    await wait_until(refused, what="SpecAccepted=False ImmutableFieldChanged")
    assert cluster.events("ImmutableFieldChanged")
    code, _ = await cluster.patch_pool("fixed", {"spec": {"idleRunners": 2}})
    assert code == 200
    await asyncio.sleep(1.0)
    jobs = cluster.jobs("fixed")
    assert len(jobs) == 1 and jobs[0]["ID"].startswith("fixed-")  # the old spec, untouched


async def test_a_lost_allocation_is_reported_as_an_event(cluster: Cluster) -> None:
    replica = await cluster.start_operator("--namespace", cluster.namespace)
    await cluster.create_pool(pool_doc("lossy", idle=1))
    await wait_until(lambda: len(cluster.jobs("lossy")) == 1, what="a runner")
    runner = await claim(cluster, replica, "lossy")
    url = f"{replica.controller.url}/v1/runners/{runner}"
    async with cluster.http.get(url) as response:
        allocation = (await response.json())["allocationId"]
    await cluster.sim.reschedule_allocation(allocation)  # the user's state is gone
    await wait_until(lambda: bool(cluster.events("AllocationLost")), what="AllocationLost")
    event = cluster.events("AllocationLost")[0]
    assert event["type"] == "Warning"
    assert event["involvedObject"]["kind"] == "RunnerPool"
    assert event["involvedObject"]["uid"] == (cluster.pool("lossy") or {})["metadata"]["uid"]
    await wait_until(lambda: runner not in [j["ID"] for j in cluster.jobs("lossy")], what="gone")


async def test_failed_starts_are_reported_as_events_and_open_the_breaker(
    cluster: Cluster,
) -> None:
    await cluster.start_operator("--namespace", cluster.namespace)
    cluster.sim.fail_starts("broken:1")
    await cluster.create_pool(
        pool_doc("flaky", idle=3, runner={"image": "broken:1", "command": ["run"]})
    )
    await wait_until(lambda: bool(cluster.events("RunnerReplaced")), what="RunnerReplaced")
    await wait_until(
        lambda: bool(cluster.events("CircuitBreakerOpen")), what="a CircuitBreakerOpen Event"
    )
    degraded = cluster.condition("flaky", "Degraded") or {}
    assert degraded.get("status") == "True" and degraded.get("reason") == "CircuitOpen"
    assert all(e["type"] == "Warning" for e in cluster.events("RunnerReplaced"))


async def test_status_is_written_only_when_it_changes(cluster: Cluster) -> None:
    replica = await cluster.start_operator("--namespace", cluster.namespace)
    await cluster.create_pool(pool_doc("calm", idle=1))
    await cluster.until_condition("calm", "Progressing", reason="Stable")
    ready = cluster.condition("calm", "Ready")

    def status_writes() -> int:
        return sum(
            1
            for r in cluster.requests()
            if r["verb"] == "patch"
            and r["objectRef"].get("subresource") == "status"
            and r["objectRef"].get("name") == "calm"
        )

    before = status_writes()
    await asyncio.sleep(2.0)  # four resyncs of 0.5 s: nothing changed, nothing written
    assert status_writes() == before
    # A restarted operator keeps the conditions' transition times and writes nothing new.
    await replica.stop()
    await cluster.start_operator("--namespace", cluster.namespace)
    await asyncio.sleep(1.5)
    assert cluster.condition("calm", "Ready") == ready
    assert status_writes() == before
    # A change is written, and only Ready's flip moves its transition time.
    await cluster.patch_pool("calm", {"spec": {"idleRunners": 3}})
    await wait_until(
        lambda: ((cluster.pool("calm") or {}).get("status") or {}).get("idleRunners") == 3,
        what="the scale-up in the status",
    )
    assert status_writes() > before


async def test_an_invalid_update_keeps_the_last_valid_version_running(cluster: Cluster) -> None:
    replica = await cluster.start_operator("--namespace", cluster.namespace)
    await cluster.create_pool(pool_doc("turn", idle=1))
    await cluster.until_condition("turn", "Ready", status="True")
    code, _ = await cluster.patch_pool(
        "turn", {"spec": {"idleRunners": 3, "nomad": {"jobTemplate": {"Type": "service"}}}}
    )
    assert code == 200
    await cluster.until_condition("turn", "SpecAccepted", reason="InvalidSpec")
    assert "jobTemplate" in (cluster.condition("turn", "SpecAccepted") or {})["message"]
    assert cluster.events("InvalidSpec")[0]["type"] == "Warning"
    assert (cluster.condition("turn", "Ready") or {}).get("status") == "True"
    pool = cluster.pool("turn") or {}
    assert pool["status"]["observedGeneration"] == pool["metadata"]["generation"]
    # The last valid version (idleRunners 1) is still reconciled and claimable: a claim
    # succeeds and the pool refills to one idle runner, not three.
    runner = await claim(cluster, replica, "turn")
    await wait_until(lambda: len(cluster.jobs("turn")) == 2, what="the claimed runner replaced")
    await asyncio.sleep(1.0)
    assert runner in [j["ID"] for j in cluster.jobs("turn")] and len(cluster.jobs("turn")) == 2


async def test_a_prefix_conflict_hands_out_nothing(cluster: Cluster) -> None:
    replica = await cluster.start_operator("--namespace", cluster.namespace)
    await cluster.create_pool(pool_doc("first", idle=1, nomad={"jobPrefix": "shared-"}))
    await wait_until(lambda: len(cluster.jobs("first")) == 1, what="a runner of the first pool")
    await cluster.create_pool(pool_doc("second", idle=1, nomad={"jobPrefix": "shared-"}))
    await cluster.until_condition("second", "Ready", reason="PrefixConflict")
    await wait_until(lambda: bool(cluster.events("PrefixConflict")), what="a PrefixConflict Event")
    url = f"{replica.controller.url}/v1/pools/{cluster.namespace}/second/claims"
    async with cluster.http.post(url, json={}) as response:
        body = await response.json()
    assert (response.status, body["error"]["code"]) == (409, "PrefixConflict")


async def test_a_pool_made_invalid_while_no_operator_ran_is_still_deleted(
    cluster: Cluster,
) -> None:
    replica = await cluster.start_operator("--namespace", cluster.namespace)
    await cluster.create_pool(pool_doc("late", idle=1, deletionPolicy="Delete"))
    await wait_until(lambda: len(cluster.jobs("late")) == 1, what="a runner")
    await replica.stop()
    await cluster.patch_pool("late", {"spec": {"nomad": {"jobTemplate": {"Name": "x"}}}})
    await cluster.start_operator("--namespace", cluster.namespace)
    await cluster.until_condition("late", "Ready", reason="InvalidSpec")
    assert len(cluster.jobs("late")) == 1
    await cluster.delete_pool("late")
    await wait_until(lambda: cluster.pool("late") is None, what="the object to go")
    assert cluster.jobs("late") == []


async def test_a_starting_replica_answers_503_until_it_has_read_the_pools(
    cluster: Cluster,
) -> None:
    """A pool defined before the replica started is no 404 while kopf has not delivered it
    yet (nor a runner of it): the replica is unready and says so, then serves it."""
    await cluster.create_pool(pool_doc("early", idle=1))
    replica = await cluster.start_operator("--namespace", cluster.namespace)
    base = replica.controller.url
    async with cluster.http.post(f"{base}/v1/pools/{cluster.namespace}/early/claims") as first:
        assert first.status == 503, await first.text()
    async with cluster.http.get(f"{base}/v1/runners/early-0123456789ab") as runner:
        assert runner.status == 503, await runner.text()
    async with cluster.http.get(f"{base}/readyz") as readiness:
        assert readiness.status == 503
    await wait_until(lambda: len(cluster.jobs("early")) == 1, what="the pool's runner")

    async def ready() -> bool:
        return await cluster.ready(replica) == 200

    await wait_until(ready, what="the replica ready once it has read the pool")
    runner_id = await claim(cluster, replica, "early")
    assert runner_id.startswith("early-")
    async with cluster.http.get(f"{base}/v1/pools/{cluster.namespace}/nowhere") as unknown:
        assert unknown.status == 404  # once every pool is read, an unknown one is unknown
