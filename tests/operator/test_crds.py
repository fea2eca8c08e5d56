"""The CRDs the operator needs, as a real kube-apiserver takes them: its own checks of a CRD
(a structural schema, the defaults against the CEL rules, the rules' names and estimated
cost)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.kube_cluster import KubeCluster

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "path",
    [
        "crds/runnerpools.poolkeeper.dev.yaml",
        "charts/poolkeeper/crds/runnerpools.poolkeeper.dev.yaml",
        "charts/poolkeeper/crds/kopf-peerings.yaml",
    ],
)
def test_the_server_accepts_the_crd(kube: KubeCluster, path: str) -> None:
    result = kube.kubectl("apply", "--dry-run=server", "-f", str(ROOT / path), check=False)
    assert result.returncode == 0, result.stderr
