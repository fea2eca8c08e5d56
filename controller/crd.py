"""The RunnerPool CRD, written from the model (controller/model.py) by `make crds`.

The schema is the models' JSON schema (pydantic) made structural for Kubernetes:
references inlined, an optional field absent rather than null, the defaults the fields'
own (a nested object's is ``{}``, which its fields' defaults then fill), integers int32
unless a field says otherwise, lists atomic unless a field says otherwise, a free-form
object (``jobTemplate``) kept as written, and ``exclusiveMinimum`` as the integer
``minimum`` it means. A keyword this module does not know makes it fail instead of
writing a schema the models do not mean. What is not the schema (the names, the
subresources, the printer columns) is here.

    python -m controller.crd PATH...          write the CRD to each PATH
    python -m controller.crd --check PATH...  exit 1 when a PATH is not the CRD written now
"""

from __future__ import annotations

import argparse
import sys
import types
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Final, Union, get_args, get_origin

import yaml
from pydantic import BaseModel
from pydantic_core import PydanticUndefined, to_jsonable_python

from controller.model import API_VERSION, KIND, RunnerPool, RunnerPoolSpec, RunnerPoolStatus

GROUP, _, VERSION = API_VERSION.partition("/")
PLURAL: Final = "runnerpools"
NAME: Final = f"{PLURAL}.{GROUP}"

HEADER: Final = """\
# The RunnerPool resource (docs/reference.md describes every field).
#
# Written by `make crds` (python -m controller.crd) from controller/model.py, the one source
# of the schema, its defaults, CEL rules and descriptions; the chart's copy in
# charts/poolkeeper/crds/ is written with it. Do not edit: tests/unit/test_crd.py fails
# when either file is not what the model writes, and tests/operator/test_crd_agreement.py
# proves on a real kube-apiserver that the CRD and the model accept and reject the same
# documents.
#
# Differences that are Kubernetes' own behaviour, not the schema's:
# - unknown fields are refused where the client asks for strict field validation, as
#   kubectl does (and pool files do), and pruned otherwise;
# - a whole number written as a float (JSON 5.0) passes the schema and is stored as 5, but
#   the CEL rules that read it and the scale subresource (idleRunners) refuse it; kubectl
#   sends YAML's 5.0 as 5;
# - null is pruned before defaulting, so `field: null` means "absent" (the default);
# - spec.nomad.jobTemplate is opaque here and checked by the controller (InvalidSpec);
# - spec.schedule[].cron and .timeZone are strings here: the controller parses them (a
#   cron expression of five fields, an IANA time zone) and reports others as InvalidSpec.
"""

DESCRIPTION: Final = "A pool of pre-warmed, single-use runners on HashiCorp Nomad."
STATUS_DESCRIPTION: Final = "Written by the controller."
PRINTER_COLUMNS: Final[tuple[dict[str, str], ...]] = (
    {
        "name": "Desired",
        "type": "integer",
        "description": "The idle target now: idleRunners, an open schedule window's floor or "
        "the demand estimate.",
        "jsonPath": ".status.desiredIdleRunners",
    },
    {
        "name": "Idle",
        "type": "integer",
        "description": "Runners claimable now.",
        "jsonPath": ".status.idleRunners",
    },
    {
        "name": "Starting",
        "type": "integer",
        "description": "Runners not running yet.",
        "jsonPath": ".status.startingRunners",
    },
    {
        "name": "Claimed",
        "type": "integer",
        "description": "Runners handed out to clients.",
        "jsonPath": ".status.claimedRunners",
    },
    {
        "name": "Ready",
        "type": "string",
        "description": "Status of the Ready condition.",
        "jsonPath": '.status.conditions[?(@.type=="Ready")].status',
    },
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
)

# The keywords a schema node may have, in the order they are written.
KEYWORDS: Final = (
    "type",
    "format",
    "description",
    "enum",
    "minimum",
    "maximum",
    "minLength",
    "maxLength",
    "pattern",
    "minItems",
    "maxItems",
    "default",
    "required",
    "x-kubernetes-list-type",
    "x-kubernetes-list-map-keys",
    "x-kubernetes-preserve-unknown-fields",
    "x-kubernetes-validations",
    "additionalProperties",
    "items",
    "properties",
)
# pydantic's keywords that say nothing to the API server, or are replaced here.
DROPPED: Final = frozenset({"title", "default"})
RULE_KEYS: Final = ("rule", "message", "fieldPath", "reason")
NULL: Final = {"type": "null"}


class SchemaError(ValueError):
    """The models say something this module cannot write as a structural schema."""


def crd() -> dict[str, Any]:
    """The RunnerPool CustomResourceDefinition."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": NAME,
            "labels": {
                "app.kubernetes.io/name": "poolkeeper",
                "app.kubernetes.io/component": "crd",
            },
        },
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": KIND.lower(),
                "shortNames": ["rpool"],
                "categories": ["poolkeeper"],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {
                        "status": {},
                        "scale": {
                            "specReplicasPath": ".spec.idleRunners",
                            "statusReplicasPath": ".status.idleRunners",
                            "labelSelectorPath": ".status.selector",
                        },
                    },
                    "additionalPrinterColumns": [dict(c) for c in PRINTER_COLUMNS],
                    "schema": {"openAPIV3Schema": open_api_schema()},
                }
            ],
        },
    }


def open_api_schema() -> dict[str, Any]:
    """The resource's schema: Kubernetes' own fields, the spec and the status."""
    spec = schema_of(RunnerPoolSpec)
    spec["description"] = RunnerPool.model_fields["spec"].description
    status = schema_of(RunnerPoolStatus)
    status["description"] = STATUS_DESCRIPTION
    return _ordered(
        {
            "type": "object",
            "description": DESCRIPTION,
            "required": ["spec"],
            "properties": {
                "apiVersion": {"type": "string"},
                "kind": {"type": "string"},
                "metadata": {"type": "object"},
                "spec": _ordered(spec),
                "status": _ordered(status),
            },
        }
    )


def schema_of(model: type[BaseModel]) -> dict[str, Any]:
    """A model's structural schema, its fields' defaults included."""
    generated = model.model_json_schema(by_alias=True)
    definitions = generated.pop("$defs", {})
    generated.pop("description", None)  # a docstring is for Python readers
    schema = _structural(generated, definitions, model.__name__)
    _set_defaults(model, schema)
    return schema


def _structural(node: Mapping[str, Any], definitions: Mapping[str, Any], at: str) -> dict[str, Any]:
    node = _resolved(node, definitions)
    unknown = set(node) - set(KEYWORDS) - DROPPED
    if unknown:
        raise SchemaError(f"{at}: no structural form for {sorted(unknown)}")
    out = {key: value for key, value in node.items() if key not in DROPPED}
    if "x-kubernetes-validations" in out:  # pydantic sorts their keys: the rule first again
        out["x-kubernetes-validations"] = [
            {key: rule[key] for key in RULE_KEYS if key in rule}
            for rule in out["x-kubernetes-validations"]
        ]
    kind = out.get("type")
    if kind == "integer":
        out.setdefault("format", "int32")
    elif kind == "array":
        out.setdefault("x-kubernetes-list-type", "atomic")
        out["items"] = _structural(out["items"], definitions, f"{at}[]")
    elif kind == "object":
        extra = out.pop("additionalProperties", False)
        if extra is True:
            out["x-kubernetes-preserve-unknown-fields"] = True
        elif isinstance(extra, Mapping):
            out["additionalProperties"] = _structural(extra, definitions, f"{at}{{}}")
        if "properties" in out:
            out["properties"] = {
                name: _structural(prop, definitions, f"{at}.{name}")
                for name, prop in out["properties"].items()
            }
    return _ordered(out)


def _resolved(given: Mapping[str, Any], definitions: Mapping[str, Any]) -> dict[str, Any]:
    """``given`` with its reference inlined (a field's own keywords win over the model's)
    and an optional value as the value itself: the API server prunes a null."""
    node = dict(given)
    while "$ref" in node or "anyOf" in node:
        if "anyOf" in node:
            options = [option for option in node.pop("anyOf") if option != NULL]
            if len(options) != 1:
                raise SchemaError(f"a union of {options}: no structural form")
            node = options[0] | node
        if "$ref" in node:
            target = dict(definitions[node.pop("$ref").rpartition("/")[2]])
            target.pop("description", None)  # the model's docstring; the field says its own
            node = target | node
    minimum = node.pop("exclusiveMinimum", None)
    if minimum is not None:
        if node.get("type") != "integer":
            raise SchemaError(f"exclusiveMinimum {minimum} of a {node.get('type')}")
        node["minimum"] = minimum + 1
    return node


def _set_defaults(model: type[BaseModel], schema: dict[str, Any]) -> None:
    """The fields' defaults, as the API server applies them: a nested model's is ``{}`` (its
    own fields' defaults fill it), and None is no default (the field stays absent)."""
    for name, info in model.model_fields.items():
        prop = schema["properties"][info.alias or name]
        default = info.get_default(call_default_factory=True)
        if isinstance(default, BaseModel):
            prop["default"] = {}
        elif default is not None and default is not PydanticUndefined:
            prop["default"] = to_jsonable_python(default)
        nested = _nested_model(info.annotation)
        if nested is not None:
            inner = prop["items"] if prop["type"] == "array" else prop
            _set_defaults(nested, inner)
        schema["properties"][info.alias or name] = _ordered(prop)


def _nested_model(annotation: Any) -> type[BaseModel] | None:
    """The model a field holds: itself, optional, or as the items of a list."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if get_origin(annotation) is Annotated:
        return _nested_model(get_args(annotation)[0])
    if get_origin(annotation) in (Union, types.UnionType, list):
        models = [m for m in map(_nested_model, get_args(annotation)) if m is not None]
        return models[0] if models else None
    return None


def _ordered(node: Mapping[str, Any]) -> dict[str, Any]:
    return {key: node[key] for key in sorted(node, key=KEYWORDS.index)}


class _Dumper(yaml.SafeDumper):
    """Block lists indented under their key, as Kubernetes' own manifests are written."""

    def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:
        super().increase_indent(flow, False)


def render() -> str:
    """The CRD file's text."""
    body = yaml.dump(crd(), Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=96)
    return HEADER + body


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m controller.crd", description="Write the RunnerPool CRD from the model."
    )
    parser.add_argument("paths", nargs="+", type=Path, metavar="PATH")
    parser.add_argument(
        "--check", action="store_true", help="change nothing; exit 1 when a file is stale"
    )
    args = parser.parse_args(argv)
    text = render()
    stale = [
        path for path in args.paths if not path.exists() or path.read_text(encoding="utf-8") != text
    ]
    if args.check:
        for path in stale:
            print(f"{path}: not the CRD of controller/model.py: run `make crds`", file=sys.stderr)
        return 1 if stale else 0
    for path in stale:
        path.write_text(text, encoding="utf-8")
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
