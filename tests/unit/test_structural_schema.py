"""The emulation of the API server's schema handling, where the CRD itself does not reach."""

from __future__ import annotations

from typing import Any, Final

import pytest

from tests.support.structural_schema import Invalid, StructuralSchema

SCHEMA: Final[dict[str, Any]] = {
    "type": "object",
    "properties": {
        "spec": {
            "type": "object",
            "properties": {
                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                "size": {"type": "integer", "minimum": 1, "maximum": 9},
                "tags": {"type": "array", "items": {"type": "integer"}, "maxItems": 2},
                "set": {
                    "type": "array",
                    "items": {"type": "integer"},
                    "x-kubernetes-list-type": "set",
                },
                "items": {
                    "type": "array",
                    "x-kubernetes-list-type": "map",
                    "x-kubernetes-list-map-keys": ["name"],
                    "items": {
                        "type": "object",
                        "properties": {"name": {"type": "string"}, "value": {"type": "integer"}},
                        "x-kubernetes-validations": [
                            {"rule": "self.value >= 0", "message": "value is negative"},
                            {"rule": "self.value >= oldSelf.value", "message": "value shrank"},
                        ],
                    },
                },
                "note": {"type": "string", "nullable": True},
            },
            "x-kubernetes-validations": [
                {"rule": "!has(self.size) || self.size != 7", "message": "not seven"}
            ],
        },
        "status": {"type": "object", "properties": {"ready": {"type": "boolean"}}},
    },
}
SCHEMA_OF: Final = StructuralSchema(SCHEMA, status_subresource=True)


def resource(**spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": "r", "namespace": "default"}, "spec": spec}


def refusal(document: dict[str, Any], current: dict[str, Any] | None = None) -> list[str]:
    with pytest.raises(Invalid) as refused:
        SCHEMA_OF.admit(document, current)
    return [str(cause) for cause in refused.value.causes]


def test_null_is_pruned_from_properties_only() -> None:
    stored = SCHEMA_OF.admit(resource(size=None, note=None))
    assert stored["spec"] == {"note": None}  # nullable keeps its null
    (wrong_type, not_checked) = refusal(resource(labels={"a": None}))
    assert wrong_type.startswith("spec.labels.a: Invalid value")
    assert "some validation rules were not checked" in not_checked


def test_integers_travel_as_go_decodes_them() -> None:
    assert SCHEMA_OF.admit(resource(size=5.0))["spec"]["size"] == 5
    assert any("must be of type integer" in e for e in refusal(resource(size=2.0**60)))
    assert any("must be of type integer" in e for e in refusal(resource(size=2**63)))


def test_cel_runs_after_errors_that_do_not_block_it() -> None:
    assert refusal(resource(size=7, tags=[1])) == ['spec: Invalid value: "object": not seven']
    too_many = refusal(resource(size=7, tags=[1, 2, 3]))
    assert too_many[0].startswith("spec.tags: Too many") and "not seven" not in str(too_many)


def test_sets_tell_true_from_one_and_map_lists_their_keys() -> None:
    assert refusal(resource(set=[1, True])) != []  # a boolean is no integer here
    assert refusal(resource(set=[1, 1])) == ["spec.set[1]: Duplicate value: 1"]
    duplicate = refusal(resource(items=[{"name": "a", "value": 1}, {"name": "a", "value": 2}]))
    assert duplicate == ['spec.items[1]: Duplicate value: "object"']


def test_rules_in_list_items_run_and_map_items_are_matched_for_transition_rules() -> None:
    assert refusal(resource(items=[{"name": "a", "value": -1}])) == [
        'spec.items[0]: Invalid value: "object": value is negative'
    ]
    stored = SCHEMA_OF.admit(resource(items=[{"name": "a", "value": 5}]))
    moved = resource(items=[{"name": "b", "value": 1}, {"name": "a", "value": 6}])
    assert SCHEMA_OF.admit(moved, stored)["spec"]["items"][0]["name"] == "b"
    shrunk = resource(items=[{"name": "a", "value": 4}])
    assert refusal(shrunk, stored) == ['spec.items[0]: Invalid value: "object": value shrank']


def test_the_status_subresource_splits_what_a_write_changes() -> None:
    created = SCHEMA_OF.admit({**resource(size=1), "status": {"ready": True}})
    assert "status" not in created
    with_status = SCHEMA_OF.admit(
        {**resource(size=9), "status": {"ready": True}}, created, subresource="status"
    )
    assert with_status["spec"] == {"size": 1} and with_status["status"] == {"ready": True}
    updated = SCHEMA_OF.admit(resource(size=2), with_status)
    assert updated["status"] == {"ready": True}
    with pytest.raises(Invalid):
        SCHEMA_OF.admit({"status": {"ready": "yes"}}, updated, subresource="status")


@pytest.mark.parametrize(
    ("metadata", "field"),
    [
        ({"name": "Upper"}, "metadata.name"),
        ({"name": "a" * 254}, "metadata.name"),
        ({}, "metadata.name"),
        ({"name": "ok", "namespace": "a.b"}, "metadata.namespace"),
    ],
)
def test_object_names_follow_kubernetes_rules(metadata: dict[str, Any], field: str) -> None:
    assert refusal({"metadata": metadata, "spec": {}})[0].startswith(field)


def test_only_object_metadata_fields_are_kept() -> None:
    stored = SCHEMA_OF.admit({"metadata": {"name": "r", "colour": "red"}, "spec": {"x": 1}})
    assert stored == {"metadata": {"name": "r"}, "spec": {}}
