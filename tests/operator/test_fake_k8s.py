"""The fake API server behaves as the real one where the operator depends on it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from tests.operator.conftest import ADMIN, Cluster, install
from tests.operator.fake_k8s import FakeKubernetes
from tests.support.documents import pool_doc

MERGE = "application/merge-patch+json"


@pytest.fixture
async def api(fake: FakeKubernetes) -> AsyncIterator[Cluster]:
    install(fake)
    world = Cluster(fake, None, None)  # type: ignore[arg-type]
    yield world
    await world.http.close()


async def test_discovery_answers_a_1_32_server_with_subresources(api: Cluster) -> None:
    async with api.http.get(api.fake.url + "/version") as response:
        assert (await response.json())["minor"] == "32"
    _, groups = await api.k8s("GET", "/apis")
    assert {"poolkeeper.dev", "kopf.dev"} <= {g["name"] for g in groups["groups"]}
    _, resources = await api.k8s("GET", "/apis/poolkeeper.dev/v1alpha1")
    names = {r["name"] for r in resources["resources"]}
    assert names == {"runnerpools", "runnerpools/status", "runnerpools/scale"}
    pools = next(r for r in resources["resources"] if r["name"] == "runnerpools")
    assert pools["shortNames"] == ["rpool"] and pools["namespaced"] is True


async def test_generation_moves_only_on_spec_changes(api: Cluster) -> None:
    created = await api.create_pool(pool_doc("g"))
    assert created["metadata"]["generation"] == 1
    rv = int(created["metadata"]["resourceVersion"])

    _, labelled = await api.patch_pool("g", {"metadata": {"labels": {"a": "b"}}})
    assert labelled["metadata"]["generation"] == 1
    assert int(labelled["metadata"]["resourceVersion"]) > rv

    _, status = await api.patch_pool("g", {"status": {"idleRunners": 3}}, sub="status")
    assert status["metadata"]["generation"] == 1 and status["status"]["idleRunners"] == 3

    _, patched = await api.patch_pool("g", {"spec": {"idleRunners": 5}, "status": {"x": 1}})
    assert patched["metadata"]["generation"] == 2
    assert patched["status"] == {"idleRunners": 3}  # the main resource ignores status

    _, spec_via_status = await api.patch_pool("g", {"spec": {"idleRunners": 9}}, sub="status")
    assert spec_via_status["spec"]["idleRunners"] == 5  # the status subresource ignores spec


async def test_stale_resource_versions_conflict(api: Cluster) -> None:
    created = await api.create_pool(pool_doc("c"))
    await api.patch_pool("c", {"spec": {"idleRunners": 1}})
    stale = dict(created, spec=dict(created["spec"], idleRunners=4))
    code, body = await api.k8s("PUT", api.pool_path("c"), stale)
    assert code == 409 and body["reason"] == "Conflict"
    unconditional = dict(stale, metadata={"name": "c", "namespace": "default"})
    code, _ = await api.k8s("PUT", api.pool_path("c"), unconditional)
    assert code == 422  # custom resources allow no unconditional update
    code, _ = await api.patch_pool(
        "c", {"metadata": {"resourceVersion": created["metadata"]["resourceVersion"]}}
    )
    assert code == 409
    code, scale = await api.k8s("GET", api.pool_path("c", "scale"))
    assert scale["spec"]["replicas"] == 1
    scale["spec"]["replicas"] = 6
    code, updated = await api.k8s("PUT", api.pool_path("c", "scale"), scale)
    assert code == 200 and updated["spec"]["replicas"] == 6
    code, _ = await api.k8s("PUT", api.pool_path("c", "scale"), scale)  # its rv is stale now
    assert code == 409
    pool = api.pool("c") or {}
    assert pool["spec"]["idleRunners"] == 6 and pool["metadata"]["generation"] == 3


async def watch(api: Cluster, since: str, count: int) -> list[dict[str, Any]]:
    url = api.fake.url + api.pool_path() + f"?watch=true&resourceVersion={since}"
    events: list[dict[str, Any]] = []
    headers = {"Authorization": f"Bearer {ADMIN}"}
    async with api.http.get(url, headers=headers) as response:
        async for line in response.content:
            events.append(json.loads(line))
            if len(events) == count:
                break
    return events


async def test_watches_resume_from_a_resource_version_and_expire(api: Cluster) -> None:
    await api.create_pool(pool_doc("w1"))
    _, listed = await api.k8s("GET", api.pool_path())
    since = listed["metadata"]["resourceVersion"]
    await api.create_pool(pool_doc("w2"))
    await api.patch_pool("w1", {"spec": {"idleRunners": 7}})
    await api.k8s("DELETE", api.pool_path("w2"))
    events = await asyncio.wait_for(watch(api, since, 3), timeout=5)
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [
        ("ADDED", "w2"),
        ("MODIFIED", "w1"),
        ("DELETED", "w2"),
    ]
    api.fake.compact()
    expired = await asyncio.wait_for(watch(api, since, 1), timeout=5)
    assert expired[0]["type"] == "ERROR" and expired[0]["object"]["code"] == 410


async def test_live_watch_sees_later_changes(api: Cluster) -> None:
    _, listed = await api.k8s("GET", api.pool_path())
    waiter = asyncio.create_task(watch(api, listed["metadata"]["resourceVersion"], 1))
    await asyncio.sleep(0.1)
    await api.create_pool(pool_doc("live"))
    events = await asyncio.wait_for(waiter, timeout=5)
    assert events[0]["type"] == "ADDED"


async def test_finalizers_hold_the_object_until_removed(api: Cluster) -> None:
    doc = pool_doc("f")
    doc["metadata"]["finalizers"] = ["example.com/hold"]
    await api.create_pool(doc)
    code, deleting = await api.k8s("DELETE", api.pool_path("f"))
    assert code == 200 and deleting["metadata"]["deletionTimestamp"]
    assert api.pool("f") is not None
    code, _ = await api.patch_pool("f", {"metadata": {"finalizers": ["a/b", "example.com/hold"]}})
    assert code == 422  # no new finalizers on a deleting object
    code, _ = await api.k8s(
        "PATCH",
        api.pool_path("f"),
        [{"op": "remove", "path": "/metadata/finalizers/0"}],
        "application/json-patch+json",
    )
    assert code == 200
    assert api.pool("f") is None


async def test_schema_prunes_defaults_and_validates(api: Cluster) -> None:
    doc = pool_doc("s")
    doc["spec"]["unknownField"] = 1
    doc["spec"]["runner"]["memoryMaxMB"] = None
    doc["status"] = {"idleRunners": 99}
    created = await api.create_pool(doc)
    spec = created["spec"]
    assert "unknownField" not in spec and "memoryMaxMB" not in spec["runner"]
    assert "status" not in created
    assert spec["maxRunners"] == 100 and spec["deletionPolicy"] == "Drain"
    assert spec["runner"]["command"] == ["sleep", "infinity"]
    assert spec["nomad"] == {"namespace": "default", "datacenters": ["*"], "jobTemplate": {}}
    assert spec["claims"]["defaultInactivityTimeoutSeconds"] == 300

    cases: list[tuple[dict[str, Any], str]] = [
        ({"idleRunners": -1}, "spec.idleRunners"),
        ({"idleRunners": "3"}, "must be of type integer"),
        ({"deletionPolicy": "Keep"}, "Unsupported value"),
        ({"idleRunners": 5, "maxRunners": 2}, "idleRunners must not be greater than maxRunners"),
        ({"runner": {"image": "x", "ports": [80]}}, "ports need network: bridge"),
    ]
    for bad, words in cases:
        doc = pool_doc("bad")
        doc["spec"].update(bad)
        code, body = await api.k8s("POST", api.pool_path(), doc)
        assert code == 422, (bad, body)
        assert words in body["message"], (bad, body["message"])
    # Transition rules run on updates only.
    code, body = await api.patch_pool("s", {"spec": {"nomad": {"namespace": "other"}}})
    assert code == 422 and "nomad.namespace is immutable" in body["message"]
    code, body = await api.patch_pool(
        "s", {"status": {"conditions": [{"type": "Ready"}]}}, "status"
    )
    assert code == 422  # the status schema is enforced on the status subresource too


async def test_every_request_is_recorded_with_its_rbac_attributes(api: Cluster) -> None:
    await api.create_pool(pool_doc("r"))
    await api.patch_pool("r", {"status": {"idleRunners": 1}}, sub="status")
    async with (
        aiohttp.ClientSession() as session,
        session.get(api.fake.url + api.pool_path()) as response,
    ):
        assert response.status == 401
    recorded = [(r.verb, r.api_group, r.rbac_resource, r.user) for r in api.fake.requests]
    assert ("create", "poolkeeper.dev", "runnerpools", "admin") in recorded
    assert ("patch", "poolkeeper.dev", "runnerpools/status", "admin") in recorded
