"""RBAC for real: the operator runs as the chart's ServiceAccount, with the Role (or
ClusterRole) the chart renders, and the API server's authorizer decides.

Every operator test checks, after it ran, that the server refused none of the operator's
requests (the `cluster` fixture, from the server's audit log); this module shows what the
chart grants and what the operator uses of it, and that a rule the chart forgot breaks a
named behaviour with the server's 403.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.operator.conftest import (
    GROUP,
    JSON,
    PLURAL,
    Cluster,
    chart_operator_args,
    render_chart,
    rule_grants,
    without_verb,
)
from tests.support.documents import pool_doc
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow

ALL_NAMESPACES = ("--set", "watch.allNamespaces=true")


def test_the_rules_come_from_the_rendered_chart() -> None:
    for values in ((), ALL_NAMESPACES):
        grants = rule_grants(render_chart("poolkeeper", *values))
        assert grants
        assert not [g for g in grants if "*" in g]


async def test_the_server_grants_the_chart_account_nothing_more(cluster: Cluster) -> None:
    cluster.install_chart()
    assert cluster.allowed(GROUP, PLURAL, "patch")
    assert cluster.allowed(GROUP, f"{PLURAL}/status", "patch")
    for group, resource, verb in (
        (GROUP, PLURAL, "delete"),
        (GROUP, PLURAL, "update"),
        (GROUP, PLURAL, "create"),
        (GROUP, f"{PLURAL}/scale", "patch"),
        ("", "secrets", "get"),
        ("", "pods", "list"),
        ("apiextensions.k8s.io", "customresourcedefinitions", "list"),
    ):
        assert not cluster.allowed(group, resource, verb), (group, resource, verb)
    # A request of the account itself, refused by the server.
    cluster.forbidden_expected = True
    token = cluster.token()
    status, answer = cluster.kube.request(
        "GET", f"/api/v1/namespaces/{cluster.namespace}/secrets", token=token
    )
    assert status == 403, answer
    assert f'User "{cluster.user}" cannot list resource "secrets"' in answer["message"]


async def test_a_whole_pool_lifecycle_stays_within_the_chart_rules(
    cluster: Cluster, tmp_path: Path
) -> None:
    await cluster.start_chart_replica("a", tmp_path)
    await cluster.create_pool(pool_doc("rbac", idle=1, nomad={"jobTemplate": {"ID": "x"}}))
    await wait_until(lambda: bool(cluster.events("InvalidSpec")), what="an Event")
    await cluster.patch_pool("rbac", {"spec": {"nomad": {"jobTemplate": None}}})
    await wait_until(lambda: len(cluster.jobs("rbac")) == 1, what="a runner")
    await cluster.delete_pool("rbac")
    await wait_until(lambda: cluster.pool("rbac") is None, what="the finalizer to finish")
    used = {
        (r["verb"], r["objectRef"].get("apiGroup", ""), _resource(r["objectRef"]))
        for r in cluster.requests()
        if r.get("objectRef")
    }
    # What an operator replica needs: watch pools, patch finalizers and status, post
    # Events; nothing of kopf.dev (no kopf peering). Written as RBAC rules are: (API
    # group, resource) and its verbs.
    needs = {
        (GROUP, PLURAL): ("list", "watch", "patch"),
        (GROUP, f"{PLURAL}/status"): ("patch",),
        ("", "events"): ("create",),
    }
    needed = {
        (verb, group, resource) for (group, resource), verbs in needs.items() for verb in verbs
    }
    assert needed <= used, needed - used
    assert not [u for u in used if u[1] == "kopf.dev"]
    assert cluster.denied() == []


def _resource(ref: dict[str, str]) -> str:
    return "/".join(filter(None, (ref.get("resource"), ref.get("subresource"))))


async def test_all_namespaces_with_the_charts_cluster_wide_rules(
    cluster: Cluster, tmp_path: Path
) -> None:
    assert "--all-namespaces" in chart_operator_args(*ALL_NAMESPACES)
    await cluster.start_chart_replica("a", tmp_path, *ALL_NAMESPACES)
    elsewhere = cluster.create_namespace()
    # Pools of other tests' namespaces are gone, but the names are this test's own anyway:
    # a pool of another namespace with the same job prefix would be a conflict.
    await cluster.create_pool(pool_doc("wide-b", idle=1), namespace=elsewhere)
    await cluster.create_pool(pool_doc("wide", idle=2))
    await wait_until(
        lambda: (
            len(cluster.jobs("wide-b", namespace=elsewhere)) == 1 and len(cluster.jobs("wide")) == 2
        ),
        what="runners for pools in two namespaces",
    )
    await cluster.until_condition("wide", "Ready", status="True")
    made = cluster.requests()
    assert any(
        r["verb"] == "watch"
        and r["objectRef"].get("resource") == PLURAL
        and not r["objectRef"].get("namespace")
        for r in made
    ), "no watch of RunnerPools across namespaces"


@dataclass(frozen=True)
class Missing:
    """A rule the chart could forget, and what then breaks."""

    values: tuple[str, ...]
    group: str
    resource: str
    verb: str


STATUS_WRITE = f"{PLURAL}/status"


@pytest.mark.parametrize(
    "missing",
    [
        pytest.param(Missing((), GROUP, STATUS_WRITE, "patch"), id="Role-status-patch"),
        pytest.param(
            Missing(ALL_NAMESPACES, "", "events", "create"), id="ClusterRole-events-create"
        ),
    ],
)
async def test_a_rule_the_chart_forgot_breaks_a_behaviour_with_the_servers_403(
    cluster: Cluster, tmp_path: Path, caplog: pytest.LogCaptureFixture, missing: Missing
) -> None:
    caplog.set_level(logging.WARNING, logger="controller.operator")
    cluster.forbidden_expected = True

    def forget(manifests: list[JSON]) -> list[JSON]:
        return without_verb(manifests, missing.resource, missing.verb)

    cluster.install_chart(*missing.values, edit=forget)
    assert not cluster.allowed(missing.group, missing.resource, missing.verb)
    await cluster.start_chart_replica("a", tmp_path, *missing.values)
    # An invalid pool: the operator writes its status and posts an InvalidSpec Event.
    await cluster.create_pool(pool_doc("broken", idle=1, nomad={"jobTemplate": {"ID": "x"}}))
    key = f"{cluster.namespace}/broken"
    await wait_until(
        lambda: any(d.resource == missing.resource and d.code == 403 for d in cluster.denied()),
        what=f"the server's 403 for {missing.verb} {missing.resource}",
    )
    # The operator's log says what the server refused, in the server's words.
    refused = (
        f'User "{cluster.user}" cannot {missing.verb} resource "{missing.resource}" in API '
        f'group "{missing.group}"'
    )
    if missing.resource == STATUS_WRITE:
        logged = f"writing the status of {key} failed: 403"
    else:
        logged = f"could not post Event InvalidSpec for {key}: HTTP 403"
    await wait_until(
        lambda: any(logged in m and refused in m for m in caplog.messages),
        what=f"the log line: {logged} ... {refused}",
    )
    if missing.resource == STATUS_WRITE:
        assert (cluster.pool("broken") or {}).get("status") is None  # never written
        await wait_until(lambda: bool(cluster.events("InvalidSpec")), what="the Event, still")
    else:
        await cluster.until_condition("broken", "Ready", reason="InvalidSpec")  # status, still
        assert cluster.events("InvalidSpec") == []
