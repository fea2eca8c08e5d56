"""An operator and a standalone controller pointed at one Nomad never fight: leases order
writers across clusters and processes (kopf peering, which the operator no longer runs,
ordered only a cluster's own replicas)."""

from __future__ import annotations

import asyncio
import socket
import time
from pathlib import Path

import pytest
import yaml

from controller.core.paths import lease_path
from controller.nomad.config import NomadConfig
from controller.standalone import Controller, Settings
from tests.operator.conftest import NOMAD_NAMESPACE, Cluster
from tests.support.documents import pool_doc
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow


def holder(cluster: Cluster) -> str:
    key = f"{cluster.namespace}/py"
    lease = cluster.sim.variables(NOMAD_NAMESPACE).get(lease_path(key)) or {}
    return str((lease.get("Items") or {}).get("holder", "")) if lease.get("Lock") else ""


async def test_an_operator_and_a_standalone_controller_never_fight(
    cluster: Cluster, tmp_path: Path
) -> None:
    operator = await cluster.start_operator("--namespace", cluster.namespace)
    await cluster.create_pool(pool_doc("py", idle=2))
    await wait_until(lambda: len(cluster.jobs("py")) == 2, what="the operator's 2 runners")
    operator_identity = socket.gethostname()  # no POD_NAME outside a pod
    await wait_until(lambda: holder(cluster) == operator_identity, what="the operator's lease")
    writes = len(cluster.sim.audit.writes)

    # The same pool, with another spec, in a standalone controller.
    pools = tmp_path / "pools.yaml"
    pools.write_text(yaml.safe_dump(pool_doc("py", idle=4, namespace=cluster.namespace)))
    tokens = tmp_path / "tokens"
    tokens.write_text("token\n")
    standalone = Controller(
        Settings(pools_path=pools, listen=("127.0.0.1", 0), resync_seconds=0.5, token_file=tokens),
        NomadConfig.from_env({"NOMAD_ADDR": cluster.sim_server.url}),
    )
    await standalone.start()
    try:
        key = f"{cluster.namespace}/py"

        def standalone_reason(type_: str) -> str:
            view = standalone.engine.pools.get(key)
            found = view.status.condition(type_) if view and view.status else None
            return found.reason if found else ""

        await wait_until(
            lambda: standalone_reason("Ready") == "LeaseHeldElsewhere",
            what="the standalone controller to wait for the lease",
        )
        assert standalone_reason("Degraded") == "SpecDiffersFromHolder"
        view = standalone.engine.pools[key]
        assert view.status is not None and view.status.reconciled_by == operator_identity
        await wait_until(
            lambda: (
                (cluster.pool("py") or {}).get("status", {}).get("reconciledBy")
                == operator_identity
            ),
            what="the operator's status naming itself",
        )
        time_before = time.monotonic()
        while time.monotonic() - time_before < 3.0:  # six resyncs of the standalone one
            assert len(cluster.jobs("py")) == 2
            await asyncio.sleep(0.2)
        assert len(cluster.sim.audit.writes) == writes, "the pool was churned"

        # The operator stops (a rollout): it gives the lease back, the other takes over.
        await operator.stop()
        stopped = time.monotonic()
        await wait_until(
            lambda: holder(cluster) == standalone.identity(),
            within=10,
            what="the standalone controller to take the lease",
        )
        assert time.monotonic() - stopped < 3.0
        await wait_until(lambda: len(cluster.jobs("py")) == 4, what="the new holder's spec")

        # A new operator replica now waits, and says so in the resource's status.
        await cluster.start_operator("--namespace", cluster.namespace, name="b")

        def operator_reason() -> str:
            ready = cluster.condition("py", "Ready") or {}
            return str(ready.get("reason", ""))

        await wait_until(
            lambda: operator_reason() == "LeaseHeldElsewhere", what="the operator to wait"
        )
        ready = cluster.condition("py", "Ready") or {}
        assert standalone.identity() in ready["message"]
        assert (cluster.condition("py", "Degraded") or {})["reason"] == "SpecDiffersFromHolder"
        assert len(cluster.jobs("py")) == 4
    finally:
        await standalone.stop()
    audit = cluster.sim.audit
    assert audit.by_non_holders() == []
    assert {w.writer for w in audit.writes} == {operator_identity, standalone.identity()}
