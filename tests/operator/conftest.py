"""Fixtures: the session's real kube-apiserver (``kube``, tests/conftest.py), the Nomad
simulator and in-process operator replicas running the real kopf machinery against them.

The RunnerPool CRD (as the chart ships it) is installed once per session. Each test gets
its own namespace holding what the chart renders for it (``helm template``): the
ServiceAccount, its Role and RoleBinding (or ClusterRole and ClusterRoleBinding). Every
replica runs as that ServiceAccount, with a token from the TokenRequest API: the real
authorizer checks each of its requests against the chart's rules, and a test fails when
the server refused the operator anything (the server's audit log says which).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import subprocess
import threading
import time
import urllib.parse
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Final

import aiohttp
import kopf
import pytest
import yaml

from controller.cli import build_parser
from controller.core.runner_ids import META_POOL
from controller.lab.kube import KubeCluster
from controller.lab.simulator import SimServer, Simulator, start_sim
from controller.nomad.config import NomadConfig
from controller.operator.controller import OperatorController
from controller.operator.handlers import run
from controller.operator.options import OperatorOptions, options_from_args
from tests.chart.helm import helm_binary
from tests.support.ports import free_port
from tests.support.relay import Relay
from tests.support.waiting import wait_until

JSON = dict[str, Any]

ROOT: Final = Path(__file__).resolve().parents[2]
CRD_FILE: Final = ROOT / "crds" / "runnerpools.poolkeeper.dev.yaml"
CHART: Final = ROOT / "charts" / "poolkeeper"
CRD_NAME: Final = "runnerpools.poolkeeper.dev"
RELEASE: Final = "poolkeeper"
NOMAD_NAMESPACE: Final = "default"  # the pools' Nomad namespace (their spec's default)
GROUP, VERSION, PLURAL = "poolkeeper.dev", "v1alpha1", "runnerpools"
# What the operator needs of the chart: its identity and its permissions.
CHART_KINDS: Final = frozenset(
    {"ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"}
)
CLUSTER_SCOPED: Final = {
    "ClusterRole": "/apis/rbac.authorization.k8s.io/v1/clusterroles",
    "ClusterRoleBinding": "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
}


def render_chart(namespace: str, *values: str) -> list[JSON]:
    """The chart as ``helm template`` renders it for a release in ``namespace``."""
    rendered = subprocess.run(
        [str(helm_binary()), "template", RELEASE, str(CHART), "--namespace", namespace, *values],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return [doc for doc in yaml.safe_load_all(rendered) if doc]


def operator_args(manifests: Iterable[JSON]) -> list[str]:
    """The operator's command line in the chart's operator Deployment."""
    for manifest in manifests:
        if manifest["kind"] != "Deployment":
            continue
        container = manifest["spec"]["template"]["spec"]["containers"][0]
        args = [str(a) for a in container.get("args") or ()]
        if args[:1] == ["operator"]:
            return args[1:]
    raise AssertionError("the chart renders no Deployment running `poolkeeper operator`")


def chart_operator_args(*values: str, namespace: str = "poolkeeper") -> list[str]:
    return operator_args(render_chart(namespace, *values))


def without_verb(manifests: list[JSON], resource: str, verb: str) -> list[JSON]:
    """The manifests with ``verb`` taken from every Role or ClusterRole rule on ``resource``
    (a chart that forgot it; a rule left without verbs goes)."""
    changed = []
    for manifest in manifests:
        if manifest["kind"] in ("Role", "ClusterRole"):
            rules = [
                dict(rule, verbs=[v for v in rule["verbs"] if v != verb])
                if resource in rule["resources"] else rule
                for rule in manifest["rules"]
            ]  # fmt: skip
            manifest = dict(manifest, rules=[rule for rule in rules if rule["verbs"]])
        changed.append(manifest)
    return changed


def rule_grants(manifests: Iterable[JSON]) -> set[tuple[str, str, str]]:
    """(API group, resource, verb) for every verb the Roles and ClusterRoles grant."""
    return {
        (group, resource, verb)
        for manifest in manifests
        if manifest["kind"] in ("Role", "ClusterRole")
        for rule in manifest["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


@pytest.fixture(scope="session")
def crds(kube: KubeCluster) -> KubeCluster:
    """The cluster, with the RunnerPool CRD installed and served."""
    assert kube.install_crds(CRD_FILE) == [CRD_NAME]
    return kube


@dataclasses.dataclass
class Replica:
    """One operator replica in its own thread and event loop, as in its own process (kopf
    cancels every task of its loop when it stops)."""

    controller: OperatorController
    thread: threading.Thread
    stop_flag: threading.Event
    name: str
    relay: Relay  # its way to the API server: cut when it crashes
    errors: list[BaseException]
    liveness: str = ""
    nomad_relay: Relay | None = None  # its way to Nomad, if it has one: cut when it crashes

    async def stop(self, *, crashed: bool = False) -> None:
        """Stop it; a replica that ``crashed`` may have failed on its way out."""
        self.stop_flag.set()
        await asyncio.to_thread(self.thread.join, 30)
        self.relay.stop()
        if self.nomad_relay is not None:
            self.nomad_relay.stop()
        assert not self.thread.is_alive(), "the operator did not stop"
        assert crashed or not self.errors, self.errors


@dataclasses.dataclass(frozen=True)
class Denied:
    """A request of the operator's ServiceAccount the server refused (from its audit log)."""

    verb: str
    resource: str
    namespace: str
    name: str
    code: int


class Cluster:
    """The real API server with this test's namespace, the simulator, and the operator
    replicas started against them."""

    def __init__(
        self, kube: KubeCluster, namespace: str, sim: Simulator, server: SimServer
    ) -> None:
        self.kube = kube
        self.namespace = namespace
        self.sim = sim
        self.sim_server = server
        self.replicas: list[Replica] = []
        self.namespaces = [namespace]  # every namespace this test made
        self.chart_values: tuple[str, ...] | None = None
        self.service_account = ""
        self.forbidden_expected = False  # a test of missing RBAC rules
        self._cluster_objects: set[tuple[str, str]] = set()  # (collection path, name)
        self._audit_offset = kube.audit_log.stat().st_size if kube.audit_log else 0
        self.http = aiohttp.ClientSession()

    # -- the chart's objects and the operator's identity ------------------------------

    def install_chart(
        self, *values: str, edit: Callable[[list[JSON]], list[JSON]] | None = None
    ) -> list[JSON]:
        """Apply what the chart renders for this namespace and ``values`` (its
        ServiceAccount and RBAC, through ``edit`` if given) and wait until
        the server authorizes exactly the rendered rules."""
        rendered = render_chart(self.namespace, *values)
        manifests = [m for m in rendered if m["kind"] in CHART_KINDS]
        rendered_grants = rule_grants(manifests)
        if edit is not None:
            manifests = edit(manifests)
        self.kube.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(manifests))
        for manifest in manifests:
            if manifest["kind"] in CLUSTER_SCOPED:
                self._cluster_objects.add(
                    (CLUSTER_SCOPED[manifest["kind"]], manifest["metadata"]["name"])
                )
        account = next(m for m in manifests if m["kind"] == "ServiceAccount")
        self.service_account = account["metadata"]["name"]
        granted = rule_grants(manifests)
        self._wait_for_rbac(granted, rendered_grants - granted)
        self.chart_values = values
        return rendered

    def _wait_for_rbac(
        self, granted: set[tuple[str, str, str]], denied: set[tuple[str, str, str]]
    ) -> None:
        """RBAC objects take effect when the authorizer's informer sees them: ask it."""
        expected = {attributes: True for attributes in granted}
        expected.update({attributes: False for attributes in denied})
        pending = dict(expected)
        deadline = time.monotonic() + 15
        while True:
            pending = {a: want for a, want in pending.items() if self.allowed(*a) != want}
            if not pending:
                return
            assert time.monotonic() < deadline, f"RBAC not in effect: {pending}"
            time.sleep(0.05)

    def allowed(self, group: str, resource: str, verb: str) -> bool:
        """Whether the server lets the chart's ServiceAccount ``verb`` ``resource`` in this
        namespace (a SubjectAccessReview)."""
        plural, _, subresource = resource.partition("/")
        status, answer = self.kube.request(
            "POST",
            "/apis/authorization.k8s.io/v1/subjectaccessreviews",
            {
                "apiVersion": "authorization.k8s.io/v1",
                "kind": "SubjectAccessReview",
                "spec": {
                    "user": self.user,
                    "groups": [
                        "system:serviceaccounts",
                        f"system:serviceaccounts:{self.namespace}",
                        "system:authenticated",
                    ],
                    "resourceAttributes": {
                        "namespace": self.namespace,
                        "group": group,
                        "resource": plural,
                        "subresource": subresource,
                        "verb": verb,
                    },
                },
            },
        )
        assert status == 201, answer
        return bool(answer["status"].get("allowed"))

    @property
    def user(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{self.service_account}"

    def token(self) -> str:
        """A token for the chart's ServiceAccount (TokenRequest), as a pod gets one."""
        return self.kube.service_account_token(self.namespace, self.service_account, create=False)

    def kubeconfig(self, path: Path) -> Path:
        """A kubeconfig with a token of the chart's ServiceAccount."""
        token = self.token()
        return self.kube.write_kubeconfig(
            path, {"token": token}, name=self.user, namespace=self.namespace
        )

    # -- operators --------------------------------------------------------------------

    async def start_operator(
        self,
        *cli: str,
        name: str = "a",
        resync_seconds: float = 0.5,
        identity: str = "",
        nomad_relay: bool = False,
    ) -> Replica:
        """A replica configured from command-line arguments, as the chart passes them,
        running as the chart's ServiceAccount; `identity`: its own, as a pod's name is
        (empty: this host's name, shared by every replica of this process); with
        `nomad_relay`, it reaches Nomad through a Relay that `crash` cuts too."""
        if self.chart_values is None:
            self.install_chart()
        if "--api-token-file" not in cli:  # the chart's replicas bring their own
            cli = ("--insecure-no-auth", *cli)
        args = build_parser().parse_args(["operator", "--listen", "127.0.0.1:0", *cli])
        args.resync_seconds = resync_seconds
        options: OperatorOptions = dataclasses.replace(
            options_from_args(args),
            finalize_retry_seconds=0.3,
            api_error_backoffs=(0.1, 0.2, 0.3),
        )
        if identity:
            options = dataclasses.replace(options, identity=identity)
        to_nomad = (
            Relay(self.sim_server.host, self.sim_server.port).start() if nomad_relay else None
        )
        nomad_url = f"http://127.0.0.1:{to_nomad.port}" if to_nomad else self.sim_server.url
        nomad = NomadConfig.from_env({"NOMAD_ADDR": nomad_url})
        token = self.token()
        address = urllib.parse.urlsplit(self.kube.server)
        relay = Relay(str(address.hostname), int(address.port or 443)).start()
        server = f"https://127.0.0.1:{relay.port}"
        ca_file, namespace = str(self.kube.ca_file), self.namespace

        def connect(_: kopf.OperatorSettings) -> kopf.ConnectionInfo:
            return kopf.ConnectionInfo(
                server=server, token=token, ca_path=ca_file, default_namespace=namespace
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

        thread = threading.Thread(target=main, name=f"operator-{name}", daemon=True)
        thread.start()
        try:
            controller = await asyncio.wrap_future(started)
        except BaseException:
            for opened in (relay, to_nomad):
                if opened is not None:
                    opened.stop()
            raise
        replica = Replica(controller, thread, stop_flag, name, relay, errors, nomad_relay=to_nomad)
        self.replicas.append(replica)
        return replica

    async def start_chart_replica(
        self, name: str, tmp_path: Path, *values: str, nomad_relay: bool = False
    ) -> Replica:
        """A replica with the chart's command line (for these chart values, whose RBAC is
        installed first) and an identity of its own, as pods have; only what binds a port
        or names a file of the pod is replaced (replicas share this machine)."""
        if self.chart_values != values:
            args = operator_args(self.install_chart(*values))
        else:
            args = chart_operator_args(*values, namespace=self.namespace)
        tokens = tmp_path / f"tokens-{name}"
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
        replica = await self.start_operator(
            *args,
            name=name,
            identity=f"{RELEASE}-{name}",
            nomad_relay=nomad_relay,
        )
        replica.liveness = local["--liveness"]
        return replica

    async def crash(self, replica: Replica) -> None:
        """The replica is gone without a word, as when its process is killed: its
        connections to the API server (and to Nomad, if it has a relay there) are reset, so
        it can neither give its leases back nor delete its member record, then it stops.

        Revoking its token would not do: kube-apiserver caches a token's authentication
        for 10 s, so a revoked token keeps working that long."""
        replica.relay.cut()
        if replica.nomad_relay is not None:
            replica.nomad_relay.cut()
        await replica.stop(crashed=True)

    async def ready(self, replica: Replica) -> int:
        async with self.http.get(replica.controller.url + "/readyz") as response:
            return response.status

    # -- Kubernetes, as admin ---------------------------------------------------------

    async def k8s(
        self, method: str, path: str, body: Any = None, content_type: str = "application/json"
    ) -> tuple[int, Any]:
        async with self.http.request(
            method,
            self.kube.server + path,
            json=body,
            headers={"Content-Type": content_type, "Accept": "application/json"},
            ssl=self.kube.ssl_context(),
        ) as response:
            return response.status, await response.json(content_type=None)

    def pool_path(self, name: str = "", sub: str = "", namespace: str = "") -> str:
        path = f"/apis/{GROUP}/{VERSION}/namespaces/{namespace or self.namespace}/{PLURAL}"
        if name:
            path += f"/{name}"
        if sub:
            path += f"/{sub}"
        return path

    async def create_pool(self, doc: JSON, namespace: str = "") -> JSON:
        namespace = namespace or self.namespace
        doc = dict(doc, metadata=dict(doc["metadata"], namespace=namespace))
        status, body = await self.k8s("POST", self.pool_path(namespace=namespace), doc)
        assert status == 201, body
        return dict(body)

    async def patch_pool(self, name: str, patch: JSON, sub: str = "") -> tuple[int, Any]:
        return await self.k8s(
            "PATCH", self.pool_path(name, sub), patch, "application/merge-patch+json"
        )

    async def delete_pool(self, name: str) -> None:
        status, body = await self.k8s("DELETE", self.pool_path(name))
        assert status in (200, 202), body

    def pool(self, name: str) -> JSON | None:
        status, body = self.kube.request("GET", self.pool_path(name))
        if status == 404:
            return None
        assert status == 200, body
        return dict(body)

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
        status, body = self.kube.request(
            "GET", f"/api/v1/namespaces/{self.namespace}/events?fieldSelector=reason%3D{reason}"
        )
        assert status == 200, body
        return list(body["items"])

    def create_namespace(self) -> str:
        """Another namespace for this test (its RunnerPools are removed after it)."""
        namespace = self.kube.create_namespace()
        self.namespaces.append(namespace)
        return namespace

    # -- the operator's requests, from the server's audit log ---------------------------

    def requests(self) -> list[JSON]:
        """The audit events of the requests the chart's ServiceAccount of this namespace
        made since the test began."""
        events = self.kube.audit_events(self._audit_offset)
        return [e for e in events if e["user"]["username"] == self.user]

    def denied(self) -> list[Denied]:
        return [
            Denied(
                e["verb"],
                "/".join(filter(None, (ref.get("resource"), ref.get("subresource")))),
                ref.get("namespace", ""),
                ref.get("name", ""),
                e["responseStatus"]["code"],
            )
            for e in self.requests()
            if e.get("responseStatus", {}).get("code") in (401, 403)
            for ref in [e.get("objectRef") or {}]
        ]

    # -- Nomad -------------------------------------------------------------------------

    def jobs(self, pool: str, *, live_only: bool = True, namespace: str = "") -> list[JSON]:
        key = f"{namespace or self.namespace}/{pool}"
        return [
            job
            for job in self.sim.job_list("*")
            if (job.get("Meta") or {}).get(META_POOL) == key
            and (not live_only or (job.get("Status") != "dead" and not job.get("Stop")))
        ]

    async def close(self) -> None:
        for replica in self.replicas:
            if replica.thread.is_alive():
                await replica.stop()
        await self.http.close()

    def remove_objects(self) -> None:
        """Nothing of this test stays where another test's operator could see it: its
        RunnerPools (finalizers dropped) and the cluster-scoped objects it installed."""
        for namespace in self.namespaces:
            status, listed = self.kube.request("GET", self.pool_path(namespace=namespace))
            assert status == 200, listed
            for item in listed["items"]:
                path = self.pool_path(item["metadata"]["name"], namespace=namespace)
                self.kube.request("PATCH", path, _NO_FINALIZERS, content_type=_MERGE)
                self.kube.request("DELETE", path)
        for collection, name in self._cluster_objects:
            self.kube.request("DELETE", f"{collection}/{name}")


_MERGE: Final = "application/merge-patch+json"
_NO_FINALIZERS: Final[Mapping[str, Any]] = {"metadata": {"finalizers": None}}


@pytest.fixture
async def cluster(crds: KubeCluster) -> AsyncIterator[Cluster]:
    namespace = crds.create_namespace()
    sim = Simulator(seed=0, start_delay=0.05)
    server = await start_sim(sim, host="127.0.0.1", port=0)
    world = Cluster(crds, namespace, sim, server)
    try:
        yield world
    finally:
        try:
            await world.close()
            await server.stop()
        finally:
            world.remove_objects()
    # RBAC is exercised by the real authorizer: no request of an operator was refused.
    if not world.forbidden_expected:
        refused = world.denied()
        assert not refused, f"requests the chart's RBAC does not allow: {refused[:5]}"
    if world.replicas:
        assert world.requests(), "the operator made no Kubernetes request"
