"""The chart installed with helm into a real kube-apiserver (tools/kube), upgraded and
uninstalled; and every value set of tests/chart/scenarios.py as the server takes it.

The cluster is this module's own: helm installs a chart's CRDs only where none exist, and
CRDs are cluster-wide (the session's cluster has them from the operator's tests). No
kubelet or controller-manager runs, so no pod starts: the objects are checked, not pods
(test_chart_on_node.py runs the pods, on a real node).
The Prometheus operator's ServiceMonitor and PrometheusRule CRDs are stand-ins written
for this test (monitoring-crds.yaml).
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import pytest
import yaml

from controller.lab import kube as kube_cluster
from controller.lab.kube import KubeCluster
from tests.chart.helm import CHART, NAMESPACE, RELEASE, Manifest, render, run_helm
from tests.chart.scenarios import SCENARIOS
from tests.chart.workloads import API, OPERATOR, container, deployment, env, pod

pytestmark = pytest.mark.slow

MONITORING_CRDS: Final = Path(__file__).with_name("monitoring-crds.yaml")
CHART_CRDS: Final = {
    "runnerpools.poolkeeper.dev": CHART / "crds" / "runnerpools.poolkeeper.dev.yaml",
}
EXAMPLES: Final = CHART.parents[1] / "examples" / "pools.yaml"
# docs/operator.md, "Upgrade, including the CRDs" (helm installs them on the first install
# only): the chart's CRDs, which helm created, taken over by the user's apply.
UPGRADE_CRDS: Final = ("apply", "--server-side", "--force-conflicts", "-f", str(CHART / "crds"))
POOLS: Final = "/apis/poolkeeper.dev/v1alpha1/runnerpools"
FINALIZER: Final = "poolkeeper.dev/finalizer"  # the operator's (controller/operator/options.py)

RELEASE_NS, TEAM_NS, MONITORING_NS = "poolkeeper", "team-b", "monitoring"
# Every optional object on: ServiceMonitors, PrometheusRule (in another namespace), the API
# tier with its HPA and PDB, the operator's PDB, NetworkPolicies, the Grafana dashboard,
# Poseidon's managed environments (their template ConfigMap), two watched namespaces,
# TLS, Nomad's TLS files and a Nomad token of the API tier's own.
EVERYTHING: Final[dict[str, Any]] = {
    "image": {"repository": "registry.example/poolkeeper", "tag": "0.1.0"},
    "watch": {"namespaces": [RELEASE_NS, TEAM_NS]},
    "api": {
        "autoscaling": {"enabled": True, "minReplicas": 2, "maxReplicas": 6},
        "nomadTokenSecret": "poolkeeper-nomad-api",
    },
    "serviceMonitor": {
        "enabled": True,
        "labels": {"release": "prometheus"},
        "tlsConfig": {"ca": {"secret": {"name": "poolkeeper-ca", "key": "ca.crt"}}},
    },
    "prometheusRule": {
        "enabled": True,
        "namespace": MONITORING_NS,
        "labels": {"release": "prometheus"},
        "alertLabels": {"team": "runners"},
        "runbookUrl": "https://git.example/poolkeeper/blob/main/docs/operator.md",
    },
    "podDisruptionBudget": {"enabled": True},
    "networkPolicy": {
        "enabled": True,
        "ingressFrom": [{"namespaceSelector": {"matchLabels": {"team": "platform"}}}],
    },
    "grafanaDashboard": {"enabled": True},
    "poseidon": {
        "enabled": True,
        "environments": "managed",
        "depletingThreshold": 0.25,
        "environmentTemplate": {
            "metadata": {"namespace": "codeocean"},
            "spec": {"maxRunners": 50, "claims": {"maxInactivityTimeoutSeconds": 1800}},
        },
    },
    "apiTls": {"secretName": "poolkeeper-api-tls"},
    "nomad": {"caCert": True, "clientCert": True, "namespace": "runners", "region": "eu"},
}
EVERYTHING_OBJECTS: Final = {
    ("Deployment", OPERATOR),
    ("Deployment", API),
    ("Service", OPERATOR),
    ("Service", f"{OPERATOR}-operator"),
    ("ServiceAccount", OPERATOR),
    ("ServiceAccount", API),
    ("Role", OPERATOR),
    ("RoleBinding", OPERATOR),
    ("PodDisruptionBudget", OPERATOR),
    ("PodDisruptionBudget", API),
    ("HorizontalPodAutoscaler", API),
    ("NetworkPolicy", OPERATOR),
    ("NetworkPolicy", API),
    ("ServiceMonitor", OPERATOR),
    ("ServiceMonitor", API),
    ("PrometheusRule", OPERATOR),
    ("ConfigMap", f"{OPERATOR}-dashboard"),
    ("ConfigMap", f"{OPERATOR}-poseidon"),
}
# The upgrade: fixed API replicas (the HPA goes), other resources and Secret names, one
# more operator replica, no dashboard.
UPGRADE: Final[dict[str, Any]] = {
    **EVERYTHING,
    "replicaCount": 3,
    "api": {
        "autoscaling": {"enabled": False},
        "replicas": 3,
        "resources": {
            "requests": {"cpu": "500m", "memory": "256Mi"},
            "limits": {"memory": "512Mi"},
        },
        "nomadTokenSecret": "poolkeeper-nomad-api-v2",
    },
    "apiTokens": {"secretName": "poolkeeper-api-tokens-v2"},
    "grafanaDashboard": {"enabled": False},
}


@pytest.fixture(scope="module")
def cluster(kube_bin_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeCluster]:
    """A cluster of this module's own, with the monitoring CRDs and no other."""
    workdir = tmp_path_factory.mktemp("kube-chart")
    with kube_cluster.kube_cluster(workdir=workdir, binaries=kube_bin_dir) as fresh:
        fresh.kubectl("apply", "-f", str(MONITORING_CRDS))
        fresh.kubectl(
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd/servicemonitors.monitoring.coreos.com",
            "crd/prometheusrules.monitoring.coreos.com",
        )
        yield fresh


def helm(cluster: KubeCluster, *args: str) -> str:
    """helm as the cluster's admin; its output (a failure fails the test)."""
    result = run_helm(*args, "--kubeconfig", str(cluster.admin_kubeconfig))
    assert result.returncode == 0, f"helm {args[0]}: {result.stderr}"
    assert "Warning" not in result.stderr and "unknown field" not in result.stderr, result.stderr
    return result.stdout


def deploy(cluster: KubeCluster, command: str, tmp_path: Path, values: Mapping[str, Any]) -> str:
    """``helm install`` or ``helm upgrade`` of the release with ``values``; the output."""
    path = tmp_path / f"values-{command}.yaml"
    path.write_text(yaml.safe_dump(dict(values)), encoding="utf-8")
    return helm(cluster, command, RELEASE, str(CHART), "-n", RELEASE_NS, "-f", str(path))


def manifest(cluster: KubeCluster) -> list[Manifest]:
    """The objects of the release's current revision, as helm rendered them."""
    rendered = helm(cluster, "get", "manifest", RELEASE, "-n", RELEASE_NS)
    return [doc for doc in yaml.safe_load_all(rendered) if doc]


def live(cluster: KubeCluster, manifests: Sequence[Manifest]) -> list[Manifest]:
    """The objects the server holds for ``manifests``, in their order (one kubectl call)."""
    listed = cluster.kubectl(
        "get", "-f", "-", "-o", "json", input=yaml.safe_dump_all(manifests)
    ).stdout
    items: list[Manifest] = json.loads(listed).get("items") or [json.loads(listed)]
    return items


def missing_from(rendered: Any, stored: Any, path: str = "") -> list[str]:
    """Where ``stored`` lacks or changed what ``rendered`` holds (the server may add)."""
    if isinstance(rendered, dict) and isinstance(stored, dict):
        return [
            problem
            for key, value in rendered.items()
            for problem in (
                missing_from(value, stored[key], f"{path}.{key}")
                if key in stored
                else [f"{path}.{key}: pruned"]
            )
        ]
    if isinstance(rendered, list) and isinstance(stored, list) and len(rendered) == len(stored):
        return [
            p
            for i, pair in enumerate(zip(rendered, stored, strict=True))
            for p in missing_from(*pair, f"{path}[{i}]")
        ]
    return [] if rendered == stored else [f"{path}: {rendered!r} stored as {stored!r}"]


def assert_stored_as_rendered(cluster: KubeCluster, manifests: Sequence[Manifest]) -> None:
    stored = live(cluster, manifests)
    problems = [
        f"{m['kind']}/{m['metadata']['name']}{problem}"
        for m, s in zip(manifests, stored, strict=True)
        for problem in missing_from(m, s)
    ]
    assert problems == []


def crd_versions(cluster: KubeCluster) -> dict[str, str]:
    """resourceVersion of each of the chart's CRDs that exists."""
    versions = {}
    for name in CHART_CRDS:
        status, crd = cluster.request(
            "GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}"
        )
        if status == 200:
            versions[name] = crd["metadata"]["resourceVersion"]
    return versions


def pool_versions(cluster: KubeCluster) -> dict[str, str]:
    """namespace/name -> resourceVersion of every RunnerPool."""
    status, listed = cluster.request("GET", POOLS)
    assert status == 200, listed
    return {
        f"{p['metadata']['namespace']}/{p['metadata']['name']}": p["metadata"]["resourceVersion"]
        for p in listed["items"]
    }


def notes_commands(notes: str) -> tuple[str, list[list[str]]]:
    """What the NOTES tell a user to run after the install: the pool of "Create a pool"
    (the heredoc) and the kubectl commands of "Scale it"."""
    heredoc = re.search(r"^kubectl apply -f - <<'YAML'\n(.*?)^YAML$", notes, re.M | re.S)
    scale = re.findall(r"^Scale it:\s+kubectl (.*)$", notes, re.M)
    assert heredoc and scale, notes
    return heredoc.group(1), [shlex.split(command) for command in scale]


def _key(manifest: Manifest) -> tuple[str, str, str]:
    return manifest["kind"], manifest["metadata"].get("namespace", ""), manifest["metadata"]["name"]


def _absent(cluster: KubeCluster, manifests: Sequence[Manifest]) -> bool:
    """None of ``manifests`` is on the server."""
    listed = cluster.kubectl(
        "get", "-f", "-", "-o", "name", "--ignore-not-found", input=yaml.safe_dump_all(manifests)
    )
    return listed.stdout.strip() == ""


def test_install_upgrade_and_uninstall_everything(cluster: KubeCluster, tmp_path: Path) -> None:
    assert crd_versions(cluster) == {}, "the chart's CRDs must not exist before the install"
    for namespace in (RELEASE_NS, TEAM_NS, MONITORING_NS):
        cluster.create_namespace(namespace)
    # The Secrets the NOTES and docs/operator.md ask the user to make: not the release's.
    user_secrets = ["poolkeeper-nomad", "poolkeeper-api-tokens", "poolkeeper-nomad-api"]
    for secret in user_secrets:
        cluster.kubectl(
            "create", "secret", "generic", secret, "-n", RELEASE_NS, "--from-literal=token=x"
        )

    # --- install: the CRDs, then every object, each stored as rendered -------------------
    notes = deploy(cluster, "install", tmp_path, EVERYTHING)
    crds = crd_versions(cluster)
    assert set(crds) == set(CHART_CRDS)
    cluster.wait_served(POOLS)
    for name, path in CHART_CRDS.items():
        shipped = [d for d in yaml.safe_load_all(path.read_text()) if d["metadata"]["name"] == name]
        assert_stored_as_rendered(cluster, shipped)
    installed = manifest(cluster)
    kinds = {(m["kind"], m["metadata"]["name"]) for m in installed}
    assert kinds == EVERYTHING_OBJECTS
    placed = {(m["kind"], m["metadata"].get("namespace")) for m in installed}
    assert {("Role", TEAM_NS), ("PrometheusRule", MONITORING_NS)} <= placed
    assert_stored_as_rendered(cluster, installed)
    assert deployment(live(cluster, installed))["spec"]["strategy"]["type"] == "RollingUpdate"

    # The NOTES' pool, as they say to create and scale it (a kubeconfig without a namespace).
    pool, scale_commands = notes_commands(notes)
    cluster.kubectl("apply", "-f", "-", input=pool)
    for command in scale_commands:
        cluster.kubectl(*command)
    status, created = cluster.request(
        "GET", f"/apis/poolkeeper.dev/v1alpha1/namespaces/{RELEASE_NS}/runnerpools/python-312"
    )
    assert status == 200 and created["spec"]["idleRunners"] == 10, created
    # More pools: the examples in the other watched namespace, one as the operator leaves a
    # pool it handles (with its finalizer).
    cluster.kubectl("apply", "-n", TEAM_NS, "-f", str(EXAMPLES))
    cluster.kubectl(
        "patch",
        "rpool",
        "java-21.temurin",
        "-n",
        TEAM_NS,
        "--type",
        "merge",
        "-p",
        json.dumps({"metadata": {"finalizers": [FINALIZER]}}),
    )
    pools = pool_versions(cluster)
    assert len(pools) == 4

    # --- upgrade as docs/operator.md says: the CRDs first, then the chart -----------------
    cluster.kubectl(*UPGRADE_CRDS)
    cluster.wait_served(POOLS)
    crds = crd_versions(cluster)
    deploy(cluster, "upgrade", tmp_path, UPGRADE)
    upgraded = manifest(cluster)
    assert {(m["kind"], m["metadata"]["name"]) for m in upgraded} == EVERYTHING_OBJECTS - {
        ("HorizontalPodAutoscaler", API),
        ("ConfigMap", f"{OPERATOR}-dashboard"),
    }
    assert_stored_as_rendered(cluster, upgraded)
    objects = live(cluster, upgraded)
    assert deployment(objects)["spec"]["replicas"] == 3
    assert deployment(objects, API)["spec"]["replicas"] == 3
    assert container(objects, API)["resources"] == UPGRADE["api"]["resources"]
    token_ref = env(container(objects, API))["NOMAD_TOKEN"]["secretKeyRef"]
    assert token_ref["name"] == "poolkeeper-nomad-api-v2"
    for tier in (OPERATOR, API):
        volumes = {v["name"]: v for v in pod(objects, tier)["volumes"]}
        secrets = {v["secret"]["secretName"] for v in volumes.values() if "secret" in v}
        assert "poolkeeper-api-tokens-v2" in secrets and "poolkeeper-api-tokens" not in secrets
    gone = set(map(_key, installed)) - set(map(_key, upgraded))
    assert gone == {
        ("HorizontalPodAutoscaler", RELEASE_NS, API),
        ("ConfigMap", RELEASE_NS, f"{OPERATOR}-dashboard"),
    }
    assert _absent(cluster, [m for m in installed if _key(m) in gone])
    assert crd_versions(cluster) == crds  # helm never upgrades a chart's CRDs
    assert pool_versions(cluster) == pools
    history = json.loads(helm(cluster, "history", RELEASE, "-n", RELEASE_NS, "-o", "json"))
    assert [(r["revision"], r["status"]) for r in history] == [(1, "superseded"), (2, "deployed")]

    # --- uninstall: what deletionPolicy and the docs promise stays -----------------------
    helm(cluster, "uninstall", RELEASE, "-n", RELEASE_NS)
    assert _absent(cluster, upgraded)
    assert crd_versions(cluster) == crds  # the CRDs stay, unchanged
    assert pool_versions(cluster) == pools  # every RunnerPool stays, unchanged
    left = cluster.kubectl("get", "secrets", "-n", RELEASE_NS, "-o", "name").stdout.split()
    assert sorted(left) == sorted(f"secret/{s}" for s in user_secrets)  # no release record
    # A pool deleted with no operator left keeps its finalizer: Terminating (docs/operator.md).
    cluster.kubectl("delete", "rpool", "java-21.temurin", "-n", TEAM_NS, "--wait=false")
    status, terminating = cluster.request(
        "GET", f"/apis/poolkeeper.dev/v1alpha1/namespaces/{TEAM_NS}/runnerpools/java-21.temurin"
    )
    assert status == 200, terminating
    assert terminating["metadata"]["deletionTimestamp"]
    assert terminating["metadata"]["finalizers"] == [FINALIZER]


# --- every documented value set, as the server takes it ----------------------------------


@pytest.fixture(scope="module")
def scenario_cluster(cluster: KubeCluster) -> KubeCluster:
    """The cluster with the chart's CRDs and the namespaces the scenarios render for."""
    cluster.kubectl(*UPGRADE_CRDS)
    cluster.wait_served(POOLS)
    for namespace in (NAMESPACE, "team-a", "team-b"):
        status, answer = cluster.request(
            "POST", "/api/v1/namespaces", {"metadata": {"name": namespace}}
        )
        assert status in (201, 409), answer  # 409: made by the install test
    return cluster


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_scenario_is_accepted_by_the_server(
    scenario_cluster: KubeCluster, scenario: str
) -> None:
    """``helm template | kubectl apply --dry-run=server``: kubectl's strict field
    validation refuses a field the server does not know, and admission and the server's
    own validation run."""
    manifests = [m for m in render(SCENARIOS[scenario]) if m["kind"] != "CustomResourceDefinition"]
    result = scenario_cluster.kubectl(
        "apply", "--dry-run=server", "-f", "-", input=yaml.safe_dump_all(manifests), check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("(server dry run)") == len(manifests), result.stdout
