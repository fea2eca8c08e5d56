"""The chart's API tier: the `api` Deployment, the client Service that selects it, its
budget, autoscaler, network policy and ServiceMonitor; and, with `api.enabled` false, the
layout before it. Every scenario is also linted and validated (test_chart.py)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from controller.cli import build_parser
from tests.chart.helm import Manifest, of_kind, render, template
from tests.chart.scenarios import SCENARIOS
from tests.chart.test_chart import render_notes
from tests.chart.workloads import (
    API,
    OPERATOR,
    container,
    deployment,
    env,
    mounted_secret_files,
    named,
    pod,
    pod_labels,
    selected,
    selects,
)

API_OFF = {"api.enabled": "false"}
# The scenarios that leave the API tier on.
WITH_API = [name for name, values in SCENARIOS.items() if values.get("api.enabled") != "false"]


def refusal(values: dict[str, str]) -> str:
    """helm's error for values the chart refuses."""
    _, stderr, code = template(values)
    assert code != 0, f"rendered with {values}"
    return stderr


# --- the Deployment -----------------------------------------------------------------------


def test_the_api_pods_run_poolkeeper_api_with_what_the_operator_gets() -> None:
    manifests = render()
    served = container(manifests, API)
    assert served["args"] == [
        "api",
        "--listen",
        "0.0.0.0:8080",
        "--resync-seconds",
        "10",
        "--log-format",
        "text",
        "--api-token-file",
        "/etc/poolkeeper/api/tokens",
    ]
    operator = container(manifests, OPERATOR)
    assert served["image"] == operator["image"]
    token_file = served["args"][served["args"].index("--api-token-file") + 1]
    assert mounted_secret_files(manifests, API)[token_file] == ("poolkeeper-api-tokens", "tokens")
    logs = container(render(SCENARIOS["logs"]), API)["args"]
    assert logs[logs.index("--log-format") :][:3] == ["--log-format", "json", "--access-log"]


@pytest.mark.parametrize("scenario", WITH_API)
def test_poolkeeper_api_takes_the_rendered_arguments(scenario: str) -> None:
    """The arguments are the command's own: its parser takes them."""
    args = container(render(SCENARIOS[scenario]), API)["args"]
    parsed = build_parser().parse_args(args)
    assert (parsed.command, parsed.listen) == ("api", "0.0.0.0:8080")


def test_replicas_rolling_update_and_probes() -> None:
    manifests = render()
    api = deployment(manifests, API)
    assert api["spec"]["replicas"] == 2
    # A new pod must be ready (it read the catalog) before an old one goes.
    assert api["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    served = container(manifests, API)
    assert [(p["name"], p["containerPort"]) for p in served["ports"]] == [("http", 8080)]
    # Readiness is gated on Nomad: /readyz of the API tier answers 503 until the catalog
    # has been read from Nomad, and while it cannot be.
    assert served["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert served["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert served["lifecycle"]["preStop"]["exec"]["command"] == ["sleep", "5"]
    assert served["resources"] == {
        "requests": {"cpu": "250m", "memory": "128Mi"},
        "limits": {"memory": "256Mi"},
    }
    assert deployment(render({"api.replicas": "5"}), API)["spec"]["replicas"] == 5


def test_each_deployment_selects_only_its_own_pods() -> None:
    """The operator Deployment's selector is immutable and stays what it was; the API pods
    carry another name, so no two controllers ever select the same pods."""
    for scenario in ("default", "everything"):
        manifests = render(SCENARIOS[scenario])
        for tier in (OPERATOR, API):
            selector = deployment(manifests, tier)["spec"]["selector"]["matchLabels"]
            assert selected(manifests, selector) == {tier}
    assert pod_labels(render(), API)["app.kubernetes.io/component"] == "api"


@pytest.mark.parametrize("scenario", WITH_API)
def test_the_operator_is_the_same_with_or_without_the_api_tier(scenario: str) -> None:
    """Switching the API tier on changes nothing of the operator's Deployment: it keeps
    reconciling (and its listener keeps serving health, metrics and the API)."""
    values = SCENARIOS[scenario]
    assert deployment(render(values)) == deployment(render({**values, **API_OFF}))


def test_the_api_tier_has_its_own_nomad_token_or_the_operators() -> None:
    shared = env(container(render(), API))
    assert shared["NOMAD_TOKEN"] == {
        "secretKeyRef": {"name": "poolkeeper-nomad", "key": "token", "optional": True}
    }
    manifests = render(SCENARIOS["apiNomadToken"])
    own = env(container(manifests, API))
    # A Secret of its own must hold the token: a missing one stops the pod from starting
    # rather than running it without one.
    assert own["NOMAD_TOKEN"] == {"secretKeyRef": {"name": "poolkeeper-nomad-api", "key": "token"}}
    assert own["NOMAD_ADDR"] == {"secretKeyRef": {"name": "poolkeeper-nomad", "key": "address"}}
    assert env(container(manifests, OPERATOR))["NOMAD_TOKEN"] == shared["NOMAD_TOKEN"]


def test_placement() -> None:
    default = pod(render(), API)
    (term,) = default["affinity"]["podAntiAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"
    ]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert selected(render(), term["podAffinityTerm"]["labelSelector"]["matchLabels"]) == {API}
    assert "nodeSelector" not in default and "tolerations" not in default

    values = SCENARIOS["apiPlacement"]
    manifests = render(values)
    placed = pod(manifests, API)
    assert placed["nodeSelector"] == json.loads(values["api.nodeSelector"])
    assert placed["tolerations"] == json.loads(values["api.tolerations"])
    assert placed["affinity"] == json.loads(values["api.affinity"])
    assert pod(manifests, OPERATOR) == pod(render(), OPERATOR)


# --- no Kubernetes API in the API pods ----------------------------------------------------


def _bound_accounts(manifests: list[Manifest]) -> set[str]:
    return {
        subject["name"]
        for binding in of_kind(manifests, "RoleBinding") + of_kind(manifests, "ClusterRoleBinding")
        for subject in binding["subjects"]
    }


@pytest.mark.parametrize("scenario", WITH_API)
def test_the_api_pods_mount_no_kubernetes_token(scenario: str) -> None:
    manifests = render(SCENARIOS[scenario])
    spec: dict[str, Any] = pod(manifests, API)
    assert spec["automountServiceAccountToken"] is False
    assert not any("projected" in volume for volume in spec["volumes"])
    account = spec["serviceAccountName"]
    if SCENARIOS[scenario].get("serviceAccount.create") == "false":
        assert account == "default"  # no token either way
    else:
        assert account == API
        assert named(manifests, "ServiceAccount", API)["automountServiceAccountToken"] is False
        assert account not in _bound_accounts(manifests)
    # The operator keeps its token: it watches RunnerPools.
    assert pod(manifests, OPERATOR)["automountServiceAccountToken"] is True


# --- the client Service -------------------------------------------------------------------


def test_the_client_service_keeps_its_name_and_selects_the_api_pods() -> None:
    for values, tier in ((SCENARIOS["default"], API), (API_OFF, OPERATOR)):
        manifests = render(values)
        (service,) = of_kind(manifests, "Service")
        assert service["metadata"]["name"] == OPERATOR  # what clients and CodeOcean use
        assert selected(manifests, service["spec"]["selector"]) == {tier}
        assert service["spec"]["ports"] == [
            {"name": "http", "port": 8080, "targetPort": "http", "protocol": "TCP"}
        ]


def test_service_monitors_scrape_each_tier() -> None:
    manifests = render(SCENARIOS["serviceMonitor"])
    services = {s["metadata"]["name"]: s for s in of_kind(manifests, "Service")}
    assert set(services) == {OPERATOR, f"{OPERATOR}-operator"}
    # The operator's pods get a headless Service for Prometheus alone.
    metrics = services[f"{OPERATOR}-operator"]["spec"]
    assert metrics["clusterIP"] == "None"
    assert selected(manifests, metrics["selector"]) == {OPERATOR}
    for tier, service in ((OPERATOR, f"{OPERATOR}-operator"), (API, OPERATOR)):
        monitor = named(manifests, "ServiceMonitor", tier)["spec"]
        assert _monitored(monitor, services.values()) == {service}
        assert monitor["endpoints"][0]["port"] == "http"

    without = render({**SCENARIOS["serviceMonitor"], **API_OFF})
    (monitor,) = of_kind(without, "ServiceMonitor")
    assert _monitored(monitor["spec"], of_kind(without, "Service")) == {OPERATOR}
    assert selected(without, named(without, "Service", OPERATOR)["spec"]["selector"]) == {OPERATOR}


def _monitored(monitor: dict[str, Any], services: Iterable[Manifest]) -> set[str]:
    """The Services a ServiceMonitor's selector picks."""
    wanted = monitor["selector"]["matchLabels"]
    return {s["metadata"]["name"] for s in services if selects(wanted, s["metadata"]["labels"])}


# --- disruptions and scaling --------------------------------------------------------------


def test_the_api_budget_lets_drains_proceed_unattended() -> None:
    manifests = render()
    spec = named(manifests, "PodDisruptionBudget", API)["spec"]
    assert selected(manifests, spec["selector"]["matchLabels"]) == {API}
    # One of the two may go at a time; an unready pod (Nomad unreachable) always may.
    assert spec["minAvailable"] == 1
    assert spec["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    assert "maxUnavailable" not in spec
    assert (
        named(render(SCENARIOS["apiPlacement"]), "PodDisruptionBudget", API)["spec"]["minAvailable"]
        == 2
    )
    off = of_kind(render({"api.podDisruptionBudget.enabled": "false"}), "PodDisruptionBudget")
    assert [m["metadata"]["name"] for m in off] == [OPERATOR]


@pytest.mark.parametrize(
    "values",
    [
        {"api.replicas": "1"},
        {"api.replicas": "3", "api.podDisruptionBudget.minAvailable": "3"},
        {"api.autoscaling.enabled": "true", "api.autoscaling.minReplicas": "1"},
    ],
)
def test_a_budget_no_drain_could_meet_is_refused(values: dict[str, str]) -> None:
    assert "a drain could never evict one" in refusal(values)
    # Without the budget, one replica is allowed.
    render({**values, "api.podDisruptionBudget.enabled": "false"})


def test_the_autoscaler_off_and_on() -> None:
    assert of_kind(render(), "HorizontalPodAutoscaler") == []
    manifests = render(SCENARIOS["apiAutoscaling"])
    (autoscaler,) = of_kind(manifests, "HorizontalPodAutoscaler")
    assert autoscaler["apiVersion"] == "autoscaling/v2"
    spec = autoscaler["spec"]
    assert spec["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": API}
    assert (spec["minReplicas"], spec["maxReplicas"]) == (3, 12)
    assert spec["metrics"] == [
        {
            "type": "Resource",
            "resource": {
                "name": "cpu",
                "target": {"type": "Utilization", "averageUtilization": 60},
            },
        }
    ]
    # The autoscaler owns the replicas: the Deployment leaves them alone.
    assert "replicas" not in deployment(manifests, API)["spec"]
    assert (
        of_kind(render({**SCENARIOS["apiAutoscaling"], **API_OFF}), "HorizontalPodAutoscaler") == []
    )


def test_autoscaling_values_that_cannot_work_are_refused() -> None:
    bounds = refusal(
        {
            "api.autoscaling.enabled": "true",
            "api.autoscaling.minReplicas": "5",
            "api.autoscaling.maxReplicas": "4",
        }
    )
    assert "api.autoscaling.minReplicas (5) is above api.autoscaling.maxReplicas (4)" in bounds
    no_request = refusal({"api.autoscaling.enabled": "true", "api.resources.requests.cpu": "null"})
    assert "api.autoscaling needs api.resources.requests.cpu" in no_request


# --- network policy -----------------------------------------------------------------------


def test_the_api_network_policy_lets_clients_in_and_only_nomad_out() -> None:
    values = SCENARIOS["networkPolicy"]
    manifests = render(values)
    policy = named(manifests, "NetworkPolicy", API)["spec"]
    assert selected(manifests, policy["podSelector"]["matchLabels"]) == {API}
    assert policy["policyTypes"] == ["Ingress", "Egress"]
    (ingress,) = policy["ingress"]
    assert ingress["ports"] == [{"port": "http", "protocol": "TCP"}]
    assert ingress["from"] == json.loads(values["networkPolicy.ingressFrom"])
    ports = {(p["port"], p["protocol"]) for rule in policy["egress"] for p in rule["ports"]}
    assert ports == {(53, "UDP"), (53, "TCP"), (4646, "TCP")}  # no Kubernetes API
    other = render({**values, "api.networkPolicy.egress.ports": "[4647]"})
    egress = named(other, "NetworkPolicy", API)["spec"]["egress"]
    assert {p["port"] for rule in egress for p in rule["ports"]} == {53, 4647}


# --- the layout before the API tier -------------------------------------------------------


def test_without_the_api_tier_the_chart_renders_the_single_service_layout() -> None:
    manifests = render(SCENARIOS["everythingApiOff"])
    names = {(m["kind"], m["metadata"]["name"]) for m in manifests}
    assert not any(name.startswith(API) for _, name in names)
    assert not any(
        m["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "api"
        for m in manifests
    )
    assert [m["metadata"]["name"] for m in of_kind(manifests, "Deployment")] == [OPERATOR]
    assert [m["metadata"]["name"] for m in of_kind(manifests, "Service")] == [OPERATOR]
    assert [m["metadata"]["name"] for m in of_kind(manifests, "ServiceAccount")] == [OPERATOR]
    for kind in ("PodDisruptionBudget", "NetworkPolicy", "ServiceMonitor"):
        (only_one,) = of_kind(manifests, kind)
        assert only_one["metadata"]["name"] == OPERATOR
    assert of_kind(manifests, "HorizontalPodAutoscaler") == []


# --- values and notes ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("api.replicas", "0"),
        ("api.enabled", '"yes"'),
        ("api.nomadTokenSecret", '"Not_A_Secret"'),
        ("api.podDisruptionBudget.minAvailable", "0"),
        ("api.podDisruptionBudget.minAvailable", '"50%"'),
        ("api.autoscaling.targetCPUUtilizationPercentage", "150"),
        ("api.autoscaling.maxReplicas", "0"),
        ("api.networkPolicy.egress.ports", "[70000]"),
        ("api.resources.limit", '{"cpu": "1"}'),
        ("api.replica", "3"),
    ],
)
def test_values_schema_rejects_bad_api_values(key: str, value: str) -> None:
    refusal({key: value})


def test_values_from_an_older_chart_are_refused_with_the_flag_to_use() -> None:
    """`helm upgrade --reuse-values` renders the new chart with the previous chart's
    defaults, which have no `api`."""
    assert "upgrade with --reset-then-reuse-values" in refusal({"api": "null"})


def test_notes_describe_both_tiers(tmp_path: Path) -> None:
    notes = render_notes(tmp_path / "a", {})
    assert "The API tier (2 replicas of Deployment pk-poolkeeper-api) serves the clients" in notes
    assert (
        "the operator (2 replica(s) of Deployment pk-poolkeeper) reconciles: the pools' leases "
        "are spread over them, all ready." in notes
    )
    own = render_notes(tmp_path / "b", SCENARIOS["apiNomadToken"])
    assert "create secret generic poolkeeper-nomad-api" in own
    scaled = render_notes(tmp_path / "c", SCENARIOS["apiAutoscaling"])
    assert "The API tier (3 to 12 replicas of Deployment pk-poolkeeper-api)" in scaled
    before = render_notes(tmp_path / "d", API_OFF)
    assert (
        "2 replica(s) reconcile and serve the clients: the pools' leases are spread over "
        "them, all ready." in before
    )
    assert "API tier" not in before
