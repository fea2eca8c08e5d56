"""The RunnerPool CRD and the chart's copy, as a real kube-apiserver takes them: its own
checks of a CRD (a structural schema, the defaults against the CEL rules, the rules' names
and estimated cost) and the immutability rules at work."""

from __future__ import annotations

import pytest

from controller.lab.kube import KubeCluster
from tests.operator.conftest import CHART, CRD_FILE, Cluster
from tests.support.documents import pool_doc

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(
    "path",
    [CRD_FILE, CHART / "crds" / CRD_FILE.name],
    ids=lambda path: str(path.relative_to(CHART.parents[1])),
)
def test_the_server_accepts_the_crd(kube: KubeCluster, path: object) -> None:
    result = kube.kubectl("apply", "--dry-run=server", "-f", str(path), check=False)
    assert result.returncode == 0, result.stderr


async def test_nomad_namespace_and_job_prefix_are_immutable(cluster: Cluster) -> None:
    await cluster.create_pool(pool_doc("fixed", idle=1))
    code, body = await cluster.patch_pool("fixed", {"spec": {"idleRunners": 2}})
    assert code == 200, body  # an update that keeps them passes the transition rules
    for nomad, message in (
        ({"namespace": "other"}, "spec.nomad.namespace: Forbidden: nomad.namespace is immutable"),
        ({"jobPrefix": "moved-"}, "spec.nomad.jobPrefix: Forbidden: nomad.jobPrefix is immutable"),
    ):
        code, body = await cluster.patch_pool("fixed", {"spec": {"nomad": nomad}})
        assert code == 422 and message in body["message"], body
