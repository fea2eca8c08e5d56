"""The Poseidon API's part of the OpenAPI document (its paths under /api/v1, its schemas
and its token), generated from the route table (app.py) and the request structs
(wire.py), with what the facade refuses besides Go's types: the document's requests are
the ones it takes."""

from __future__ import annotations

from typing import Any, Final

from controller.core.gojson import GO_BOOLS, GoSlice, GoStruct, json_schema
from controller.executions.commands import BELOW_PATTERN, ENV_NAME_PATTERN
from controller.executions.streaming import UPGRADE_HEADERS
from controller.model import INT32_MAX
from controller.poseidon.app import ROUTES, TOKEN_HEADER, PoseidonRoute
from controller.poseidon.context import PREFIX
from controller.poseidon.executions import FORBIDDEN_CHARACTER
from controller.poseidon.wire import ErrorCode

_REF = "#/components/schemas/{name}"
SECURITY: Final = "poseidonToken"
_INT64_MAX = (1 << 63) - 1

# What the facade refuses of values Go's types take (400), by struct and field.
_REFUSED: Final[dict[str, dict[str, Any]]] = {
    # What a pool needs of an environment (model.py's runner): managed, less is 400;
    # read-only, it does not match a pool (409).
    "dto.ExecutionEnvironmentRequest": {
        "image": {"type": "string", "minLength": 1},
        "cpuLimit": {"type": "integer", "minimum": 1, "maximum": INT32_MAX},
        "memoryLimit": {"type": "integer", "minimum": 10, "maximum": INT32_MAX},
        "exposedPorts": {"items": {"type": "integer", "minimum": 1, "maximum": 65535}},
    },
    "dto.RunnerRequest": {"inactivityTimeout": {"minimum": 0}},
    "dto.ExecutionRequest": {
        "command": {"pattern": f"^[^{FORBIDDEN_CHARACTER}]*$"},
        "timeLimit": {"minimum": 0},
        "environment": {
            "patternProperties": {ENV_NAME_PATTERN: {"type": ["string", "null"]}},
            "additionalProperties": False,
        },
    },
    # Paths the facade refuses empty (as null makes them).
    "dto.UpdateFileSystemRequest": {
        "delete": {"items": {"type": "string", "pattern": BELOW_PATTERN}}
    },
    "dto.File": {"path": {"type": "string", "pattern": BELOW_PATTERN}},
}

_STRING = {"type": "string"}
_UINT = {"type": "integer", "minimum": 0}
_ERROR_CODES = [code.value for code in ErrorCode]
SCHEMAS: Final[dict[str, Any]] = {
    "PoseidonError": {
        "type": "object",
        "properties": {"message": _STRING, "errorCode": {"enum": _ERROR_CODES}},
        "required": ["message"],
        "additionalProperties": False,
    },
    "PoseidonVersion": _STRING,
    "PoseidonStatistics": {
        "type": "object",
        "description": "keyed by the environment's ID",
        "additionalProperties": {
            "type": "object",
            "properties": {
                "id": {"type": "integer"},
                "prewarmingPoolSize": _UINT,
                "idleRunners": _UINT,
                "usedRunners": _UINT,
            },
            "required": ["id", "prewarmingPoolSize", "idleRunners", "usedRunners"],
            "additionalProperties": False,
        },
    },
    "PoseidonEnvironment": {
        "type": "object",
        "properties": {
            "prewarmingPoolSize": _UINT,
            "cpuLimit": _UINT,
            "memoryLimit": _UINT,
            "image": _STRING,
            "networkAccess": {"type": "boolean"},
            "exposedPorts": {
                "type": ["array", "null"],
                "items": {"type": "integer", "minimum": 0, "maximum": 65535},
            },
            "id": {"type": "integer"},
        },
        "required": [
            "prewarmingPoolSize", "cpuLimit", "memoryLimit", "image", "networkAccess",
            "exposedPorts", "id",
        ],
        "additionalProperties": False,
    },
    "PoseidonEnvironments": {
        "type": "object",
        "properties": {
            "executionEnvironments": {
                "type": "array",
                "items": {"$ref": _REF.format(name="PoseidonEnvironment")},
            }
        },
        "required": ["executionEnvironments"],
        "additionalProperties": False,
    },
    "PoseidonRunner": {
        "type": "object",
        "properties": {
            "runnerId": _STRING,
            "mappedPorts": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"exposedPort": _UINT, "hostAddress": _STRING},
                },
            },
        },
        "required": ["runnerId", "mappedPorts"],
        "additionalProperties": False,
    },
    "PoseidonFiles": {
        "type": "object",
        "properties": {
            "files": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "name": _STRING,
                        "entryType": _STRING,
                        "linkTarget": _STRING,
                        "size": {"type": "integer"},
                        "modificationTime": {"type": "integer"},
                        "permissions": _STRING,
                        "owner": _STRING,
                        "group": _STRING,
                    },
                    "required": [
                        "name", "entryType", "size", "modificationTime", "permissions",
                        "owner", "group",
                    ],
                    "additionalProperties": False,
                },
            }
        },
        "required": ["files"],
        "additionalProperties": False,
    },
    "PoseidonExecution": {
        "type": "object",
        "properties": {"websocketUrl": _STRING},
        "required": ["websocketUrl"],
        "additionalProperties": False,
    },
}  # fmt: skip
# The body of each route's 200 (its JSON schema's name; None: the file's bytes).
_SUCCESS: Final[dict[str, str | None]] = {
    "poseidonVersion": "PoseidonVersion",
    "poseidonStatistics": "PoseidonStatistics",
    "poseidonListEnvironments": "PoseidonEnvironments",
    "poseidonGetEnvironment": "PoseidonEnvironment",
    "poseidonClaimRunner": "PoseidonRunner",
    "poseidonListFiles": "PoseidonFiles",
    "poseidonDownloadFile": None,
    "poseidonExecute": "PoseidonExecution",
}
_QUERY: Final[dict[str, tuple[str, dict[str, Any]]]] = {
    "fetch": ("read the managed environments from Nomad first", {"enum": ["", *sorted(GO_BOOLS)]}),
    "path": ("relative: under the working directory", _STRING),
    "recursive": ("a Go boolean; anything else is true", _STRING),
    "executionID": ("what POST .../execute answered", _STRING),
}
_PATH_PARAMETERS: Final[dict[str, dict[str, Any]]] = {
    "id": {"type": "integer", "minimum": 0, "maximum": _INT64_MAX},
    "runnerId": {"type": "string", "minLength": 1},
}


def request_schema(struct: GoStruct) -> dict[str, Any]:
    """A request body: what Go decodes into `struct` (null, anywhere, as Go's zero
    value), less what the facade refuses."""
    schema = json_schema(struct)
    _narrow(schema, struct)
    return schema


# Fields without which the facade refuses a struct (Go would decode them as "").
_REQUIRED: Final[dict[str, list[str]]] = {
    "dto.File": ["path"],
    "dto.ExecutionEnvironmentRequest": ["image", "cpuLimit", "memoryLimit"],
}


def _narrow(schema: dict[str, Any], struct: GoStruct) -> None:
    if struct.name in _REQUIRED:  # its zero value is refused: null is too
        schema["type"] = "object"
        schema["required"] = _REQUIRED[struct.name]
    for name, kind in struct.fields.items():
        field = schema["properties"][name]
        field.update(_REFUSED.get(struct.name, {}).get(name, {}))
        if isinstance(kind, GoSlice) and isinstance(kind.item, GoStruct):
            _narrow(field["items"], kind.item)


def _json(name: str) -> dict[str, Any]:
    return {"application/json": {"schema": {"$ref": _REF.format(name=name)}}}


def _answer(route: PoseidonRoute, status: int, description: str) -> dict[str, Any]:
    answer: dict[str, Any] = {"description": description}
    if status == 200:
        body = _SUCCESS[route.operation]
        answer["content"] = (
            _json(body)
            if body is not None
            else {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}
        )
    elif status >= 400 and status not in route.empty and status != 401:
        answer["content"] = _json("PoseidonError")
    return answer


def _operation(route: PoseidonRoute) -> dict[str, Any]:
    answers = dict(route.answers)
    if route.needs_token:
        answers[401] = "no or a wrong Poseidon-Token (empty body)"
    operation: dict[str, Any] = {
        "operationId": route.operation,
        "summary": route.summary,
        "tags": ["poseidon"],
        "security": [{SECURITY: []}] if route.needs_token else [],
        "responses": {
            str(status): _answer(route, status, description)
            for status, description in sorted(answers.items())
        },
    }
    parameters = [
        {"name": name, "in": "path", "required": True, "schema": schema}
        for name, schema in _PATH_PARAMETERS.items()
        if "{" + name in route.path
    ]
    if 101 in route.answers:
        parameters += UPGRADE_HEADERS
    for name in route.query:
        description, schema = _QUERY[name]
        parameters.append(
            {"name": name, "in": "query", "description": description, "schema": schema}
        )
    if parameters:
        operation["parameters"] = parameters
    if route.body is not None:
        body = request_schema(route.body)
        operation["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": body}},
        }
    return operation


def _template(path: str) -> str:
    """aiohttp's `{id:[0-9]+}` as OpenAPI's `{id}`."""
    return PREFIX + path.replace(":[0-9]+}", "}")


def openapi_part() -> dict[str, Any]:
    """The paths, schemas and security scheme the Poseidon API adds to the document."""
    paths: dict[str, dict[str, Any]] = {}
    for route in ROUTES:
        paths.setdefault(_template(route.path), {})[route.method.lower()] = _operation(route)
    return {
        "paths": paths,
        "components": {
            "schemas": SCHEMAS,
            "securitySchemes": {SECURITY: {"type": "apiKey", "in": "header", "name": TOKEN_HEADER}},
        },
    }
