"""The Helm chart: lint, render, validate offline, and check what the operator relies on."""

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

# Each optional feature switched on alone, and the other modes of the chart.
SCENARIOS: Final[dict[str, dict[str, str]]] = {
    "default": {},
    "serviceMonitor": {"serviceMonitor.enabled": "true"},
    "podDisruptionBudget": {"podDisruptionBudget.enabled": "true"},
    "networkPolicy": {
        "networkPolicy.enabled": "true",
        "networkPolicy.ingressFrom": json.dumps(
            [{"namespaceSelector": {"matchLabels": {"team": "platform"}}}]
        ),
    },
    "grafanaDashboard": {"grafanaDashboard.enabled": "true"},
    "prometheusRule": {"prometheusRule.enabled": "true"},
    "logs": {"logFormat": '"json"', "accessLog": "true"},
    "allNamespaces": {"watch.allNamespaces": "true"},
    "namespaces": {"watch.namespaces": '["team-a", "team-b"]'},
    "nomadTls": {"nomad.caCert": "true", "nomad.clientCert": "true"},
    "insecureNoAuth": {"apiTokens.insecureNoAuth": "true"},
    "poseidon": {"poseidon.enabled": "true"},
    "poseidonManaged": {
        "poseidon.enabled": "true",
        "poseidon.environments": '"managed"',
        "poseidon.depletingThreshold": "0.25",
        "poseidon.environmentTemplate": json.dumps(
            {"metadata": {"namespace": "codeocean"}, "spec": {"maxRunners": 50}}
        ),
    },
    "apiTls": {
        "apiTls.secretName": '"poolkeeper-api-tls"',
        "serviceMonitor.enabled": "true",
        "serviceMonitor.tlsConfig": '{"serverName": "poolkeeper"}',
    },
    "everything": {
        "serviceMonitor.enabled": "true",
        "podDisruptionBudget.enabled": "true",
        "networkPolicy.enabled": "true",
        "grafanaDashboard.enabled": "true",
        "prometheusRule.enabled": "true",
        "watch.allNamespaces": "true",
        "nomad.caCert": "true",
        "nomad.namespace": '"runners"',
        "nomad.region": '"eu"',
        "replicaCount": "3",
    },
}
KUBERNETES_VERSION: Final = "1.32"

CRD_FILE: Final = "runnerpools.poolkeeper.dev.yaml"
PEERING_CRDS: Final = ROOT / "charts" / "poolkeeper" / "crds" / "kopf-peerings.yaml"


# --- lint and offline validation ----------------------------------------------------------


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_helm_lint_strict(scenario: str) -> None:
    result = run_helm("lint", "--strict", str(CHART), *set_args(SCENARIOS[scenario]))
    assert result.returncode == 0, result.stdout + result.stderr


def _peering_schemas() -> dict[str, Mapping[str, Any]]:
    schemas = {}
    for crd in yaml.safe_load_all(PEERING_CRDS.read_text(encoding="utf-8")):
        (version,) = crd["spec"]["versions"]
        api_version = f"{crd['spec']['group']}/{version['name']}"
        schemas[f"{api_version}/{crd['spec']['names']['kind']}"] = version["schema"][
            "openAPIV3Schema"
        ]
    return schemas


def _check_service_monitor(manifest: Manifest, manifests: list[Manifest]) -> None:
    """No Kubernetes schema exists for the Prometheus operator's ServiceMonitor: check the
    fields it is used by against the Service it must find."""
    service = only(manifests, "Service")
    spec = manifest["spec"]
    assert set(spec) == {"selector", "namespaceSelector", "endpoints"}
    labels = service["metadata"]["labels"]
    assert spec["selector"]["matchLabels"].items() <= labels.items()
    assert spec["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    (endpoint,) = spec["endpoints"]
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert endpoint["path"] == "/metrics"
    assert re.fullmatch(r"\d+[smh]", endpoint["interval"])


def validate_offline(manifests: list[Manifest]) -> list[str]:
    """Every manifest against the Kubernetes 1.32 schemas (strict: no unknown fields).
    Kinds without a built-in schema: kopf peerings against their CRD in the chart, the
    ServiceMonitor and the PrometheusRule by their own checks; any other unknown kind is
    an error."""
    problems: list[str] = []
    peering_schemas = _peering_schemas()
    for manifest in manifests:
        name = f"{manifest['kind']}/{manifest['metadata']['name']}"
        try:
            kubernetes_validate.validate(manifest, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.SchemaNotFoundError:
            key = f"{manifest['apiVersion']}/{manifest['kind']}"
            if key in peering_schemas:
                jsonschema.Draft4Validator(peering_schemas[key]).validate(manifest)
            elif key == "monitoring.coreos.com/v1/ServiceMonitor":
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
    deployment = only(manifests, "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    container["securityContext"]["readOnlyRootFileSystem"] = True
    problems = validate_offline(manifests)
    assert len(problems) == 1 and "readOnlyRootFileSystem" in problems[0]


@pytest.mark.parametrize(
    ("scenario", "kind"),
    [
        ("serviceMonitor", "ServiceMonitor"),
        ("podDisruptionBudget", "PodDisruptionBudget"),
        ("networkPolicy", "NetworkPolicy"),
        ("grafanaDashboard", "ConfigMap"),
        ("prometheusRule", "PrometheusRule"),
    ],
)
def test_optional_features_render_only_when_enabled(scenario: str, kind: str) -> None:
    assert of_kind(render(), kind) == []
    assert len(of_kind(render(SCENARIOS[scenario]), kind)) == 1


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


def test_chart_crd_is_identical_to_the_top_level_copy() -> None:
    top = (ROOT / "crds" / CRD_FILE).read_bytes()
    assert (CHART / "crds" / CRD_FILE).read_bytes() == top


def test_chart_ships_the_crds_kopf_peering_needs() -> None:
    crds = {m["metadata"]["name"]: m for m in of_kind(render(), "CustomResourceDefinition")}
    assert set(crds) == {
        "runnerpools.poolkeeper.dev",
        "kopfpeerings.kopf.dev",
        "clusterkopfpeerings.kopf.dev",
    }
    assert crds["kopfpeerings.kopf.dev"]["spec"]["scope"] == "Namespaced"
    assert crds["clusterkopfpeerings.kopf.dev"]["spec"]["scope"] == "Cluster"
    for name in ("kopfpeerings.kopf.dev", "clusterkopfpeerings.kopf.dev"):
        spec = crds[name]["spec"]
        assert spec["group"] == "kopf.dev"
        (version,) = spec["versions"]
        assert version["name"] == "v1" and version["served"] and version["storage"]
        # kopf writes its keep-alives into a free-form status with plain patches.
        assert "subresources" not in version
        status = version["schema"]["openAPIV3Schema"]["properties"]["status"]
        assert status["x-kubernetes-preserve-unknown-fields"] is True


# --- RBAC ---------------------------------------------------------------------------------


def _rules(role: Manifest) -> set[tuple[str, str, str]]:
    return {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def expected_rules(peering: str) -> set[tuple[str, str, str]]:
    rules = {("poolkeeper.dev", "runnerpools", v) for v in ("get", "list", "watch", "patch")}
    rules.add(("poolkeeper.dev", "runnerpools/status", "patch"))
    rules.add(("", "events", "create"))
    rules |= {("kopf.dev", peering, v) for v in ("get", "list", "watch", "patch")}
    return rules


def _no_wildcards(role: Manifest) -> None:
    for rule in role["rules"]:
        assert set(rule) <= {"apiGroups", "resources", "verbs"}  # no resourceNames, URLs
        for key in ("apiGroups", "resources", "verbs"):
            assert all("*" not in item for item in rule[key]), rule


@pytest.mark.parametrize(
    ("scenario", "namespaces"),
    [("default", [NAMESPACE]), ("namespaces", ["team-a", "team-b"])],
)
def test_namespaced_rbac_is_exactly_the_least_privilege_set(
    scenario: str, namespaces: list[str]
) -> None:
    manifests = render(SCENARIOS[scenario])
    assert of_kind(manifests, "ClusterRole") == []
    assert of_kind(manifests, "ClusterRoleBinding") == []
    roles = of_kind(manifests, "Role")
    bindings = of_kind(manifests, "RoleBinding")
    assert sorted(r["metadata"]["namespace"] for r in roles) == sorted(namespaces)
    account = only(manifests, "ServiceAccount")["metadata"]
    for role in roles:
        _no_wildcards(role)
        assert _rules(role) == expected_rules("kopfpeerings")
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
    assert _rules(role) == expected_rules("clusterkopfpeerings")
    binding = only(manifests, "ClusterRoleBinding")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": role["metadata"]["name"],
    }
    account = only(manifests, "ServiceAccount")["metadata"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account["name"], "namespace": account["namespace"]}
    ]


# --- the Deployment -----------------------------------------------------------------------


def _pod(manifests: list[Manifest]) -> dict[str, Any]:
    spec: dict[str, Any] = only(manifests, "Deployment")["spec"]["template"]["spec"]
    return spec


def _container(manifests: list[Manifest]) -> dict[str, Any]:
    (container,) = _pod(manifests)["containers"]
    return dict(container)


def test_deployment_args_in_namespaced_mode() -> None:
    assert _container(render())["args"] == [
        "operator",
        "--peering",
        "poolkeeper",
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
    logs = _container(render(SCENARIOS["logs"]))["args"]
    assert logs[logs.index("--log-format") :][:3] == ["--log-format", "json", "--access-log"]
    args = _container(render(SCENARIOS["namespaces"]))["args"]
    assert args[args.index("--namespace") :][:4] == [
        "--namespace",
        "team-a",
        "--namespace",
        "team-b",
    ]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_no_priority_is_passed_and_the_scope_is_exclusive(scenario: str) -> None:
    """Replicas draw distinct random priorities themselves: the chart must not pin one."""
    args = _container(render(SCENARIOS[scenario]))["args"]
    assert not any(arg.startswith("--priority") for arg in args)
    assert args[:2] == ["operator", "--peering"]
    assert ("--all-namespaces" in args) != ("--namespace" in args)
    assert ("--api-token-file" in args) != ("--insecure-no-auth" in args)


def test_all_namespaces_mode() -> None:
    manifests = render(SCENARIOS["allNamespaces"])
    args = _container(manifests)["args"]
    assert "--all-namespaces" in args
    peering = only(manifests, "ClusterKopfPeering")
    assert of_kind(manifests, "KopfPeering") == []
    assert peering["metadata"]["name"] == args[args.index("--peering") + 1]
    assert "namespace" not in peering["metadata"]


@pytest.mark.parametrize(
    ("scenario", "namespaces"),
    [("default", [NAMESPACE]), ("namespaces", ["team-a", "team-b"])],
)
def test_a_peering_object_exists_where_the_operator_looks(
    scenario: str, namespaces: list[str]
) -> None:
    manifests = render(SCENARIOS[scenario])
    args = _container(manifests)["args"]
    peerings = of_kind(manifests, "KopfPeering")
    assert {p["metadata"]["name"] for p in peerings} == {args[args.index("--peering") + 1]}
    assert sorted(p["metadata"]["namespace"] for p in peerings) == sorted(namespaces)


def test_replicas_and_update_strategy() -> None:
    deployment = only(render(), "Deployment")
    assert deployment["spec"]["replicas"] == 2
    # Passive replicas never become ready, so a rolling update could never progress.
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    assert only(render({"replicaCount": "3"}), "Deployment")["spec"]["replicas"] == 3


def test_hardened_security_context() -> None:
    for scenario in SCENARIOS.values():
        manifests = render(scenario)
        pod = _pod(manifests)
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        context = _container(manifests)["securityContext"]
        assert context["runAsNonRoot"] is True
        assert isinstance(context["runAsUser"], int) and context["runAsUser"] > 0
        assert context["readOnlyRootFilesystem"] is True
        assert context["allowPrivilegeEscalation"] is False
        assert context["privileged"] is False
        assert context["capabilities"] == {"drop": ["ALL"]}
        assert context["seccompProfile"] == {"type": "RuntimeDefault"}


def test_image_user_matches_the_chart() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    user = _container(render())["securityContext"]["runAsUser"]
    assert f"USER {user}:" in dockerfile
    assert 'ENTRYPOINT ["poolkeeper"]' in dockerfile and 'CMD ["operator"]' in dockerfile


def test_the_poseidon_api_options_and_template() -> None:
    default = _container(render())
    assert not any(arg.startswith("--poseidon") for arg in default["args"])
    args = _container(render(SCENARIOS["poseidon"]))["args"]
    assert args[args.index("--poseidon-api") :] == [
        "--poseidon-api",
        "--poseidon-environments",
        "readonly",
        "--poseidon-depleting-threshold",
        "0",
    ]
    assert of_kind(render(SCENARIOS["poseidon"]), "ConfigMap") == []

    managed = render(SCENARIOS["poseidonManaged"])
    container = _container(managed)
    args = container["args"]
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
    mount = next(m for m in container["volumeMounts"] if m["name"] == "poseidon-template")
    assert mount["mountPath"] == "/etc/poolkeeper/poseidon"
    volume = next(v for v in _pod(managed)["volumes"] if v["name"] == "poseidon-template")
    assert volume["configMap"]["name"] == config_map["metadata"]["name"]
    # The template is read at start: changing it rolls the pods.
    annotations = only(managed, "Deployment")["spec"]["template"]["metadata"]["annotations"]
    changed = dict(
        SCENARIOS["poseidonManaged"],
        **{"poseidon.environmentTemplate": '{"spec": {"maxRunners": 60}}'},
    )
    other = only(render(changed), "Deployment")["spec"]["template"]["metadata"]["annotations"]
    assert annotations["checksum/poseidon-template"] != other["checksum/poseidon-template"]


def test_probes_service_and_ports() -> None:
    manifests = render()
    container = _container(manifests)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"http": 8080, "liveness": 8081}
    liveness = container["livenessProbe"]["httpGet"]
    assert (liveness["path"], ports[liveness["port"]]) == ("/healthz", 8081)
    readiness = container["readinessProbe"]["httpGet"]
    assert (readiness["path"], readiness["port"]) == ("/readyz", "http")
    assert container["resources"]["requests"] and container["resources"]["limits"]
    service = only(manifests, "Service")
    assert service["spec"]["ports"] == [
        {"name": "http", "port": 8080, "targetPort": "http", "protocol": "TCP"}
    ]
    pod_labels = only(manifests, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()


def _env(container: Mapping[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def _mounted_secret_files(manifests: list[Manifest]) -> dict[str, tuple[str, str]]:
    """Mounted file path -> (secret name, key)."""
    pod = _pod(manifests)
    volumes = {v["name"]: v for v in pod["volumes"]}
    files = {}
    for mount in _container(manifests)["volumeMounts"]:
        secret = volumes[mount["name"]].get("secret")
        if secret:
            assert mount["readOnly"] is True
            for item in secret["items"]:
                files[f"{mount['mountPath']}/{item['path']}"] = (
                    secret["secretName"],
                    item["key"],
                )
    return files


def test_nomad_connection_and_api_tokens_come_from_secrets() -> None:
    manifests = render()
    container = _container(manifests)
    env = _env(container)
    assert env["NOMAD_ADDR"] == {"secretKeyRef": {"name": "poolkeeper-nomad", "key": "address"}}
    assert env["NOMAD_TOKEN"] == {
        "secretKeyRef": {"name": "poolkeeper-nomad", "key": "token", "optional": True}
    }
    assert env["POD_ID"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert "NOMAD_CACERT" not in env and "NOMAD_NAMESPACE" not in env
    files = _mounted_secret_files(manifests)
    token_file = container["args"][container["args"].index("--api-token-file") + 1]
    assert files[token_file] == ("poolkeeper-api-tokens", "tokens")


def test_nomad_tls_files_are_mounted_where_the_env_points() -> None:
    manifests = render(SCENARIOS["nomadTls"])
    env = _env(_container(manifests))
    files = _mounted_secret_files(manifests)
    assert files[env["NOMAD_CACERT"]] == ("poolkeeper-nomad", "ca.crt")
    assert files[env["NOMAD_CLIENT_CERT"]] == ("poolkeeper-nomad", "tls.crt")
    assert files[env["NOMAD_CLIENT_KEY"]] == ("poolkeeper-nomad", "tls.key")
    everything = _env(_container(render(SCENARIOS["everything"])))
    assert (everything["NOMAD_NAMESPACE"], everything["NOMAD_REGION"]) == ("runners", "eu")


def test_insecure_no_auth_mounts_no_tokens() -> None:
    manifests = render(SCENARIOS["insecureNoAuth"])
    assert "--insecure-no-auth" in _container(manifests)["args"]
    assert _mounted_secret_files(manifests) == {}


def test_root_filesystem_is_read_only_but_tmp_is_writable() -> None:
    manifests = render()
    mounts = {m["mountPath"]: m["name"] for m in _container(manifests)["volumeMounts"]}
    volumes = {v["name"]: v for v in _pod(manifests)["volumes"]}
    assert "emptyDir" in volumes[mounts["/tmp"]]


# --- optional features --------------------------------------------------------------------


def test_pod_disruption_budget_selects_the_pods() -> None:
    manifests = render(SCENARIOS["podDisruptionBudget"])
    budget = only(manifests, "PodDisruptionBudget")["spec"]
    pod_labels = only(manifests, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert budget["selector"]["matchLabels"].items() <= pod_labels.items()
    # Passive replicas are unready by design: they must stay evictable.
    assert budget["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    assert budget["maxUnavailable"] == 1


def test_network_policy() -> None:
    manifests = render(SCENARIOS["networkPolicy"])
    policy = only(manifests, "NetworkPolicy")["spec"]
    pod_labels = only(manifests, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert policy["podSelector"]["matchLabels"].items() <= pod_labels.items()
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
    assert "kubectl scale rpool/python-312" in notes
    assert "create secret generic poolkeeper-nomad" in notes
    assert "create secret generic poolkeeper-api-tokens" in notes
    assert f"RunnerPools in: {NAMESPACE}" in notes
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
    container = _container(manifests)
    args = container["args"]
    assert args[args.index("--tls-cert") :][:4] == [
        "--tls-cert",
        "/etc/poolkeeper/api-tls/tls.crt",
        "--tls-key",
        "/etc/poolkeeper/api-tls/tls.key",
    ]
    files = _mounted_secret_files(manifests)
    assert files["/etc/poolkeeper/api-tls/tls.crt"] == ("poolkeeper-api-tls", "tls.crt")
    assert files["/etc/poolkeeper/api-tls/tls.key"] == ("poolkeeper-api-tls", "tls.key")
    assert container["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"
    endpoint = only(manifests, "ServiceMonitor")["spec"]["endpoints"][0]
    assert (endpoint["scheme"], endpoint["tlsConfig"]) == ("https", {"serverName": "poolkeeper"})
    # Without it: plain HTTP everywhere.
    plain = render({"serviceMonitor.enabled": "true"})
    assert "--tls-cert" not in _container(plain)["args"]
    assert "scheme" not in _container(plain)["readinessProbe"]["httpGet"]
    assert "scheme" not in only(plain, "ServiceMonitor")["spec"]["endpoints"][0]
