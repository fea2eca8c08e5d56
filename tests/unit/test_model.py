"""RunnerPool documents: validation, defaults, job prefixes and the paths of errors."""

from __future__ import annotations

import datetime
from typing import Any

import pytest
from pydantic import ValidationError

from controller.model import (
    ClaimsSpec,
    DeletionPolicy,
    FieldError,
    NetworkMode,
    NomadSpec,
    ObjectMeta,
    RunnerPool,
    RunnerPoolSpec,
    RunnerSpec,
    derive_job_prefix,
    format_validation_error,
    immutable_changes,
    job_template_problems,
    validation_errors,
)
from tests.support.documents import DELETE, pool_doc, with_fields


def document(**changes: Any) -> dict[str, Any]:
    """A valid minimal document without a namespace, ``changes`` applied (``with_fields``)."""
    return with_fields(pool_doc(namespace=None), changes)


def errors_of(doc: dict[str, Any]) -> list[FieldError]:
    with pytest.raises(ValidationError) as info:
        RunnerPool.parse_document(doc)
    return validation_errors(info.value)


def paths_of(doc: dict[str, Any]) -> list[str]:
    return [error.path for error in errors_of(doc)]


def pool(**changes: Any) -> RunnerPool:
    return RunnerPool.parse_document(document(**changes))


def test_defaults_are_the_contracts() -> None:
    p = pool()
    spec = p.spec
    assert p.metadata.namespace == "default"
    assert (spec.idle_runners, spec.max_runners, spec.startup_timeout_seconds) == (2, 100, 120)
    assert spec.claims.default_inactivity_timeout_seconds == 300
    assert spec.claims.max_inactivity_timeout_seconds == 3600
    runner = spec.runner
    assert runner.command == ["sleep", "infinity"]
    assert (runner.cpu, runner.memory_mb, runner.memory_max_mb) == (100, 128, None)
    assert runner.network is NetworkMode.NONE
    assert runner.ports == [] and runner.env == {}
    nomad = spec.nomad
    assert nomad.namespace == "default" and nomad.datacenters == ["*"]
    assert nomad.node_pool is None and nomad.job_prefix is None and nomad.job_template == {}
    assert spec.deletion_policy is DeletionPolicy.DRAIN
    assert spec.drain_timeout_seconds == 3600


def test_full_document_round_trips_through_camel_case() -> None:
    doc = document(
        **{
            "metadata.namespace": "team-a",
            "spec.maxRunners": 7,
            "spec.runner.memoryMB": 256,
            "spec.runner.memoryMaxMB": 512,
            "spec.runner.network": "bridge",
            "spec.runner.ports": [8080, 9090],
            "spec.runner.env": {"A_B": "1"},
            "spec.nomad.nodePool": "runners",
            "spec.nomad.jobPrefix": "py-",
            "spec.nomad.jobTemplate": {"Meta": {"team": "a"}},
            "spec.deletionPolicy": "Orphan",
        }
    )
    p = RunnerPool.parse_document(doc)
    assert p.spec.runner.memory_max_mb == 512
    assert p.spec.deletion_policy is DeletionPolicy.ORPHAN
    dumped = p.model_dump(by_alias=True, mode="json")
    assert dumped["spec"]["runner"]["memoryMB"] == 256
    assert dumped["spec"]["nomad"]["jobPrefix"] == "py-"
    assert RunnerPool.parse_document(dumped) == p


def test_python_construction_by_attribute_name() -> None:
    p = RunnerPool(
        metadata=ObjectMeta(name="a.b"),
        spec=RunnerPoolSpec(
            idle_runners=1,
            runner=RunnerSpec(image="x", memory_mb=64),
            nomad=NomadSpec(job_prefix="ab-"),
            claims=ClaimsSpec(default_inactivity_timeout_seconds=5),
        ),
    )
    assert p.api_version == "poolkeeper.dev/v1alpha1" and p.kind == "RunnerPool"
    assert p.key == "default/a.b"
    assert p.job_prefix == "ab-"


def test_documents_accept_only_camel_case() -> None:
    # A file must be rejected where the CRD would prune: snake_case is not the document's.
    doc = document(**{"spec.idle_runners": 2, "spec.idleRunners": DELETE})
    errors = errors_of(doc)
    assert FieldError("spec.idleRunners", "field required") in errors
    assert FieldError("spec.idle_runners", "unknown field") in errors


def test_models_are_frozen() -> None:
    p = pool()
    with pytest.raises(ValidationError):
        p.spec.idle_runners = 3


def test_kubernetes_metadata_other_than_labels_and_status_are_ignored() -> None:
    doc = document(
        **{
            "metadata.uid": "1234",
            "metadata.resourceVersion": "99",
            "metadata.generation": 3,
            "metadata.labels": {"app": "x"},
            "metadata.annotations": {"a": "b"},
            "status": {"idleRunners": 4},
        }
    )
    assert RunnerPool.parse_document(doc).metadata.name == "python-312"


@pytest.mark.parametrize(
    "labels",
    [
        {"app": "x", "example.com/team": "a-b_c.d", "empty": ""},
        {"poolkeeper.dev/poseidon-environment": "0"},
        {"poolkeeper.dev/poseidon-environment": str(2**63 - 1)},
        None,  # `labels:` with nothing under it
    ],
)
def test_labels_kubernetes_accepts(labels: dict[str, str] | None) -> None:
    assert pool(**{"metadata.labels": labels}).metadata.labels == (labels or {})


@pytest.mark.parametrize(
    ("labels", "message"),
    [
        ({"app": 5}, 'must be a string: quote it ("5")'),
        ({"app": ["x"]}, "input should be a valid string"),
        ({"a b": "x"}, "the key's name must be"),
        ({"Example.COM/x": "y"}, "the key's prefix must be a DNS-1123 subdomain"),
        ({"x" * 64: "y"}, "the key's name must be"),
        ({"app": "-x"}, "must be at most 63 letters"),
        ({"app": "x" * 64}, "must be at most 63 letters"),
        ({"poolkeeper.dev/poseidon-environment": "010"}, "an execution environment ID"),
        ({"poolkeeper.dev/poseidon-environment": "ten"}, "an execution environment ID"),
        ({"poolkeeper.dev/poseidon-environment": str(2**63)}, "an execution environment ID"),
        ({"poolkeeper.dev/poseidon-environment": ""}, "an execution environment ID"),
    ],
)
def test_labels_name_the_bad_one(labels: dict[str, Any], message: str) -> None:
    (error,) = errors_of(document(**{"metadata.labels": labels}))
    assert error.path == f"metadata.labels.{next(iter(labels))}"
    assert message in error.message


def test_the_poseidon_environment_label_names_the_environment() -> None:
    assert pool().poseidon_environment is None
    labelled = pool(**{"metadata.labels": {"poolkeeper.dev/poseidon-environment": "10"}})
    assert labelled.poseidon_environment == 10


def test_api_version_and_kind_are_required_in_documents() -> None:
    doc = document(**{"apiVersion": DELETE, "kind": DELETE})
    assert paths_of(doc) == ["apiVersion", "kind"]


VALID = [
    ("spec.idleRunners", 0),
    ("spec.maxRunners", 2),
    ("spec.runner.command", []),
    ("spec.runner.command", ["python3", "-c", ""]),
    ("spec.runner.memoryMaxMB", 128),
    ("spec.runner.network", "bridge"),
    ("spec.runner.env", {"_X1": "", "PATH": "/bin"}),
    ("spec.nomad.namespace", "Team-A"),
    ("spec.nomad.datacenters", ["dc1", "dc2"]),
    ("spec.nomad.nodePool", "gpu_pool.v2"),
    ("spec.nomad.nodePool", None),
    ("spec.nomad.jobPrefix", "a-"),
    ("spec.nomad.jobPrefix", "a" * 63 + "-"),
    ("spec.nomad.jobPrefix", "0--"),
    ("spec.deletionPolicy", "Delete"),
    ("metadata.name", "a"),
    ("metadata.name", "java-21.temurin"),
    ("metadata.name", "a" * 253),
    ("metadata.namespace", "kube-x"),
    ("spec.claims.defaultInactivityTimeoutSeconds", 3600),
]


@pytest.mark.parametrize(("path", "value"), VALID)
def test_valid_values(path: str, value: Any) -> None:
    RunnerPool.parse_document(document(**{path: value}))


INVALID = [
    # (field set, value, path named by the error)
    ("spec.idleRunners", -1, "spec.idleRunners"),
    ("spec.idleRunners", "5", "spec.idleRunners"),
    ("spec.idleRunners", True, "spec.idleRunners"),
    ("spec.idleRunners", 2.5, "spec.idleRunners"),
    ("spec.idleRunners", DELETE, "spec.idleRunners"),
    ("spec.idleRunners", 101, "spec.idleRunners"),  # above the default maxRunners
    ("spec.maxRunners", -1, "spec.maxRunners"),
    ("spec.maxRunners", 1, "spec.idleRunners"),  # idle 2 > max 1
    ("spec.maxRunners", 2**31, "spec.maxRunners"),
    ("spec.startupTimeoutSeconds", 0, "spec.startupTimeoutSeconds"),
    ("spec.drainTimeoutSeconds", 0, "spec.drainTimeoutSeconds"),
    (
        "spec.claims.defaultInactivityTimeoutSeconds",
        0,
        "spec.claims.defaultInactivityTimeoutSeconds",
    ),
    ("spec.claims.maxInactivityTimeoutSeconds", -5, "spec.claims.maxInactivityTimeoutSeconds"),
    ("spec.claims.maxInactivityTimeoutSeconds", 299, "spec.claims.defaultInactivityTimeoutSeconds"),
    ("spec.claims.extra", 1, "spec.claims.extra"),
    ("spec.runner", DELETE, "spec.runner"),
    ("spec.runner.image", DELETE, "spec.runner.image"),
    ("spec.runner.image", "", "spec.runner.image"),
    ("spec.runner.image", "  ", "spec.runner.image"),
    ("spec.runner.image", 3, "spec.runner.image"),
    ("spec.runner.command", "sleep infinity", "spec.runner.command"),
    ("spec.runner.command", ["", "x"], "spec.runner.command[0]"),
    ("spec.runner.command", ["sleep", 5], "spec.runner.command[1]"),
    ("spec.runner.cpu", 0, "spec.runner.cpu"),
    ("spec.runner.memoryMB", 9, "spec.runner.memoryMB"),
    ("spec.runner.memoryMaxMB", 64, "spec.runner.memoryMaxMB"),  # below memoryMB 128
    ("spec.runner.network", "host", "spec.runner.network"),
    ("spec.runner.network", "Bridge", "spec.runner.network"),
    ("spec.runner.ports", [80], "spec.runner.ports"),  # network none
    ("spec.runner.env", {"1X": "a"}, "spec.runner.env.1X"),
    ("spec.runner.env", {"A-B": "a"}, "spec.runner.env.A-B"),
    ("spec.runner.env", {"A": 1}, "spec.runner.env.A"),
    ("spec.runner.env", ["A=1"], "spec.runner.env"),
    ("spec.runner.memory_mb", 64, "spec.runner.memory_mb"),
    ("spec.nomad.namespace", "", "spec.nomad.namespace"),
    ("spec.nomad.namespace", "a/b", "spec.nomad.namespace"),
    ("spec.nomad.datacenters", [], "spec.nomad.datacenters"),
    ("spec.nomad.datacenters", ["dc1", ""], "spec.nomad.datacenters[1]"),
    ("spec.nomad.datacenters", "dc1", "spec.nomad.datacenters"),
    ("spec.nomad.nodePool", "", "spec.nomad.nodePool"),
    ("spec.nomad.nodePool", "a b", "spec.nomad.nodePool"),
    ("spec.nomad.jobPrefix", "python", "spec.nomad.jobPrefix"),
    ("spec.nomad.jobPrefix", "Python-", "spec.nomad.jobPrefix"),
    ("spec.nomad.jobPrefix", "-python-", "spec.nomad.jobPrefix"),
    ("spec.nomad.jobPrefix", "py.thon-", "spec.nomad.jobPrefix"),
    ("spec.nomad.jobPrefix", "a" * 64 + "-", "spec.nomad.jobPrefix"),
    ("spec.nomad.jobTemplate", [], "spec.nomad.jobTemplate"),
    ("spec.deletionPolicy", "drain", "spec.deletionPolicy"),
    ("spec.deletionPolicy", "Keep", "spec.deletionPolicy"),
    ("spec.unknownField", 1, "spec.unknownField"),
    ("unknownTop", 1, "unknownTop"),
    ("apiVersion", "poolkeeper.dev/v1", "apiVersion"),
    ("kind", "Pool", "kind"),
    ("metadata.name", DELETE, "metadata.name"),
    ("metadata.name", "Python", "metadata.name"),
    ("metadata.name", "python_3", "metadata.name"),
    ("metadata.name", "-python", "metadata.name"),
    ("metadata.name", "python.", "metadata.name"),
    ("metadata.name", "a" * 254, "metadata.name"),
    ("metadata.name", "python\n", "metadata.name"),
    ("spec.nomad.jobPrefix", "py-\n", "spec.nomad.jobPrefix"),
    ("spec.nomad.namespace", "ns\n", "spec.nomad.namespace"),
    ("spec.nomad.nodePool", "np\n", "spec.nomad.nodePool"),
    ("spec.runner.env", {"A\n": "1"}, "spec.runner.env.A\n"),
    ("metadata.namespace", "ns\n", "metadata.namespace"),
    ("metadata.namespace", "a.b", "metadata.namespace"),
    ("metadata.namespace", "", "metadata.namespace"),
]


@pytest.mark.parametrize(("path", "value", "error_path"), INVALID)
def test_invalid_values_name_the_field(path: str, value: Any, error_path: str) -> None:
    paths = paths_of(document(**{path: value}))
    assert error_path in paths, paths


def test_ports_with_bridge_must_be_in_range_and_unique() -> None:
    bridge = {"spec.runner.network": "bridge"}
    RunnerPool.parse_document(document(**bridge, **{"spec.runner.ports": [1, 65535]}))
    for ports, path in [
        ([0], "spec.runner.ports[0]"),
        ([80, 65536], "spec.runner.ports[1]"),
        ([80, 80], "spec.runner.ports[1]"),
        (["80"], "spec.runner.ports[0]"),
    ]:
        assert paths_of(document(**bridge, **{"spec.runner.ports": ports})) == [path]


def test_messages_are_readable() -> None:
    errors = errors_of(document(**{"spec.runner.image": DELETE, "spec.maxRunners": -1}))
    assert [str(e) for e in errors] == [
        "spec.maxRunners: input should be greater than or equal to 0",
        "spec.runner.image: field required",
    ]
    (cross,) = errors_of(document(**{"spec.maxRunners": 1}))
    assert str(cross) == "spec.idleRunners: must not be greater than maxRunners (1)"


def test_format_validation_error_is_one_line() -> None:
    with pytest.raises(ValidationError) as info:
        RunnerPool.parse_document(document(**{"spec.runner.image": "", "spec.bogus": 1}))
    line = format_validation_error(info.value)
    assert "\n" not in line
    assert line.startswith("spec.runner.image: ") and "spec.bogus: unknown field" in line


def test_validation_errors_of_a_spec_alone_take_a_root() -> None:
    with pytest.raises(ValidationError) as info:
        RunnerPoolSpec.model_validate({"idleRunners": 1, "runner": {"image": "x", "cpu": 0}})
    assert [e.path for e in validation_errors(info.value, root="spec")] == ["spec.runner.cpu"]


def test_validation_errors_map_attribute_names_to_aliases() -> None:
    with pytest.raises(ValidationError) as info:
        RunnerSpec(image="x", memory_mb=5)
    assert [e.path for e in validation_errors(info.value, root="spec.runner")] == [
        "spec.runner.memoryMB"
    ]


# --- job prefixes --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "prefix"),
    [
        ("python-312", "python-312-"),
        ("java-21.temurin", "java-21-temurin-"),
        ("a.b.c", "a-b-c-"),
        ("x" * 60, "x" * 50 + "-"),
        ("a" * 49 + ".b", "a" * 49 + "--"),
    ],
)
def test_derived_job_prefix(name: str, prefix: str) -> None:
    assert derive_job_prefix(name) == prefix
    p = pool(**{"metadata.name": name})
    assert p.job_prefix == prefix
    assert p.spec.job_prefix_for(name) == prefix


def test_explicit_job_prefix_wins() -> None:
    p = pool(**{"spec.nomad.jobPrefix": "py-"})
    assert p.job_prefix == "py-"
    assert p.key == "default/python-312"


def test_immutable_changes() -> None:
    base = pool()
    assert immutable_changes(base, pool(**{"spec.idleRunners": 5})) == []
    # Spelling out the derived prefix is no change.
    assert immutable_changes(base, pool(**{"spec.nomad.jobPrefix": "python-312-"})) == []
    assert immutable_changes(base, pool(**{"spec.nomad.jobPrefix": "py-"})) == [
        "spec.nomad.jobPrefix"
    ]
    assert immutable_changes(base, pool(**{"spec.nomad.namespace": "other"})) == [
        "spec.nomad.namespace"
    ]


# --- jobTemplate -------------------------------------------------------------------------


TEMPLATE_INVALID = [
    ({"ID": "x"}, "spec.nomad.jobTemplate.ID"),
    ({"id": "x"}, "spec.nomad.jobTemplate.id"),
    ({"nAmE": "x"}, "spec.nomad.jobTemplate.nAmE"),
    ({"NAMESPACE": "x"}, "spec.nomad.jobTemplate.NAMESPACE"),
    ({"type": "service"}, "spec.nomad.jobTemplate.type"),
    ({"Job": {"Priority": 10}}, "spec.nomad.jobTemplate.Job"),
    ({"TaskGroups": [{"Count": 2}]}, "spec.nomad.jobTemplate.TaskGroups[0].Count"),
    ({"taskgroups": [{"COUNT": 2}]}, "spec.nomad.jobTemplate.taskgroups[0].COUNT"),
    ({"Meta": {"poolkeeper_pool": "x"}}, "spec.nomad.jobTemplate.Meta.poolkeeper_pool"),
    ({"meta": {"PoolKeeper_Other": "x"}}, "spec.nomad.jobTemplate.meta.PoolKeeper_Other"),
    (
        {"TaskGroups": [{"META": {"poolkeeper_template": "x"}}]},
        "spec.nomad.jobTemplate.TaskGroups[0].META.poolkeeper_template",
    ),
    (
        {"TaskGroups": [{"Tasks": [{"Meta": {"POOLKEEPER_X": "x"}}]}]},
        "spec.nomad.jobTemplate.TaskGroups[0].Tasks[0].Meta.POOLKEEPER_X",
    ),
    ({"Meta": {"a": 1}}, "spec.nomad.jobTemplate.Meta.a"),
    ({"Meta": "x"}, "spec.nomad.jobTemplate.Meta"),
    ({"TaskGroups": [{}, {}]}, "spec.nomad.jobTemplate.TaskGroups"),
    ({"TaskGroups": {"Tasks": []}}, "spec.nomad.jobTemplate.TaskGroups"),
    ({"TaskGroups": ["x"]}, "spec.nomad.jobTemplate.TaskGroups[0]"),
    ({"TaskGroups": [{"Tasks": [{}, {}]}]}, "spec.nomad.jobTemplate.TaskGroups[0].Tasks"),
    ({"Priority": 50, "priority": 60}, "spec.nomad.jobTemplate.priority"),
    ({"Priority": float("nan")}, "spec.nomad.jobTemplate.Priority"),
    ({"Meta": {"since": datetime.date(2026, 1, 1)}}, "spec.nomad.jobTemplate.Meta.since"),
    ({"Constraints": [{"LTarget": object()}]}, "spec.nomad.jobTemplate.Constraints[0].LTarget"),
]


@pytest.mark.parametrize(("template", "error_path"), TEMPLATE_INVALID)
def test_job_template_reserved_and_malformed(template: dict[str, Any], error_path: str) -> None:
    assert paths_of(document(**{"spec.nomad.jobTemplate": template})) == [error_path]


@pytest.mark.parametrize(
    "template",
    [
        {},
        {"Priority": 70, "Meta": {"team": "a"}},
        {"TaskGroups": []},
        {"TaskGroups": [{"Name": "g", "RestartPolicy": {"Attempts": 0}}]},
        {"TaskGroups": [{"Tasks": [{"Config": {"Image": "x", "image": "y"}, "KillTimeout": 1}]}]},
        {"TaskGroups": [{"Tasks": [{"Env": {"a": "1", "A": "2"}}]}]},
        {"Constraints": [{"LTarget": "${attr.kernel.name}", "RTarget": "linux"}]},
    ],
)
def test_job_template_accepted(template: dict[str, Any]) -> None:
    p = pool(**{"spec.nomad.jobTemplate": template})
    assert p.spec.nomad.job_template == template


def test_job_template_problems_lists_every_problem() -> None:
    problems = job_template_problems(
        {"ID": "x", "TaskGroups": [{"Count": 1, "Tasks": [{"Meta": {"poolkeeper_a": "1"}}]}]}
    )
    assert [p.path for p in problems] == [
        "ID",
        "TaskGroups[0].Count",
        "TaskGroups[0].Tasks[0].Meta.poolkeeper_a",
    ]
