"""The RunnerPool resource (docs/reference.md), as pydantic models.

The same models validate Kubernetes custom resources (operator) and pool files
(standalone), so both front doors accept and reject the same documents. Python
attributes are snake_case; documents use the camelCase aliases.

They are also the one source of the CRD: `make crds` writes crds/ and the chart's copy
from them (controller/crd.py). What the types and Field constraints say becomes the
OpenAPI schema; what a validator checks in Python is said to the API server next to it,
as schema keywords or a CEL rule (`_crd`, `Rule`), and the descriptions are the fields'.
tests/operator/test_crd_agreement.py holds the two to the same verdicts on a real API
server.

Bounds beyond the contract's wording:
- every integer is a strict integer (``"5"`` and ``true`` are rejected, as a structural
  CRD schema does) and at most 2**31 - 1;
- ``cpu >= 1`` and ``memoryMB >= 10`` (Nomad's own minimum task resources);
- ``ports`` are unique, 1..65535, and need ``network: bridge`` (with ``none`` there is
  nothing to expose them on);
- ``datacenters`` is a non-empty list of non-empty strings;
- ``nomad.namespace`` and ``nodePool`` follow Nomad's name rules;
- ``command`` may be empty (the image's own entrypoint runs); when given, its first
  element is non-empty;
- ``env`` keys match ``[A-Za-z_][A-Za-z0-9_]*``;
- ``demand.windowSeconds`` is at most 600: claims are counted from claim variables and
  their tombstones, and a tombstone is kept for ten minutes after its runner ends;
- ``schedule`` holds at most 20 windows of at most a week each (10080 minutes), and a
  window's ``idleRunners`` is at most ``maxRunners`` and ``demand.maxIdleRunners``, as
  ``idleRunners`` is; ``timeZone`` defaults to ``UTC``.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Final, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    StrictStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError

from controller.core.demand import TargetReason
from controller.core.schedule import cron_problem, time_zone_problem

API_VERSION: Final = "poolkeeper.dev/v1alpha1"
KIND: Final = "RunnerPool"

INT32_MAX: Final = 2**31 - 1
JOB_PREFIX_PATTERN: Final = r"^[a-z0-9][a-z0-9-]{0,62}-$"
# DNS-1123 subdomain (object names) and label (namespaces), as Kubernetes checks them.
_DNS_LABEL: Final = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
DNS_SUBDOMAIN_RE: Final = re.compile(rf"^{_DNS_LABEL}(\.{_DNS_LABEL})*$")
DNS_LABEL_RE: Final = re.compile(rf"^{_DNS_LABEL}$")
# Nomad's own validation of namespace and node pool names.
NOMAD_NAMESPACE_RE: Final = re.compile(r"^[a-zA-Z0-9-]{1,128}$")
NOMAD_NODE_POOL_RE: Final = re.compile(r"^[a-zA-Z0-9_.-]{1,128}$")
ENV_KEY_RE: Final = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Kubernetes label syntax: a value, or a key's name part, is at most 63 characters of
# letters, digits, '-', '_' and '.', beginning and ending with a letter or digit.
LABEL_NAME_RE: Final = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
LABEL_NAME_MAX: Final = 63
# The label naming the Poseidon execution environment a pool serves (docs/poseidon.md).
POSEIDON_ENVIRONMENT_LABEL: Final = "poolkeeper.dev/poseidon-environment"
# An environment ID as Poseidon's routes take it: decimal, no leading zero, a Go int64.
ENVIRONMENT_ID_RE: Final = re.compile(r"^(0|[1-9][0-9]{0,18})$")
ENVIRONMENT_ID_MAX: Final = 2**63 - 1

# Derived job prefixes keep room for the 12 hex characters of a runner ID.
DERIVED_PREFIX_MAX: Final = 50
META_RESERVED_PREFIX: Final = "poolkeeper_"
# jobTemplate keys owned by poolkeeper at job level (compared case-insensitively).
RESERVED_JOB_KEYS: Final = frozenset({"id", "name", "namespace", "type"})
# Nomad fields holding maps: their keys are data (case-sensitive), not struct fields.
MAP_FIELDS: Final = frozenset({"meta", "env", "config"})

# The error type and context key validators use to point below the validated field.
_ERROR_TYPE: Final = "poolkeeper_invalid"
_SUBPATH: Final = "poolkeeper_subpath"

Count = Annotated[StrictInt, Field(ge=0, le=INT32_MAX)]
Seconds = Annotated[StrictInt, Field(gt=0, le=INT32_MAX)]
# Claims are counted from claim variables and tombstones; a tombstone is kept 10 minutes.
MAX_DEMAND_WINDOW_SECONDS: Final = 600
MAX_SCHEDULE_WINDOWS: Final = 20
MAX_SCHEDULE_MINUTES: Final = 7 * 24 * 60


def _invalid(message: str, subpath: str = "") -> PydanticCustomError:
    """An error whose field path ends in ``subpath`` below where it was raised."""
    # Only ``{<context key>}`` is substituted, so other braces (regexes) stay as they are.
    return PydanticCustomError(_ERROR_TYPE, message, {_SUBPATH: subpath})


# --- what the CRD says beyond the types --------------------------------------------------


@dataclass(frozen=True)
class Rule:
    """A CEL rule of the CRD (``x-kubernetes-validations``): the API server's form of a
    check a validator here makes. ``message`` is what the server answers, word for word;
    ``field_path`` where it points, relative to the object the rule is on."""

    rule: str
    message: str
    field_path: str | None = None
    reason: str = "FieldValueInvalid"

    def keyword(self) -> dict[str, str]:
        written = {"rule": self.rule, "message": self.message}
        if self.field_path is not None:
            written["fieldPath"] = self.field_path
        return written | {"reason": self.reason}


def _validations(*rules: Rule) -> dict[str, Any]:
    """A model's CEL rules, for its ``model_config`` (``json_schema_extra``)."""
    return {"x-kubernetes-validations": [rule.keyword() for rule in rules]}


def _crd(*rules: Rule, **keywords: Any) -> Any:
    """A field's (or type's) CRD schema keywords that its annotation does not give: what a
    validator checks here in Python, and what only Kubernetes has (list types, CEL rules,
    formats)."""
    return Field(json_schema_extra=keywords | (_validations(*rules) if rules else {}))


# A list the API server treats as a set: a duplicate is refused (the model refuses it too).
LIST_SET: Final = {"x-kubernetes-list-type": "set"}
# Not blank: at least one character that Python's str.isspace() does not take (the model
# strips), as an RE2 character class for the CRD; tests/unit/test_crd.py derives it.
NOT_BLANK_PATTERN: Final = (
    r"[^\x{9}-\x{d}\x{1c}-\x{20}\x{85}\x{a0}\x{1680}\x{2000}-\x{200a}\x{2028}-\x{2029}"
    r"\x{202f}\x{205f}\x{3000}]"
)


def _names_a_program(value: list[str]) -> list[str]:
    if value and not value[0]:
        raise _invalid("the program (first element) must not be empty", "[0]")
    return value


# A program and its arguments; empty means none (the image's own entrypoint, no wrapper).
Argv = Annotated[
    list[StrictStr],
    AfterValidator(_names_a_program),
    _crd(Rule("size(self) == 0 || self[0] != ''", "the program (first element) must not be empty")),
]


def _matching(pattern: re.Pattern[str], message: str) -> AfterValidator:
    """A check that the whole string matches `pattern`, failing with `message`."""

    def check(value: str) -> str:
        if not pattern.fullmatch(value):
            raise _invalid(message)
        return value

    return AfterValidator(check)


DnsSubdomain = Annotated[
    StrictStr,
    Field(min_length=1, max_length=253),
    _matching(
        DNS_SUBDOMAIN_RE,
        "must be a DNS-1123 subdomain (lowercase letters, digits, '-' and '.', "
        "starting and ending with a letter or digit)",
    ),
]
DnsLabel = Annotated[
    StrictStr,
    Field(min_length=1, max_length=63),
    _matching(DNS_LABEL_RE, "must be a DNS-1123 label (lowercase letters, digits and '-')"),
]
# The maxLength beside each pattern is implied by it; the API server wants it said, to
# bound the cost of CEL rules reading the string.
NomadNamespace = Annotated[
    StrictStr,
    _matching(NOMAD_NAMESPACE_RE, "must be 1-128 letters, digits or '-' (a Nomad namespace name)"),
    _crd(pattern=NOMAD_NAMESPACE_RE.pattern, maxLength=128),
]
NomadNodePool = Annotated[
    StrictStr,
    _matching(
        NOMAD_NODE_POOL_RE, "must be 1-128 letters, digits, '-', '_' or '.' (a Nomad node pool)"
    ),
    _crd(pattern=NOMAD_NODE_POOL_RE.pattern, maxLength=128),
]
JobPrefix = Annotated[
    StrictStr,
    _matching(re.compile(JOB_PREFIX_PATTERN), f"must match {JOB_PREFIX_PATTERN}"),
    _crd(pattern=JOB_PREFIX_PATTERN, maxLength=64),
]


class DeletionPolicy(StrEnum):
    DRAIN = "Drain"
    DELETE = "Delete"
    ORPHAN = "Orphan"


class NetworkMode(StrEnum):
    NONE = "none"
    BRIDGE = "bridge"


class _Model(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True
    )


def label_problem(key: str, value: str) -> str | None:
    """What Kubernetes would refuse in a label (or poolkeeper in one of its own), if
    anything, so that pool files accept the labels the API server accepts."""
    prefix, slash, name = key.rpartition("/")
    if slash and not (len(prefix) <= 253 and DNS_SUBDOMAIN_RE.fullmatch(prefix)):
        return "the key's prefix must be a DNS-1123 subdomain"
    if len(name) > LABEL_NAME_MAX or not LABEL_NAME_RE.fullmatch(name):
        return (
            "the key's name must be 1-63 letters, digits, '-', '_' or '.', beginning and "
            "ending with a letter or digit"
        )
    if value and (len(value) > LABEL_NAME_MAX or not LABEL_NAME_RE.fullmatch(value)):
        return (
            "must be at most 63 letters, digits, '-', '_' or '.', beginning and ending "
            "with a letter or digit"
        )
    if key == POSEIDON_ENVIRONMENT_LABEL and not is_environment_id(value):
        return "must be an execution environment ID: a decimal number without leading zeros"
    return None


def is_environment_id(text: str) -> bool:
    return bool(ENVIRONMENT_ID_RE.fullmatch(text)) and int(text) <= ENVIRONMENT_ID_MAX


class ObjectMeta(BaseModel):
    """The part of Kubernetes metadata poolkeeper reads; other keys are ignored."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    name: DnsSubdomain
    namespace: DnsLabel = "default"
    labels: dict[StrictStr, StrictStr] = Field(default_factory=dict)

    @field_validator("labels", mode="before")
    @classmethod
    def _labels_are_strings(cls, value: Any) -> Any:
        if value is None:
            return {}  # `labels:` with nothing under it
        if isinstance(value, Mapping):
            for key, label in value.items():
                if isinstance(key, str) and isinstance(label, int | float | bool):
                    # YAML reads `10` and `true` as numbers and booleans.
                    raise _invalid(f'must be a string: quote it ("{json.dumps(label)}")', key)
        return value

    @field_validator("labels")
    @classmethod
    def _labels_valid(cls, value: dict[str, str]) -> dict[str, str]:
        for key, label in value.items():
            problem = label_problem(key, label)
            if problem is not None:
                raise _invalid(problem, key)
        return value


class ClaimsSpec(_Model):
    # The API server checks a rule against the {} default of the object itself, before the
    # fields' own defaults fill it: the has() guards of this rule and the next are for that.
    model_config = ConfigDict(
        json_schema_extra=_validations(
            Rule(
                "!has(self.defaultInactivityTimeoutSeconds) || "
                "!has(self.maxInactivityTimeoutSeconds) || "
                "self.defaultInactivityTimeoutSeconds <= self.maxInactivityTimeoutSeconds",
                "defaultInactivityTimeoutSeconds must not be greater than "
                "maxInactivityTimeoutSeconds",
                ".defaultInactivityTimeoutSeconds",
            )
        )
    )

    default_inactivity_timeout_seconds: Seconds = 300
    max_inactivity_timeout_seconds: Seconds = 3600

    @model_validator(mode="after")
    def _default_within_max(self) -> ClaimsSpec:
        if self.default_inactivity_timeout_seconds > self.max_inactivity_timeout_seconds:
            raise _invalid(
                "must not be greater than maxInactivityTimeoutSeconds "
                f"({self.max_inactivity_timeout_seconds})",
                "defaultInactivityTimeoutSeconds",
            )
        return self


MIB: Final = 1024 * 1024
# A path a shell can be given (PATH_MAX on Linux).
MAX_PATH_LENGTH: Final = 4096


class ExecutionsSpec(_Model):
    """Executions and files in a claimed runner (docs/reference.md, "Executions")."""

    model_config = ConfigDict(
        json_schema_extra=_validations(
            Rule(
                "!has(self.defaultTimeLimitSeconds) || !has(self.maxTimeLimitSeconds) || "
                "self.defaultTimeLimitSeconds <= self.maxTimeLimitSeconds",
                "defaultTimeLimitSeconds must not be greater than maxTimeLimitSeconds",
                ".defaultTimeLimitSeconds",
            )
        )
    )

    default_time_limit_seconds: Seconds = Field(
        default=60, description="The time limit of an execution that names none."
    )
    max_time_limit_seconds: Seconds = 3600
    max_concurrent: Annotated[StrictInt, Field(ge=1, le=INT32_MAX)] = Field(
        default=8, description="Running executions per runner; more answer 409."
    )
    working_dir: Annotated[StrictStr, Field(min_length=1, max_length=MAX_PATH_LENGTH)] | None = (
        Field(
            default=None,
            description="Relative paths of executions and files are under it; absent, the "
            "runner task's own working directory (the image's WORKDIR).",
        )
    )
    max_upload_bytes: Annotated[StrictInt, Field(ge=1, le=INT32_MAX)] = Field(
        default=64 * MIB, description="Decoded bytes of one file upload."
    )
    unprivileged_wrapper: Argv = Field(
        default_factory=list,
        description="Argument vector prefix of executions with privileged false, e.g. "
        "[/sbin/setuser, user].",
    )

    @model_validator(mode="after")
    def _default_within_max(self) -> ExecutionsSpec:
        if self.default_time_limit_seconds > self.max_time_limit_seconds:
            raise _invalid(
                f"must not be greater than maxTimeLimitSeconds ({self.max_time_limit_seconds})",
                "defaultTimeLimitSeconds",
            )
        return self


class RunnerSpec(_Model):
    model_config = ConfigDict(
        json_schema_extra=_validations(
            Rule(
                "!has(self.memoryMaxMB) || self.memoryMaxMB >= self.memoryMB",
                "memoryMaxMB must not be less than memoryMB",
                ".memoryMaxMB",
            ),
            Rule(
                "size(self.ports) == 0 || self.network == 'bridge'",
                "ports need network: bridge",
                ".ports",
            ),
        )
    )

    image: Annotated[StrictStr, Field(min_length=1), _crd(pattern=NOT_BLANK_PATTERN)]
    command: Argv = Field(
        default_factory=lambda: ["sleep", "infinity"],
        description="Empty runs the image's own entrypoint.",
    )
    cpu: Annotated[StrictInt, Field(ge=1, le=INT32_MAX)] = Field(
        default=100, description="CPU in MHz."
    )
    memory_mb: Annotated[StrictInt, Field(ge=10, le=INT32_MAX, alias="memoryMB")] = 128
    memory_max_mb: Annotated[StrictInt | None, Field(ge=10, le=INT32_MAX, alias="memoryMaxMB")] = (
        Field(default=None, description="Optional memory oversubscription limit.")
    )
    network: NetworkMode = NetworkMode.NONE
    ports: Annotated[list[Annotated[StrictInt, Field(ge=1, le=65535)]], _crd(**LIST_SET)] = Field(
        default_factory=list, description="Container ports to expose (network bridge only)."
    )
    env: Annotated[
        dict[str, StrictStr],
        _crd(
            Rule(
                f"self.all(k, k.matches('{ENV_KEY_RE.pattern}'))",
                "invalid variable name (letters, digits and '_', not starting with a digit)",
            )
        ),
    ] = Field(default_factory=dict)

    @field_validator("image")
    @classmethod
    def _image_not_blank(cls, value: str) -> str:
        if not value.strip():
            raise _invalid("must not be blank")
        return value

    @field_validator("ports")
    @classmethod
    def _ports_unique(cls, value: list[int]) -> list[int]:
        seen: set[int] = set()
        for index, port in enumerate(value):
            if port in seen:
                raise _invalid(f"duplicate port {port}", f"[{index}]")
            seen.add(port)
        return value

    @field_validator("env")
    @classmethod
    def _env_keys_valid(cls, value: dict[str, str]) -> dict[str, str]:
        for key in value:
            if not ENV_KEY_RE.fullmatch(key):
                raise _invalid(
                    "invalid variable name (letters, digits and '_', not starting with a digit)",
                    key,
                )
        return value

    @model_validator(mode="after")
    def _cross_field(self) -> RunnerSpec:
        if self.memory_max_mb is not None and self.memory_max_mb < self.memory_mb:
            raise _invalid(f"must not be less than memoryMB ({self.memory_mb})", "memoryMaxMB")
        if self.ports and self.network is not NetworkMode.BRIDGE:
            raise _invalid("ports need network: bridge", "ports")
        return self


class NomadSpec(_Model):
    # Transition rules: the API server runs them on updates only, when nomad exists on both
    # sides (always, thanks to its default); immutable_changes() is the model's side.
    # "namespace" is a reserved word of CEL: the field is __namespace__ in rules.
    model_config = ConfigDict(
        json_schema_extra=_validations(
            Rule(
                "has(self.__namespace__) == has(oldSelf.__namespace__) && "
                "(!has(self.__namespace__) || self.__namespace__ == oldSelf.__namespace__)",
                "nomad.namespace is immutable",
                ".namespace",
                "FieldValueForbidden",
            ),
            Rule(
                "has(self.jobPrefix) == has(oldSelf.jobPrefix) && "
                "(!has(self.jobPrefix) || self.jobPrefix == oldSelf.jobPrefix)",
                "nomad.jobPrefix is immutable",
                ".jobPrefix",
                "FieldValueForbidden",
            ),
        )
    )

    namespace: NomadNamespace = "default"
    datacenters: Annotated[list[Annotated[StrictStr, Field(min_length=1)]], Field(min_length=1)] = (
        Field(default_factory=lambda: ["*"])
    )
    node_pool: NomadNodePool | None = None
    job_prefix: JobPrefix | None = Field(
        default=None,
        description='Default: metadata.name with every "." as "-", cut to 50 characters, then "-".',
    )
    # Opaque to the CRD (kept as written): job_template_problems() is its only check.
    job_template: dict[str, Any] = Field(
        default_factory=dict,
        description="Raw Nomad JSON job deep-merged over the rendered one (checked by the "
        "controller).",
    )

    @field_validator("job_template")
    @classmethod
    def _job_template_valid(cls, value: dict[str, Any]) -> dict[str, Any]:
        problem = next(iter(job_template_problems(value)), None)
        if problem is not None:
            raise _invalid(problem.message, problem.path)
        return value


class DemandSpec(_Model):
    max_idle_runners: Count | None = Field(
        default=None, description="Ceiling of the idle target (at most maxRunners)."
    )
    window_seconds: Annotated[StrictInt, Field(ge=1, le=MAX_DEMAND_WINDOW_SECONDS)] = Field(
        default=300, description="Claims are counted over this moving window."
    )
    cover_seconds: Seconds | None = Field(
        default=None,
        description="Seconds of claims the buffer absorbs; absent, the measured p90 time from "
        "registration to running, plus 50%.",
    )


class ScheduleSpec(_Model):
    cron: Annotated[StrictStr, Field(max_length=256)] = Field(
        description="A cron expression of five fields (minute hour day month weekday) in "
        "timeZone; each time it names opens the window."
    )
    duration_minutes: Annotated[StrictInt, Field(ge=1, le=MAX_SCHEDULE_MINUTES)]
    idle_runners: Count = Field(description="The idle floor while the window is open.")
    time_zone: Annotated[StrictStr, Field(max_length=256)] = Field(
        default="UTC", description="An IANA time zone, such as Europe/Berlin."
    )

    @field_validator("cron", "time_zone")
    @classmethod
    def _parses(cls, value: str, info: ValidationInfo) -> str:
        # The CRD holds both as plain strings: they are checked here only.
        check = cron_problem if info.field_name == "cron" else time_zone_problem
        problem = check(value)
        if problem is not None:
            raise _invalid(problem)
        return value


class RunnerPoolSpec(_Model):
    model_config = ConfigDict(
        json_schema_extra=_validations(
            Rule(
                "self.idleRunners <= self.maxRunners",
                "idleRunners must not be greater than maxRunners",
                ".idleRunners",
            ),
            Rule(
                "!has(self.demand) || !has(self.demand.maxIdleRunners) || "
                "(self.demand.maxIdleRunners >= self.idleRunners && "
                "self.demand.maxIdleRunners <= self.maxRunners)",
                "demand.maxIdleRunners must be at least idleRunners and at most maxRunners",
                ".demand.maxIdleRunners",
            ),
            Rule(
                "self.schedule.all(w, w.idleRunners <= "
                "(has(self.demand) && has(self.demand.maxIdleRunners) ? "
                "self.demand.maxIdleRunners : self.maxRunners))",
                "a schedule window's idleRunners must not be greater than "
                "demand.maxIdleRunners (when set) or maxRunners",
                ".schedule",
            ),
        )
    )

    idle_runners: Count = Field(
        description="Desired warm, unclaimed runners (the scale subresource)."
    )
    max_runners: Count = Field(
        default=100,
        description="Cap on all runners of the pool (idle, starting, claimed, outdated, "
        "terminating).",
    )
    startup_timeout_seconds: Seconds = Field(
        default=120, description="A runner not running by then is replaced."
    )
    claims: ClaimsSpec = Field(default_factory=ClaimsSpec)
    executions: ExecutionsSpec = Field(
        default_factory=ExecutionsSpec, description="Executions and files in a claimed runner."
    )
    runner: RunnerSpec = Field(description="The runner, rendered into a Nomad batch job.")
    nomad: NomadSpec = Field(default_factory=NomadSpec)
    deletion_policy: DeletionPolicy = DeletionPolicy.DRAIN
    drain_timeout_seconds: Seconds = 3600
    demand: DemandSpec | None = Field(
        default=None,
        description="Size the idle buffer by the measured claim rate; absent, idleRunners "
        "alone sizes it.",
    )
    schedule: Annotated[list[ScheduleSpec], Field(max_length=MAX_SCHEDULE_WINDOWS)] = Field(
        default_factory=list, description="Idle floors by time of day."
    )

    @model_validator(mode="after")
    def _idle_within_max(self) -> RunnerPoolSpec:
        if self.idle_runners > self.max_runners:
            raise _invalid(
                f"must not be greater than maxRunners ({self.max_runners})", "idleRunners"
            )
        ceiling = self.demand.max_idle_runners if self.demand is not None else None
        if ceiling is not None and not self.idle_runners <= ceiling <= self.max_runners:
            raise _invalid(
                f"must be at least idleRunners ({self.idle_runners}) and at most "
                f"maxRunners ({self.max_runners})",
                "demand.maxIdleRunners",
            )
        for index, window in enumerate(self.schedule):
            limit, name = (
                (ceiling, "demand.maxIdleRunners")
                if ceiling is not None
                else (self.max_runners, "maxRunners")
            )
            if window.idle_runners > limit:
                raise _invalid(
                    f"must not be greater than {name} ({limit})", f"schedule[{index}].idleRunners"
                )
        return self

    def job_prefix_for(self, name: str) -> str:
        """The effective job prefix of a pool called ``name`` with this spec."""
        if self.nomad.job_prefix is not None:
            return self.nomad.job_prefix
        return derive_job_prefix(name)


class RunnerPool(_Model):
    api_version: Literal["poolkeeper.dev/v1alpha1"] = API_VERSION
    kind: Literal["RunnerPool"] = KIND
    metadata: ObjectMeta
    spec: RunnerPoolSpec = Field(
        description="The desired pool. Required fields are idleRunners and runner.image."
    )

    @model_validator(mode="before")
    @classmethod
    def _drop_status(cls, data: Any) -> Any:
        # Kubernetes sends the status with the object; it is output, never input.
        if isinstance(data, Mapping) and "status" in data:
            return {k: v for k, v in data.items() if k != "status"}
        return data

    @classmethod
    def parse_document(cls, document: Any) -> RunnerPool:
        """Validate a RunnerPool document (a file's or Kubernetes'): camelCase keys only,
        ``apiVersion`` and ``kind`` required. Raises ``pydantic.ValidationError``."""
        if isinstance(document, Mapping):
            missing = [key for key in ("apiVersion", "kind") if key not in document]
            if missing:
                raise ValidationError.from_exception_data(
                    cls.__name__,
                    [{"type": "missing", "loc": (key,), "input": document} for key in missing],
                )
        return cls.model_validate(document, by_alias=True, by_name=False)

    @property
    def key(self) -> str:
        """``<namespace>/<name>``: the pool's identity, also its ``poolkeeper_pool`` Meta."""
        return f"{self.metadata.namespace}/{self.metadata.name}"

    @property
    def job_prefix(self) -> str:
        return self.spec.job_prefix_for(self.metadata.name)

    @property
    def spec_hash(self) -> str:
        """A stable hash of the spec (16 hex characters): two processes reconciling one
        pool compare theirs through its lease."""
        spec = self.spec.model_dump(mode="json", by_alias=True)
        canonical = json.dumps(spec, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]

    @property
    def nomad_namespace(self) -> str:
        return self.spec.nomad.namespace

    @property
    def poseidon_environment(self) -> int | None:
        """The Poseidon execution environment the pool serves (its label), if any."""
        label = self.metadata.labels.get(POSEIDON_ENVIRONMENT_LABEL)
        return None if label is None else int(label)


# --- the status: written by the controller (core/status.py), never read as input ---------

# Kubernetes' own bounds of a condition (metav1.Condition).
CONDITION_TYPE_PATTERN: Final = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$"
)
CONDITION_REASON_PATTERN: Final = r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"
RunnerTotal = Annotated[StrictInt, Field(ge=0)]
Generation = Annotated[StrictInt, Field(ge=0), _crd(format="int64")]
Measure = Annotated[float, Field(ge=0)]


class StatusCondition(_Model):
    type: Annotated[StrictStr, Field(max_length=316, pattern=CONDITION_TYPE_PATTERN)]
    status: Literal["True", "False", "Unknown"]
    observed_generation: Generation | None = None
    last_transition_time: datetime
    reason: Annotated[
        StrictStr, Field(min_length=1, max_length=1024, pattern=CONDITION_REASON_PATTERN)
    ]
    message: Annotated[StrictStr, Field(max_length=32768)]


class DemandStatus(_Model):
    claims_per_minute: Measure | None = None
    start_seconds_p90: Measure | None = None


class RunnerPoolStatus(_Model):
    """A RunnerPool's status as the controller writes it (``PoolStatus.to_dict``): the
    CRD's status schema, and what tests hold the controller's writes to."""

    idle_runners: RunnerTotal | None = None
    starting_runners: RunnerTotal | None = None
    claimed_runners: RunnerTotal | None = None
    outdated_runners: RunnerTotal | None = None
    total_runners: RunnerTotal | None = None
    desired_idle_runners: RunnerTotal | None = Field(
        default=None, description="The idle target now."
    )
    desired_idle_reason: TargetReason | None = Field(
        default=None, description="What sets the idle target now."
    )
    demand: DemandStatus | None = Field(
        default=None, description="What the demand estimate measured (pools with spec.demand)."
    )
    selector: StrictStr | None = Field(
        default=None, description="Label selector string for the scale subresource."
    )
    template_hash: StrictStr | None = None
    reconciled_by: StrictStr | None = Field(
        default=None, description="The process holding the pool's lease (host/pid or pod name)."
    )
    observed_generation: Generation | None = None
    last_reconcile_time: datetime | None = None
    conditions: (
        Annotated[
            list[StatusCondition],
            _crd(**{"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]}),
        ]
        | None
    ) = None


def derive_job_prefix(name: str) -> str:
    """The default job prefix: dots as dashes, cut to 50 characters, then ``-``."""
    return name.replace(".", "-")[:DERIVED_PREFIX_MAX] + "-"


def pool_key(namespace: str, name: str) -> str:
    return f"{namespace}/{name}"


# --- jobTemplate checks ------------------------------------------------------------------


@dataclass(frozen=True)
class FieldError:
    """One problem of a document: ``path`` in contract spelling (``spec.runner.image``)."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


def _join(path: str, part: str | int) -> str:
    if isinstance(part, int):
        return f"{path}[{part}]"
    if part.startswith("["):
        return path + part
    return f"{path}.{part}" if path else part


def _lookup(obj: Mapping[str, Any], name: str) -> tuple[str, Any] | None:
    """The key of ``obj`` equal to ``name`` ignoring case, as Nomad's JSON decoder reads it."""
    for key, value in obj.items():
        if isinstance(key, str) and key.lower() == name:
            return key, value
    return None


def _json_problems(value: Any, path: str, in_map: bool) -> Iterator[FieldError]:
    """Values JSON cannot carry, and keys Nomad would read as one field."""
    if isinstance(value, Mapping):
        seen: dict[str, str] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                yield FieldError(path, f"key {key!r} must be a string")
                continue
            if not in_map:
                folded = key.lower()
                if folded in seen:
                    yield FieldError(
                        _join(path, key),
                        f"duplicates {seen[folded]!r} (Nomad reads JSON keys case-insensitively)",
                    )
                seen[folded] = key
            yield from _json_problems(item, _join(path, key), in_map or key.lower() in MAP_FIELDS)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _json_problems(item, _join(path, index), in_map)
    elif isinstance(value, float):
        if not math.isfinite(value):
            yield FieldError(path, "must be a finite number")
    elif value is not None and not isinstance(value, str | int | bool):
        yield FieldError(path, f"a {type(value).__name__} is not a JSON value")


def _meta_problems(obj: Mapping[str, Any], path: str) -> Iterator[FieldError]:
    found = _lookup(obj, "meta")
    if found is None:
        return
    key, meta = found
    if not isinstance(meta, Mapping):
        yield FieldError(_join(path, key), "must be an object")
        return
    for name, value in meta.items():
        if isinstance(name, str) and name.lower().startswith(META_RESERVED_PREFIX):
            yield FieldError(
                _join(_join(path, key), name), "poolkeeper_* Meta is set by poolkeeper"
            )
        elif not isinstance(value, str):
            yield FieldError(_join(_join(path, key), str(name)), "Meta values must be strings")


def _single_list(
    obj: Mapping[str, Any], name: str, path: str
) -> tuple[list[FieldError], list[tuple[str, Mapping[str, Any]]]]:
    """Checks a TaskGroups/Tasks list: at most one object. Returns (errors, [(path, item)])."""
    found = _lookup(obj, name)
    if found is None:
        return [], []
    key, items = found
    here = _join(path, key)
    if not isinstance(items, list):
        return [FieldError(here, "must be a list")], []
    if len(items) > 1:
        return [FieldError(here, "must hold at most one element (the runner's)")], []
    if items and not isinstance(items[0], Mapping):
        return [FieldError(_join(here, 0), "must be an object")], []
    return [], [(_join(here, 0), item) for item in items]


def job_template_problems(template: Mapping[str, Any]) -> list[FieldError]:
    """Everything wrong with a jobTemplate; paths are relative to the template."""
    problems = list(_json_problems(template, "", in_map=False))
    for key in template:
        if isinstance(key, str) and key.lower() in RESERVED_JOB_KEYS:
            problems.append(FieldError(key, "is set by poolkeeper"))
        elif isinstance(key, str) and key.lower() == "job":
            problems.append(
                FieldError(key, "jobTemplate is the job itself, not a register request")
            )
    problems.extend(_meta_problems(template, ""))
    errors, groups = _single_list(template, "taskgroups", "")
    problems.extend(errors)
    for group_path, group in groups:
        count = _lookup(group, "count")
        if count is not None:
            problems.append(FieldError(_join(group_path, count[0]), "is set by poolkeeper"))
        problems.extend(_meta_problems(group, group_path))
        errors, tasks = _single_list(group, "tasks", group_path)
        problems.extend(errors)
        for task_path, task in tasks:
            problems.extend(_meta_problems(task, task_path))
    return problems


# --- turning pydantic errors into contract paths -----------------------------------------


_MODELS: Final[tuple[type[BaseModel], ...]] = (
    RunnerPool,
    ObjectMeta,
    RunnerPoolSpec,
    ClaimsSpec,
    ExecutionsSpec,
    RunnerSpec,
    NomadSpec,
    DemandSpec,
    ScheduleSpec,
)


def _field_tables() -> dict[type[BaseModel], dict[str, tuple[str, type[BaseModel] | None]]]:
    """Per model: attribute name or alias -> (alias, nested model)."""
    tables: dict[type[BaseModel], dict[str, tuple[str, type[BaseModel] | None]]] = {}
    for model in _MODELS:
        table: dict[str, tuple[str, type[BaseModel] | None]] = {}
        for name, info in model.model_fields.items():
            alias = info.alias or name
            annotation = info.annotation
            nested = (
                annotation
                if isinstance(annotation, type) and issubclass(annotation, BaseModel)
                else None
            )
            table[name] = table[alias] = (alias, nested)
        tables[model] = table
    return tables


_MODELS_BY_TITLE: Final[dict[str, type[BaseModel]]] = {model.__name__: model for model in _MODELS}
_FIELD_TABLES: Final = _field_tables()


def _message(error: Mapping[str, Any]) -> str:
    kind = error["type"]
    if kind == "missing":
        return "field required"
    if kind == "extra_forbidden":
        return "unknown field"
    message = str(error["msg"])
    if kind.startswith("value_error"):
        message = message.removeprefix("Value error, ")
    if len(message) > 1 and message[0].isupper() and message[1].islower():
        message = message[0].lower() + message[1:]
    return message


def validation_errors(exc: ValidationError, root: str = "") -> list[FieldError]:
    """The errors of ``exc`` with contract paths (``spec.runner.memoryMB``, camelCase).

    ``root`` is prepended, e.g. ``"spec"`` when only a ``RunnerPoolSpec`` was validated.
    """
    result: list[FieldError] = []
    model: type[BaseModel] | None = _MODELS_BY_TITLE.get(exc.title)
    for error in exc.errors():
        path = root
        current = model
        loc = error["loc"]
        for index, part in enumerate(loc):
            # An unknown key is shown as written, even where it spells an attribute name.
            verbatim = error["type"] == "extra_forbidden" and index == len(loc) - 1
            if (
                isinstance(part, str)
                and current is not None
                and not verbatim
                and part in _FIELD_TABLES[current]
            ):
                alias, current = _FIELD_TABLES[current][part]
                path = _join(path, alias)
            elif part == "[key]":
                path = _join(path, "(key)")
                current = None
            else:
                # Below an opaque field (env, jobTemplate, list items) names are data.
                path = _join(path, part)
                current = None
        ctx = error.get("ctx") or {}
        subpath = ctx.get(_SUBPATH, "")
        if subpath:
            path = _join(path, subpath)
        result.append(FieldError(path, _message(error)))
    return result


def format_validation_error(exc: ValidationError, root: str = "") -> str:
    """All errors of ``exc`` on one line: ``spec.runner.image: field required; ...``."""
    return "; ".join(str(error) for error in validation_errors(exc, root))


def immutable_changes(old: RunnerPool, new: RunnerPool) -> list[str]:
    """The immutable fields that differ between two versions (namespace, job prefix)."""
    changed: list[str] = []
    if old.spec.nomad.namespace != new.spec.nomad.namespace:
        changed.append("spec.nomad.namespace")
    if old.job_prefix != new.job_prefix:
        changed.append("spec.nomad.jobPrefix")
    return changed
