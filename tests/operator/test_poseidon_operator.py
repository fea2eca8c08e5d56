"""The Poseidon API of the operator, configured by the chart's values: labelled RunnerPools
are execution environments (a label change counts), and managed environments are pools
beside them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.operator.conftest import Cluster, chart_operator_args
from tests.support.documents import pool_doc
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow

LABEL = "poolkeeper.dev/poseidon-environment"
HEADERS = {"Poseidon-Token": "api-token", "Content-Type": "application/json"}  # the chart replica's


async def poseidon(
    cluster: Cluster, base: str, method: str, path: str, body: Any = None
) -> tuple[int, Any]:
    async with cluster.http.request(
        method, base + "/api/v1" + path, data=json.dumps(body) if body else None, headers=HEADERS
    ) as response:
        raw = await response.read()
        return response.status, json.loads(raw) if raw else None


async def test_labelled_resources_and_managed_environments(
    cluster: Cluster, tmp_path: Path
) -> None:
    values = ("--set", "poseidon.enabled=true", "--set", "poseidon.environments=managed")
    assert "--poseidon-api" in chart_operator_args(*values)
    replica = await cluster.start_chart_replica("a", tmp_path, *values)
    base = replica.controller.url
    document = pool_doc("python", idle=1, runner={"image": "python:3.12", "cpu": 20})
    document["metadata"]["labels"] = {LABEL: "10"}
    await cluster.create_pool(document)

    async def environments() -> list[int] | None:
        status, body = await poseidon(cluster, base, "GET", "/execution-environments")
        if status == 500 and body.get("errorCode") == "NOMAD_UNREACHABLE":
            return None  # Poseidon's answer while the replica has not read the pools yet
        assert status == 200, (status, body)
        return [e["id"] for e in body["executionEnvironments"]]

    async def listed(expected: list[int]) -> bool:
        return await environments() == expected

    await wait_until(lambda: listed([10]), what="the labelled resource as environment 10")

    async def idle(env_id: str) -> bool:
        _, stats = await poseidon(cluster, base, "GET", "/statistics/execution-environments")
        return bool(stats.get(env_id, {}).get("idleRunners"))

    await wait_until(lambda: idle("10"), what="its idle runner")
    status, claim = await poseidon(
        cluster, base, "POST", "/runners", {"executionEnvironmentId": 10, "inactivityTimeout": 60}
    )
    assert status == 200 and claim["runnerId"].startswith("python-")

    # A label change alone (no new generation) moves the pool to another environment.
    code, _ = await cluster.patch_pool("python", {"metadata": {"labels": {LABEL: "11"}}})
    assert code == 200
    await wait_until(lambda: listed([11]), what="the relabelled resource as environment 11")

    sync = {"image": "python:3.13", "prewarmingPoolSize": 1, "cpuLimit": 20, "memoryLimit": 128}
    status, _ = await poseidon(cluster, base, "PUT", "/execution-environments/12", sync)
    assert status == 201
    await wait_until(lambda: listed([11, 12]), what="the managed environment beside it")

    def managed_runners() -> int:
        return sum(
            1
            for job in cluster.sim.job_list("*")
            if job["ID"].startswith("environment-12-") and job.get("Status") != "dead"
        )

    await wait_until(lambda: managed_runners() == 1, what="the managed environment's runner")
    status, _ = await poseidon(cluster, base, "DELETE", "/execution-environments/11")
    assert status == 409  # the resource's, not Poseidon's to delete
    status, _ = await poseidon(cluster, base, "DELETE", "/execution-environments/12")
    assert status == 204
    await wait_until(lambda: managed_runners() == 0, what="the managed environment drained")
