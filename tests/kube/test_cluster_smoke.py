"""The test cluster itself: a real kube-apiserver (with etcd) of the built release, kubectl
against it, RBAC for ServiceAccount tokens, and a teardown that leaves nothing running."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from controller.lab import kube as kube_cluster
from controller.lab.kube import KubeCluster, KubeClusterError

pytestmark = pytest.mark.slow

POD_READER_ROLE = """\
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: pod-reader, namespace: {namespace}}}
rules:
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: robot-reads-pods, namespace: {namespace}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: pod-reader}}
subjects:
- {{kind: ServiceAccount, name: robot, namespace: {namespace}}}
"""


def test_apiserver_serves_the_built_release(kube: KubeCluster) -> None:
    status, version = kube.request("GET", "/version")
    assert status == 200
    assert version["gitVersion"] == kube_cluster.release()
    assert kube.timings.apiserver > 0


def test_kubectl_reports_client_and_server_release(kube: KubeCluster) -> None:
    versions = json.loads(kube.kubectl("version", "-o", "json").stdout)
    assert versions["clientVersion"]["gitVersion"] == kube_cluster.release()
    assert versions["serverVersion"]["gitVersion"] == kube_cluster.release()


def test_kubectl_creates_a_namespace(kube: KubeCluster) -> None:
    kube.kubectl("create", "namespace", "smoke-kubectl")
    phase = kube.kubectl("get", "namespace", "smoke-kubectl", "-o", "jsonpath={.status.phase}")
    assert phase.stdout == "Active"
    name = kube.create_namespace()
    named = kube.kubectl("get", "namespace", name, "-o", "name")
    assert named.stdout.strip() == f"namespace/{name}"


def test_admin_may_do_anything_and_a_stranger_nothing(kube: KubeCluster) -> None:
    assert kube.kubectl("auth", "can-i", "*", "*", "--all-namespaces").stdout.strip() == "yes"
    stranger = kube.user_kubeconfig("stranger", ["testers"])
    answer = kube.kubectl("auth", "can-i", "list", "pods", kubeconfig=stranger, check=False)
    assert (answer.returncode, answer.stdout.strip()) == (1, "no")


def test_service_account_token_is_authorized_by_rbac(kube: KubeCluster) -> None:
    namespace, elsewhere = kube.create_namespace(), kube.create_namespace()
    token = kube.service_account_token(namespace, "robot")
    pods = f"/api/v1/namespaces/{namespace}/pods"

    status, answer = kube.request("GET", pods, token=token)
    assert status == 403, answer
    assert answer["reason"] == "Forbidden"
    assert f"system:serviceaccount:{namespace}:robot" in answer["message"]

    kube.kubectl("apply", "-f", "-", input=POD_READER_ROLE.format(namespace=namespace))
    # The authorizer reads RBAC objects from an informer: a binding takes effect shortly after.
    deadline = time.monotonic() + 15
    while (status := kube.request("GET", pods, token=token)[0]) == 403:
        assert time.monotonic() < deadline, "the RoleBinding never took effect"
        time.sleep(0.1)
    assert status == 200
    assert kube.request("GET", f"/api/v1/namespaces/{elsewhere}/pods", token=token)[0] == 403

    config = kube.service_account_kubeconfig(namespace, "robot")
    listed = kube.kubectl("get", "pods", kubeconfig=config)
    assert "No resources found" in listed.stderr
    denied = kube.kubectl("get", "secrets", kubeconfig=config, check=False)
    assert denied.returncode == 1
    assert "Forbidden" in denied.stderr


def test_service_account_requests_are_in_the_audit_log(kube: KubeCluster) -> None:
    assert kube.audit_log is not None  # tests/conftest.py's policy
    start = kube.audit_log.stat().st_size
    namespace = kube.create_namespace()
    token = kube.service_account_token(namespace, "robot")
    assert kube.request("GET", f"/api/v1/namespaces/{namespace}/secrets", token=token)[0] == 403
    logged = [
        (e["verb"], e["objectRef"]["resource"], e["responseStatus"]["code"])
        for e in kube.audit_events(start)
        if e["user"]["username"] == f"system:serviceaccount:{namespace}:robot"
    ]
    assert logged == [("list", "secrets", 403)]  # admin's own requests are not logged


def test_unauthenticated_requests_are_refused(kube: KubeCluster) -> None:
    status, _ = kube.request("GET", "/api/v1/namespaces", token="not-a-token")
    assert status == 401


def _processes_mentioning(text: str) -> list[int]:
    """Live processes whose command line contains ``text`` (their workdir, say)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if text in cmdline and state != "Z":
            found.append(int(entry.name))
    return found


def _group_exists(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def test_stop_leaves_nothing_running(kube_bin_dir: Path, tmp_path: Path) -> None:
    with kube_cluster.kube_cluster(workdir=tmp_path, binaries=kube_bin_dir) as cluster:
        assert cluster.running()
        groups = cluster.pids()
        assert len(_processes_mentioning(str(tmp_path))) == 2
        assert cluster.request("GET", "/readyz")[0] == 200
    assert not cluster.running()
    assert _processes_mentioning(str(tmp_path)) == []
    assert not any(_group_exists(pgid) for pgid in groups)
    cluster.stop()  # a second stop is harmless


def test_a_failed_start_leaves_nothing_running(kube_bin_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(KubeClusterError, match="no-such-flag"):
        kube_cluster.start_cluster(
            workdir=tmp_path, binaries=kube_bin_dir, extra_apiserver_args=["--no-such-flag"]
        )
    assert _processes_mentioning(str(tmp_path)) == []
