"""The Helm chart: lint, render, validate offline, and check what the operator relies on
(the API tier's own objects: test_api_tier.py)."""

from __future__ import annotations

import copy
import json
import re
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import jsonschema
import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml

from tests.chart.alert_rules import OPERATOR_DOCS, doc_anchors, exported_series, rule_problems
from tests.chart.helm import (
    CHART,
    NAMESPACE,
    ROOT,
    Manifest,
    of_kind,
    only,
    render,
    run_helm,
    set_args,
    template,
)
from tests.chart.scenarios import SCENARIOS
from tests.chart.workloads import (
    API,
    OPERATOR,
    container,
    deployment,
    env,
    mounted_secret_files,
    named,
    pod,
    selected,
    selects,
)

KUBERNETES_VERSION: Final = "1.32"


# --- lint and offline validation ----------------------------------------------------------


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_helm_lint_strict(scenario: str) -> None:
    result = run_helm("lint", "--strict", str(CHART), *set_args(SCENARIOS[scenario]))
    assert result.returncode == 0, result.stdout + result.stderr


def _check_service_monitor(manifest: Manifest, manifests: list[Manifest]) -> None:
    """No Kubernetes schema exists for the Prometheus operator's ServiceMonitor: check the
    fields it is used by against the one Service it must find, whose pods are those of the
    Deployment of the same name (the operator's, or the API tier's)."""
    spec = manifest["spec"]
    assert set(spec) == {"selector", "namespaceSelector", "endpoints"}
    (service,) = [
        m
        for m in of_kind(manifests, "Service")
        if selects(spec["selector"]["matchLabels"], m["metadata"]["labels"])
    ]
    assert selected(manifests, service["spec"]["selector"]) == {manifest["metadata"]["name"]}
    assert spec["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    (endpoint,) = spec["endpoints"]
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert endpoint["path"] == "/metrics"
    assert re.fullmatch(r"\d+[smh]", endpoint["interval"])


def validate_offline(manifests: list[Manifest]) -> list[str]:
    """Every manifest against the Kubernetes 1.32 schemas (strict: no unknown fields).
    Kinds without a built-in schema: the ServiceMonitor and the PrometheusRule by their
    own checks; any other unknown kind is an error."""
    problems: list[str] = []
    for manifest in manifests:
        name = f"{manifest['kind']}/{manifest['metadata']['name']}"
        try:
            kubernetes_validate.validate(manifest, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.SchemaNotFoundError:
            key = f"{manifest['apiVersion']}/{manifest['kind']}"
            if key == "monitoring.coreos.com/v1/ServiceMonitor":
                _check_service_monitor(manifest, manifests)
            elif key == "monitoring.coreos.com/v1/PrometheusRule":
                anchors = doc_anchors(OPERATOR_DOCS.read_text(encoding="utf-8"))
                problems += [f"{name}: {p}" for p in rule_problems(manifest, anchors)]
            else:
                problems.append(f"{name}: no schema for {key}")
        except kubernetes_validate.ValidationError as error:
            path = ".".join(str(part) for part in error.path)
            problems.append(f"{name}: {path}: {error.message}")
    return problems


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_rendered_manifest_is_valid_for_kubernetes_1_32(scenario: str) -> None:
    manifests = render(SCENARIOS[scenario])
    assert validate_offline(manifests) == []


def test_offline_validation_catches_a_misspelled_field() -> None:
    manifests = copy.deepcopy(render())
    (operator,) = pod(manifests)["containers"]
    operator["securityContext"]["readOnlyRootFileSystem"] = True
    problems = validate_offline(manifests)
    assert len(problems) == 1 and "readOnlyRootFileSystem" in problems[0]


@pytest.mark.parametrize(
    ("scenario", "kind", "names"),
    [
        ("serviceMonitor", "ServiceMonitor", {OPERATOR, API}),
        ("networkPolicy", "NetworkPolicy", {OPERATOR, API}),
        ("grafanaDashboard", "ConfigMap", {"pk-poolkeeper-dashboard"}),
        ("prometheusRule", "PrometheusRule", {"pk-poolkeeper"}),
    ],
)
def test_optional_features_render_only_when_enabled(
    scenario: str, kind: str, names: set[str]
) -> None:
    def rendered(values: dict[str, str]) -> set[str]:
        return {m["metadata"]["name"] for m in of_kind(render(values), kind)}

    assert rendered({}) == set()
    assert rendered(SCENARIOS[scenario]) == names


# --- values.schema.json -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "value", "misspelled"),
    [
        ("watch.allNamespace", "true", "allNamespace"),
        ("replicas", "3", "replicas"),
        ("serviceMonitor.enable", "true", "enable"),
        ("nomad.caCerts", "true", "caCerts"),
        ("resources.limit", '{"cpu": "1"}', "limit"),
        ("prometheusRule.severities.PoolkeeperTypo", '"warning"', "PoolkeeperTypo"),
    ],
)
def test_values_schema_rejects_a_misspelled_key(key: str, value: str, misspelled: str) -> None:
    _, stderr, code = template({key: value})
    assert code != 0
    assert f"Additional property {misspelled} is not allowed" in stderr


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("replicaCount", "0"),
        ("image.pullPolicy", '"Sometimes"'),
        ("watch.namespaces", '["Not_A_Namespace"]'),
        ("service.port", "70000"),
        ("poseidon.environments", '"writable"'),
        ("poseidon.depletingThreshold", "1.5"),
        ("poseidon.environmentTemplate", '{"spec": {"maxRunners": 5}}'),  # needs managed
        ("logFormat", '"xml"'),
        ("prometheusRule.claimErrorRatio", "5"),
        ("prometheusRule.alertLabels", '{"severity": "page"}'),
        ("prometheusRule.severities.PoolkeeperClaimErrors", '""'),
        ("apiTls.secretName", '"Not_A_Secret"'),
        ("podDisruptionBudget.minAvailable", "0"),
        ("podDisruptionBudget.maxUnavailable", "1"),  # the budget counts ready pods left
        ("peering.enabled", "true"),  # kopf peering is gone: leases share the pools
    ],
)
def test_values_schema_rejects_bad_values(key: str, value: str) -> None:
    assert template({key: value})[2] != 0


def test_values_file_matches_its_schema() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text(encoding="utf-8"))
    values = yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))
    jsonschema.Draft7Validator(schema).validate(values)

    def closed(node: Mapping[str, Any], path: str) -> list[str]:
        open_objects = []
        if (
            node.get("type") == "object"
            and "properties" in node
            and node.get("additionalProperties") is not False
        ):
            open_objects.append(path)
        for key, child in node.get("properties", {}).items():
            open_objects += closed(child, f"{path}.{key}")
        return open_objects

    assert closed(schema, "") == []


# --- the CRDs -----------------------------------------------------------------------------


def test_chart_ships_the_runnerpool_crd_alone() -> None:
    crds = of_kind(render(), "CustomResourceDefinition")
    assert [crd["metadata"]["name"] for crd in crds] == ["runnerpools.poolkeeper.dev"]


# --- RBAC ---------------------------------------------------------------------------------


def _rules(role: Manifest) -> set[tuple[str, str, str]]:
    return {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


EXPECTED_RULES: Final = {
    *(("poolkeeper.dev", "runnerpools", verb) for verb in ("get", "list", "watch", "patch")),
    ("poolkeeper.dev", "runnerpools/status", "patch"),
    ("", "events", "create"),
}


def _no_wildcards(role: Manifest) -> None:
    for rule in role["rules"]:
        assert set(rule) <= {"apiGroups", "resources", "verbs"}  # no resourceNames, URLs
        for key in ("apiGroups", "resources", "verbs"):
            assert all("*" not in item for item in rule[key]), rule


@pytest.mark.parametrize(
    ("values", "namespaces"),
    [(SCENARIOS["default"], [NAMESPACE]), (SCENARIOS["namespaces"], ["team-a", "team-b"])],
)
def test_namespaced_rbac_is_exactly_the_least_privilege_set(
    values: dict[str, str], namespaces: list[str]
) -> None:
    manifests = render(values)
    assert of_kind(manifests, "ClusterRole") == []
    assert of_kind(manifests, "ClusterRoleBinding") == []
    roles = of_kind(manifests, "Role")
    bindings = of_kind(manifests, "RoleBinding")
    assert sorted(r["metadata"]["namespace"] for r in roles) == sorted(namespaces)
    account = named(manifests, "ServiceAccount", OPERATOR)["metadata"]
    for role in roles:
        _no_wildcards(role)
        assert _rules(role) == EXPECTED_RULES
    for binding in bindings:
        role_name = binding["roleRef"]["name"]
        assert binding["roleRef"]["kind"] == "Role"
        assert any(
            r["metadata"]["name"] == role_name
            and r["metadata"]["namespace"] == binding["metadata"]["namespace"]
            for r in roles
        )
        assert binding["subjects"] == [
            {
                "kind": "ServiceAccount",
                "name": account["name"],
                "namespace": account["namespace"],
            }
        ]
    assert sorted(b["metadata"]["namespace"] for b in bindings) == sorted(namespaces)


def test_all_namespaces_rbac_is_a_cluster_role_with_the_same_rules() -> None:
    manifests = render(SCENARIOS["allNamespaces"])
    assert of_kind(manifests, "Role") == []
    assert of_kind(manifests, "RoleBinding") == []
    role = only(manifests, "ClusterRole")
    _no_wildcards(role)
    assert _rules(role) == EXPECTED_RULES
    binding = only(manifests, "ClusterRoleBinding")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": role["metadata"]["name"],
    }
    account = named(manifests, "ServiceAccount", OPERATOR)["metadata"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account["name"], "namespace": account["namespace"]}
    ]


# --- the Deployment -----------------------------------------------------------------------


def test_deployment_args_in_namespaced_mode() -> None:
    assert container(render())["args"] == [
        "operator",
        "--listen",
        "0.0.0.0:8080",
        "--liveness",
        "http://0.0.0.0:8081/healthz",
        "--resync-seconds",
        "10",
        "--log-format",
        "text",
        "--namespace",
        NAMESPACE,
        "--api-token-file",
        "/etc/poolkeeper/api/tokens",
    ]
    logs = container(render(SCENARIOS["logs"]))["args"]
    assert logs[logs.index("--log-format") :][:3] == ["--log-format", "json", "--access-log"]
    args = container(render(SCENARIOS["namespaces"]))["args"]
    assert args[args.index("--namespace") :][:4] == [
        "--namespace",
        "team-a",
        "--namespace",
        "team-b",
    ]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_the_operator_command_and_its_exclusive_scope(scenario: str) -> None:
    args = container(render(SCENARIOS[scenario]))["args"]
    assert args[0] == "operator"
    assert ("--all-namespaces" in args) != ("--namespace" in args)
    assert ("--api-token-file" in args) != ("--insecure-no-auth" in args)


def test_all_namespaces_mode() -> None:
    assert "--all-namespaces" in container(render(SCENARIOS["allNamespaces"]))["args"]


def test_replicas_and_update_strategy() -> None:
    operator = deployment(render())
    assert operator["spec"]["replicas"] == 2
    # Every replica is active and ready: a new one is ready before an old one stops.
    assert operator["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    assert deployment(render({"replicaCount": "3"}))["spec"]["replicas"] == 3


def test_hardened_security_context() -> None:
    for scenario in SCENARIOS.values():
        manifests = render(scenario)
        for tier in (m["metadata"]["name"] for m in of_kind(manifests, "Deployment")):
            spec = pod(manifests, tier)
            assert spec["securityContext"]["runAsNonRoot"] is True
            assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
            context = container(manifests, tier)["securityContext"]
            assert context["runAsNonRoot"] is True
            assert isinstance(context["runAsUser"], int) and context["runAsUser"] > 0
            assert context["readOnlyRootFilesystem"] is True
            assert context["allowPrivilegeEscalation"] is False
            assert context["privileged"] is False
            assert context["capabilities"] == {"drop": ["ALL"]}
            assert context["seccompProfile"] == {"type": "RuntimeDefault"}


def test_image_user_matches_the_chart() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    user = container(render())["securityContext"]["runAsUser"]
    assert f"USER {user}:" in dockerfile
    assert 'ENTRYPOINT ["poolkeeper"]' in dockerfile and 'CMD ["operator"]' in dockerfile


@pytest.mark.parametrize("tier", [OPERATOR, API])
def test_the_poseidon_api_options_and_template(tier: str) -> None:
    """Both tiers serve the Poseidon API; the operator also registers managed environments'
    pools, so both get the options and the template."""
    default = container(render(), tier)
    assert not any(arg.startswith("--poseidon") for arg in default["args"])
    args = container(render(SCENARIOS["poseidon"]), tier)["args"]
    assert args[args.index("--poseidon-api") :] == [
        "--poseidon-api",
        "--poseidon-environments",
        "readonly",
        "--poseidon-depleting-threshold",
        "0",
    ]
    assert of_kind(render(SCENARIOS["poseidon"]), "ConfigMap") == []

    managed = render(SCENARIOS["poseidonManaged"])
    served = container(managed, tier)
    args = served["args"]
    assert args[args.index("--poseidon-api") :] == [
        "--poseidon-api",
        "--poseidon-environments",
        "managed",
        "--poseidon-depleting-threshold",
        "0.25",
        "--poseidon-environment-template",
        "/etc/poolkeeper/poseidon/template.yaml",
    ]
    config_map = only(managed, "ConfigMap")
    assert yaml.safe_load(config_map["data"]["template.yaml"]) == {
        "metadata": {"namespace": "codeocean"},
        "spec": {"maxRunners": 50},
    }
    mount = next(m for m in served["volumeMounts"] if m["name"] == "poseidon-template")
    assert mount["mountPath"] == "/etc/poolkeeper/poseidon"
    volume = next(v for v in pod(managed, tier)["volumes"] if v["name"] == "poseidon-template")
    assert volume["configMap"]["name"] == config_map["metadata"]["name"]
    # The template is read at start: changing it rolls the pods.
    annotations = deployment(managed, tier)["spec"]["template"]["metadata"]["annotations"]
    changed = dict(
        SCENARIOS["poseidonManaged"],
        **{"poseidon.environmentTemplate": '{"spec": {"maxRunners": 60}}'},
    )
    other = deployment(render(changed), tier)["spec"]["template"]["metadata"]["annotations"]
    assert annotations["checksum/poseidon-template"] != other["checksum/poseidon-template"]


def test_probes_and_ports() -> None:
    operator = container(render())
    ports = {p["name"]: p["containerPort"] for p in operator["ports"]}
    assert ports == {"http": 8080, "liveness": 8081}
    liveness = operator["livenessProbe"]["httpGet"]
    assert (liveness["path"], ports[liveness["port"]]) == ("/healthz", 8081)
    readiness = operator["readinessProbe"]["httpGet"]
    assert (readiness["path"], readiness["port"]) == ("/readyz", "http")
    assert operator["resources"]["requests"] and operator["resources"]["limits"]


def test_nomad_connection_and_api_tokens_come_from_secrets() -> None:
    manifests = render()
    operator = container(manifests)
    variables = env(operator)
    assert variables["NOMAD_ADDR"] == {
        "secretKeyRef": {"name": "poolkeeper-nomad", "key": "address"}
    }
    assert variables["NOMAD_TOKEN"] == {
        "secretKeyRef": {"name": "poolkeeper-nomad", "key": "token", "optional": True}
    }
    # The lease identity (and Events' reporting instance) is the pod's name.
    assert variables["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert "NOMAD_CACERT" not in variables and "NOMAD_NAMESPACE" not in variables
    files = mounted_secret_files(manifests)
    token_file = operator["args"][operator["args"].index("--api-token-file") + 1]
    assert files[token_file] == ("poolkeeper-api-tokens", "tokens")


def test_nomad_tls_files_are_mounted_where_the_env_points() -> None:
    manifests = render(SCENARIOS["nomadTls"])
    everything = render(SCENARIOS["everything"])
    for tier in (OPERATOR, API):
        variables = env(container(manifests, tier))
        files = mounted_secret_files(manifests, tier)
        assert files[variables["NOMAD_CACERT"]] == ("poolkeeper-nomad", "ca.crt")
        assert files[variables["NOMAD_CLIENT_CERT"]] == ("poolkeeper-nomad", "tls.crt")
        assert files[variables["NOMAD_CLIENT_KEY"]] == ("poolkeeper-nomad", "tls.key")
        # Both tiers share the home namespace: the catalog is there.
        home = env(container(everything, tier))
        assert (home["NOMAD_NAMESPACE"], home["NOMAD_REGION"]) == ("runners", "eu")


def test_insecure_no_auth_mounts_no_tokens() -> None:
    manifests = render(SCENARIOS["insecureNoAuth"])
    for tier in (OPERATOR, API):
        assert "--insecure-no-auth" in container(manifests, tier)["args"]
        assert mounted_secret_files(manifests, tier) == {}


def test_root_filesystem_is_read_only_but_tmp_is_writable() -> None:
    manifests = render()
    for tier in (OPERATOR, API):
        mounts = {m["mountPath"]: m["name"] for m in container(manifests, tier)["volumeMounts"]}
        volumes = {v["name"]: v for v in pod(manifests, tier)["volumes"]}
        assert "emptyDir" in volumes[mounts["/tmp"]]


# --- optional features --------------------------------------------------------------------


def test_pod_disruption_budget_selects_the_pods() -> None:
    manifests = render()
    budget = named(manifests, "PodDisruptionBudget", OPERATOR)["spec"]
    assert selected(manifests, budget["selector"]["matchLabels"]) == {OPERATOR}
    # One of the two ready replicas may go at a time; an unready one (Nomad unreachable)
    # always may.
    assert budget["minAvailable"] == 1
    assert budget["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    assert "maxUnavailable" not in budget
    scaled = render(SCENARIOS["operatorBudget"])
    assert named(scaled, "PodDisruptionBudget", OPERATOR)["spec"]["minAvailable"] == 2
    off = render({"podDisruptionBudget.enabled": "false"})
    assert [m["metadata"]["name"] for m in of_kind(off, "PodDisruptionBudget")] == [API]


@pytest.mark.parametrize(
    "values",
    [{"replicaCount": "1"}, {"replicaCount": "3", "podDisruptionBudget.minAvailable": "3"}],
)
def test_a_budget_no_drain_could_satisfy_is_refused(values: dict[str, str]) -> None:
    _, stderr, code = template(values)
    assert code != 0
    assert "podDisruptionBudget.minAvailable" in stderr and "must be below replicaCount" in stderr
    render({**values, "podDisruptionBudget.enabled": "false"})


def test_network_policy() -> None:
    manifests = render(SCENARIOS["networkPolicy"])
    policy = named(manifests, "NetworkPolicy", OPERATOR)["spec"]
    assert selected(manifests, policy["podSelector"]["matchLabels"]) == {OPERATOR}
    assert policy["policyTypes"] == ["Ingress", "Egress"]
    api, liveness = policy["ingress"]
    assert api["ports"] == [{"port": "http", "protocol": "TCP"}]
    assert api["from"] == [{"namespaceSelector": {"matchLabels": {"team": "platform"}}}]
    assert liveness["ports"] == [{"port": "liveness", "protocol": "TCP"}]
    egress_ports = {(p["port"], p["protocol"]) for rule in policy["egress"] for p in rule["ports"]}
    assert {(53, "UDP"), (53, "TCP"), (443, "TCP"), (6443, "TCP"), (4646, "TCP")} == egress_ports


PROMISED_METRICS: Final = {
    "poolkeeper_runners",
    "poolkeeper_desired_idle_runners",
    "poolkeeper_reconcile_duration_seconds",
    "poolkeeper_reconcile_total",
    "poolkeeper_claims_total",
    "poolkeeper_claim_duration_seconds",
    "poolkeeper_runners_created_total",
    "poolkeeper_runners_destroyed_total",
    "poolkeeper_nomad_requests_total",
    "poolkeeper_event_stream_up",
}


def test_grafana_dashboard_uses_the_contract_metrics() -> None:
    config_map = only(render(SCENARIOS["grafanaDashboard"]), "ConfigMap")
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard = json.loads(config_map["data"]["poolkeeper.json"])
    assert dashboard["uid"] == "poolkeeper"
    expressions = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    series = {name for e in expressions for name in re.findall(r"poolkeeper_\w+", e)}
    assert {re.sub(r"_bucket$", "", name) for name in series} == PROMISED_METRICS
    assert series <= set(exported_series())  # the alert rules get the same check
    panel_ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(panel_ids) == len(set(panel_ids))


def render_notes(tmp_path: Path, values: Mapping[str, str]) -> str:
    """NOTES.txt as helm would print it after an install. ``helm install --dry-run`` needs
    a cluster, so a copy of the chart renders the notes into a ConfigMap instead."""
    chart = tmp_path / "poolkeeper"
    shutil.copytree(CHART, chart)
    notes = (chart / "templates" / "NOTES.txt").read_text(encoding="utf-8")
    (chart / "templates" / "NOTES.txt").unlink()
    (chart / "templates" / "_notes.tpl").write_text(
        '{{- define "rendered.notes" -}}\n' + notes + "\n{{- end }}\n", encoding="utf-8"
    )
    (chart / "templates" / "notes.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: notes}\n"
        'data:\n  notes: {{ include "rendered.notes" . | toJson }}\n',
        encoding="utf-8",
    )
    result = run_helm(
        "template",
        "pk",
        str(chart),
        "--namespace",
        NAMESPACE,
        "--show-only",
        "templates/notes.yaml",
        *set_args(values),
    )
    assert result.returncode == 0, result.stderr
    notes_text: str = yaml.safe_load(result.stdout)["data"]["notes"]
    return notes_text


def test_notes_render(tmp_path: Path) -> None:
    notes = render_notes(tmp_path, {})
    # The pool's namespace is named: a user's kubeconfig may point at another.
    assert f"kubectl scale rpool/python-312 --replicas=10 -n {NAMESPACE}\n" in notes
    assert "create secret generic poolkeeper-nomad" in notes
    assert "create secret generic poolkeeper-api-tokens" in notes
    assert f"RunnerPools in: {NAMESPACE}.\n" in notes
    insecure = render_notes(
        tmp_path / "b", {**SCENARIOS["allNamespaces"], **SCENARIOS["insecureNoAuth"]}
    )
    assert "WITHOUT authentication" in insecure
    assert "every namespace" in insecure
    assert "Poseidon" not in notes
    poseidon = render_notes(tmp_path / "c", SCENARIOS["poseidon"])
    assert f"runner_management.url: http://pk-poolkeeper.{NAMESPACE}.svc:8080/api/v1" in poseidon
    tls = render_notes(tmp_path / "d", {**SCENARIOS["poseidon"], **SCENARIOS["apiTls"]})
    assert f"runner_management.url: https://pk-poolkeeper.{NAMESPACE}.svc:8080/api/v1" in tls


def test_chart_files_are_all_used() -> None:
    """The dashboard JSON is the one the ConfigMap carries (no stale copy)."""
    config_map = only(render(SCENARIOS["grafanaDashboard"]), "ConfigMap")
    on_disk = (CHART / "dashboards" / "poolkeeper.json").read_text(encoding="utf-8")
    assert json.loads(config_map["data"]["poolkeeper.json"]) == json.loads(on_disk)
    assert Path(CHART / "templates" / "NOTES.txt").is_file()


def test_api_tls_serves_https_to_probes_and_prometheus() -> None:
    manifests = render(SCENARIOS["apiTls"])
    plain = render({"serviceMonitor.enabled": "true"})
    for tier in (OPERATOR, API):
        served = container(manifests, tier)
        args = served["args"]
        assert args[args.index("--tls-cert") :][:4] == [
            "--tls-cert",
            "/etc/poolkeeper/api-tls/tls.crt",
            "--tls-key",
            "/etc/poolkeeper/api-tls/tls.key",
        ]
        files = mounted_secret_files(manifests, tier)
        assert files["/etc/poolkeeper/api-tls/tls.crt"] == ("poolkeeper-api-tls", "tls.crt")
        assert files["/etc/poolkeeper/api-tls/tls.key"] == ("poolkeeper-api-tls", "tls.key")
        assert served["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"
        endpoint = named(manifests, "ServiceMonitor", tier)["spec"]["endpoints"][0]
        assert (endpoint["scheme"], endpoint["tlsConfig"]) == (
            "https",
            {"serverName": "poolkeeper"},
        )
        # Without it: plain HTTP everywhere.
        assert "--tls-cert" not in container(plain, tier)["args"]
        assert "scheme" not in container(plain, tier)["readinessProbe"]["httpGet"]
        assert "scheme" not in named(plain, "ServiceMonitor", tier)["spec"]["endpoints"][0]
    # The API pods' liveness is on the same listener: HTTPS too.
    assert container(manifests, API)["livenessProbe"]["httpGet"]["scheme"] == "HTTPS"
