"""RBAC is exercised: the operator's requests against the chart's rendered rules.

Every e2e test checks its own requests when its fake API server shuts down (see the
`cluster` fixture); this module proves the checker itself and the chart as its source.
"""

from __future__ import annotations

from pathlib import Path

from controller.core.runner_ids import META_POOL
from tests.operator.conftest import (
    GROUP,
    PEERING,
    PLURAL,
    SERVICE_ACCOUNT,
    VERSION,
    Cluster,
    chart_operator_args,
    chart_rules,
)
from tests.operator.fake_k8s import Request, denied
from tests.support.documents import pool_doc
from tests.support.waiting import wait_until


def test_the_rules_come_from_the_rendered_chart() -> None:
    rules, source = chart_rules()
    assert source == "chart"
    for rule in rules:
        assert "*" not in rule.verbs + rule.resources + rule.api_groups


def test_the_checker_refuses_what_the_chart_does_not_grant() -> None:
    rules, _ = chart_rules()
    allowed = Request(SERVICE_ACCOUNT, "PATCH", "/", "patch", "poolkeeper.dev", "runnerpools")
    status = Request(
        SERVICE_ACCOUNT, "PATCH", "/", "patch", "poolkeeper.dev", "runnerpools", "status"
    )
    deleting = Request(SERVICE_ACCOUNT, "DELETE", "/", "delete", "poolkeeper.dev", "runnerpools")
    updating = Request(SERVICE_ACCOUNT, "PUT", "/", "update", "poolkeeper.dev", "runnerpools")
    secrets = Request(SERVICE_ACCOUNT, "GET", "/", "get", "", "secrets")
    crds = Request(
        SERVICE_ACCOUNT, "LIST", "/", "list", "apiextensions.k8s.io", "customresourcedefinitions"
    )
    assert denied([allowed, status], rules) == []
    assert denied([deleting, updating, secrets, crds], rules) == [deleting, updating, secrets, crds]


async def test_a_whole_pool_lifecycle_stays_within_the_chart_rules(
    cluster: Cluster, tmp_path: Path
) -> None:
    await cluster.start_chart_replica("operator-a", tmp_path, lifetime=3)
    await cluster.create_pool(pool_doc("rbac", idle=1, nomad={"jobTemplate": {"ID": "x"}}))
    await wait_until(lambda: bool(cluster.events("InvalidSpec")), what="an Event")
    await cluster.patch_pool("rbac", {"spec": {"nomad": {"jobTemplate": None}}})
    await wait_until(lambda: len(cluster.jobs("rbac")) == 1, what="a runner")
    await cluster.k8s("DELETE", cluster.pool_path("rbac"))
    await wait_until(lambda: cluster.pool("rbac") is None, what="the finalizer to finish")
    made = [r for r in cluster.fake.requests if r.user == SERVICE_ACCOUNT]
    used = {(r.verb, r.api_group, r.rbac_resource) for r in made if not r.non_resource}
    # What an operator replica needs: watch pools and peerings, patch finalizers and
    # status, keep its peering record alive, post Events. Written as RBAC rules are:
    # (API group, resource) and its verbs.
    needs = {
        ("poolkeeper.dev", "runnerpools"): ("list", "watch", "patch"),
        ("poolkeeper.dev", "runnerpools/status"): ("patch",),
        ("", "events"): ("create",),
        ("kopf.dev", "kopfpeerings"): ("watch", "patch"),
    }
    needed = {
        (verb, group, resource) for (group, resource), verbs in needs.items() for verb in verbs
    }
    assert needed <= used
    rules, _ = chart_rules()
    assert denied(made, rules) == []


async def test_all_namespaces_with_the_charts_cluster_wide_rules(
    cluster: Cluster, tmp_path: Path
) -> None:
    values = ("--set", "watch.allNamespaces=true")
    assert "--all-namespaces" in chart_operator_args(*values)
    peerings = cluster.fake._type_by_plural("kopf.dev", "clusterkopfpeerings")
    cluster.fake.create_object(peerings, "", {"metadata": {"name": PEERING}})
    replica = await cluster.start_chart_replica("operator-a", tmp_path, 3, *values)
    await wait_until(lambda: replica.active, what="the replica to lead")
    other = pool_doc("wide-b", idle=1)  # "wide-" in the same Nomad namespace would conflict
    other["metadata"]["namespace"] = "team-b"
    code, _ = await cluster.k8s(
        "POST", f"/apis/{GROUP}/{VERSION}/namespaces/team-b/{PLURAL}", other
    )
    assert code == 201
    await cluster.create_pool(pool_doc("wide", idle=2))

    def runners(key: str) -> int:
        return sum(
            1
            for job in cluster.sim.job_list("*")
            if (job.get("Meta") or {}).get(META_POOL) == key and job.get("Status") != "dead"
        )

    await wait_until(
        lambda: runners("team-b/wide-b") == 1 and runners("default/wide") == 2,
        what="runners for pools in two namespaces",
    )
    made = [r for r in cluster.fake.requests if r.user == SERVICE_ACCOUNT]
    assert any(r.resource == "clusterkopfpeerings" and r.verb == "patch" for r in made)
    assert any(r.resource == PLURAL and r.verb == "watch" and not r.namespace for r in made)
