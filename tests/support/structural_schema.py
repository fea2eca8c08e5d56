"""What a Kubernetes API server does with a custom resource under a structural schema.

An emulation, fast enough for the agreement test of the CRD and the model
(``tests/unit/test_crd_agreement.py``, thousands of documents); the operator's tests run
against a real kube-apiserver (tests/operator). In the API server's order:

1. the JSON round trip: Go decodes a whole float such as ``5.0`` as a number it validates
   as an integer and stores as ``5``, and an integer beyond int64 as a float;
2. pruning: unknown fields go (kept below ``x-kubernetes-preserve-unknown-fields``), and of
   ``metadata`` only the fields of an ObjectMeta stay;
3. a ``null`` in a non-nullable property is dropped, then defaults are applied, also
   inside what was defaulted (so ``null`` means "absent");
4. OpenAPI validation (``jsonschema``'s draft 4 with RE2 patterns as Go evaluates them,
   ``x-kubernetes-list-type`` set and map uniqueness, ``nullable``) and the object name
   rules;
5. the CEL rules (``x-kubernetes-validations``, with ``cel-python``) on every value of the
   object, transition rules (those using ``oldSelf``) only where the old object has the
   value, and none at all after an error the API server calls blocking (a wrong type, a
   missing required field, an unsupported enum value, too long, too many).

With a status subresource a write to the main resource keeps the stored status (drops it
on create), and a write through ``/status`` changes the status only and validates only it.
Errors come as the causes of a 422 ``Status``, with the API server's reasons and fields.
Property names are escaped in rules as the API server escapes them (``__namespace__``).
Not emulated: validation ratcheting, ``format`` checks, CEL cost limits, and the checks of
the CRD itself (its defaults against its rules): tests/operator installs it into a real
kube-apiserver.
"""

from __future__ import annotations

import copy
import json
import math
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any, Final

import celpy
import jsonschema
import re2  # type: ignore[import-untyped]
from celpy.adapter import json_to_cel
from celpy.celtypes import BoolType
from celpy.evaluation import CELEvalError

JSON = dict[str, Any]

_ROOT_FIELDS: Final = ("apiVersion", "kind", "metadata")
_OBJECT_META_FIELDS: Final = frozenset(
    {
        "name",
        "generateName",
        "namespace",
        "selfLink",
        "uid",
        "resourceVersion",
        "generation",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "labels",
        "annotations",
        "ownerReferences",
        "finalizers",
        "managedFields",
    }
)
# Kubernetes' own definitions (apimachinery's validation), not the model's.
_DNS_LABEL: Final = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS_LABEL_RE: Final = re.compile(_DNS_LABEL)
_DNS_SUBDOMAIN_RE: Final = re.compile(rf"{_DNS_LABEL}(\.{_DNS_LABEL})*")
# After one of these the API server does not evaluate the CEL rules.
_BLOCKING: Final = frozenset(
    {
        "FieldValueNotSupported",
        "FieldValueRequired",
        "FieldValueTooLong",
        "FieldValueTooMany",
        "FieldValueTypeInvalid",
    }
)
_INT64: Final = range(-(2**63), 2**63)
_LARGEST_JSON_INTEGER: Final = 2**53
_TRANSITION_RULE: Final = re.compile(r"\boldSelf\b")
_ABSENT: Final = object()  # no old value to correlate with (a create, a new field)


@dataclass(frozen=True)
class Cause:
    """One reason of a 422, as in the ``details.causes`` of a ``Status``."""

    field: str
    message: str
    reason: str = "FieldValueInvalid"

    def as_json(self) -> JSON:
        return {"reason": self.reason, "message": self.message, "field": self.field}

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


class Invalid(Exception):
    def __init__(self, causes: list[Cause]) -> None:
        super().__init__("; ".join(map(str, causes)))
        self.causes = causes


class StructuralSchema:
    """One CRD version: its ``openAPIV3Schema`` and whether it has a status subresource."""

    def __init__(self, schema: Mapping[str, Any], *, status_subresource: bool = False) -> None:
        self.schema = schema
        self.status_subresource = status_subresource
        self._validator = _OpenApiValidator(schema)
        status_schema = schema.get("properties", {}).get("status")
        self._status_schema: Mapping[str, Any] = (
            status_schema if isinstance(status_schema, Mapping) else {}
        )
        self._status_validator = _OpenApiValidator(self._status_schema)

    @classmethod
    def of_version(cls, version: Mapping[str, Any]) -> StructuralSchema:
        """A version of a CRD's ``spec.versions``; without a schema anything is kept."""
        schema = (version.get("schema") or {}).get("openAPIV3Schema") or {
            "type": "object",
            "x-kubernetes-preserve-unknown-fields": True,
        }
        subresources = version.get("subresources") or {}
        return cls(schema, status_subresource="status" in subresources)

    @classmethod
    def of_storage_version(cls, crd: Mapping[str, Any]) -> StructuralSchema:
        (version,) = [v for v in crd["spec"]["versions"] if v.get("storage")]
        return cls.of_version(version)

    # -- the API server's steps ----------------------------------------------------------

    def normalize(self, obj: Any) -> Any:
        """The object as stored and served: round-tripped, pruned, defaulted."""
        value = _json_round_trip(copy.deepcopy(obj))
        if isinstance(value, dict) and isinstance(value.get("metadata"), dict):
            value["metadata"] = {
                key: item for key, item in value["metadata"].items() if key in _OBJECT_META_FIELDS
            }
        return _default(_prune(value, self.schema, root=True), self.schema)

    def admit(
        self,
        proposed: JSON,
        current: JSON | None = None,
        *,
        subresource: str = "",
        cel: bool = True,
    ) -> JSON:
        """The object stored by a create (no ``current``), an update of the stored
        ``current``, or a write through ``subresource`` "status"; raises ``Invalid``."""
        obj: JSON = self.normalize(self._as_written(proposed, current, subresource))
        if subresource == "status":
            problems = self._status_causes(obj, current, cel=cel)
        else:
            problems = self._causes(obj, current, cel=cel)
        if problems:
            raise Invalid(problems)
        return obj

    # -- verdicts on documents -------------------------------------------------------

    def errors(self, document: JSON, old: JSON | None = None, *, status: bool = False) -> list[str]:
        """Why a create of ``document`` is refused, or an update of ``old`` to it; with
        ``status``, a write of its status (to ``old`` or to ``document`` as stored)."""
        current = None if old is None else self.normalize(old)
        if status and current is None:
            current = self.normalize(document)
        try:
            self.admit(document, current, subresource="status" if status else "")
        except Invalid as refused:
            return [str(cause) for cause in refused.causes]
        return []

    def accepts(self, document: JSON, old: JSON | None = None, *, status: bool = False) -> bool:
        return not self.errors(document, old, status=status)

    # -- inside ------------------------------------------------------------------------

    def _as_written(self, proposed: JSON, current: JSON | None, subresource: str) -> JSON:
        if not self.status_subresource:
            return proposed
        if subresource == "status":
            assert current is not None, "a status write needs the stored object"
            written = copy.deepcopy(current)
            source = proposed
        else:
            written = dict(proposed)
            source = current or {}
        if "status" in source:
            written["status"] = copy.deepcopy(source["status"])
        else:
            written.pop("status", None)
        return written

    def _causes(self, obj: JSON, current: JSON | None, *, cel: bool) -> list[Cause]:
        found = self._validator.causes(obj)
        found.extend(_metadata_causes(obj))
        old = _ABSENT if current is None else current
        return self._with_cel(found, obj, old, self.schema, (), cel=cel)

    def _status_causes(self, obj: JSON, current: JSON | None, *, cel: bool) -> list[Cause]:
        """Only the status is checked: everything else is the stored object, unchanged."""
        if "status" not in obj:
            return []
        found = self._status_validator.causes(obj["status"], at=("status",))
        old = (current or {}).get("status", _ABSENT)
        return self._with_cel(found, obj["status"], old, self._status_schema, ("status",), cel=cel)

    @staticmethod
    def _with_cel(
        found: list[Cause],
        value: Any,
        old: Any,
        schema: Mapping[str, Any],
        at: tuple[str | int, ...],
        *,
        cel: bool,
    ) -> list[Cause]:
        if not cel:
            return found
        if any(cause.reason in _BLOCKING for cause in found):
            message = (
                "Invalid value: null: some validation rules were not checked because the "
                "object was invalid; correct the existing errors to complete validation"
            )
            return [*found, Cause("<nil>", message)]
        return [*found, *_cel_causes(value, old, schema, at)]


# ---- normalization ------------------------------------------------------------------------


def _json_round_trip(value: Any) -> Any:
    """Go decodes a JSON number as an int64 if it is one, else as a float64; a float64 is an
    integer to the validation only up to 2**53 (and then stored without a fraction)."""
    if isinstance(value, dict):
        return {key: _json_round_trip(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_json_round_trip(item) for item in value]
    if isinstance(value, int) and not isinstance(value, bool) and value not in _INT64:
        return float(value)
    if (
        isinstance(value, float)
        and math.isfinite(value)
        and value.is_integer()
        and abs(value) <= _LARGEST_JSON_INTEGER
    ):
        return int(value)
    return value


def _is_object(schema: Mapping[str, Any]) -> bool:
    return bool(schema.get("type", "object") == "object")


def _schema_of(schema: Mapping[str, Any], key: str) -> Mapping[str, Any] | None:
    """The schema of an object's ``key``: its property's, else ``additionalProperties``."""
    prop = schema.get("properties", {}).get(key)
    if isinstance(prop, Mapping):
        return prop
    additional = schema.get("additionalProperties")
    return additional if isinstance(additional, Mapping) else None


def _prune(value: Any, schema: Mapping[str, Any], *, root: bool = False) -> Any:
    if isinstance(value, dict) and _is_object(schema):
        preserve = bool(schema.get("x-kubernetes-preserve-unknown-fields"))
        result: JSON = {}
        for key, item in value.items():
            sub = _schema_of(schema, key)
            if root and key in _ROOT_FIELDS:
                result[key] = item
            elif sub is not None:
                result[key] = _prune(item, sub)
            elif preserve:
                result[key] = item
        return result
    if isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        return [_prune(item, schema["items"]) for item in value]
    return value


def _default(value: Any, schema: Mapping[str, Any]) -> Any:
    """A non-nullable ``null`` property is dropped and a missing one defaulted; values of
    ``additionalProperties`` are never dropped (a ``null`` there fails validation)."""
    if isinstance(value, dict) and _is_object(schema):
        properties: Mapping[str, Any] = schema.get("properties", {})
        result = dict(value)
        for key, prop in properties.items():
            if key in result and result[key] is None and not prop.get("nullable"):
                del result[key]
            if key not in result and "default" in prop:
                result[key] = copy.deepcopy(prop["default"])
        for key, item in result.items():
            sub = _schema_of(schema, key)
            if sub is not None:
                result[key] = _default(item, sub)
        return result
    if isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        return [_default(item, schema["items"]) for item in value]
    return value


# ---- OpenAPI validation -------------------------------------------------------------------


def _field(parts: Iterable[str | int]) -> str:
    """A Kubernetes field path: ``spec.runner.ports[1]``."""
    text = ""
    for part in parts:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else part
    return text or "<nil>"


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def _shown(value: Any) -> str:
    """A value as the API server quotes it in a message: scalars as such, else the type."""
    if isinstance(value, dict | list):
        return f'"{_json_type(value)}"'
    return json.dumps(value, ensure_ascii=False)


def _nullable_type(
    validator: Any, types: Any, instance: Any, schema: Mapping[str, Any]
) -> Iterator[jsonschema.ValidationError]:
    if instance is None and schema.get("nullable"):
        return
    yield from _DRAFT4_TYPE(validator, types, instance, schema)


def _required(
    validator: Any, required: list[str], instance: Any, schema: Any
) -> Iterator[jsonschema.ValidationError]:
    """Each missing property is an error at its own path, as the API server reports it."""
    if isinstance(instance, dict):
        for name in required:
            if name not in instance:
                yield jsonschema.ValidationError("Required value", path=[name])


def _re2_pattern(
    validator: Any, pattern: str, instance: Any, schema: Any
) -> Iterator[jsonschema.ValidationError]:
    """Go's RE2, an unanchored search: ``$`` is the end of the text, not of a line."""
    if isinstance(instance, str) and not re2.search(pattern, instance):
        yield jsonschema.ValidationError(f"should match '{pattern}'")


def _list_type(
    validator: Any, list_type: str, instance: Any, schema: Mapping[str, Any]
) -> Iterator[jsonschema.ValidationError]:
    """A ``set`` holds no value twice (``1`` and ``true`` differ, as in Go), a ``map`` no
    two items with the same keys."""
    if not isinstance(instance, list) or list_type not in ("set", "map"):
        return
    keys = schema.get("x-kubernetes-list-map-keys", [])
    seen: set[str] = set()
    for index, item in enumerate(instance):
        identity = _map_key(item, keys) if list_type == "map" else json.dumps(item, sort_keys=True)
        if identity in seen:
            yield jsonschema.ValidationError(f"Duplicate value: {_shown(item)}", path=[index])
        seen.add(identity)


def _map_key(item: Any, keys: Iterable[str]) -> str:
    fields = item if isinstance(item, dict) else {}
    return json.dumps([fields.get(key) for key in keys])


_DRAFT4_TYPE: Final = jsonschema.Draft4Validator.VALIDATORS["type"]
_KubernetesDraft4 = jsonschema.validators.extend(  # type: ignore[no-untyped-call]
    jsonschema.Draft4Validator,
    {
        "type": _nullable_type,
        "required": _required,
        "pattern": _re2_pattern,
        "x-kubernetes-list-type": _list_type,
    },
)


class _OpenApiValidator:
    def __init__(self, schema: Mapping[str, Any]) -> None:
        self._validator = _KubernetesDraft4(schema)

    def causes(self, value: Any, *, at: tuple[str | int, ...] = ()) -> list[Cause]:
        errors = list(self._validator.iter_errors(value))
        # A value of the wrong type is reported for that alone, as the API server does.
        mistyped = {tuple(e.absolute_path) for e in errors if e.validator == "type"}
        return [
            _cause(error, (*at, *error.absolute_path))
            for error in errors
            if error.validator == "type" or tuple(error.absolute_path) not in mistyped
        ]


def _cause(error: jsonschema.ValidationError, parts: tuple[str | int, ...]) -> Cause:
    field = _field(parts)
    keyword = error.validator
    bound: Any = error.validator_value
    value: Any = error.instance
    if keyword == "type":
        actual = _json_type(value)
        message = f'Invalid value: "{actual}": {field} in body must be of type {bound}: "{actual}"'
        return Cause(field, message, "FieldValueTypeInvalid")
    if keyword == "required":
        return Cause(field, "Required value", "FieldValueRequired")
    if keyword == "enum":
        supported = ", ".join(json.dumps(v) for v in bound)
        message = f"Unsupported value: {_shown(value)}: supported values: {supported}"
        return Cause(field, message, "FieldValueNotSupported")
    if keyword == "maxLength":
        return Cause(field, f"Too long: may not be longer than {bound}", "FieldValueTooLong")
    if keyword in ("maxItems", "maxProperties"):
        message = f"Too many: {len(value)}: must have at most {bound} items"
        return Cause(field, message, "FieldValueTooMany")
    if keyword == "x-kubernetes-list-type":
        return Cause(field, error.message, "FieldValueDuplicate")
    phrases = {
        "minimum": f"should be greater than or equal to {bound}",
        "maximum": f"should be less than or equal to {bound}",
        "minLength": f"should be at least {bound} chars long",
        "minItems": f"should have at least {bound} items",
        "minProperties": f"should have at least {bound} properties",
        "multipleOf": f"should be a multiple of {bound}",
    }
    detail = phrases.get(str(keyword), error.message)
    return Cause(field, f"Invalid value: {_shown(value)}: {field} in body {detail}")


def _metadata_causes(obj: Any) -> Iterator[Cause]:
    """The API server's name rules for a custom resource (and its namespace, if any)."""
    metadata = obj.get("metadata") if isinstance(obj, dict) else None
    if not isinstance(metadata, dict) or not metadata.get("name"):
        message = "Required value: name or generateName is required"
        yield Cause("metadata.name", message, "FieldValueRequired")
        return
    name = metadata["name"]
    if not (isinstance(name, str) and len(name) <= 253 and _DNS_SUBDOMAIN_RE.fullmatch(name)):
        message = (
            f"Invalid value: {_shown(name)}: a lowercase RFC 1123 subdomain must consist of "
            "lower case alphanumeric characters, '-' or '.', and must start and end with an "
            "alphanumeric character"
        )
        yield Cause("metadata.name", message)
    namespace = metadata.get("namespace")
    if namespace is not None and not (
        isinstance(namespace, str) and len(namespace) <= 63 and _DNS_LABEL_RE.fullmatch(namespace)
    ):
        message = (
            f"Invalid value: {_shown(namespace)}: a lowercase RFC 1123 label must consist of "
            "lower case alphanumeric characters or '-', and must start and end with an "
            "alphanumeric character"
        )
        yield Cause("metadata.namespace", message)


# ---- CEL ----------------------------------------------------------------------------------


@cache
def _cel_program(expression: str) -> celpy.Runner:
    environment = celpy.Environment()
    return environment.program(environment.compile(expression))


def _holds(expression: str, activation: Mapping[str, Any]) -> bool:
    """True only when the rule evaluates to true: false or an evaluation error refuses."""
    try:
        result = _cel_program(expression).evaluate(
            {name: json_to_cel(value) for name, value in activation.items()}
        )
    except CELEvalError:
        return False
    return isinstance(result, BoolType) and bool(result)


_RULE_PREFIXES: Final = {
    "FieldValueForbidden": "Forbidden: ",
    "FieldValueRequired": "Required value: ",
    "FieldValueDuplicate": "Duplicate value: ",
}


# CEL's reserved words: a property named like one is __{word}__ in rules (self.__namespace__).
_CEL_RESERVED: Final = frozenset(
    {
        "true", "false", "null", "in", "as", "break", "const", "continue", "else", "for",
        "function", "if", "import", "let", "loop", "package", "namespace", "return", "var",
        "void", "while",
    }
)  # fmt: skip
_CEL_ESCAPES: Final = {"__": "__underscores__", ".": "__dot__", "-": "__dash__", "/": "__slash__"}


def _cel_name(name: str) -> str:
    """A property's name in CEL rules, as the API server escapes it."""
    if name in _CEL_RESERVED:
        return f"__{name}__"
    return re.sub(r"__|[./-]", lambda found: _CEL_ESCAPES[found.group()], name)


def _cel_view(value: Any, schema: Mapping[str, Any]) -> Any:
    """``value`` as the rules of ``schema`` see it: declared properties by their CEL names
    (the keys of a map stay as they are)."""
    if isinstance(value, dict):
        properties = schema.get("properties")
        if isinstance(properties, Mapping):
            return {
                (_cel_name(key) if key in properties else key): _cel_view(
                    item, properties.get(key, {})
                )
                for key, item in value.items()
            }
        additional = schema.get("additionalProperties")
        if isinstance(additional, Mapping):
            return {key: _cel_view(item, additional) for key, item in value.items()}
    elif isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        return [_cel_view(item, schema["items"]) for item in value]
    return value


def _cel_causes(
    value: Any, old: Any, schema: Mapping[str, Any], at: tuple[str | int, ...]
) -> Iterator[Cause]:
    """The rules of ``schema`` on ``value`` and below it; ``old`` is the value the old
    object has at the same place (``_ABSENT`` if none): object fields and map-list items
    are matched by key, other list items are never matched."""
    for rule in schema.get("x-kubernetes-validations", ()):
        expression = rule["rule"]
        transition = _TRANSITION_RULE.search(expression) is not None
        if transition and old is _ABSENT:
            continue
        activation = {"self": _cel_view(value, schema)}
        if transition:
            activation["oldSelf"] = _cel_view(old, schema)
        if not _holds(expression, activation):
            reason = rule.get("reason", "FieldValueInvalid")
            prefix = _RULE_PREFIXES.get(reason, f'Invalid value: "{_json_type(value)}": ')
            field = (_field(at) if at else "") + rule.get("fieldPath", "")
            message = rule.get("message") or f"failed rule: {expression}"
            yield Cause(field.lstrip(".") or "<nil>", prefix + message, reason)
    if isinstance(value, dict):
        for key, item in value.items():
            sub = _schema_of(schema, key)
            if sub is not None:
                old_item = old.get(key, _ABSENT) if isinstance(old, dict) else _ABSENT
                yield from _cel_causes(item, old_item, sub, (*at, key))
    elif isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        old_items: dict[str, Any] = {}
        keys = schema.get("x-kubernetes-list-map-keys", [])
        if schema.get("x-kubernetes-list-type") == "map" and isinstance(old, list):
            old_items = {_map_key(item, keys): item for item in old}
        for index, item in enumerate(value):
            old_item = old_items.get(_map_key(item, keys), _ABSENT) if old_items else _ABSENT
            yield from _cel_causes(item, old_item, schema["items"], (*at, index))
