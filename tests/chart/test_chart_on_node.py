"""The chart's pods on a real node: the image built here (scripts/build-image.sh), the
chart installed with helm into a cluster with a kubelet, containerd, kube-proxy and the
controllers (controller/lab/node.py), and the Nomad simulator on the host, which the pods
reach at the node's address. What a user's first ``helm install`` does, step by step:

1. the operator's and the API tier's pods Running and Ready through the chart's own probes,
   as 10001:10001 on a read-only root filesystem, the operator with its ServiceAccount's
   token and the API pods with none;
2. a RunnerPool applied with kubectl is filled in Nomad, its status written by a pod;
3. claims, an execution and a release through the API Service, which the test reaches as
   any client in the cluster would: its ClusterIP, through kube-proxy's rules; the NOTES'
   port-forward too; a changed API token Secret taken by the pods without a restart;
4. an API pod deleted during a stream of claims: no claim lost beyond those in flight;
5. ``helm upgrade`` to a new image tag: the pods roll one by one, the PDBs never broken,
   claims streaming meanwhile and none lost;
6. ``kubectl drain`` of the one node: one pod of each tier evicted, the rest kept by the
   PDBs until the drain gives up; claims still served; ``uncordon`` brings it back;
7. ``helm uninstall`` leaves what deletionPolicy promises: a pool deleted before it was
   drained by a pod; the pool left in place keeps its runners, its claims and its object.

The steps run in this order on one release (each leaves it serving for the next).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import select
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import pytest
import yaml

from controller.lab import image as images
from controller.lab.node import KubeNode
from tests.chart.helm import CHART, run_helm
from tests.support.ports import free_port

pytestmark = pytest.mark.slow

NAMESPACE: Final = "poolkeeper"
RELEASE: Final = "poolkeeper"
TOKEN: Final = "node-test-token"
OPERATOR: Final = "app.kubernetes.io/name=poolkeeper,app.kubernetes.io/instance=poolkeeper"
API: Final = "app.kubernetes.io/name=poolkeeper-api,app.kubernetes.io/instance=poolkeeper"
TIERS: Final = {"operator": OPERATOR, "api": API}
POOL: Final = "python-312"  # the NOTES' pool
RUNNERS: Final = "/apis/poolkeeper.dev/v1alpha1/namespaces/poolkeeper/runnerpools"
FINALIZER: Final = "poolkeeper.dev/finalizer"
TOKEN_DIR: Final = "/var/run/secrets/kubernetes.io/serviceaccount"  # where kubelet mounts it
# Every tier keeps one ready pod through a voluntary disruption (the chart's defaults).
MIN_AVAILABLE: Final = 1


@dataclass
class Release:
    """The installed release and what the test reaches it by."""

    node: KubeNode
    image: str
    sim_url: str  # the simulator, at the node's address
    service_url: str = ""  # the API Service's ClusterIP
    helm_args: tuple[str, ...] = ()
    workdir: Path = Path()
    token: str = TOKEN  # the API token the clients present

    # --- Kubernetes ----------------------------------------------------------------------

    def kubectl(self, *args: str, check: bool = True, timeout: float = 120.0) -> str:
        return self.node.cluster.kubectl(*args, check=check, timeout=timeout).stdout

    def get(self, path: str) -> Any:
        status, body = self.node.cluster.request("GET", path)
        assert status == 200, f"GET {path}: {status} {body}"
        return body

    def pods(self, selector: str) -> list[dict[str, Any]]:
        listed = self.get(f"/api/v1/namespaces/{NAMESPACE}/pods?labelSelector={selector}")
        return list(listed["items"])

    def ready_pods(self, selector: str) -> list[str]:
        return [p["metadata"]["name"] for p in self.pods(selector) if _ready(p)]

    def helm(self, *args: str, timeout: float = 300.0) -> str:
        result = run_helm(
            *args, "--kubeconfig", str(self.node.cluster.admin_kubeconfig), timeout=timeout
        )
        assert result.returncode == 0, f"helm {args[0]}: {result.stderr}"
        return result.stdout

    def pool(self, name: str = POOL) -> dict[str, Any]:
        return dict(self.get(f"{RUNNERS}/{name}"))

    # --- the API, through its Service ----------------------------------------------------

    def api(self, method: str, path: str, body: Any = None, timeout: float = 30.0) -> Any:
        status, answer = _call(self.service_url, self.token, method, path, body, timeout)
        assert 200 <= status < 300, f"{method} {path}: {status} {answer}"
        return answer

    # --- Nomad (the simulator) -------------------------------------------------------------

    def nomad(self, path: str) -> Any:
        with urllib.request.urlopen(self.sim_url + path, timeout=10) as response:
            return json.loads(response.read())

    def live_jobs(self, pool: str = POOL) -> set[str]:
        jobs = self.nomad("/v1/jobs?meta=true")
        return {
            job["ID"]
            for job in jobs
            if (job.get("Meta") or {}).get("poolkeeper_pool") == f"{NAMESPACE}/{pool}"
            and job["Status"] != "dead"
            and not job["Stop"]
        }

    def claims_in_nomad(self) -> dict[str, str]:
        """runner id -> the state of its claim record (claimed, released, ...)."""
        listed = self.nomad("/v1/vars?prefix=poolkeeper/claims/")
        return {
            var["Path"].rsplit("/", 1)[1]: self.nomad(f"/v1/var/{var['Path']}")["Items"]["state"]
            for var in listed
        }


def _ready(pod: dict[str, Any]) -> bool:
    conditions = pod.get("status", {}).get("conditions") or []
    return pod["metadata"].get("deletionTimestamp") is None and any(
        c["type"] == "Ready" and c["status"] == "True" for c in conditions
    )


def _call(
    base: str, token: str, method: str, path: str, body: Any, timeout: float
) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(base + path, data=data, method=method)
    request.add_header("Authorization", f"Bearer {token}")
    if data is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            status, raw = int(response.status), response.read()
    except urllib.error.HTTPError as error:
        status, raw = error.code, error.read()
    try:
        return status, json.loads(raw) if raw else None
    except ValueError:
        return status, raw.decode(errors="replace")


def wait(check: Callable[[], bool], within: float, what: str) -> None:
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, f"timed out after {within} s waiting for {what}"
        time.sleep(0.2)


# --- a stream of claims ------------------------------------------------------------------------


@dataclass
class Outcome:
    started: float
    ended: float
    status: int = 0  # 0: no answer (the connection failed or timed out)
    runner: str = ""
    error: str = ""


@dataclass
class ClaimStream:
    """Clients claiming runners through the Service, ``workers`` at a time, one claim each
    ``pause`` seconds, until stopped (at most ``limit`` claims)."""

    release: Release
    workers: int = 3
    pause: float = 0.25
    limit: int = 150
    outcomes: list[Outcome] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _pool: concurrent.futures.ThreadPoolExecutor | None = None

    def _client(self) -> None:
        while not self._stop.is_set() and len(self.outcomes) < self.limit:
            outcome = Outcome(time.monotonic(), 0.0)
            try:
                status, answer = _call(
                    self.release.service_url,
                    self.release.token,
                    "POST",
                    f"/v1/pools/{NAMESPACE}/{POOL}/claims",
                    {"inactivityTimeoutSeconds": 900},
                    10.0,
                )
                outcome.status = status
                if status == 201:
                    outcome.runner = answer["runnerId"]
                else:
                    outcome.error = str(answer)
            except OSError as error:
                outcome.error = repr(error)
            outcome.ended = time.monotonic()
            self.outcomes.append(outcome)
            self._stop.wait(self.pause)

    @contextlib.contextmanager
    def running(self) -> Iterator[ClaimStream]:
        self._pool = concurrent.futures.ThreadPoolExecutor(self.workers)
        futures = [self._pool.submit(self._client) for _ in range(self.workers)]
        try:
            yield self
        finally:
            self._stop.set()
            for future in futures:
                future.result(timeout=60)
            self._pool.shutdown()

    @property
    def told(self) -> set[str]:
        return {o.runner for o in self.outcomes if o.runner}

    @property
    def unanswered(self) -> list[Outcome]:
        """Claims whose outcome the client does not know: no answer, or a server error."""
        return [o for o in self.outcomes if o.status == 0 or o.status >= 500]

    def settle(self) -> dict[str, int]:
        """Check that no claim was lost beyond those in flight and give every claimed runner
        back; the counts."""
        held = {r for r, state in self.release.claims_in_nomad().items() if state == "claimed"}
        told = self.told
        # Every claim a client was told about is held in Nomad...
        assert told <= held, f"claims answered but not held: {told - held}"
        # ...and a runner held without its client knowing is one per claim in flight that
        # got no answer (none when every request was answered).
        unknown = held - told
        assert len(unknown) <= len(self.unanswered), (unknown, self.unanswered)
        for runner in held:
            self.release.api("DELETE", f"/v1/runners/{runner}")
        return {
            "claims": len(self.outcomes),
            "answered": len(told),
            "unanswered": len(self.unanswered),
            "held unknown": len(unknown),
        }


# --- the release --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sim(kube_node: KubeNode, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``poolkeeper sim`` on the host, at the node's address (which the pods reach)."""
    address = f"{kube_node.address}:{free_port()}"
    log = tmp_path_factory.mktemp("sim") / "sim.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "controller", "sim", "--listen", address, "--exec", "local"],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    url = f"http://{address}"

    def answers() -> bool:
        assert process.poll() is None, log.read_text()
        try:
            with urllib.request.urlopen(url + "/v1/jobs", timeout=2):
                return True
        except OSError:
            return False

    try:
        wait(answers, 60, "the simulator")
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)


@pytest.fixture(scope="module")
def release(
    kube_node: KubeNode, poolkeeper_image: str, sim: str, tmp_path_factory: pytest.TempPathFactory
) -> Release:
    repository, tag = poolkeeper_image.rsplit(":", 1)
    deployed = Release(kube_node, poolkeeper_image, sim, workdir=tmp_path_factory.mktemp("rel"))
    deployed.kubectl("create", "namespace", NAMESPACE)
    deployed.kubectl(
        "-n", NAMESPACE, "create", "secret", "generic", "poolkeeper-nomad",
        f"--from-literal=address={sim}",
    )  # fmt: skip
    deployed.kubectl(
        "-n", NAMESPACE, "create", "secret", "generic", "poolkeeper-api-tokens",
        f"--from-literal=tokens={TOKEN}",
    )  # fmt: skip
    deployed.helm_args = ("--set", f"image.repository={repository}", "--set", f"image.tag={tag}")
    return deployed


# --- the steps ------------------------------------------------------------------------------


def test_pods_run_the_image_and_are_ready_through_their_probes(release: Release) -> None:
    started = time.monotonic()
    release.helm(
        "install", RELEASE, str(CHART), "-n", NAMESPACE, *release.helm_args,
        "--wait", "--timeout", "180s",
    )  # fmt: skip
    print(f"helm install --wait: {time.monotonic() - started:.1f} s")
    for tier, selector in TIERS.items():
        pods = release.pods(selector)
        assert len(pods) == 2 and all(_ready(p) for p in pods), (tier, pods)
        for pod in pods:
            (status,) = pod["status"]["containerStatuses"]
            assert status["ready"] and status["restartCount"] == 0, status
            assert status["image"] == release.image
            name = pod["metadata"]["name"]
            # The chart's security context, as the container runs it.
            ids = release.kubectl("-n", NAMESPACE, "exec", name, "--", "id")
            assert ids.startswith("uid=10001(poolkeeper) gid=10001(poolkeeper) "), ids
            read_only = release.node.cluster.kubectl(
                "-n", NAMESPACE, "exec", name, "--", "touch", "/opt/poolkeeper/x", check=False
            )
            assert "Read-only file system" in read_only.stderr, read_only
            writes = release.kubectl("-n", NAMESPACE, "exec", name, "--", "touch", "/tmp/x")
            assert writes == ""
            # The operator reads its ServiceAccount's token; the API pods have none.
            listed = ("-n", NAMESPACE, "exec", name, "--", "ls", TOKEN_DIR)
            token = release.kubectl(*listed, check=False)
            assert ("token" in token.split()) == (tier == "operator"), (tier, token)
    # The Service's endpoints are the API pods, reached through kube-proxy at its ClusterIP.
    service = release.get(f"/api/v1/namespaces/{NAMESPACE}/services/{RELEASE}")
    release.service_url = f"http://{service['spec']['clusterIP']}:8080"
    status, ready = _call(release.service_url, release.token, "GET", "/readyz", None, 10)
    assert status == 200 and ready["status"] == "ready", ready


def test_a_pool_applied_with_kubectl_is_filled_and_its_status_written_by_a_pod(
    release: Release,
) -> None:
    manifest = {
        "apiVersion": "poolkeeper.dev/v1alpha1",
        "kind": "RunnerPool",
        "metadata": {"name": POOL, "namespace": NAMESPACE},
        "spec": {"idleRunners": 20, "maxRunners": 200, "runner": {"image": "python:3.12-slim"}},
    }
    release.node.cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(manifest))
    wait(lambda: len(release.live_jobs()) == 20, 60, "20 runner jobs in Nomad")

    def reported() -> bool:
        status = release.pool().get("status") or {}
        return status.get("idleRunners") == 20 and any(
            c["type"] == "Ready" and c["status"] == "True" for c in status.get("conditions", [])
        )

    wait(reported, 60, "the pool's status: 20 idle, Ready")
    writer = release.pool()["status"]["reconciledBy"]
    assert writer in release.ready_pods(OPERATOR), writer


def test_claims_an_execution_and_a_release_through_the_service(release: Release) -> None:
    claim = release.api(
        "POST", f"/v1/pools/{NAMESPACE}/{POOL}/claims", {"inactivityTimeoutSeconds": 300}
    )
    runner = claim["runnerId"]
    assert release.claims_in_nomad()[runner] == "claimed"
    executed = release.api(
        "POST", f"/v1/runners/{runner}/executions", {"command": "echo from-a-pod", "wait": True}
    )
    assert executed["exitCode"] == 0 and executed["stdout"] == "from-a-pod\n", executed
    release.api("DELETE", f"/v1/runners/{runner}")
    assert release.claims_in_nomad()[runner] == "released"


def test_the_notes_port_forward_reaches_the_api(release: Release) -> None:
    """The NOTES' way in: `kubectl -n poolkeeper port-forward svc/poolkeeper 8080:8080`
    (the API server, then the kubelet, then the pod's network namespace)."""
    port = free_port()
    forward = subprocess.Popen(
        [
            str(release.node.cluster.bin_dir / "kubectl"),
            "--kubeconfig", str(release.node.cluster.admin_kubeconfig),
            "-n", NAMESPACE, "port-forward", f"svc/{RELEASE}", f"{port}:8080",
        ],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        assert forward.stdout is not None
        readable, _, _ = select.select([forward.stdout], [], [], 60)
        assert readable, "kubectl port-forward said nothing in 60 s"
        assert forward.stdout.readline().startswith("Forwarding from 127.0.0.1:")
        status, ready = _call(f"http://127.0.0.1:{port}", release.token, "GET", "/readyz", None, 10)
        assert status == 200 and ready["status"] == "ready", ready
    finally:
        forward.terminate()
        forward.wait(timeout=30)


def test_a_changed_token_secret_is_read_again_by_the_pods(release: Release) -> None:
    """The kubelet updates a Secret's volume by swapping a symlink (..data), not by writing
    the file: the pods take the new token and refuse the old one, without a restart."""
    new = "node-test-token-rotated"
    rotated = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "poolkeeper-api-tokens", "namespace": NAMESPACE},
        "stringData": {"tokens": f"{new}\n"},
    }
    release.node.cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(rotated))

    def answers(token: str) -> int:
        request = urllib.request.Request(release.service_url + "/v1/pools")
        request.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return int(response.status)
        except urllib.error.HTTPError as error:
            return error.code

    def every_pod_rotated() -> bool:  # a few tries: the Service picks a pod per connection
        return all(answers(new) == 200 and answers(TOKEN) == 401 for _ in range(6))

    wait(every_pod_rotated, 120, "the new token taken and the old one refused")
    restarts = [
        s["restartCount"] for p in release.pods(API) for s in p["status"]["containerStatuses"]
    ]
    assert restarts == [0, 0]
    release.token = new


def test_an_api_pod_deleted_during_a_stream_of_claims_loses_none(release: Release) -> None:
    victim = release.ready_pods(API)[0]
    with ClaimStream(release).running() as stream:
        time.sleep(3)
        release.kubectl("-n", NAMESPACE, "delete", "pod", victim, "--wait=false")
        wait(lambda: len(release.ready_pods(API)) == 2 and victim not in release.ready_pods(API),
             90, "a new API pod ready")  # fmt: skip
        time.sleep(3)
    counts = stream.settle()
    print(f"API pod {victim} deleted during a stream of claims: {counts}")
    assert counts["answered"] > 0


def test_helm_upgrade_to_a_new_tag_rolls_the_pods_with_the_pdbs_honoured(release: Release) -> None:
    repository, tag = release.image.rsplit(":", 1)
    rolled = f"{repository}:{tag}-rolled"
    images.tag(release.image, rolled)
    release.node.load_image(rolled)
    before = {tier: set(release.ready_pods(selector)) for tier, selector in TIERS.items()}
    with Watch(release).running() as watch, ClaimStream(release).running() as stream:
        release.helm(
            "upgrade", RELEASE, str(CHART), "-n", NAMESPACE, "--reuse-values",
            "--set", f"image.tag={tag}-rolled", "--wait", "--timeout", "300s",
        )  # fmt: skip
    for tier, selector in TIERS.items():  # the old pods' graceful stop ends
        wait(_exactly_two(release, selector), 90, f"the old {tier} pods gone")
    after = {tier: release.pods(selector) for tier, selector in TIERS.items()}
    for tier, pods in after.items():
        assert len(pods) == 2 and all(_ready(p) for p in pods), (tier, pods)
        assert {p["spec"]["containers"][0]["image"] for p in pods} == {rolled}
        assert not before[tier] & {p["metadata"]["name"] for p in pods}, "a pod was not rolled"
        # The rollout (maxSurge 1, maxUnavailable 0) never left fewer ready pods than
        # replicas, nor the PDB fewer healthy pods than it wants.
        assert watch.fewest_ready[tier] >= 2, watch.fewest_ready
    assert watch.broken_budgets == [], watch.broken_budgets
    counts = stream.settle()
    print(f"helm upgrade: fewest ready {watch.fewest_ready}; claims {counts}")
    wait(lambda: release.pool()["status"]["reconciledBy"] in release.ready_pods(OPERATOR),
         60, "the pool reconciled by a new operator pod")  # fmt: skip
    release.image = rolled


def test_a_drain_of_the_node_is_held_by_the_pdbs(release: Release) -> None:
    """One node: the drain evicts one pod of each tier, whose replacement cannot be
    scheduled anywhere (the node is cordoned), and the PDBs keep the other until the drain
    gives up. Claims are served meanwhile."""
    with Watch(release).running() as watch, ClaimStream(release, pause=1.0).running() as stream:
        drain = release.node.cluster.kubectl(
            "drain", release.node.name, "--ignore-daemonsets", "--delete-emptydir-data",
            "--timeout", "30s", check=False, timeout=120,
        )  # fmt: skip
    print(f"kubectl drain exited {drain.returncode}:\n{drain.stderr[-1500:]}")
    assert drain.returncode != 0
    assert "would violate the pod's disruption budget" in drain.stderr
    for tier, selector in TIERS.items():
        pods = release.pods(selector)
        ready = [p for p in pods if _ready(p)]
        pending = [p for p in pods if p["status"]["phase"] == "Pending"]
        assert len(ready) == MIN_AVAILABLE and len(pending) == 1, (tier, pods)
        assert watch.fewest_ready[tier] >= MIN_AVAILABLE, watch.fewest_ready
    assert watch.broken_budgets == [], watch.broken_budgets
    counts = stream.settle()
    print(f"kubectl drain: fewest ready {watch.fewest_ready}; claims {counts}")
    assert counts["unanswered"] == 0
    # The evicted operator pod handed its leases over: the one left reconciles the pool.
    wait(lambda: release.pool()["status"]["reconciledBy"] in release.ready_pods(OPERATOR),
         60, "the pool reconciled by the operator pod left")  # fmt: skip
    release.kubectl("uncordon", release.node.name)
    for tier, selector in TIERS.items():
        wait(_exactly_two(release, selector), 120, f"2 {tier} pods ready")


def test_helm_uninstall_leaves_what_deletion_policy_promises(release: Release) -> None:
    # A pool deleted while the operator runs is drained by it (deletionPolicy: Drain)...
    drained = {
        "apiVersion": "poolkeeper.dev/v1alpha1",
        "kind": "RunnerPool",
        "metadata": {"name": "short-lived", "namespace": NAMESPACE},
        "spec": {"idleRunners": 3, "runner": {"image": "python:3.12-slim"}},
    }
    release.node.cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(drained))
    wait(lambda: len(release.live_jobs("short-lived")) == 3, 60, "short-lived's 3 runners")
    release.kubectl("-n", NAMESPACE, "delete", "rpool", "short-lived", "--timeout", "60s")
    assert release.live_jobs("short-lived") == set()
    # ...and the one still defined at the uninstall keeps everything: its runners, its claim.
    claim = release.api(
        "POST", f"/v1/pools/{NAMESPACE}/{POOL}/claims", {"inactivityTimeoutSeconds": 900}
    )
    wait(lambda: len(release.live_jobs()) == 21, 60, "the pool refilled")
    jobs, pool = release.live_jobs(), release.pool()
    release.helm("uninstall", RELEASE, "-n", NAMESPACE, "--wait", "--timeout", "120s")
    wait(lambda: not release.pods(OPERATOR) and not release.pods(API), 120, "the pods gone")
    assert release.live_jobs() == jobs
    assert release.claims_in_nomad()[claim["runnerId"]] == "claimed"
    kept = release.pool()
    assert kept["metadata"]["finalizers"] == [FINALIZER]
    assert kept["metadata"].get("deletionTimestamp") is None
    assert kept["spec"] == pool["spec"]
    secrets = release.kubectl("-n", NAMESPACE, "get", "secrets", "-o", "name").split()
    assert sorted(secrets) == ["secret/poolkeeper-api-tokens", "secret/poolkeeper-nomad"]


def _exactly_two(release: Release, selector: str) -> Callable[[], bool]:
    """The tier has its two pods, both ready, and no other (none stopping)."""

    def check() -> bool:
        pods = release.pods(selector)
        return len(pods) == 2 and all(_ready(p) for p in pods)

    return check


@dataclass
class Watch:
    """Samples the tiers' ready pods and their PodDisruptionBudgets while a step runs."""

    release: Release
    fewest_ready: dict[str, int] = field(default_factory=dict)
    broken_budgets: list[tuple[str, int, int]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def _sample(self) -> None:
        while not self._stop.is_set():
            for tier, selector in TIERS.items():
                ready = len(self.release.ready_pods(selector))
                self.fewest_ready[tier] = min(self.fewest_ready.get(tier, ready), ready)
            budgets = self.release.get(
                f"/apis/policy/v1/namespaces/{NAMESPACE}/poddisruptionbudgets"
            )
            for budget in budgets["items"]:
                status = budget.get("status") or {}
                healthy, wanted = status.get("currentHealthy", 0), status.get("desiredHealthy", 0)
                if healthy < wanted:
                    self.broken_budgets.append((budget["metadata"]["name"], healthy, wanted))
            self._stop.wait(0.2)

    @contextlib.contextmanager
    def running(self) -> Iterator[Watch]:
        thread = threading.Thread(target=self._sample, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            thread.join(30)
