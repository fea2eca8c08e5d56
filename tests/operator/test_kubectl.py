"""kubectl against the fake API server: the CRD and the example pools, as a user applies them.

client-go sends bearer tokens over TLS only, so kubectl talks to the plain-HTTP fake as
system:anonymous (the fake's anonymous auth); the operator keeps its own token. Client-side
validation needs the OpenAPI documents, which the fake does not serve: --validate=false (the
API server's own checks, pruning, defaults and CEL rules, still apply).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.operator.conftest import CRD_FILE, GROUP, PLURAL, ROOT, Cluster, install
from tests.operator.fake_k8s import FakeKubernetes
from tests.support.waiting import wait_until

EXAMPLES = ROOT / "examples" / "pools.yaml"


@pytest.fixture
def preinstalled() -> bool:
    return False  # kubectl installs the CRD


async def kubectl(kubeconfig: Path, *args: str, stdin: str | None = None) -> tuple[int, str]:
    process = await asyncio.create_subprocess_exec(
        "kubectl",
        "--kubeconfig",
        str(kubeconfig),
        *args,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(process.communicate(stdin.encode() if stdin else None), 60)
    return process.returncode or 0, out.decode()


async def test_kubectl_applies_the_crd_and_the_example_pools(
    cluster: Cluster, tmp_path: Path
) -> None:
    cluster.fake.anonymous = True
    config = cluster.fake.kubeconfig(tmp_path / "kubeconfig")
    code, out = await kubectl(config, "version", "-o", "json")
    assert code == 0 and '"minor": "32"' in out, out

    code, out = await kubectl(config, "apply", "--validate=false", "-f", str(CRD_FILE))
    assert code == 0 and "created" in out, out
    await cluster.start_operator("--namespace", "default")
    code, out = await kubectl(
        config, "apply", "--validate=false", "-n", "default", "-f", str(EXAMPLES)
    )
    assert code == 0, out
    assert out.count("created") == 3, out
    names = ["python-312", "java-21.temurin", "node-22-web"]

    def all_ready() -> bool:
        return all(
            (cluster.condition(name, "Ready") or {}).get("status") == "True" for name in names
        )

    await wait_until(all_ready, within=20, what="the example pools to be Ready")
    code, out = await kubectl(config, "get", "rpool", "-n", "default")
    assert code == 0, out
    header, *rows = out.strip().splitlines()
    assert header.split() == ["NAME", "DESIRED", "IDLE", "STARTING", "CLAIMED", "READY", "AGE"]
    row = next(r.split() for r in rows if r.startswith("python-312 "))
    assert row[1:6] == ["5", "5", "0", "0", "True"], out

    code, out = await kubectl(
        config, "scale", "rpool", "python-312", "--replicas=2", "-n", "default"
    )
    assert code == 0 and "scaled" in out, out
    await wait_until(lambda: len(cluster.jobs("python-312")) == 2, what="the scale-down")

    code, out = await kubectl(
        config,
        "apply",
        "--validate=false",
        "-n",
        "default",
        "-f",
        "-",
        stdin=(
            "apiVersion: poolkeeper.dev/v1alpha1\nkind: RunnerPool\n"
            "metadata: {name: too-big}\n"
            "spec: {idleRunners: 5, maxRunners: 2, runner: {image: busybox}}\n"
        ),
    )
    assert code != 0 and "idleRunners must not be greater than maxRunners" in out, out

    code, out = await kubectl(
        config, "delete", "rpool", "java-21.temurin", "-n", "default", "--wait=true"
    )
    assert code == 0, out
    assert cluster.pool("java-21.temurin") is None
    assert cluster.jobs("java-21.temurin") == []


async def test_the_example_pools_apply_to_the_namespace_given(
    fake: FakeKubernetes, tmp_path: Path
) -> None:
    """docs/operator.md, step 4: `kubectl apply -f examples/pools.yaml -n poolkeeper`."""
    install(fake)
    fake.anonymous = True
    config = fake.kubeconfig(tmp_path / "kubeconfig")
    code, out = await kubectl(
        config, "apply", "--validate=false", "-f", str(EXAMPLES), "-n", "poolkeeper"
    )
    assert code == 0, out
    assert out.count("created") == 3, out
    names = {item["metadata"]["name"] for item in fake.items(GROUP, PLURAL, "poolkeeper")}
    assert names == {"python-312", "java-21.temurin", "node-22-web"}
