"""The RunnerPool CRD schema and the pydantic models accept and reject the same documents.

The CRD is applied as a Kubernetes API server applies it (``tests/support/structural_schema``:
JSON round trip, pruning, null pruning and defaulting, OpenAPI validation, CEL rules).

For a canonical document (no unknown field, no ``null``, no whole float) the CRD and
``RunnerPool.parse_document`` must agree, and on acceptance parse to the same pool (the
defaults agree). For any document, what the operator is served (the normalised object) must
be accepted by the model exactly when the CRD accepted the document. Where the two differ on
purpose it is asserted too: Kubernetes prunes unknown fields and takes ``null`` for absent
where a pool file is refused, and ``jobTemplate`` is opaque to the CRD and checked by the
controller.
"""

from __future__ import annotations

import json
import types
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Final, get_args

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from controller.model import RunnerPool, ScheduleSpec, immutable_changes
from tests.support.documents import DELETE, pool_doc, with_fields
from tests.support.structural_schema import StructuralSchema

ROOT: Final = Path(__file__).resolve().parents[2]
CRD_PATH: Final = ROOT / "crds" / "runnerpools.poolkeeper.dev.yaml"
INT32_MAX: Final = 2**31 - 1
CRD: Final = StructuralSchema.of_storage_version(
    yaml.safe_load(CRD_PATH.read_text(encoding="utf-8"))
)


def model_accepts(document: Any) -> bool:
    try:
        RunnerPool.parse_document(document)
    except ValidationError:
        return False
    return True


# --- documents ---------------------------------------------------------------------------


def document_with(changes: Mapping[str, Any]) -> dict[str, Any]:
    """A valid document of one idle runner with dotted paths set (``DELETE`` removes)."""
    return with_fields(pool_doc(idle=1), changes)


OK, BAD = True, False
BRIDGE: Final = {"spec.runner.network": "bridge"}
WINDOW: Final = {"cron": "45 8 * * 1-5", "durationMinutes": 90, "idleRunners": 50}

# (changes, valid): every known field, at and beyond its bounds, with wrong types.
CASES: Final[list[tuple[dict[str, Any], bool]]] = [
    ({}, OK),
    # idleRunners (required) and maxRunners
    ({"spec.idleRunners": 0}, OK),
    ({"spec.idleRunners": 100}, OK),
    ({"spec.idleRunners": 101}, BAD),
    ({"spec.idleRunners": -1}, BAD),
    ({"spec.idleRunners": "5"}, BAD),
    ({"spec.idleRunners": True}, BAD),
    ({"spec.idleRunners": 1.5}, BAD),
    ({"spec.idleRunners": DELETE}, BAD),
    ({"spec.idleRunners": INT32_MAX, "spec.maxRunners": INT32_MAX}, OK),
    ({"spec.idleRunners": INT32_MAX + 1, "spec.maxRunners": INT32_MAX}, BAD),
    ({"spec.idleRunners": 0, "spec.maxRunners": 0}, OK),
    ({"spec.idleRunners": 3, "spec.maxRunners": 2}, BAD),
    ({"spec.maxRunners": -1}, BAD),
    ({"spec.maxRunners": INT32_MAX + 1}, BAD),
    ({"spec.maxRunners": "100"}, BAD),
    # startupTimeoutSeconds and drainTimeoutSeconds (> 0)
    ({"spec.startupTimeoutSeconds": 1}, OK),
    ({"spec.startupTimeoutSeconds": 0}, BAD),
    ({"spec.startupTimeoutSeconds": INT32_MAX}, OK),
    ({"spec.startupTimeoutSeconds": INT32_MAX + 1}, BAD),
    ({"spec.startupTimeoutSeconds": "120"}, BAD),
    ({"spec.drainTimeoutSeconds": 1}, OK),
    ({"spec.drainTimeoutSeconds": 0}, BAD),
    ({"spec.drainTimeoutSeconds": -3600}, BAD),
    ({"spec.drainTimeoutSeconds": []}, BAD),
    # claims
    ({"spec.claims": {}}, OK),
    ({"spec.claims.defaultInactivityTimeoutSeconds": 3600}, OK),
    ({"spec.claims.defaultInactivityTimeoutSeconds": 3601}, BAD),
    ({"spec.claims.maxInactivityTimeoutSeconds": 299}, BAD),  # below the default 300
    ({"spec.claims.maxInactivityTimeoutSeconds": 300}, OK),
    (
        {
            "spec.claims.defaultInactivityTimeoutSeconds": 10,
            "spec.claims.maxInactivityTimeoutSeconds": 10,
        },
        OK,
    ),
    ({"spec.claims.defaultInactivityTimeoutSeconds": 0}, BAD),
    ({"spec.claims.maxInactivityTimeoutSeconds": INT32_MAX + 1}, BAD),
    ({"spec.claims": "300"}, BAD),
    ({"spec.claims": []}, BAD),
    # runner.image (required, not blank)
    ({"spec.runner": DELETE}, BAD),
    ({"spec.runner": "python"}, BAD),
    ({"spec.runner.image": DELETE}, BAD),
    ({"spec.runner.image": ""}, BAD),
    ({"spec.runner.image": " "}, BAD),
    ({"spec.runner.image": "\t\n"}, BAD),
    ({"spec.runner.image": "\u00a0\u3000\u2028"}, BAD),
    ({"spec.runner.image": "\x1c"}, BAD),
    ({"spec.runner.image": " x "}, OK),
    ({"spec.runner.image": "\u200b"}, OK),  # zero-width space is not whitespace
    ({"spec.runner.image": 5}, BAD),
    # runner.command
    ({"spec.runner.command": []}, OK),
    ({"spec.runner.command": ["python", "-c", ""]}, OK),
    ({"spec.runner.command": [""]}, BAD),
    ({"spec.runner.command": ["", "x"]}, BAD),
    ({"spec.runner.command": [" "]}, OK),
    ({"spec.runner.command": [1]}, BAD),
    ({"spec.runner.command": "sleep infinity"}, BAD),
    # runner.cpu, memoryMB, memoryMaxMB
    ({"spec.runner.cpu": 1}, OK),
    ({"spec.runner.cpu": 0}, BAD),
    ({"spec.runner.cpu": INT32_MAX + 1}, BAD),
    ({"spec.runner.cpu": "100"}, BAD),
    ({"spec.runner.memoryMB": 10}, OK),
    ({"spec.runner.memoryMB": 9}, BAD),
    ({"spec.runner.memoryMB": False}, BAD),
    ({"spec.runner.memoryMaxMB": 128}, OK),
    ({"spec.runner.memoryMaxMB": 127}, BAD),  # below the default memoryMB 128
    ({"spec.runner.memoryMaxMB": 10, "spec.runner.memoryMB": 10}, OK),
    ({"spec.runner.memoryMaxMB": 9, "spec.runner.memoryMB": 10}, BAD),
    ({"spec.runner.memoryMaxMB": INT32_MAX}, OK),
    ({"spec.runner.memoryMaxMB": INT32_MAX + 1}, BAD),
    ({"spec.runner.memoryMaxMB": "512"}, BAD),
    # runner.network and ports
    ({"spec.runner.network": "none"}, OK),
    ({"spec.runner.network": "bridge"}, OK),
    ({"spec.runner.network": "host"}, BAD),
    ({"spec.runner.network": "Bridge"}, BAD),
    ({"spec.runner.ports": []}, OK),
    ({"spec.runner.ports": [8080]}, BAD),  # needs bridge
    ({**BRIDGE, "spec.runner.ports": [8080, 1, 65535]}, OK),
    ({**BRIDGE, "spec.runner.ports": [0]}, BAD),
    ({**BRIDGE, "spec.runner.ports": [65536]}, BAD),
    ({**BRIDGE, "spec.runner.ports": [80, 80]}, BAD),
    ({**BRIDGE, "spec.runner.ports": ["80"]}, BAD),
    ({**BRIDGE, "spec.runner.ports": 80}, BAD),
    # runner.env
    ({"spec.runner.env": {}}, OK),
    ({"spec.runner.env": {"A_1": "x", "_b": "", "PYTHONUNBUFFERED": "1"}}, OK),
    ({"spec.runner.env": {"1A": "x"}}, BAD),
    ({"spec.runner.env": {"A-B": "x"}}, BAD),
    ({"spec.runner.env": {"": "x"}}, BAD),
    ({"spec.runner.env": {"A": 1}}, BAD),
    ({"spec.runner.env": {"PATH\n": "/bin"}}, BAD),
    ({"spec.runner.env": {"A": True}}, BAD),
    ({"spec.runner.env": ["A=1"]}, BAD),
    # nomad.namespace
    ({"spec.nomad": {}}, OK),
    ({"spec.nomad.namespace": "team-A-2"}, OK),
    ({"spec.nomad.namespace": "a" * 128}, OK),
    ({"spec.nomad.namespace": "a" * 129}, BAD),
    ({"spec.nomad.namespace": ""}, BAD),
    ({"spec.nomad.namespace": "a_b"}, BAD),
    ({"spec.nomad.namespace": "a b"}, BAD),
    ({"spec.nomad.namespace": 1}, BAD),
    ({"spec.nomad.namespace": "default\n"}, BAD),  # RE2's $ is the end of text
    # nomad.datacenters
    ({"spec.nomad.datacenters": ["dc1", "dc2", "dc1"]}, OK),
    ({"spec.nomad.datacenters": []}, BAD),
    ({"spec.nomad.datacenters": [""]}, BAD),
    ({"spec.nomad.datacenters": "dc1"}, BAD),
    ({"spec.nomad.datacenters": [1]}, BAD),
    # nomad.nodePool
    ({"spec.nomad.nodePool": "gpu.pool_1-a"}, OK),
    ({"spec.nomad.nodePool": "p" * 128}, OK),
    ({"spec.nomad.nodePool": "p" * 129}, BAD),
    ({"spec.nomad.nodePool": ""}, BAD),
    ({"spec.nomad.nodePool": "a/b"}, BAD),
    ({"spec.nomad.nodePool": 7}, BAD),
    ({"spec.nomad.nodePool": "gpu\n"}, BAD),
    # nomad.jobPrefix
    ({"spec.nomad.jobPrefix": "python-"}, OK),
    ({"spec.nomad.jobPrefix": "a-"}, OK),
    ({"spec.nomad.jobPrefix": "0--"}, OK),
    ({"spec.nomad.jobPrefix": "a" * 63 + "-"}, OK),
    ({"spec.nomad.jobPrefix": "a" * 64 + "-"}, BAD),
    ({"spec.nomad.jobPrefix": "python"}, BAD),
    ({"spec.nomad.jobPrefix": "-python-"}, BAD),
    ({"spec.nomad.jobPrefix": "Python-"}, BAD),
    ({"spec.nomad.jobPrefix": "py.thon-"}, BAD),
    ({"spec.nomad.jobPrefix": "-"}, BAD),
    ({"spec.nomad.jobPrefix": ["python-"]}, BAD),
    ({"spec.nomad.jobPrefix": "python-\n"}, BAD),
    # nomad.jobTemplate (an object; its content is the controller's business)
    ({"spec.nomad.jobTemplate": {}}, OK),
    ({"spec.nomad.jobTemplate": {"Meta": {"course": "web"}, "Priority": 60}}, OK),
    ({"spec.nomad.jobTemplate": "{}"}, BAD),
    ({"spec.nomad.jobTemplate": []}, BAD),
    # deletionPolicy
    ({"spec.deletionPolicy": "Drain"}, OK),
    ({"spec.deletionPolicy": "Delete"}, OK),
    ({"spec.deletionPolicy": "Orphan"}, OK),
    ({"spec.deletionPolicy": "drain"}, BAD),
    ({"spec.deletionPolicy": ""}, BAD),
    ({"spec.deletionPolicy": 1}, BAD),
    # demand
    ({"spec.demand": {}}, OK),
    ({"spec.demand.maxIdleRunners": 60}, OK),
    ({"spec.demand.maxIdleRunners": 1}, OK),  # = idleRunners
    ({"spec.demand.maxIdleRunners": 100}, OK),  # = maxRunners
    ({"spec.demand.maxIdleRunners": 0}, BAD),  # below idleRunners 1
    ({"spec.demand.maxIdleRunners": 101}, BAD),  # above maxRunners 100
    ({"spec.demand.maxIdleRunners": "60"}, BAD),
    ({"spec.demand.maxIdleRunners": None, "spec.demand.windowSeconds": 60}, OK),
    ({"spec.demand.windowSeconds": 1}, OK),
    ({"spec.demand.windowSeconds": 600}, OK),
    ({"spec.demand.windowSeconds": 0}, BAD),
    ({"spec.demand.windowSeconds": 601}, BAD),
    ({"spec.demand.windowSeconds": 30.5}, BAD),
    ({"spec.demand.coverSeconds": 1}, OK),
    ({"spec.demand.coverSeconds": None}, OK),
    ({"spec.demand.coverSeconds": 0}, BAD),
    ({"spec.demand.coverSeconds": INT32_MAX + 1}, BAD),
    ({"spec.demand": 5}, BAD),
    # schedule
    ({"spec.schedule": []}, OK),
    ({"spec.schedule": [WINDOW]}, OK),
    ({"spec.schedule": [WINDOW] * 20}, OK),
    ({"spec.schedule": [WINDOW] * 21}, BAD),
    ({"spec.schedule": [{**WINDOW, "timeZone": "Europe/Berlin"}]}, OK),
    ({"spec.schedule": [{**WINDOW, "idleRunners": 100}]}, OK),  # = maxRunners
    ({"spec.schedule": [{**WINDOW, "idleRunners": 101}]}, BAD),
    ({"spec.schedule": [{**WINDOW, "idleRunners": 61}], "spec.demand.maxIdleRunners": 60}, BAD),
    ({"spec.schedule": [{**WINDOW, "idleRunners": 60}], "spec.demand.maxIdleRunners": 60}, OK),
    ({"spec.schedule": [{**WINDOW, "idleRunners": -1}]}, BAD),
    ({"spec.schedule": [{**WINDOW, "durationMinutes": 10080}]}, OK),
    ({"spec.schedule": [{**WINDOW, "durationMinutes": 10081}]}, BAD),
    ({"spec.schedule": [{**WINDOW, "durationMinutes": 0}]}, BAD),
    ({"spec.schedule": [{**WINDOW, "durationMinutes": "90"}]}, BAD),
    ({"spec.schedule": [{**WINDOW, "cron": 5}]}, BAD),
    ({"spec.schedule": [{**WINDOW, "cron": "1," * 130 + "2 8 * * *"}]}, BAD),  # too long
    ({"spec.schedule": [{**WINDOW, "timeZone": 1}]}, BAD),
    ({"spec.schedule": [{k: v for k, v in WINDOW.items() if k != "cron"}]}, BAD),
    ({"spec.schedule": [{k: v for k, v in WINDOW.items() if k != "idleRunners"}]}, BAD),
    ({"spec.schedule": [{k: v for k, v in WINDOW.items() if k != "durationMinutes"}]}, BAD),
    ({"spec.schedule": [5]}, BAD),
    ({"spec.schedule": WINDOW}, BAD),
    # executions
    ({"spec.executions": {}}, OK),
    ({"spec.executions.defaultTimeLimitSeconds": 1}, OK),
    ({"spec.executions.defaultTimeLimitSeconds": 3600}, OK),  # = maxTimeLimitSeconds
    ({"spec.executions.defaultTimeLimitSeconds": 3601}, BAD),
    ({"spec.executions.defaultTimeLimitSeconds": 0}, BAD),
    ({"spec.executions.defaultTimeLimitSeconds": "60"}, BAD),
    ({"spec.executions.maxTimeLimitSeconds": INT32_MAX}, OK),
    ({"spec.executions.maxTimeLimitSeconds": 59}, BAD),  # below the default 60
    ({"spec.executions.maxTimeLimitSeconds": INT32_MAX + 1}, BAD),
    ({"spec.executions.maxConcurrent": 1}, OK),
    ({"spec.executions.maxConcurrent": 0}, BAD),
    ({"spec.executions.maxConcurrent": 2.5}, BAD),
    ({"spec.executions.workingDir": "/workspace"}, OK),
    ({"spec.executions.workingDir": "work"}, OK),
    ({"spec.executions.workingDir": None}, OK),
    ({"spec.executions.workingDir": "/" * 4096}, OK),
    ({"spec.executions.workingDir": "/" * 4097}, BAD),
    ({"spec.executions.workingDir": ""}, BAD),
    ({"spec.executions.workingDir": 5}, BAD),
    ({"spec.executions.maxUploadBytes": 1}, OK),
    ({"spec.executions.maxUploadBytes": INT32_MAX}, OK),
    ({"spec.executions.maxUploadBytes": 0}, BAD),
    ({"spec.executions.maxUploadBytes": INT32_MAX + 1}, BAD),
    ({"spec.executions.unprivilegedWrapper": ["/sbin/setuser", "user"]}, OK),
    ({"spec.executions.unprivilegedWrapper": ["runuser", ""]}, OK),
    ({"spec.executions.unprivilegedWrapper": []}, OK),
    ({"spec.executions.unprivilegedWrapper": [""]}, BAD),
    ({"spec.executions.unprivilegedWrapper": "setuser"}, BAD),
    ({"spec.executions.unprivilegedWrapper": [1]}, BAD),
    ({"spec.executions": []}, BAD),
    # the document itself
    ({"spec": DELETE}, BAD),
    ({"spec": []}, BAD),
    ({"metadata.name": "java-21.temurin"}, OK),
    ({"metadata.name": "Python"}, BAD),
    ({"metadata.name": "a_b"}, BAD),
    ({"metadata.namespace": "team-a"}, OK),
    ({"metadata.namespace": "team.a"}, BAD),
]


def _case_id(case: tuple[dict[str, Any], bool]) -> str:
    changes, valid = case
    shown = ",".join(f"{k.removeprefix('spec.')}={v!r}"[:60] for k, v in changes.items())
    return f"{'ok' if valid else 'bad'}:{shown or 'base'}"


def assert_agreement(document: dict[str, Any]) -> bool:
    """The CRD and the model agree on a canonical document and on what it normalises to;
    returns the verdict."""
    crd_errors = CRD.errors(document)
    crd_ok = not crd_errors
    model_ok = model_accepts(document)
    assert crd_ok == model_ok, (
        f"CRD {'accepts' if crd_ok else 'rejects'} ({crd_errors}), "
        f"model {'accepts' if model_ok else 'rejects'}: {json.dumps(document)}"
    )
    served = CRD.normalize(document)
    assert model_accepts(served) == crd_ok, f"the model disagrees on the served {served}"
    if crd_ok:
        # Defaults agree: the stored object means the same pool as the document.
        assert RunnerPool.parse_document(served) == RunnerPool.parse_document(document)
    return crd_ok


@pytest.mark.parametrize("case", CASES, ids=[_case_id(case) for case in CASES])
def test_crd_and_model_agree_on_every_field(case: tuple[dict[str, Any], bool]) -> None:
    changes, valid = case
    assert assert_agreement(document_with(changes)) is valid


def test_every_spec_field_of_the_model_is_in_the_table_and_the_schema() -> None:
    spec_schema = CRD.schema["properties"]["spec"]
    covered = {key.removeprefix("spec.") for changes, _ in CASES for key in changes}

    def walk(model: Any, schema: Mapping[str, Any], prefix: str) -> Iterator[str]:
        for name, info in model.model_fields.items():
            alias = info.alias or name
            assert alias in schema["properties"], f"{prefix}{alias} missing from the CRD"
            nested = info.annotation
            if isinstance(nested, types.UnionType):  # `DemandSpec | None`: walked the same
                (nested,) = [a for a in get_args(nested) if a is not type(None)]
            if isinstance(nested, type) and hasattr(nested, "model_fields"):
                yield from walk(nested, schema["properties"][alias], f"{prefix}{alias}.")
            else:
                yield f"{prefix}{alias}"

    leaves = set(walk(RunnerPool.model_fields["spec"].annotation, spec_schema, ""))
    assert leaves - covered == set()
    # And nothing in the CRD's spec that the model does not know.
    schema_leaves = set()
    for key, prop in spec_schema["properties"].items():
        if prop.get("type") == "object" and "properties" in prop:
            schema_leaves |= {f"{key}.{inner}" for inner in prop["properties"]}
        else:
            schema_leaves.add(key)
    assert schema_leaves == leaves
    # A schedule window's fields, which the list items hold.
    window_schema = spec_schema["properties"]["schedule"]["items"]["properties"]
    assert set(window_schema) == {
        info.alias or name for name, info in ScheduleSpec.model_fields.items()
    }
    covered_window_keys = {
        key
        for changes, _ in CASES
        for value in changes.values()
        if isinstance(value, list)
        for window in value
        if isinstance(window, dict)
        for key in window
    }
    assert covered_window_keys == set(window_schema)


def test_defaults_are_the_models() -> None:
    served = CRD.normalize(pool_doc())
    from_model = RunnerPool.parse_document(pool_doc()).spec.model_dump(
        by_alias=True, mode="json", exclude_none=True
    )
    assert served["spec"] == from_model


# --- where Kubernetes and pool files differ on purpose ----------------------------------


@pytest.mark.parametrize(
    "changes",
    [
        {"spec.replicas": 3},
        {"spec.runner.gpu": 1},
        {"spec.claims.timeout": 5},
        {"spec.nomad.region": "eu"},
        {"status": {"idleRunners": 3}, "spec.extra": {"a": 1}},
    ],
)
def test_unknown_fields_are_pruned_by_the_crd_and_rejected_by_files(
    changes: dict[str, Any],
) -> None:
    document = document_with(changes)
    assert CRD.accepts(document)
    assert not model_accepts(document)
    served = CRD.normalize(document)
    assert model_accepts(served)
    assert "replicas" not in served["spec"] and "gpu" not in served["spec"]["runner"]


def test_unknown_keys_inside_job_template_are_kept() -> None:
    template = {"Meta": {"a": "b"}, "TaskGroups": [{"Tasks": [{"Config": {"x": [1, {}]}}]}]}
    served = CRD.normalize(document_with({"spec.nomad.jobTemplate": template}))
    assert served["spec"]["nomad"]["jobTemplate"] == template


@pytest.mark.parametrize(
    "template",
    [
        {"ID": "mine"},
        {"type": "service"},
        {"TaskGroups": [{"Count": 2}]},
        {"Meta": {"poolkeeper_pool": "x"}},
        {"TaskGroups": [{}, {}]},
    ],
)
def test_job_template_is_opaque_to_the_crd_and_checked_by_the_controller(
    template: dict[str, Any],
) -> None:
    document = document_with({"spec.nomad.jobTemplate": template})
    assert CRD.accepts(document)
    assert not model_accepts(document)


@pytest.mark.parametrize(
    "window",
    [
        {**WINDOW, "cron": "45 8 * *"},  # four fields
        {**WINDOW, "cron": "0 0 8 * * 1"},  # six (seconds) fields
        {**WINDOW, "cron": "@hourly"},
        {**WINDOW, "cron": "61 8 * * *"},
        {**WINDOW, "cron": "* * 31 2 * extra"},
        {**WINDOW, "timeZone": "Mars/Olympus_Mons"},
        {**WINDOW, "timeZone": ""},
        {**WINDOW, "timeZone": "../etc/passwd"},
    ],
)
def test_cron_and_time_zone_are_strings_to_the_crd_and_parsed_by_the_controller(
    window: dict[str, Any],
) -> None:
    document = document_with({"spec.schedule": [window]})
    assert CRD.accepts(document)
    assert not model_accepts(document)


@pytest.mark.parametrize(
    ("field", "expect_file_accepts"),
    [
        ("spec.maxRunners", False),
        ("spec.claims", False),
        ("spec.runner.command", False),
        ("spec.runner.env", False),
        ("spec.nomad", False),
        ("spec.runner.memoryMaxMB", True),
        ("spec.nomad.nodePool", True),
        ("spec.nomad.jobPrefix", True),
        ("spec.demand", True),
        ("spec.schedule", False),
        ("spec.executions", False),
        ("spec.executions.workingDir", True),
        ("spec.executions.unprivilegedWrapper", False),
    ],
)
def test_null_means_absent_to_the_crd(field: str, expect_file_accepts: bool) -> None:
    document = document_with({field: None})
    assert CRD.accepts(document)
    served = CRD.normalize(document)
    assert RunnerPool.parse_document(served) == RunnerPool.parse_document(
        document_with({field: DELETE})
    )
    # Files take null only where the contract shows it (optional fields).
    assert model_accepts(document) is expect_file_accepts


@pytest.mark.parametrize("field", ["spec.idleRunners", "spec.runner", "spec.runner.image"])
def test_null_in_a_required_field_is_refused_by_both(field: str) -> None:
    document = document_with({field: None})
    assert not CRD.accepts(document)
    assert not model_accepts(document)


def test_a_whole_float_is_served_as_an_integer() -> None:
    document = document_with({"spec.idleRunners": 5.0})
    assert CRD.accepts(document)
    assert CRD.normalize(document)["spec"]["idleRunners"] == 5
    assert model_accepts(CRD.normalize(document))
    assert not model_accepts(document)  # files are strict: 5.0 is not an integer


# --- transition rules: immutable fields ---------------------------------------------------


@pytest.mark.parametrize(
    ("old", "new", "allowed"),
    [
        ({}, {"spec.idleRunners": 9}, True),
        ({"spec.nomad.namespace": "a"}, {"spec.nomad.namespace": "a"}, True),
        ({"spec.nomad.namespace": "a"}, {"spec.nomad.namespace": "b"}, False),
        ({}, {"spec.nomad.namespace": "other"}, False),
        ({"spec.nomad.namespace": "default"}, {}, True),  # the default is the same value
        ({"spec.nomad.jobPrefix": "py-"}, {"spec.nomad.jobPrefix": "py-"}, True),
        ({"spec.nomad.jobPrefix": "py-"}, {"spec.nomad.jobPrefix": "px-"}, False),
        ({"spec.nomad.jobPrefix": "py-"}, {}, False),
        ({}, {"spec.nomad.jobPrefix": "py-"}, False),
        ({}, {"spec.nomad.jobPrefix": None}, True),  # null is absent
    ],
)
def test_immutable_fields(old: dict[str, Any], new: dict[str, Any], allowed: bool) -> None:
    old_doc, new_doc = document_with(old), document_with(new)
    assert CRD.accepts(new_doc, old=old_doc) is allowed
    assert CRD.accepts(new_doc)  # a create of the same document is fine
    changed = immutable_changes(
        RunnerPool.parse_document(CRD.normalize(old_doc)),
        RunnerPool.parse_document(CRD.normalize(new_doc)),
    )
    assert (not changed) is allowed


def test_explicit_prefix_equal_to_the_derived_one_is_still_a_change_to_the_crd() -> None:
    """CEL cannot see the derived prefix, so the CRD is stricter than the file reload:
    setting ``jobPrefix`` to exactly the derived value is refused in Kubernetes."""
    old_doc = pool_doc()
    new_doc = document_with({"spec.nomad.jobPrefix": "python-312-"})
    assert not CRD.accepts(new_doc, old=old_doc)
    assert (
        immutable_changes(RunnerPool.parse_document(old_doc), RunnerPool.parse_document(new_doc))
        == []
    )


# --- hypothesis: generated field values, valid and invalid --------------------------------

INTS: Final = st.one_of(
    st.integers(min_value=-3, max_value=130),
    st.integers(min_value=INT32_MAX - 2, max_value=INT32_MAX + 2),
    st.sampled_from([300, 3600, 65535, 65536, 2**63]),
)
WRONG: Final[st.SearchStrategy[Any]] = st.one_of(
    st.booleans(),
    st.just("5"),
    st.floats(allow_nan=False, allow_infinity=False).filter(lambda f: not f.is_integer()),
    st.just([]),
    st.just({}),
)
NAME_CHARS: Final = st.sampled_from([*"abcAB09-_. /\n\t", "\u00a0", "\u00e9"])


def _text(max_size: int) -> st.SearchStrategy[str]:
    return st.one_of(
        st.text(NAME_CHARS, max_size=max_size),
        st.text(st.characters(codec="utf-8"), max_size=8),
    )


PREFIXES: Final = st.one_of(
    st.from_regex(r"\A[a-z0-9][a-z0-9-]{0,62}-\Z"), _text(70), st.just("a" * 64 + "-")
)
NOMAD_NAMES: Final = st.one_of(
    st.from_regex(r"\A[a-zA-Z0-9_.-]{1,12}\Z"),
    _text(16),
    st.text(st.just("n"), min_size=126, max_size=130),
)
ENV_KEYS: Final = st.one_of(st.from_regex(r"\A[A-Za-z_][A-Za-z0-9_]{0,6}\Z"), _text(6))

FIELDS: Final[dict[str, st.SearchStrategy[Any]]] = {
    "spec.idleRunners": st.one_of(INTS, WRONG),
    "spec.maxRunners": st.one_of(INTS, WRONG),
    "spec.startupTimeoutSeconds": st.one_of(INTS, WRONG),
    "spec.drainTimeoutSeconds": st.one_of(INTS, WRONG),
    "spec.claims.defaultInactivityTimeoutSeconds": st.one_of(INTS, WRONG),
    "spec.claims.maxInactivityTimeoutSeconds": st.one_of(INTS, WRONG),
    "spec.runner.image": st.one_of(_text(4), WRONG),
    "spec.runner.command": st.one_of(
        st.lists(st.one_of(_text(3), st.integers(0, 1)), max_size=3), WRONG
    ),
    "spec.runner.cpu": st.one_of(INTS, WRONG),
    "spec.runner.memoryMB": st.one_of(INTS, WRONG),
    "spec.runner.memoryMaxMB": st.one_of(INTS, WRONG),
    "spec.runner.network": st.one_of(st.sampled_from(["none", "bridge", "host", ""]), WRONG),
    "spec.runner.ports": st.one_of(
        st.lists(st.one_of(st.integers(-1, 65537), st.just("80")), max_size=4), WRONG
    ),
    "spec.runner.env": st.one_of(
        st.dictionaries(ENV_KEYS, st.one_of(_text(3), st.integers(0, 1)), max_size=3), WRONG
    ),
    "spec.nomad.namespace": st.one_of(NOMAD_NAMES, WRONG),
    "spec.nomad.datacenters": st.one_of(
        st.lists(st.one_of(_text(3), st.integers(0, 1)), max_size=3), WRONG
    ),
    "spec.nomad.nodePool": st.one_of(NOMAD_NAMES, WRONG),
    "spec.nomad.jobPrefix": st.one_of(PREFIXES, WRONG),
    "spec.deletionPolicy": st.one_of(
        st.sampled_from(["Drain", "Delete", "Orphan", "drain", "Keep"]), WRONG
    ),
    "spec.demand.maxIdleRunners": st.one_of(INTS, WRONG),
    "spec.demand.windowSeconds": st.one_of(INTS, st.sampled_from([600, 601]), WRONG),
    "spec.demand.coverSeconds": st.one_of(INTS, WRONG),
    "spec.schedule": st.one_of(
        st.lists(
            st.fixed_dictionaries(
                {"cron": st.sampled_from(["45 8 * * 1-5", "*/5 * * * *"])},
                optional={
                    "durationMinutes": st.one_of(INTS, st.sampled_from([10080, 10081]), WRONG),
                    "idleRunners": st.one_of(INTS, WRONG),
                    "timeZone": st.sampled_from(["UTC", "Europe/Berlin", "America/New_York"]),
                },
            ),
            max_size=3,
        ),
        WRONG,
    ),
}


@st.composite
def field_changes(draw: Callable[[st.SearchStrategy[Any]], Any]) -> dict[str, Any]:
    keys = draw(st.lists(st.sampled_from(sorted(FIELDS)), min_size=1, max_size=5, unique=True))
    return {key: draw(FIELDS[key]) for key in keys}


@settings(
    max_examples=400,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
@given(field_changes())
def test_generated_documents_agree(changes: dict[str, Any]) -> None:
    assert_agreement(document_with(changes))


@settings(max_examples=150, deadline=None)
@given(
    field_changes(),
    st.dictionaries(st.sampled_from(["spec.bogus", "spec.runner.extra", "spec.x"]), INTS),
    st.sampled_from(["spec.maxRunners", "spec.nomad", "spec.runner.ports", "spec.claims"]),
)
def test_generated_documents_as_served_agree(
    changes: dict[str, Any], unknown: dict[str, Any], null_field: str
) -> None:
    """With unknown fields and nulls mixed in, the CRD accepts exactly what the model
    accepts once Kubernetes has pruned and defaulted it (what the operator is served)."""
    document = document_with({**changes, **unknown, null_field: None})
    crd_ok = CRD.accepts(document)
    assert model_accepts(CRD.normalize(document)) is crd_ok


NOMAD_IDENTITY: Final = st.fixed_dictionaries(
    {},
    optional={
        "namespace": st.sampled_from(["default", "team-a", "team-b"]),
        "jobPrefix": st.sampled_from(["python-312-", "py-", "px-"]),
    },
)


@settings(max_examples=150, deadline=None)
@given(NOMAD_IDENTITY, NOMAD_IDENTITY, st.integers(0, 5))
def test_generated_updates_agree_on_immutability(
    old_nomad: dict[str, str], new_nomad: dict[str, str], idle: int
) -> None:
    """An update is refused by the CEL transition rules exactly when the file reload would
    refuse it, except for writing out the derived prefix explicitly (stricter in the CRD)."""
    old_doc = document_with({"spec.nomad": old_nomad})
    new_doc = document_with({"spec.nomad": new_nomad, "spec.idleRunners": idle})
    changed = immutable_changes(
        RunnerPool.parse_document(old_doc), RunnerPool.parse_document(new_doc)
    )
    crd_allows = CRD.accepts(new_doc, old=old_doc)
    if changed:
        assert not crd_allows
    else:
        explicit_change = old_nomad.get("jobPrefix") != new_nomad.get("jobPrefix")
        assert crd_allows is not explicit_change


# --- the rest of the resource definition -------------------------------------------------


def test_resource_definition() -> None:
    crd = yaml.safe_load(CRD_PATH.read_text(encoding="utf-8"))
    assert crd["apiVersion"] == "apiextensions.k8s.io/v1"
    spec = crd["spec"]
    assert (spec["group"], spec["scope"]) == ("poolkeeper.dev", "Namespaced")
    assert spec["names"]["kind"] == "RunnerPool"
    assert spec["names"]["plural"] == "runnerpools"
    assert spec["names"]["shortNames"] == ["rpool"]
    (version,) = spec["versions"]
    assert (version["name"], version["served"], version["storage"]) == ("v1alpha1", True, True)
    assert version["subresources"]["status"] == {}
    assert version["subresources"]["scale"] == {
        "specReplicasPath": ".spec.idleRunners",
        "statusReplicasPath": ".status.idleRunners",
        "labelSelectorPath": ".status.selector",
    }
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    assert list(columns) == ["Desired", "Idle", "Starting", "Claimed", "Ready", "Age"]
    assert columns["Ready"] == '.status.conditions[?(@.type=="Ready")].status'
    status = version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    assert set(status) == {
        "idleRunners",
        "startingRunners",
        "claimedRunners",
        "outdatedRunners",
        "totalRunners",
        "desiredIdleRunners",
        "desiredIdleReason",
        "demand",
        "selector",
        "templateHash",
        "reconciledBy",
        "observedGeneration",
        "lastReconcileTime",
        "conditions",
    }


def test_status_accepts_a_controller_written_status() -> None:
    document = pool_doc()
    document["status"] = {
        "idleRunners": 1,
        "startingRunners": 0,
        "claimedRunners": 2,
        "outdatedRunners": 0,
        "totalRunners": 3,
        "desiredIdleRunners": 7,
        "desiredIdleReason": "demand",
        "demand": {"claimsPerMinute": 12.5, "startSecondsP90": 2.75},
        "selector": "poolkeeper.dev/pool=python-312",
        "templateHash": "abc123",
        "observedGeneration": 4,
        "lastReconcileTime": "2026-11-30T09:00:00Z",
        "conditions": [
            {
                "type": "Ready",
                "status": "True",
                "reason": "Reconciled",
                "message": "",
                "lastTransitionTime": "2026-11-30T09:00:00Z",
                "observedGeneration": 4,
            }
        ],
    }
    assert CRD.accepts(document, status=True)
    document["status"]["conditions"][0]["status"] = "Yes"
    assert not CRD.accepts(document, status=True)
    document["status"]["conditions"][0]["status"] = "False"
    document["status"]["conditions"].append(dict(document["status"]["conditions"][0]))
    assert not CRD.accepts(document, status=True)  # one condition per type
    assert CRD.accepts(document)  # the main resource ignores status


def test_structural_schema_rules() -> None:
    """What the API server demands of a structural schema: a type everywhere (but below
    preserve-unknown-fields), no nullable (null means absent here), no uniqueItems."""
    schema = CRD.schema

    def walk(node: Mapping[str, Any], path: str) -> Iterator[str]:
        if "type" not in node:
            yield f"{path}: no type"
        if node.get("nullable") or node.get("uniqueItems"):
            yield f"{path}: nullable/uniqueItems"
        for key, prop in node.get("properties", {}).items():
            yield from walk(prop, f"{path}.{key}")
        for key in ("items", "additionalProperties"):
            if isinstance(node.get(key), Mapping):
                yield from walk(node[key], f"{path}[{key}]")

    assert list(walk(schema, "")) == []
