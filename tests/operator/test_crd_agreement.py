"""The RunnerPool CRD and the pydantic models accept and reject the same documents, as the
real kube-apiserver applies the CRD (the session's cluster, tests/conftest.py's ``kube``).

Every document is sent to the server as a client sends it (JSON, server-side dry run into
one namespace, no operator): the server's verdict, the messages of its 422 (the CRD's own
rule messages and the schema's), and the object it would store (pruned and defaulted) are
compared with what ``RunnerPool.parse_document`` makes of the same document.

For a canonical document (no unknown field, no ``null``, no float) the server and the model
must agree, and on acceptance mean the same pool (the defaults agree). Where the two differ
on purpose it is asserted too: the server prunes unknown fields (unless the client asks for
strict field validation, as kubectl does) and takes ``null`` for absent where a pool file
is refused, ``jobTemplate`` is opaque to the CRD and checked by the controller, and a whole
float such as ``5.0`` passes the schema but not a CEL rule that reads it.
"""

from __future__ import annotations

import copy
import json
import re
import types
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final, get_args

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from controller.lab.kube import KubeCluster
from controller.model import RunnerPool, ScheduleSpec, immutable_changes
from tests.operator.conftest import CRD_FILE, GROUP, PLURAL, ROOT, VERSION
from tests.support.documents import DELETE, as_integers, pool_doc, with_fields

NAMESPACE: Final = "crd-agreement"
INT32_MAX: Final = 2**31 - 1
CRD: Final = yaml.safe_load(CRD_FILE.read_text(encoding="utf-8"))
SCHEMA: Final = CRD["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
EXAMPLES: Final = ROOT / "examples" / "pools.yaml"
DOCUMENTED: Final = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def model_accepts(document: Any) -> bool:
    try:
        RunnerPool.parse_document(document)
    except ValidationError:
        return False
    return True


def document_with(changes: Mapping[str, Any]) -> dict[str, Any]:
    """A valid document of one idle runner with dotted paths set (``DELETE`` removes)."""
    return with_fields(pool_doc(idle=1, namespace=NAMESPACE), changes)


# --- the server ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Answer:
    """The API server's answer to one write."""

    code: int
    body: Any

    @property
    def accepted(self) -> bool:
        return self.code in (200, 201)

    @property
    def causes(self) -> list[tuple[str, str]]:
        """(field, message) of each cause of a refusal."""
        details = (self.body.get("details") or {}) if isinstance(self.body, dict) else {}
        return [(c.get("field", ""), c.get("message", "")) for c in details.get("causes") or ()]


class Pools:
    """The RunnerPools of NAMESPACE, written as admin."""

    def __init__(self, kube: KubeCluster) -> None:
        self.kube = kube

    def path(self, name: str = "", sub: str = "") -> str:
        path = f"/apis/{GROUP}/{VERSION}/namespaces/{NAMESPACE}/{PLURAL}"
        return "/".join(filter(None, (path, name, sub)))

    def create(self, document: Mapping[str, Any], *, query: str = "dryRun=All") -> Answer:
        """A create (a dry run unless ``query`` says otherwise)."""
        return Answer(*self.kube.request("POST", f"{self.path()}?{query}", document))

    def store(self, document: Mapping[str, Any]) -> dict[str, Any]:
        """Create it for real; the stored object."""
        answer = self.create(document, query="")
        assert answer.code == 201, answer.body
        return dict(answer.body)

    def update(self, document: Mapping[str, Any], *, sub: str = "") -> Answer:
        """A dry-run update of the stored object of the same name to ``document`` (through
        the ``sub``resource if given), at the stored resourceVersion."""
        name = document["metadata"]["name"]
        status, stored = self.kube.request("GET", self.path(name))
        assert status == 200, stored
        body = copy.deepcopy(dict(document))
        body["metadata"]["resourceVersion"] = stored["metadata"]["resourceVersion"]
        return Answer(*self.kube.request("PUT", f"{self.path(name, sub)}?dryRun=All", body))


@pytest.fixture(scope="module")
def pools(crds: KubeCluster) -> Iterator[Pools]:
    crds.create_namespace(NAMESPACE)
    yield Pools(crds)
    # No finalizer without an operator: the stored pools go at once, before an operator of a
    # later test (all namespaces) could see them.
    status, body = crds.request("DELETE", Pools(crds).path())
    assert status == 200, body


# --- expected refusals --------------------------------------------------------------------


@dataclass(frozen=True)
class Refused:
    """A 422 with a cause for ``field`` whose message contains ``message``."""

    field: str
    message: str


OK: Final = None
Expected = Refused | None


def rule(field: str, message: str) -> Refused:
    """One of the CRD's CEL rules (``message`` is its message, word for word)."""
    return Refused(field, f"Invalid value: {message}")


def at_least(field: str, bound: int) -> Refused:
    return Refused(field, f"{field} in body should be greater than or equal to {bound}")


def at_most(field: str, bound: int) -> Refused:
    return Refused(field, f"{field} in body should be less than or equal to {bound}")


def of_type(field: str, json_type: str) -> Refused:
    return Refused(field, f"{field} in body must be of type {json_type}")


def matching(field: str, pattern: str) -> Refused:
    return Refused(field, f"{field} in body should match '{pattern}'")


def required(field: str) -> Refused:
    return Refused(field, "Required value")


def too_long(field: str, limit: int) -> Refused:
    return Refused(field, f"Too long: may not be more than {limit} bytes")


def unsupported(field: str, value: str, supported: str) -> Refused:
    return Refused(field, f'Unsupported value: "{value}": supported values: {supported}')


def assert_refused(answer: Answer, expected: Refused) -> None:
    assert answer.code == 422, (answer.code, answer.body)
    matches = [f for f, m in answer.causes if f == expected.field and expected.message in m]
    assert matches, f"no cause {expected} in {answer.causes}"


IDLE_ABOVE_MAX: Final = "idleRunners must not be greater than maxRunners"
DEMAND_BOUNDS: Final = "demand.maxIdleRunners must be at least idleRunners and at most maxRunners"
WINDOW_ABOVE_MAX: Final = (
    "a schedule window's idleRunners must not be greater than demand.maxIdleRunners "
    "(when set) or maxRunners"
)
CLAIMS_DEFAULT_ABOVE_MAX: Final = (
    "defaultInactivityTimeoutSeconds must not be greater than maxInactivityTimeoutSeconds"
)
EXECUTIONS_DEFAULT_ABOVE_MAX: Final = (
    "defaultTimeLimitSeconds must not be greater than maxTimeLimitSeconds"
)
EMPTY_PROGRAM: Final = "the program (first element) must not be empty"
MEMORY_MAX_BELOW: Final = "memoryMaxMB must not be less than memoryMB"
PORTS_NEED_BRIDGE: Final = "ports need network: bridge"
ENV_NAME: Final = "invalid variable name (letters, digits and '_', not starting with a digit)"
NAMESPACE_IMMUTABLE: Final = "nomad.namespace is immutable"
PREFIX_IMMUTABLE: Final = "nomad.jobPrefix is immutable"
NOMAD_NAME: Final = "^[a-zA-Z0-9-]{1,128}$"
NODE_POOL: Final = "^[a-zA-Z0-9_.-]{1,128}$"
JOB_PREFIX: Final = "^[a-z0-9][a-z0-9-]{0,62}-$"
NETWORKS: Final = '"none", "bridge"'
POLICIES: Final = '"Drain", "Delete", "Orphan"'
NAME_RULE: Final = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric"

BRIDGE: Final = {"spec.runner.network": "bridge"}
WINDOW: Final = {"cron": "45 8 * * 1-5", "durationMinutes": 90, "idleRunners": 50}
IDLE, MAX = "spec.idleRunners", "spec.maxRunners"
STARTUP, DRAIN = "spec.startupTimeoutSeconds", "spec.drainTimeoutSeconds"
CLAIM_DEFAULT = "spec.claims.defaultInactivityTimeoutSeconds"
CLAIM_MAX = "spec.claims.maxInactivityTimeoutSeconds"
IMAGE, COMMAND = "spec.runner.image", "spec.runner.command"
CPU, MEMORY, MEMORY_MAX = "spec.runner.cpu", "spec.runner.memoryMB", "spec.runner.memoryMaxMB"
PORTS, ENV = "spec.runner.ports", "spec.runner.env"
NOMAD_NS, DCS = "spec.nomad.namespace", "spec.nomad.datacenters"
POOL, PREFIX, TEMPLATE = "spec.nomad.nodePool", "spec.nomad.jobPrefix", "spec.nomad.jobTemplate"
MAX_IDLE, WINDOW_S, COVER = (
    "spec.demand.maxIdleRunners",
    "spec.demand.windowSeconds",
    "spec.demand.coverSeconds",
)
TIME_DEFAULT = "spec.executions.defaultTimeLimitSeconds"
TIME_MAX = "spec.executions.maxTimeLimitSeconds"
CONCURRENT, WORKDIR = "spec.executions.maxConcurrent", "spec.executions.workingDir"
UPLOAD, WRAPPER = "spec.executions.maxUploadBytes", "spec.executions.unprivilegedWrapper"
W0 = "spec.schedule[0]"

# (changes, expected): every known field, at and beyond its bounds, with wrong types; for a
# refusal, the cause the server names (beside others it may add, such as the scale
# subresource's own check of idleRunners).
CASES: Final[list[tuple[dict[str, Any], Expected]]] = [
    ({}, OK),
    # idleRunners (required) and maxRunners
    ({IDLE: 0}, OK),
    ({IDLE: 100}, OK),
    ({IDLE: 101}, rule(IDLE, IDLE_ABOVE_MAX)),
    ({IDLE: -1}, at_least(IDLE, 0)),
    ({IDLE: "5"}, of_type(IDLE, 'integer: "string"')),
    ({IDLE: True}, of_type(IDLE, "int32")),  # the format's check answers for a boolean
    ({IDLE: 1.5}, of_type(IDLE, 'int32: "float64"')),
    ({IDLE: DELETE}, required(IDLE)),
    ({IDLE: INT32_MAX, MAX: INT32_MAX}, OK),
    ({IDLE: INT32_MAX + 1, MAX: INT32_MAX}, at_most(IDLE, INT32_MAX)),
    ({IDLE: 0, MAX: 0}, OK),
    ({IDLE: 3, MAX: 2}, rule(IDLE, IDLE_ABOVE_MAX)),
    ({MAX: -1}, at_least(MAX, 0)),
    ({MAX: INT32_MAX + 1}, at_most(MAX, INT32_MAX)),
    ({MAX: "100"}, of_type(MAX, 'integer: "string"')),
    # startupTimeoutSeconds and drainTimeoutSeconds (> 0)
    ({STARTUP: 1}, OK),
    ({STARTUP: 0}, at_least(STARTUP, 1)),
    ({STARTUP: INT32_MAX}, OK),
    ({STARTUP: INT32_MAX + 1}, at_most(STARTUP, INT32_MAX)),
    ({STARTUP: "120"}, of_type(STARTUP, 'integer: "string"')),
    ({DRAIN: 1}, OK),
    ({DRAIN: 0}, at_least(DRAIN, 1)),
    ({DRAIN: -3600}, at_least(DRAIN, 1)),
    ({DRAIN: []}, of_type(DRAIN, 'integer: "array"')),
    # claims
    ({"spec.claims": {}}, OK),
    ({CLAIM_DEFAULT: 3600}, OK),
    ({CLAIM_DEFAULT: 3601}, rule(CLAIM_DEFAULT, CLAIMS_DEFAULT_ABOVE_MAX)),
    ({CLAIM_MAX: 299}, rule(CLAIM_DEFAULT, CLAIMS_DEFAULT_ABOVE_MAX)),  # below the default
    ({CLAIM_MAX: 300}, OK),
    ({CLAIM_DEFAULT: 10, CLAIM_MAX: 10}, OK),
    ({CLAIM_DEFAULT: 0}, at_least(CLAIM_DEFAULT, 1)),
    ({CLAIM_MAX: INT32_MAX + 1}, at_most(CLAIM_MAX, INT32_MAX)),
    ({"spec.claims": "300"}, of_type("spec.claims", 'object: "string"')),
    ({"spec.claims": []}, of_type("spec.claims", 'object: "array"')),
    # runner.image (required, not blank)
    ({"spec.runner": DELETE}, required("spec.runner")),
    ({"spec.runner": "python"}, of_type("spec.runner", 'object: "string"')),
    ({IMAGE: DELETE}, required(IMAGE)),
    ({IMAGE: ""}, Refused(IMAGE, f"{IMAGE} in body should be at least 1 chars long")),
    ({IMAGE: " "}, Refused(IMAGE, f"{IMAGE} in body should match '[^")),
    ({IMAGE: "\t\n"}, Refused(IMAGE, f"{IMAGE} in body should match '[^")),
    ({IMAGE: "\u00a0\u3000\u2028"}, Refused(IMAGE, f"{IMAGE} in body should match '[^")),
    ({IMAGE: "\x1c"}, Refused(IMAGE, f"{IMAGE} in body should match '[^")),
    ({IMAGE: " x "}, OK),
    ({IMAGE: "\u200b"}, OK),  # zero-width space is not whitespace
    ({IMAGE: 5}, of_type(IMAGE, 'string: "integer"')),
    # runner.command
    ({COMMAND: []}, OK),
    ({COMMAND: ["python", "-c", ""]}, OK),
    ({COMMAND: [""]}, rule(COMMAND, EMPTY_PROGRAM)),
    ({COMMAND: ["", "x"]}, rule(COMMAND, EMPTY_PROGRAM)),
    ({COMMAND: [" "]}, OK),
    ({COMMAND: [1]}, of_type(f"{COMMAND}[0]", 'string: "integer"')),
    ({COMMAND: "sleep infinity"}, of_type(COMMAND, 'array: "string"')),
    # runner.cpu, memoryMB, memoryMaxMB
    ({CPU: 1}, OK),
    ({CPU: 0}, at_least(CPU, 1)),
    ({CPU: INT32_MAX + 1}, at_most(CPU, INT32_MAX)),
    ({CPU: "100"}, of_type(CPU, 'integer: "string"')),
    ({MEMORY: 10}, OK),
    ({MEMORY: 9}, at_least(MEMORY, 10)),
    ({MEMORY: False}, of_type(MEMORY, "int32")),
    ({MEMORY_MAX: 128}, OK),
    ({MEMORY_MAX: 127}, rule(MEMORY_MAX, MEMORY_MAX_BELOW)),  # below the default memoryMB
    ({MEMORY_MAX: 10, MEMORY: 10}, OK),
    ({MEMORY_MAX: 9, MEMORY: 10}, rule(MEMORY_MAX, MEMORY_MAX_BELOW)),
    ({MEMORY_MAX: INT32_MAX}, OK),
    ({MEMORY_MAX: INT32_MAX + 1}, at_most(MEMORY_MAX, INT32_MAX)),
    ({MEMORY_MAX: "512"}, of_type(MEMORY_MAX, 'integer: "string"')),
    # runner.network and ports
    ({"spec.runner.network": "none"}, OK),
    ({"spec.runner.network": "bridge"}, OK),
    ({"spec.runner.network": "host"}, unsupported("spec.runner.network", "host", NETWORKS)),
    ({"spec.runner.network": "Bridge"}, unsupported("spec.runner.network", "Bridge", NETWORKS)),
    ({PORTS: []}, OK),
    ({PORTS: [8080]}, rule(PORTS, PORTS_NEED_BRIDGE)),
    ({**BRIDGE, PORTS: [8080, 1, 65535]}, OK),
    ({**BRIDGE, PORTS: [0]}, at_least(f"{PORTS}[0]", 1)),
    ({**BRIDGE, PORTS: [65536]}, at_most(f"{PORTS}[0]", 65535)),
    ({**BRIDGE, PORTS: [80, 80]}, Refused(f"{PORTS}[1]", "Duplicate value: 80")),
    ({**BRIDGE, PORTS: ["80"]}, of_type(f"{PORTS}[0]", 'integer: "string"')),
    ({**BRIDGE, PORTS: 80}, of_type(PORTS, 'array: "integer"')),
    # runner.env
    ({ENV: {}}, OK),
    ({ENV: {"A_1": "x", "_b": "", "PYTHONUNBUFFERED": "1"}}, OK),
    ({ENV: {"1A": "x"}}, rule(ENV, ENV_NAME)),
    ({ENV: {"A-B": "x"}}, rule(ENV, ENV_NAME)),
    ({ENV: {"": "x"}}, rule(ENV, ENV_NAME)),
    ({ENV: {"A": 1}}, of_type(f"{ENV}.A", 'string: "integer"')),
    ({ENV: {"PATH\n": "/bin"}}, rule(ENV, ENV_NAME)),
    ({ENV: {"A": True}}, of_type(f"{ENV}.A", 'string: "boolean"')),
    ({ENV: ["A=1"]}, of_type(ENV, 'object: "array"')),
    # nomad.namespace
    ({"spec.nomad": {}}, OK),
    ({NOMAD_NS: "team-A-2"}, OK),
    ({NOMAD_NS: "a" * 128}, OK),
    ({NOMAD_NS: "a" * 129}, too_long(NOMAD_NS, 128)),
    ({NOMAD_NS: ""}, matching(NOMAD_NS, NOMAD_NAME)),
    ({NOMAD_NS: "a_b"}, matching(NOMAD_NS, NOMAD_NAME)),
    ({NOMAD_NS: "a b"}, matching(NOMAD_NS, NOMAD_NAME)),
    ({NOMAD_NS: 1}, of_type(NOMAD_NS, 'string: "integer"')),
    ({NOMAD_NS: "default\n"}, matching(NOMAD_NS, NOMAD_NAME)),  # RE2's $ is the end of text
    # nomad.datacenters
    ({DCS: ["dc1", "dc2", "dc1"]}, OK),
    ({DCS: []}, Refused(DCS, f"{DCS} in body should have at least 1 items")),
    ({DCS: [""]}, Refused(f"{DCS}[0]", f"{DCS}[0] in body should be at least 1 chars long")),
    ({DCS: "dc1"}, of_type(DCS, 'array: "string"')),
    ({DCS: [1]}, of_type(f"{DCS}[0]", 'string: "integer"')),
    # nomad.nodePool
    ({POOL: "gpu.pool_1-a"}, OK),
    ({POOL: "p" * 128}, OK),
    ({POOL: "p" * 129}, too_long(POOL, 128)),
    ({POOL: ""}, matching(POOL, NODE_POOL)),
    ({POOL: "a/b"}, matching(POOL, NODE_POOL)),
    ({POOL: 7}, of_type(POOL, 'string: "integer"')),
    ({POOL: "gpu\n"}, matching(POOL, NODE_POOL)),
    # nomad.jobPrefix
    ({PREFIX: "python-"}, OK),
    ({PREFIX: "a-"}, OK),
    ({PREFIX: "0--"}, OK),
    ({PREFIX: "a" * 63 + "-"}, OK),
    ({PREFIX: "a" * 64 + "-"}, too_long(PREFIX, 64)),
    ({PREFIX: "python"}, matching(PREFIX, JOB_PREFIX)),
    ({PREFIX: "-python-"}, matching(PREFIX, JOB_PREFIX)),
    ({PREFIX: "Python-"}, matching(PREFIX, JOB_PREFIX)),
    ({PREFIX: "py.thon-"}, matching(PREFIX, JOB_PREFIX)),
    ({PREFIX: "-"}, matching(PREFIX, JOB_PREFIX)),
    ({PREFIX: ["python-"]}, of_type(PREFIX, 'string: "array"')),
    ({PREFIX: "python-\n"}, matching(PREFIX, JOB_PREFIX)),
    # nomad.jobTemplate (an object; its content is the controller's business)
    ({TEMPLATE: {}}, OK),
    ({TEMPLATE: {"Meta": {"course": "web"}, "Priority": 60}}, OK),
    ({TEMPLATE: "{}"}, of_type(TEMPLATE, 'object: "string"')),
    ({TEMPLATE: []}, of_type(TEMPLATE, 'object: "array"')),
    # deletionPolicy
    ({"spec.deletionPolicy": "Drain"}, OK),
    ({"spec.deletionPolicy": "Delete"}, OK),
    ({"spec.deletionPolicy": "Orphan"}, OK),
    ({"spec.deletionPolicy": "drain"}, unsupported("spec.deletionPolicy", "drain", POLICIES)),
    ({"spec.deletionPolicy": ""}, unsupported("spec.deletionPolicy", "", POLICIES)),
    ({"spec.deletionPolicy": 1}, of_type("spec.deletionPolicy", 'string: "integer"')),
    # demand
    ({"spec.demand": {}}, OK),
    ({MAX_IDLE: 60}, OK),
    ({MAX_IDLE: 1}, OK),  # = idleRunners
    ({MAX_IDLE: 100}, OK),  # = maxRunners
    ({MAX_IDLE: 0}, rule(MAX_IDLE, DEMAND_BOUNDS)),  # below idleRunners 1
    ({MAX_IDLE: 101}, rule(MAX_IDLE, DEMAND_BOUNDS)),  # above maxRunners 100
    ({MAX_IDLE: "60"}, of_type(MAX_IDLE, 'integer: "string"')),
    ({MAX_IDLE: None, WINDOW_S: 60}, OK),
    ({WINDOW_S: 1}, OK),
    ({WINDOW_S: 600}, OK),
    ({WINDOW_S: 0}, at_least(WINDOW_S, 1)),
    ({WINDOW_S: 601}, at_most(WINDOW_S, 600)),
    ({WINDOW_S: 30.5}, of_type(WINDOW_S, 'int32: "float64"')),
    ({COVER: 1}, OK),
    ({COVER: None}, OK),
    ({COVER: 0}, at_least(COVER, 1)),
    ({COVER: INT32_MAX + 1}, at_most(COVER, INT32_MAX)),
    ({"spec.demand": 5}, of_type("spec.demand", 'object: "integer"')),
    # schedule
    ({"spec.schedule": []}, OK),
    ({"spec.schedule": [WINDOW]}, OK),
    ({"spec.schedule": [WINDOW] * 20}, OK),
    ({"spec.schedule": [WINDOW] * 21}, Refused("spec.schedule", "must have at most 20 items")),
    ({"spec.schedule": [{**WINDOW, "timeZone": "Europe/Berlin"}]}, OK),
    ({"spec.schedule": [{**WINDOW, "idleRunners": 100}]}, OK),  # = maxRunners
    ({"spec.schedule": [{**WINDOW, "idleRunners": 101}]}, rule("spec.schedule", WINDOW_ABOVE_MAX)),
    (
        {"spec.schedule": [{**WINDOW, "idleRunners": 61}], MAX_IDLE: 60},
        rule("spec.schedule", WINDOW_ABOVE_MAX),
    ),
    ({"spec.schedule": [{**WINDOW, "idleRunners": 60}], MAX_IDLE: 60}, OK),
    ({"spec.schedule": [{**WINDOW, "idleRunners": -1}]}, at_least(f"{W0}.idleRunners", 0)),
    ({"spec.schedule": [{**WINDOW, "durationMinutes": 10080}]}, OK),
    (
        {"spec.schedule": [{**WINDOW, "durationMinutes": 10081}]},
        at_most(f"{W0}.durationMinutes", 10080),
    ),
    ({"spec.schedule": [{**WINDOW, "durationMinutes": 0}]}, at_least(f"{W0}.durationMinutes", 1)),
    (
        {"spec.schedule": [{**WINDOW, "durationMinutes": "90"}]},
        of_type(f"{W0}.durationMinutes", 'integer: "string"'),
    ),
    ({"spec.schedule": [{**WINDOW, "cron": 5}]}, of_type(f"{W0}.cron", 'string: "integer"')),
    (
        {"spec.schedule": [{**WINDOW, "cron": "1," * 130 + "2 8 * * *"}]},
        too_long(f"{W0}.cron", 256),
    ),
    (
        {"spec.schedule": [{**WINDOW, "timeZone": 1}]},
        of_type(f"{W0}.timeZone", 'string: "integer"'),
    ),
    ({"spec.schedule": [{k: v for k, v in WINDOW.items() if k != "cron"}]}, required(f"{W0}.cron")),
    (
        {"spec.schedule": [{k: v for k, v in WINDOW.items() if k != "idleRunners"}]},
        required(f"{W0}.idleRunners"),
    ),
    (
        {"spec.schedule": [{k: v for k, v in WINDOW.items() if k != "durationMinutes"}]},
        required(f"{W0}.durationMinutes"),
    ),
    ({"spec.schedule": [5]}, of_type(W0, 'object: "integer"')),
    ({"spec.schedule": WINDOW}, of_type("spec.schedule", 'array: "object"')),
    # executions
    ({"spec.executions": {}}, OK),
    ({TIME_DEFAULT: 1}, OK),
    ({TIME_DEFAULT: 3600}, OK),  # = maxTimeLimitSeconds
    ({TIME_DEFAULT: 3601}, rule(TIME_DEFAULT, EXECUTIONS_DEFAULT_ABOVE_MAX)),
    ({TIME_DEFAULT: 0}, at_least(TIME_DEFAULT, 1)),
    ({TIME_DEFAULT: "60"}, of_type(TIME_DEFAULT, 'integer: "string"')),
    ({TIME_MAX: INT32_MAX}, OK),
    ({TIME_MAX: 59}, rule(TIME_DEFAULT, EXECUTIONS_DEFAULT_ABOVE_MAX)),  # below the default
    ({TIME_MAX: INT32_MAX + 1}, at_most(TIME_MAX, INT32_MAX)),
    ({CONCURRENT: 1}, OK),
    ({CONCURRENT: 0}, at_least(CONCURRENT, 1)),
    ({CONCURRENT: 2.5}, of_type(CONCURRENT, 'int32: "float64"')),
    ({WORKDIR: "/workspace"}, OK),
    ({WORKDIR: "work"}, OK),
    ({WORKDIR: None}, OK),
    ({WORKDIR: "/" * 4096}, OK),
    ({WORKDIR: "/" * 4097}, too_long(WORKDIR, 4096)),
    ({WORKDIR: ""}, Refused(WORKDIR, f"{WORKDIR} in body should be at least 1 chars long")),
    ({WORKDIR: 5}, of_type(WORKDIR, 'string: "integer"')),
    ({UPLOAD: 1}, OK),
    ({UPLOAD: INT32_MAX}, OK),
    ({UPLOAD: 0}, at_least(UPLOAD, 1)),
    ({UPLOAD: INT32_MAX + 1}, at_most(UPLOAD, INT32_MAX)),
    ({WRAPPER: ["/sbin/setuser", "user"]}, OK),
    ({WRAPPER: ["runuser", ""]}, OK),
    ({WRAPPER: []}, OK),
    ({WRAPPER: [""]}, rule(WRAPPER, EMPTY_PROGRAM)),
    ({WRAPPER: "setuser"}, of_type(WRAPPER, 'array: "string"')),
    ({WRAPPER: [1]}, of_type(f"{WRAPPER}[0]", 'string: "integer"')),
    ({"spec.executions": []}, of_type("spec.executions", 'object: "array"')),
    # the document itself
    ({"spec": DELETE}, required("spec")),
    ({"spec": []}, of_type("spec", 'object: "array"')),
    ({"metadata.name": "java-21.temurin"}, OK),
    ({"metadata.name": "Python"}, Refused("metadata.name", NAME_RULE)),
    ({"metadata.name": "a_b"}, Refused("metadata.name", NAME_RULE)),
]


def _case_id(case: tuple[dict[str, Any], Expected]) -> str:
    changes, expected = case
    shown = ",".join(f"{k.removeprefix('spec.')}={v!r}"[:60] for k, v in changes.items())
    return f"{'ok' if expected is OK else 'bad'}:{shown or 'base'}"


def assert_agreement(pools: Pools, document: dict[str, Any]) -> Answer:
    """The server and the model agree on a canonical document and, when both accept it, on
    the pool it means (what the operator is served parses to the document's pool)."""
    answer = pools.create(document)
    model_ok = model_accepts(document)
    assert answer.accepted == model_ok, (
        f"the server {'accepts' if answer.accepted else 'refuses'} ({answer.causes}), the "
        f"model {'accepts' if model_ok else 'refuses'}: {json.dumps(document)}"
    )
    if answer.accepted:
        assert RunnerPool.parse_document(answer.body) == RunnerPool.parse_document(document)
    return answer


@pytest.mark.parametrize("case", CASES, ids=[_case_id(case) for case in CASES])
def test_the_server_and_the_model_agree_on_every_field(
    pools: Pools, case: tuple[dict[str, Any], Expected]
) -> None:
    changes, expected = case
    answer = assert_agreement(pools, document_with(changes))
    if expected is OK:
        assert answer.code == 201, answer.body
    else:
        assert_refused(answer, expected)


def _rule_messages(node: Any) -> Iterator[str]:
    if isinstance(node, Mapping):
        for validation in node.get("x-kubernetes-validations") or ():
            yield " ".join(validation["message"].split())
        for value in node.values():
            yield from _rule_messages(value)
    elif isinstance(node, list):
        for item in node:
            yield from _rule_messages(item)


def test_every_rule_of_the_crd_is_seen_refusing() -> None:
    """Each CEL rule's message is one a case above (or a transition below) expects."""
    expected = {
        refusal.message
        for refusal in [*(e for _, e in CASES), *(e for _, _, e in TRANSITIONS)]
        if refusal is not None
    }
    unseen = {
        message
        for message in _rule_messages(SCHEMA)
        if not {f"Invalid value: {message}", f"Forbidden: {message}"} & expected
    }
    assert unseen == set()


def test_every_spec_field_of_the_model_is_in_the_table_and_the_schema() -> None:
    spec_schema = SCHEMA["properties"]["spec"]
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


@pytest.mark.parametrize(
    ("namespace", "valid"),
    [("team-a", True), ("a" * 63, True), ("team.a", False), ("Team", False), ("a" * 64, False)],
)
def test_a_pools_namespace_is_what_the_server_takes_as_a_namespace_name(
    kube: KubeCluster, namespace: str, valid: bool
) -> None:
    """A RunnerPool lives in an existing Namespace: the model's namespace rule is the
    server's rule for a Namespace's name."""
    status, answer = kube.request(
        "POST", "/api/v1/namespaces?dryRun=All",
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
    )  # fmt: skip
    assert (status == 201) is valid, answer
    if not valid:
        assert status == 422 and "metadata.name: Invalid value" in answer["message"], answer
    assert model_accepts(document_with({"metadata.namespace": namespace})) is valid


# --- defaults and the examples ------------------------------------------------------------


def test_the_servers_defaults_are_the_models(pools: Pools) -> None:
    answer = pools.create(pool_doc(namespace=NAMESPACE))
    assert answer.code == 201, answer.body
    from_model = RunnerPool.parse_document(pool_doc()).spec.model_dump(
        by_alias=True, mode="json", exclude_none=True
    )
    assert answer.body["spec"] == from_model


def documented_pools() -> list[tuple[str, dict[str, Any]]]:
    """(where, document) of every RunnerPool in examples/pools.yaml and in a ```yaml block of
    the README and docs/."""
    found = [
        (f"examples/pools.yaml#{i}", document)
        for i, document in enumerate(yaml.safe_load_all(EXAMPLES.read_text(encoding="utf-8")))
    ]
    for path in DOCUMENTED:
        blocks = re.findall(r"^```yaml\n(.*?)^```", path.read_text(encoding="utf-8"), re.M | re.S)
        for index, block in enumerate(blocks):
            for document in yaml.safe_load_all(block):
                if isinstance(document, dict) and document.get("kind") == "RunnerPool":
                    found.append((f"{path.relative_to(ROOT)}#{index}", document))
    return found


def test_the_documented_pools_are_found() -> None:
    where = {place.split("#")[0] for place, _ in documented_pools()}
    assert where == {"examples/pools.yaml", "docs/reference.md", "docs/poseidon.md"}


@pytest.mark.parametrize(
    "example", documented_pools(), ids=[place for place, _ in documented_pools()]
)
def test_the_documented_pools_are_accepted_as_they_are_written(
    pools: Pools, example: tuple[str, dict[str, Any]]
) -> None:
    _, document = example
    document = copy.deepcopy(document)
    document["metadata"]["namespace"] = NAMESPACE
    answer = assert_agreement(pools, document)
    assert answer.code == 201, answer.body


# --- where Kubernetes and pool files differ on purpose ----------------------------------


@pytest.mark.parametrize(
    ("changes", "unknown"),
    [
        ({"spec.replicas": 3}, ['"spec.replicas"']),
        ({"spec.runner.gpu": 1}, ['"spec.runner.gpu"']),
        ({"spec.claims.timeout": 5}, ['"spec.claims.timeout"']),
        ({"spec.nomad.region": "eu"}, ['"spec.nomad.region"']),
        ({"metadata.owner": "me", "spec.extra": {"a": 1}}, ['"metadata.owner"', '"spec.extra"']),
    ],
)
def test_unknown_fields_are_pruned_or_refused_by_the_server_and_refused_by_files(
    pools: Pools, changes: dict[str, Any], unknown: list[str]
) -> None:
    """Pruned for a client that does not ask (the server only warns); refused, as by the
    pool file loader, for one that asks for strict field validation, as kubectl does."""
    document = document_with(changes)
    assert not model_accepts(document)
    answer = pools.create(document)
    assert answer.code == 201, answer.body
    served = answer.body
    assert model_accepts(served)
    assert "replicas" not in served["spec"] and "gpu" not in served["spec"]["runner"]
    assert "extra" not in served["spec"] and "owner" not in served["metadata"]
    assert RunnerPool.parse_document(served) == RunnerPool.parse_document(document_with({}))
    strict = pools.create(document, query="dryRun=All&fieldValidation=Strict")
    assert strict.code == 400, strict.body
    for field in unknown:
        assert f"unknown field {field}" in strict.body["message"], strict.body


def test_status_is_dropped_from_a_create(pools: Pools) -> None:
    """The status subresource: a create (or update) of the resource ignores its status."""
    answer = pools.create(document_with({"status": {"idleRunners": "many", "bogus": 1}}))
    assert answer.code == 201, answer.body
    assert "status" not in answer.body


def test_unknown_keys_inside_job_template_are_kept(pools: Pools) -> None:
    template = {"Meta": {"a": "b"}, "TaskGroups": [{"Tasks": [{"Config": {"x": [1, {}]}}]}]}
    answer = pools.create(document_with({TEMPLATE: template}))
    assert answer.code == 201, answer.body
    assert answer.body["spec"]["nomad"]["jobTemplate"] == template


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
    pools: Pools, template: dict[str, Any]
) -> None:
    document = document_with({TEMPLATE: template})
    answer = pools.create(document)
    assert answer.code == 201, answer.body
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
    pools: Pools, window: dict[str, Any]
) -> None:
    document = document_with({"spec.schedule": [window]})
    answer = pools.create(document)
    assert answer.code == 201, answer.body
    assert not model_accepts(document)


@pytest.mark.parametrize(
    ("field", "expect_file_accepts"),
    [
        (MAX, False),
        ("spec.claims", False),
        (COMMAND, False),
        (ENV, False),
        ("spec.nomad", False),
        (MEMORY_MAX, True),
        (POOL, True),
        (PREFIX, True),
        ("spec.demand", True),
        ("spec.schedule", False),
        ("spec.executions", False),
        (WORKDIR, True),
        (WRAPPER, False),
    ],
)
def test_null_means_absent_to_the_server(
    pools: Pools, field: str, expect_file_accepts: bool
) -> None:
    document = document_with({field: None})
    answer = pools.create(document)
    assert answer.code == 201, answer.body
    assert RunnerPool.parse_document(answer.body) == RunnerPool.parse_document(
        document_with({field: DELETE})
    )
    # Files take null only where the contract shows it (optional fields).
    assert model_accepts(document) is expect_file_accepts


@pytest.mark.parametrize("field", [IDLE, "spec.runner", IMAGE])
def test_null_in_a_required_field_is_refused_by_both(pools: Pools, field: str) -> None:
    document = document_with({field: None})
    assert_refused(pools.create(document), required(field))
    assert not model_accepts(document)


def _float_rule(field: str, message: str) -> Refused:
    return Refused(field, f"invalid data, expected int, got float64 evaluating rule: {message}")


WHOLE_FLOATS: Final[list[tuple[dict[str, Any], Expected]]] = [
    ({CPU: 200.0}, OK),
    ({MEMORY: 256.0}, OK),  # the memoryMaxMB rule reads it only with memoryMaxMB set
    ({DRAIN: 900.0}, OK),
    ({CONCURRENT: 2.0}, OK),
    ({**BRIDGE, PORTS: [8080.0]}, OK),
    ({"spec.schedule": [{**WINDOW, "durationMinutes": 90.0}]}, OK),
    # The scale subresource reads spec.idleRunners as an int64 too.
    ({IDLE: 5.0}, Refused(".spec.idleRunners", "5 is of the type float64, expected int64")),
    ({MAX: 100.0}, _float_rule("spec", IDLE_ABOVE_MAX)),
    ({MEMORY_MAX: 512.0}, _float_rule("spec.runner", MEMORY_MAX_BELOW)),
    ({CLAIM_MAX: 1800.0}, _float_rule("spec.claims", CLAIMS_DEFAULT_ABOVE_MAX)),
    ({MAX_IDLE: 5.0}, _float_rule("spec", DEMAND_BOUNDS)),
    ({TIME_DEFAULT: 30.0}, _float_rule("spec.executions", EXECUTIONS_DEFAULT_ABOVE_MAX)),
]


@pytest.mark.parametrize("case", WHOLE_FLOATS, ids=[_case_id(case) for case in WHOLE_FLOATS])
def test_a_whole_float_passes_the_schema_but_not_a_rule_that_reads_it(
    pools: Pools, case: tuple[dict[str, Any], Expected]
) -> None:
    """JSON ``5.0`` is an integer to the OpenAPI schema, and the server stores it as ``5``,
    but CEL sees a double where a rule compares integers. Pool files refuse it (the model
    is strict); what the server stores is the integer, which the model takes."""
    changes, expected = case
    document = document_with(changes)
    assert not model_accepts(document)
    answer = pools.create(document)
    if expected is OK:
        assert answer.code == 201, answer.body
        integral = document_with(as_integers(changes))
        assert answer.body["spec"] == as_integers(answer.body["spec"])
        assert RunnerPool.parse_document(answer.body) == RunnerPool.parse_document(integral)
    else:
        assert_refused(answer, expected)


def test_a_whole_float_inside_job_template_is_written_back_as_an_integer(pools: Pools) -> None:
    answer = pools.create(document_with({TEMPLATE: {"Priority": 60.0}}))
    assert answer.code == 201, answer.body
    priority = answer.body["spec"]["nomad"]["jobTemplate"]["Priority"]
    assert priority == 60 and isinstance(priority, int)


def test_kubectl_sends_a_whole_float_of_yaml_as_an_integer(pools: Pools) -> None:
    """Why the above reaches only API clients writing JSON themselves: kubectl converts
    YAML's ``5.0`` to JSON ``5``."""
    manifest = yaml.safe_dump(document_with({IDLE: 5.0, MAX: 10.0, CLAIM_MAX: 1800.0}))
    assert "idleRunners: 5.0" in manifest
    result = pools.kube.kubectl("apply", "--dry-run=server", "-f", "-", input=manifest)
    assert "runnerpool.poolkeeper.dev/python-312 created (server dry run)" in result.stdout


# --- status -------------------------------------------------------------------------------


def test_status_takes_what_the_controller_writes(pools: Pools) -> None:
    stored = pools.store(pool_doc("status-writes", namespace=NAMESPACE))
    stored["status"] = {
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
        "reconciledBy": "poolkeeper-0",
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
    answer = pools.update(stored, sub="status")
    assert answer.code == 200, answer.body
    assert answer.body["status"] == stored["status"]
    assert answer.body["spec"] == stored["spec"]

    condition = stored["status"]["conditions"][0]
    condition["status"] = "Yes"
    assert_refused(
        pools.update(stored, sub="status"),
        unsupported("status.conditions[0].status", "Yes", '"True", "False", "Unknown"'),
    )
    condition["status"] = "False"
    stored["status"]["conditions"].append(dict(condition))  # one condition per type
    assert_refused(
        pools.update(stored, sub="status"),
        Refused("status.conditions[1]", 'Duplicate value: {"type":"Ready"}'),
    )
    # The resource itself ignores status: an update of it writes the spec only.
    assert pools.update(stored).code == 200


def test_the_status_schema_is_the_controllers() -> None:
    status = SCHEMA["properties"]["status"]["properties"]
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


# --- transition rules: immutable fields ---------------------------------------------------

# (old, new, expected) of an update.
TRANSITIONS: Final[list[tuple[dict[str, Any], dict[str, Any], Expected]]] = [
    ({}, {IDLE: 9}, OK),
    ({NOMAD_NS: "a"}, {NOMAD_NS: "a"}, OK),
    ({NOMAD_NS: "a"}, {NOMAD_NS: "b"}, Refused(NOMAD_NS, f"Forbidden: {NAMESPACE_IMMUTABLE}")),
    ({}, {NOMAD_NS: "other"}, Refused(NOMAD_NS, f"Forbidden: {NAMESPACE_IMMUTABLE}")),
    ({NOMAD_NS: "default"}, {}, OK),  # the default is the same value
    ({PREFIX: "py-"}, {PREFIX: "py-"}, OK),
    ({PREFIX: "py-"}, {PREFIX: "px-"}, Refused(PREFIX, f"Forbidden: {PREFIX_IMMUTABLE}")),
    ({PREFIX: "py-"}, {}, Refused(PREFIX, f"Forbidden: {PREFIX_IMMUTABLE}")),
    ({}, {PREFIX: "py-"}, Refused(PREFIX, f"Forbidden: {PREFIX_IMMUTABLE}")),
    ({}, {PREFIX: None}, OK),  # null is absent
]


@pytest.mark.parametrize(("index", "transition"), list(enumerate(TRANSITIONS)))
def test_immutable_fields(
    pools: Pools, index: int, transition: tuple[dict[str, Any], dict[str, Any], Expected]
) -> None:
    old, new, expected = transition
    name = f"transition-{index}"
    stored = pools.store(document_with({**old, "metadata.name": name}))
    new_doc = document_with({**new, "metadata.name": name})
    answer = pools.update(new_doc)
    if expected is OK:
        assert answer.code == 200, answer.body
    else:
        assert_refused(answer, expected)
    assert pools.create(document_with(new)).code == 201  # a create of it is fine
    changed = immutable_changes(
        RunnerPool.parse_document(stored), RunnerPool.parse_document(new_doc)
    )
    assert (not changed) is (expected is OK)


def test_explicit_prefix_equal_to_the_derived_one_is_still_a_change_to_the_crd(
    pools: Pools,
) -> None:
    """CEL cannot see the derived prefix, so the CRD is stricter than the file reload:
    setting ``jobPrefix`` to exactly the derived value is refused in Kubernetes."""
    stored = pools.store(pool_doc("derived", namespace=NAMESPACE))
    new_doc = with_fields(pool_doc("derived", namespace=NAMESPACE), {PREFIX: "derived-"})
    assert_refused(pools.update(new_doc), Refused(PREFIX, f"Forbidden: {PREFIX_IMMUTABLE}"))
    assert (
        immutable_changes(RunnerPool.parse_document(stored), RunnerPool.parse_document(new_doc))
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
    IDLE: st.one_of(INTS, WRONG),
    MAX: st.one_of(INTS, WRONG),
    STARTUP: st.one_of(INTS, WRONG),
    DRAIN: st.one_of(INTS, WRONG),
    CLAIM_DEFAULT: st.one_of(INTS, WRONG),
    CLAIM_MAX: st.one_of(INTS, WRONG),
    IMAGE: st.one_of(_text(4), WRONG),
    COMMAND: st.one_of(st.lists(st.one_of(_text(3), st.integers(0, 1)), max_size=3), WRONG),
    CPU: st.one_of(INTS, WRONG),
    MEMORY: st.one_of(INTS, WRONG),
    MEMORY_MAX: st.one_of(INTS, WRONG),
    "spec.runner.network": st.one_of(st.sampled_from(["none", "bridge", "host", ""]), WRONG),
    PORTS: st.one_of(st.lists(st.one_of(st.integers(-1, 65537), st.just("80")), max_size=4), WRONG),
    ENV: st.one_of(
        st.dictionaries(ENV_KEYS, st.one_of(_text(3), st.integers(0, 1)), max_size=3), WRONG
    ),
    NOMAD_NS: st.one_of(NOMAD_NAMES, WRONG),
    DCS: st.one_of(st.lists(st.one_of(_text(3), st.integers(0, 1)), max_size=3), WRONG),
    POOL: st.one_of(NOMAD_NAMES, WRONG),
    PREFIX: st.one_of(PREFIXES, WRONG),
    "spec.deletionPolicy": st.one_of(
        st.sampled_from(["Drain", "Delete", "Orphan", "drain", "Keep"]), WRONG
    ),
    MAX_IDLE: st.one_of(INTS, WRONG),
    WINDOW_S: st.one_of(INTS, st.sampled_from([600, 601]), WRONG),
    COVER: st.one_of(INTS, WRONG),
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


# A few hundred documents a run: each is a request (about 15 ms on a quiet machine).
GENERATED: Final = settings(
    max_examples=400,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


@pytest.mark.slow
@GENERATED
@given(changes=field_changes())
def test_generated_documents_agree(pools: Pools, changes: dict[str, Any]) -> None:
    assert_agreement(pools, document_with(changes))


@pytest.mark.slow
@settings(GENERATED, max_examples=150)
@given(
    changes=field_changes(),
    unknown=st.dictionaries(st.sampled_from(["spec.bogus", "spec.runner.extra", "spec.x"]), INTS),
    null_field=st.sampled_from([MAX, "spec.nomad", PORTS, "spec.claims", COVER, WORKDIR]),
)
def test_generated_documents_with_unknown_fields_and_nulls_agree(
    pools: Pools, changes: dict[str, Any], unknown: dict[str, Any], null_field: str
) -> None:
    """With unknown fields and nulls mixed in, the server decides as the model does on the
    document without them, and serves the same pool."""
    plain = document_with({**changes, null_field: DELETE})
    answer = pools.create(with_fields(copy.deepcopy(plain), {**unknown, null_field: None}))
    assert answer.accepted is model_accepts(plain), answer.causes
    if answer.accepted:
        assert RunnerPool.parse_document(answer.body) == RunnerPool.parse_document(plain)


NOMAD_IDENTITY: Final = st.fixed_dictionaries(
    {},
    optional={
        "namespace": st.sampled_from(["default", "team-a", "team-b"]),
        "jobPrefix": st.sampled_from(["python-312-", "py-", "px-"]),
    },
)


@pytest.fixture(scope="module")
def stored_nomad(pools: Pools) -> Callable[[dict[str, str]], str]:
    """The name of a stored pool (one idle runner) with this ``spec.nomad``, made once."""
    names: dict[str, str] = {}

    def stored(nomad: dict[str, str]) -> str:
        key = json.dumps(nomad, sort_keys=True)
        if key not in names:
            names[key] = f"nomad-{len(names)}"
            pools.store(document_with({"spec.nomad": nomad, "metadata.name": names[key]}))
        return names[key]

    return stored


@pytest.mark.slow
@settings(GENERATED, max_examples=150)
@given(old_nomad=NOMAD_IDENTITY, new_nomad=NOMAD_IDENTITY, idle=st.integers(0, 5))
def test_generated_updates_agree_on_immutability(
    pools: Pools,
    stored_nomad: Callable[[dict[str, str]], str],
    old_nomad: dict[str, str],
    new_nomad: dict[str, str],
    idle: int,
) -> None:
    """An update is refused by the CEL transition rules exactly when the file reload would
    refuse it, except for writing out the derived prefix explicitly (stricter in the CRD)."""
    name = stored_nomad(old_nomad)
    old_doc = document_with({"spec.nomad": old_nomad, "metadata.name": name})
    new_doc = document_with({"spec.nomad": new_nomad, IDLE: idle, "metadata.name": name})
    changed = immutable_changes(
        RunnerPool.parse_document(old_doc), RunnerPool.parse_document(new_doc)
    )
    answer = pools.update(new_doc)
    explicit_change = old_nomad.get("jobPrefix") != new_nomad.get("jobPrefix")
    assert answer.accepted is (not changed and not explicit_change), answer.causes


# --- the rest of the resource definition -------------------------------------------------


def test_resource_definition() -> None:
    assert CRD["apiVersion"] == "apiextensions.k8s.io/v1"
    spec = CRD["spec"]
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


def test_null_means_absent_everywhere_in_the_schema() -> None:
    """No property is ``nullable``: a ``null`` is pruned and the field takes its default
    (the server would store a null of a nullable property, which no model field takes)."""

    def nullable(node: Mapping[str, Any], path: str) -> Iterator[str]:
        if node.get("nullable"):
            yield path
        for key, prop in node.get("properties", {}).items():
            yield from nullable(prop, f"{path}.{key}")
        for key in ("items", "additionalProperties"):
            if isinstance(node.get(key), Mapping):
                yield from nullable(node[key], f"{path}[{key}]")

    assert list(nullable(SCHEMA, "")) == []
