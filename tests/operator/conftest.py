"""Fixtures: the fake Kubernetes API, the Nomad simulator and in-process operator replicas
running the real kopf machinery against them."""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import subprocess
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import kopf
import pytest
import yaml

from controller.cli import build_parser
from controller.core.runner_ids import META_POOL
from controller.lab.simulator import SimServer, Simulator, start_sim
from controller.nomad.config import NomadConfig
from controller.operator.controller import OperatorController
from controller.operator.handlers import run
from controller.operator.options import OperatorOptions, options_from_args
from tests.operator.fake_k8s import JSON, FakeKubernetes, Rule, denied
from tests.support.ports import free_port
from tests.support.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
CRD_FILE = ROOT / "crds" / "runnerpools.poolkeeper.dev.yaml"
CHART = ROOT / "charts" / "poolkeeper"
HELM = ROOT / ".cache" / "helm" / "helm"
NAMESPACE = "default"
PEERING = "poolkeeper"
SERVICE_ACCOUNT = "system:serviceaccount:default:poolkeeper"
ADMIN = "admin-token"
GROUP, VERSION, PLURAL = "poolkeeper.dev", "v1alpha1", "runnerpools"

# The least-privilege rules the issue lists; used only while the chart cannot be rendered.
FALLBACK_RULES = [
    Rule((GROUP,), (PLURAL,), ("get", "list", "watch", "patch")),
    Rule((GROUP,), (f"{PLURAL}/status",), ("get", "patch")),
    Rule(("",), ("events",), ("create",)),
    Rule(("kopf.dev",), ("kopfpeerings",), ("get", "list", "watch", "patch")),
]


def chart_rules(*values: str) -> tuple[list[Rule], str]:
    """The RBAC rules of the chart as helm renders it (peering on, one namespace)."""
    if not (CHART / "Chart.yaml").exists() or not HELM.exists():
        return FALLBACK_RULES, "fallback list (chart or helm not available)"
    rules = [
        Rule.from_manifest(rule)
        for doc in render_chart(*values)
        if doc.get("kind") in ("Role", "ClusterRole")
        for rule in doc.get("rules") or ()
    ]
    return rules, "chart"


def render_chart(*values: str) -> list[JSON]:
    rendered = subprocess.run(
        [str(HELM), "template", "poolkeeper", str(CHART), "--namespace", NAMESPACE, *values],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return [doc for doc in yaml.safe_load_all(rendered) if doc]


def chart_operator_args(*values: str) -> list[str]:
    """The operator's command line in the chart's Deployment."""
    deployment = next(d for d in render_chart(*values) if d["kind"] == "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    args = [str(a) for a in container["args"]]
    assert args[0] == "operator", args
    return args[1:]


@dataclasses.dataclass
class Replica:
    """One operator replica in its own thread and event loop, as in its own process (kopf
    cancels every task of its loop when it stops)."""

    controller: OperatorController
    thread: threading.Thread
    stop_flag: threading.Event
    token: str
    errors: list[BaseException]
    liveness: str = ""

    @property
    def active(self) -> bool:
        return self.controller.active

    async def stop(self) -> None:
        self.stop_flag.set()
        await asyncio.to_thread(self.thread.join, 30)
        assert not self.thread.is_alive(), "the operator did not stop"
        assert not self.errors, self.errors


class Cluster:
    """The fake API server, the simulator, and the operator replicas started against them."""

    def __init__(self, fake: FakeKubernetes, sim: Simulator, server: SimServer) -> None:
        self.fake = fake
        self.sim = sim
        self.sim_server = server
        self.replicas: list[Replica] = []
        self.chart_values: tuple[str, ...] = ()
        self.http = aiohttp.ClientSession()

    # -- operators --------------------------------------------------------------------

    async def start_operator(
        self,
        *cli: str,
        token: str = "operator-a",
        lifetime: int = 3,
        resync_seconds: float = 0.5,
    ) -> Replica:
        """A replica configured from command-line arguments, as the chart passes them."""
        if "--api-token-file" not in cli:  # the chart's replicas bring their own
            cli = ("--insecure-no-auth", *cli)
        args = build_parser().parse_args(["operator", "--listen", "127.0.0.1:0", *cli])
        args.resync_seconds = resync_seconds
        options: OperatorOptions = dataclasses.replace(
            options_from_args(args),
            peering_lifetime=lifetime,
            finalize_retry_seconds=0.3,
            api_error_backoffs=(0.1, 0.2, 0.3),
        )
        nomad = NomadConfig.from_env({"NOMAD_ADDR": self.sim_server.url})

        def connect(_: kopf.OperatorSettings) -> kopf.ConnectionInfo:
            return kopf.ConnectionInfo(
                server=self.fake.url, token=token, default_namespace=NAMESPACE
            )

        started: concurrent.futures.Future[OperatorController] = concurrent.futures.Future()
        stop_flag = threading.Event()
        errors: list[BaseException] = []

        def main() -> None:
            try:
                asyncio.run(
                    run(
                        options,
                        nomad,
                        connect=connect,
                        stop_flag=stop_flag,
                        started=started.set_result,
                    )
                )
            except BaseException as error:
                errors.append(error)
                if not started.done():
                    started.set_exception(error)

        thread = threading.Thread(target=main, name=f"operator-{token}", daemon=True)
        thread.start()
        controller = await asyncio.wrap_future(started)
        replica = Replica(controller, thread, stop_flag, token, errors)
        self.replicas.append(replica)
        return replica

    async def start_chart_replica(
        self, token: str, tmp_path: Path, lifetime: int, *values: str
    ) -> Replica:
        """A replica with the chart's command line (for these chart values); only what
        binds a port or names a file of the pod is replaced (replicas share this machine).
        The requests of the test are then checked against the same values' RBAC rules."""
        self.chart_values = values
        args = chart_operator_args(*values)
        tokens = tmp_path / f"tokens-{token}"
        tokens.write_text("api-token\n")
        local = {
            "--listen": "127.0.0.1:0",
            "--liveness": f"http://127.0.0.1:{free_port()}/healthz",
            "--api-token-file": str(tokens),
            "--resync-seconds": "0.5",
        }
        for index, arg in enumerate(args[:-1]):
            if arg in local:
                args[index + 1] = local[arg]
        replica = await self.start_operator(*args, token=token, lifetime=lifetime)
        replica.liveness = local["--liveness"]
        return replica

    async def ready(self, replica: Replica) -> int:
        async with self.http.get(replica.controller.url + "/readyz") as response:
            return response.status

    # -- Kubernetes ------------------------------------------------------------------

    async def k8s(
        self, method: str, path: str, body: Any = None, content_type: str = "application/json"
    ) -> tuple[int, Any]:
        headers = {"Authorization": f"Bearer {ADMIN}", "Content-Type": content_type}
        data = None if body is None else yaml.safe_dump(body) if "yaml" in content_type else None
        async with self.http.request(
            method,
            self.fake.url + path,
            json=body if data is None and body is not None else None,
            data=data,
            headers=headers,
        ) as response:
            return response.status, await response.json(content_type=None)

    @staticmethod
    def pool_path(name: str = "", sub: str = "") -> str:
        path = f"/apis/{GROUP}/{VERSION}/namespaces/{NAMESPACE}/{PLURAL}"
        if name:
            path += f"/{name}"
        if sub:
            path += f"/{sub}"
        return path

    async def create_pool(self, doc: JSON) -> JSON:
        status, body = await self.k8s("POST", self.pool_path(), doc)
        assert status == 201, body
        return dict(body)

    async def patch_pool(self, name: str, patch: JSON, sub: str = "") -> tuple[int, Any]:
        return await self.k8s(
            "PATCH", self.pool_path(name, sub), patch, "application/merge-patch+json"
        )

    def pool(self, name: str) -> JSON | None:
        return self.fake.get(GROUP, PLURAL, NAMESPACE, name)

    def condition(self, name: str, type_: str) -> JSON | None:
        pool = self.pool(name) or {}
        conditions = (pool.get("status") or {}).get("conditions") or []
        return next((c for c in conditions if c["type"] == type_), None)

    async def until_condition(self, name: str, type_: str, **expected: str) -> JSON:
        """Wait until the pool's condition `type_` has the `expected` fields (e.g.
        reason="Stable"); the condition."""

        def matches() -> bool:
            condition = self.condition(name, type_) or {}
            return all(condition.get(key) == value for key, value in expected.items())

        await wait_until(matches, what=f"{name}: {type_} {expected}")
        return self.condition(name, type_) or {}

    def events(self, reason: str) -> list[JSON]:
        return [e for e in self.fake.items("", "events", NAMESPACE) if e.get("reason") == reason]

    # -- Nomad -------------------------------------------------------------------------

    def jobs(self, pool: str, *, live_only: bool = True) -> list[JSON]:
        return [
            job
            for job in self.sim.job_list("*")
            if (job.get("Meta") or {}).get(META_POOL) == f"{NAMESPACE}/{pool}"
            and (not live_only or (job.get("Status") != "dead" and not job.get("Stop")))
        ]

    async def close(self) -> None:
        for replica in self.replicas:
            if replica.thread.is_alive():
                await replica.stop()
        await self.http.close()


@pytest.fixture
async def fake() -> AsyncIterator[FakeKubernetes]:
    api = FakeKubernetes(
        tokens={ADMIN: "admin", "operator-a": SERVICE_ACCOUNT, "operator-b": SERVICE_ACCOUNT}
    )
    await api.start()
    yield api
    await api.stop()


def install(api: FakeKubernetes) -> None:
    crds = api._type_by_plural("apiextensions.k8s.io", "customresourcedefinitions")
    api.create_object(crds, "", yaml.safe_load(CRD_FILE.read_text()))
    namespaces = api._type_by_plural("", "namespaces")
    api.create_object(namespaces, "", {"metadata": {"name": NAMESPACE}})
    peerings = api._type_by_plural("kopf.dev", "kopfpeerings")
    api.create_object(peerings, NAMESPACE, {"metadata": {"name": PEERING}})


@pytest.fixture
def preinstalled() -> bool:
    """Whether the CRD, the namespace and the peering object exist from the start."""
    return True


@pytest.fixture
async def cluster(fake: FakeKubernetes, preinstalled: bool) -> AsyncIterator[Cluster]:
    if preinstalled:
        install(fake)
    sim = Simulator(seed=0, start_delay=0.05)
    server = await start_sim(sim, host="127.0.0.1", port=0)
    world = Cluster(fake, sim, server)
    try:
        yield world
    finally:
        await world.close()
        await server.stop()
    # RBAC is exercised: every request an operator replica made must be allowed.
    rules, _ = chart_rules(*world.chart_values)
    made = [r for r in fake.requests if r.user == SERVICE_ACCOUNT]
    assert made, "the operator made no Kubernetes request"
    refused = denied(made, rules)
    assert not refused, f"requests the chart's RBAC does not allow: {refused[:5]}"
