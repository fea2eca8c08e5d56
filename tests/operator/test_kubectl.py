"""kubectl against the real API server: the CRD and the example pools as a user applies
them, the printer columns, scale, describe and server-side apply.

The kubectl is the one tools/kube builds, of the server's release (the machine's own, if
any, is never used): client-side validation uses the server's OpenAPI documents.
"""

from __future__ import annotations

import asyncio

import pytest

from controller.lab import kube as kube_cluster
from tests.operator.conftest import CRD_FILE, CRD_NAME, GROUP, PLURAL, ROOT, VERSION, Cluster
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow

EXAMPLES = ROOT / "examples" / "pools.yaml"
EXAMPLE_NAMES = {"python-312", "java-21.temurin", "node-22-web"}


async def kubectl(cluster: Cluster, *args: str, stdin: str | None = None) -> tuple[int, str]:
    """The built kubectl as admin, off the event loop (the simulator runs on it)."""
    result = await asyncio.to_thread(cluster.kube.kubectl, *args, check=False, input=stdin)
    return result.returncode, result.stdout + result.stderr


async def test_kubectl_applies_the_crd_and_the_example_pools(cluster: Cluster) -> None:
    code, out = await kubectl(cluster, "version", "-o", "json")
    assert code == 0 and out.count(f'"gitVersion": "{kube_cluster.release()}"') == 2, out

    code, out = await kubectl(cluster, "apply", "-f", str(CRD_FILE))
    assert code == 0 and f"customresourcedefinition.apiextensions.k8s.io/{CRD_NAME}" in out
    await cluster.start_operator("--namespace", cluster.namespace)
    ns = ("-n", cluster.namespace)
    code, out = await kubectl(cluster, "apply", *ns, "-f", str(EXAMPLES))
    assert code == 0, out
    assert out.count("created") == 3, out

    def all_ready() -> bool:
        return all(
            (cluster.condition(name, "Ready") or {}).get("status") == "True"
            for name in EXAMPLE_NAMES
        )

    await wait_until(all_ready, within=20, what="the example pools to be Ready")
    code, out = await kubectl(cluster, "get", "rpool", *ns)
    assert code == 0, out
    header, *rows = out.strip().splitlines()
    assert header.split() == ["NAME", "DESIRED", "IDLE", "STARTING", "CLAIMED", "READY", "AGE"]
    row = next(r.split() for r in rows if r.startswith("python-312 "))
    assert row[1:6] == ["5", "5", "0", "0", "True"], out

    code, out = await kubectl(cluster, "scale", "rpool", "python-312", "--replicas=2", *ns)
    assert code == 0 and "scaled" in out, out
    await wait_until(lambda: len(cluster.jobs("python-312")) == 2, what="the scale-down")
    await cluster.until_condition("python-312", "Progressing", reason="Stable")

    code, out = await kubectl(cluster, "describe", "rpool", "python-312", *ns)
    assert code == 0, out
    described = [line.split() for line in out.splitlines()]
    assert ["Kind:", "RunnerPool"] in described, out
    assert ["Idle", "Runners:", "2"] in described, out  # the spec and the status say 2
    assert ["Type:", "Ready"] in described, out

    code, out = await kubectl(
        cluster,
        "apply",
        *ns,
        "-f",
        "-",
        stdin=(
            "apiVersion: poolkeeper.dev/v1alpha1\nkind: RunnerPool\n"
            "metadata: {name: too-big}\n"
            "spec: {idleRunners: 5, maxRunners: 2, runner: {image: busybox}}\n"
        ),
    )
    assert code != 0 and "idleRunners must not be greater than maxRunners" in out, out

    code, out = await kubectl(cluster, "delete", "rpool", "java-21.temurin", *ns, "--wait=true")
    assert code == 0, out
    assert cluster.pool("java-21.temurin") is None
    assert cluster.jobs("java-21.temurin") == []


async def test_the_example_pools_apply_to_the_namespace_given(cluster: Cluster) -> None:
    """docs/operator.md, step 4: `kubectl apply -f examples/pools.yaml -n poolkeeper`; and
    by server-side apply, where applying again changes nothing."""
    code, out = await kubectl(cluster, "apply", "-f", str(EXAMPLES), "-n", cluster.namespace)
    assert code == 0 and out.count("created") == 3, out
    assert versions(cluster, cluster.namespace).keys() == EXAMPLE_NAMES

    elsewhere = cluster.create_namespace()
    applied = []
    for _ in range(2):
        code, out = await kubectl(
            cluster, "apply", "--server-side", "-f", str(EXAMPLES), "-n", elsewhere
        )
        assert code == 0 and out.count("serverside-applied") == 3, out
        applied.append(versions(cluster, elsewhere))
    assert applied[0].keys() == EXAMPLE_NAMES
    assert applied[1] == applied[0]  # the same resourceVersions: nothing was written


def versions(cluster: Cluster, namespace: str) -> dict[str, str]:
    """The RunnerPools of ``namespace``: name -> resourceVersion."""
    status, listed = cluster.kube.request(
        "GET", f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}"
    )
    assert status == 200, listed
    return {i["metadata"]["name"]: i["metadata"]["resourceVersion"] for i in listed["items"]}
