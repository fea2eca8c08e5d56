"""The controller on a Nomad with ACLs, with a token of exactly examples/nomad-policy.hcl,
and the API tier with one of exactly examples/nomad-policy-api.hcl: everything works;
without one capability, the log names what is missing."""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from controller.api_tier import ApiTier
from controller.claims.service import ClaimRequest
from controller.core.environments import Environment
from controller.engine import observe
from controller.lab.simulator import SimServer, Simulator, start_sim
from controller.metrics import Metrics
from controller.nomad.config import NomadConfig
from controller.nomad.errors import NomadError
from controller.poseidon.context import EnvironmentMode, PoseidonSettings
from controller.serving import ServingSettings
from controller.standalone import Controller, Settings
from tests.support.documents import pool_doc
from tests.support.waiting import wait_until

from .conftest import write_pools

ENVIRONMENT = {
    "id": 11,
    "image": "python:3.12-slim",
    "prewarmingPoolSize": 1,
    "cpuLimit": 20,
    "memoryLimit": 256,
    "networkAccess": False,
    "exposedPorts": None,
}
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
POLICY = EXAMPLES / "nomad-policy.hcl"
API_POLICY = EXAMPLES / "nomad-policy-api.hcl"
NODE_BLOCK = re.compile(r'^node \{\s*policy = "read"\s*\}\n', re.MULTILINE)


@pytest.fixture
async def acl_server() -> AsyncIterator[tuple[Simulator, SimServer]]:
    sim = Simulator(seed=3, start_delay=0.05, acl_enabled=True, exec_mode="local")
    server = await start_sim(sim, host="127.0.0.1", port=0)
    yield sim, server
    await server.stop()


def token_with(sim: Simulator, rules: str, name: str = "poolkeeper") -> str:
    if not sim.acl.bootstrapped:
        sim.bootstrap()
    sim.put_policy(name, {"Name": name, "Rules": rules})
    token = sim.create_token({"Name": name, "Type": "client", "Policies": [name]})
    return str(token["SecretID"])


def refused(metrics: Metrics) -> list[str]:
    """The Nomad requests answered 403, by endpoint."""
    return [
        sample.labels["endpoint"]
        for family in metrics.registry.collect()
        if family.name == "poolkeeper_nomad_requests"
        for sample in family.samples
        if sample.labels.get("code") == "403" and sample.value
    ]


async def controller_with(
    server: SimServer, token: str, tmp_path: Path, poseidon: PoseidonSettings | None = None
) -> Controller:
    settings = Settings(
        pools_path=write_pools(tmp_path / "p.yaml", pool_doc("py", idle=2)),
        listen=("127.0.0.1", 0),
        insecure_no_auth=True,
        resync_seconds=0.5,
        poseidon=poseidon or PoseidonSettings(),
    )
    nomad = NomadConfig.from_env({"NOMAD_ADDR": server.url, "NOMAD_TOKEN": token})
    controller = Controller(settings, nomad)
    await controller.start()
    return controller


async def test_the_controller_works_with_a_token_of_exactly_the_example_policy(
    acl_server: tuple[Simulator, SimServer], tmp_path: Path
) -> None:
    sim, server = acl_server
    controller = await controller_with(server, token_with(sim, POLICY.read_text()), tmp_path)
    try:

        async def full() -> bool:
            view = controller.engine.pools["default/py"]
            return bool(view.status and view.status.counts.idle == 2 and view.lease)

        await wait_until(full, what="two idle runners under the example policy")
        assert controller.engine.pools["default/py"].lease.held  # type: ignore[union-attr]
        claimed = await controller.claims.claim("default", "py", ClaimRequest())
        await controller.runners.release(claimed.records[0].runner_id)
        await wait_until(full, what="the released runner replaced")
        errors = controller.metrics.registry.get_sample_value(
            "poolkeeper_nomad_requests_total", {"endpoint": "/v1/jobs", "code": "403"}
        )
        assert errors is None  # nothing was refused
    finally:
        await controller.stop()


async def test_managed_poseidon_environments_work_with_the_example_policy(
    acl_server: tuple[Simulator, SimServer], tmp_path: Path
) -> None:
    sim, server = acl_server
    managed = PoseidonSettings(enabled=True, environments=EnvironmentMode.MANAGED)
    token = token_with(sim, POLICY.read_text())
    controller = await controller_with(server, token, tmp_path, managed)
    try:
        store = controller.environments
        assert store is not None
        assert await store.put(Environment(11, 1, 20, 256, "python:3.12-slim", False))  # created

        async def served() -> bool:
            view = controller.engine.pools.get("poseidon/environment-11")
            return bool(view and view.status and view.status.counts.idle == 1)

        await wait_until(served, what="the managed environment's runner")
        for endpoint in ("/v1/vars", "/v1/var/:path"):
            denied = controller.metrics.registry.get_sample_value(
                "poolkeeper_nomad_requests_total", {"endpoint": endpoint, "code": "403"}
            )
            assert denied is None, endpoint

        # Nomad leaves out of a list, without an error, the variables a token may not
        # read: a policy that loses them must not drain the environments.
        narrower = POLICY.read_text().replace(
            'path "poolkeeper/*" {',
            'path "poolkeeper/environments/*" {\n      capabilities = ["deny"]\n    }\n'
            '    path "poolkeeper/*" {',
        )
        sim.put_policy("poolkeeper", {"Name": "poolkeeper", "Rules": narrower})
        with pytest.raises(NomadError):
            await store.refresh()
        assert controller.engine.pools["poseidon/environment-11"].active
    finally:
        await controller.stop()


async def test_a_token_lacking_a_capability_is_named_in_the_log(
    acl_server: tuple[Simulator, SimServer], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    sim, server = acl_server
    lacking = POLICY.read_text().replace('"submit-job",', "")
    controller = await controller_with(server, token_with(sim, lacking), tmp_path)
    try:
        with caplog.at_level(logging.WARNING):

            async def named() -> bool:
                return any(
                    "POST /v1/jobs: 403" in m and "needs the submit-job capability" in m
                    for m in caplog.messages
                )

            await wait_until(named, what="the missing capability to be named")
        assert sim.job_list("*") == []
    finally:
        await controller.stop()


async def test_the_api_tier_works_with_a_token_of_exactly_its_policy(
    acl_server: tuple[Simulator, SimServer], tmp_path: Path
) -> None:
    sim, server = acl_server
    managed = PoseidonSettings(enabled=True, environments=EnvironmentMode.MANAGED)
    controller = await controller_with(
        server, token_with(sim, POLICY.read_text()), tmp_path, managed
    )
    api_token = token_with(sim, API_POLICY.read_text(), "poolkeeper-api")
    nomad = NomadConfig.from_env({"NOMAD_ADDR": server.url, "NOMAD_TOKEN": api_token})
    tier = ApiTier(
        ServingSettings(listen=("127.0.0.1", 0), insecure_no_auth=True, poseidon=managed), nomad
    )
    await tier.start()
    try:
        await wait_until(lambda: tier.readiness().ready, what="the API tier to read the catalog")
        await wait_until(
            lambda: bool((entry := tier.directory.pools.get("default/py")) and entry.offer),
            what="runners offered",
        )
        async with aiohttp.ClientSession(tier.url) as http:
            async with http.post("/v1/pools/default/py/claims", json={"requestId": "r1"}) as r:
                assert r.status == 201, await r.text()
                runner = (await r.json())["runnerId"]
            async with http.post(f"/v1/runners/{runner}/keepalive") as r:
                assert r.status == 200, await r.text()
            async with http.post(
                f"/v1/runners/{runner}/executions", json={"command": "echo ok", "wait": True}
            ) as r:
                assert (r.status, (await r.json())["stdout"]) == (200, "ok\n")
            async with http.get("/v1/pools/default/py/claims") as r:
                assert r.status == 200
            async with http.put("/api/v1/execution-environments/11", json=ENVIRONMENT) as r:
                assert r.status == 201, await r.text()
            # The replica reads who runs the managed environments from the member records.
            assert await tier.serving.refresh_environments()
            runner_request = {"executionEnvironmentId": 11, "inactivityTimeout": 60}
            async with http.post("/api/v1/runners", json=runner_request) as r:
                body = await r.json()
                assert r.status == 200 or body["errorCode"] == "NOMAD_OVERLOAD", body
            async with http.delete(f"/v1/runners/{runner}") as r:
                assert r.status == 204

        def purged() -> bool:
            return sim.get_job(runner) is None

        await wait_until(purged, what="the reconciler to purge the released runner")
        await wait_until(
            lambda: "poseidon/environment-11" in controller.engine.pools,
            what="the reconciler to take the environment",
        )
        await tier.stop()  # deletes its waiting record, writes its last ring
        assert refused(tier.metrics) == []
        assert refused(controller.metrics) == []
    finally:
        await tier.stop()
        await controller.stop()


async def test_without_node_read_pools_are_reconciled_without_drain_awareness(
    acl_server: tuple[Simulator, SimServer],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(observe, "NODE_RETRY_SECONDS", 0.5)
    sim, server = acl_server
    # A namespace-scoped token: the example policy without its node block.
    scoped = NODE_BLOCK.sub("", POLICY.read_text())
    assert "node {" not in scoped
    with caplog.at_level(logging.INFO, logger="controller.engine.observe"):
        controller = await controller_with(server, token_with(sim, scoped), tmp_path)
        try:

            def node_read() -> float | None:
                return controller.metrics.registry.get_sample_value(
                    "poolkeeper_capability", {"name": "node_read"}
                )

            def degraded() -> tuple[str, str]:
                view = controller.engine.pools["default/py"]
                found = view.status.condition("Degraded") if view.status else None
                return (found.status, found.reason) if found else ("", "")

            async def full_without_drain_awareness() -> bool:
                view = controller.engine.pools["default/py"]
                return bool(
                    view.status
                    and view.status.counts.idle == 2
                    and degraded() == ("False", "DrainAwarenessOff")
                )

            await wait_until(full_without_drain_awareness, what="the pool filled all the same")
            assert node_read() == 0
            for _ in range(3):
                await controller.engine.reconcile_namespace("default")
            said = [m for m in caplog.messages if "node" in m]
            assert len(said) == 1 and "drain awareness" in said[0], said
            assert controller.engine.node_named("sim-node-1") is None

            # The capability appears: drain awareness comes back at the next retry.
            sim.put_policy("poolkeeper", {"Name": "poolkeeper", "Rules": POLICY.read_text()})

            async def drain_aware_again() -> bool:
                return node_read() == 1 and degraded() == ("False", "AsExpected")

            await wait_until(drain_aware_again, what="drain awareness to come back")
            assert controller.engine.node_named("sim-node-1") is not None
            said = [m for m in caplog.messages if "node" in m]
            assert len(said) == 2 and "drain awareness is on again" in said[1], said
        finally:
            await controller.stop()
