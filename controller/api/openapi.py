"""The OpenAPI 3 document of the HTTP API (served at /openapi.json)."""

from __future__ import annotations

from typing import Any

from controller import __version__
from controller.claims.service import MAX_WAIT_SECONDS, REQUEST_ID_PATTERN
from controller.core.runner_ids import RUNNER_ID_PATTERN


def _error(description: str) -> dict[str, Any]:
    return {
        "description": description,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
    }


def _json(description: str, schema: str) -> dict[str, Any]:
    return {
        "description": description,
        "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{schema}"}}},
    }


_POOL_PARAMS = [
    {"name": "namespace", "in": "path", "required": True, "schema": {"type": "string"}},
    {"name": "name", "in": "path", "required": True, "schema": {"type": "string"}},
]
_RUNNER_PARAM = [
    {
        "name": "runnerId",
        "in": "path",
        "required": True,
        "schema": {"type": "string", "pattern": RUNNER_ID_PATTERN.pattern},
    }
]
_COMMON_ERRORS = {
    "401": _error("missing or wrong bearer token"),
    "503": _error("Nomad is unavailable"),
}


def document() -> dict[str, Any]:
    return {
        "openapi": "3.0.3",
        "info": {"title": "poolkeeper", "version": __version__},
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {
                "Error": {
                    "type": "object",
                    "required": ["error"],
                    "properties": {
                        "error": {
                            "type": "object",
                            "required": ["code", "message"],
                            "properties": {
                                "code": {"type": "string"},
                                "message": {"type": "string"},
                                "reason": {"type": "string"},
                            },
                        }
                    },
                },
                "ClaimRequest": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "inactivityTimeoutSeconds": {"type": "integer", "minimum": 1},
                        "requestId": {"type": "string", "pattern": REQUEST_ID_PATTERN.pattern},
                        "waitSeconds": {
                            "type": "number",
                            "minimum": 0,
                            "maximum": MAX_WAIT_SECONDS,
                        },
                    },
                },
                "Claim": {
                    "type": "object",
                    "required": [
                        "runnerId",
                        "pool",
                        "allocationId",
                        "nodeName",
                        "claimedAt",
                        "expiresAt",
                        "inactivityTimeoutSeconds",
                        "requestId",
                        "ports",
                    ],
                    "properties": {
                        "runnerId": {"type": "string"},
                        "pool": {"type": "string"},
                        "allocationId": {"type": "string"},
                        "nodeName": {"type": "string"},
                        "claimedAt": {"type": "string", "format": "date-time"},
                        "expiresAt": {"type": "string", "format": "date-time"},
                        "inactivityTimeoutSeconds": {"type": "integer"},
                        "requestId": {"type": "string", "nullable": True},
                        "ports": {
                            "type": "object",
                            "additionalProperties": {"type": "integer"},
                        },
                    },
                },
                "ClaimList": {
                    "type": "object",
                    "required": ["claims"],
                    "properties": {
                        "claims": {"type": "array", "items": {"$ref": "#/components/schemas/Claim"}}
                    },
                },
                "PoolList": {
                    "type": "object",
                    "required": ["pools"],
                    "properties": {
                        "pools": {
                            "type": "array",
                            "items": {
                                "type": "object",
                                "required": ["namespace", "name", "spec", "status"],
                                "properties": {
                                    "namespace": {"type": "string"},
                                    "name": {"type": "string"},
                                    "spec": {"type": "object"},
                                    "status": {"type": "object"},
                                },
                            },
                        }
                    },
                },
            },
        },
        "security": [{"bearer": []}],
        "paths": {
            "/v1/pools": {
                "get": {
                    "operationId": "listPools",
                    "responses": {"200": _json("every pool", "PoolList"), **_COMMON_ERRORS},
                }
            },
            "/v1/pools/{namespace}/{name}/claims": {
                "parameters": _POOL_PARAMS,
                "post": {
                    "operationId": "claimRunner",
                    "requestBody": {
                        "required": False,
                        "content": {
                            "application/json": {
                                "schema": {"$ref": "#/components/schemas/ClaimRequest"}
                            }
                        },
                    },
                    "responses": {
                        "201": _json("a runner was claimed", "Claim"),
                        "200": _json(
                            "the claim of an earlier request with this requestId", "Claim"
                        ),
                        "400": _error("invalid request"),
                        "404": _error("unknown pool"),
                        "409": _error("requestId used for another pool"),
                        "408": _error("the body did not arrive in time"),
                        "410": _error("the runner of this requestId is gone"),
                        "413": _error("body too large"),
                        **_COMMON_ERRORS,
                    },
                },
                "get": {
                    "operationId": "listClaims",
                    "responses": {
                        "200": _json("the pool's live claims", "ClaimList"),
                        "404": _error("unknown pool"),
                        **_COMMON_ERRORS,
                    },
                },
            },
            "/v1/runners/{runnerId}": {
                "parameters": _RUNNER_PARAM,
                "get": {
                    "operationId": "getRunner",
                    "responses": {
                        "200": _json("the runner's live claim", "Claim"),
                        "404": _error("not a claimed runner"),
                        "410": _error("the runner is gone; reason says why"),
                        **_COMMON_ERRORS,
                    },
                },
                "delete": {
                    "operationId": "releaseRunner",
                    "responses": {
                        "204": {"description": "released; the runner is destroyed"},
                        "404": _error("not a claimed runner"),
                        "410": _error("the runner is gone already; reason says why"),
                        **_COMMON_ERRORS,
                    },
                },
            },
            "/v1/runners/{runnerId}/keepalive": {
                "parameters": _RUNNER_PARAM,
                "post": {
                    "operationId": "keepaliveRunner",
                    "responses": {
                        "200": _json("the deadline moved", "Claim"),
                        "404": _error("not a claimed runner"),
                        "410": _error("the runner is gone; reason says why"),
                        **_COMMON_ERRORS,
                    },
                },
            },
            "/healthz": {"get": {"security": [], "responses": {"200": {"description": "alive"}}}},
            "/readyz": {
                "get": {
                    "security": [],
                    "responses": {
                        "200": {"description": "ready"},
                        "503": {"description": "not ready; lists the unready pools"},
                    },
                }
            },
            "/metrics": {
                "get": {"security": [], "responses": {"200": {"description": "Prometheus"}}}
            },
        },
    }
