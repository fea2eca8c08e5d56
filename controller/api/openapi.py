"""The OpenAPI 3.1 document of the HTTP API (served at /openapi.json), generated from the
route table and the pydantic models; with --poseidon-api, the Poseidon API's part
(poseidon/openapi.py) is added to it (`extended`)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from controller import __version__
from controller.api.models import ErrorBody
from controller.api.route import Route
from controller.api.routes import ROUTES
from controller.core.runner_ids import RUNNER_ID_PATTERN
from controller.executions.streaming import UPGRADE_HEADERS

_REF = "#/components/schemas/{model}"
# Every route that needs a token can also answer these.
_TOKEN_ERRORS = {401: "missing or wrong bearer token", 503: "Nomad is unavailable"}


def _schemas() -> dict[str, Any]:
    models: set[type[BaseModel]] = {ErrorBody}
    for route in ROUTES:
        if route.body is not None:
            models.add(route.body)
        models.update(model for _, model in route.responses.values() if model is not None)
    _, schema = models_json_schema(
        [(model, "validation") for model in sorted(models, key=lambda m: m.__name__)],
        ref_template=_REF,
    )
    definitions: dict[str, Any] = schema.get("$defs", {})
    return definitions


def _content(model: type[BaseModel]) -> dict[str, Any]:
    return {"application/json": {"schema": {"$ref": _REF.format(model=model.__name__)}}}


def _parameters(path: str) -> list[dict[str, Any]]:
    parameters = []
    for name in ("namespace", "name", "runnerId", "executionId"):
        if "{" + name + "}" in path:
            schema: dict[str, Any] = {"type": "string"}
            if name == "runnerId":
                schema["pattern"] = RUNNER_ID_PATTERN.pattern
            parameters.append({"name": name, "in": "path", "required": True, "schema": schema})
    return parameters


def _operation(route: Route) -> dict[str, Any]:
    responses: dict[str, Any] = {}
    for status, (description, model) in sorted(route.responses.items()):
        responses[str(status)] = {"description": description}
        if model is not None:
            responses[str(status)]["content"] = _content(model)
    errors = dict(_TOKEN_ERRORS) if route.needs_token else {}
    errors.update(route.errors)
    for status, description in sorted(errors.items()):
        responses[str(status)] = {"description": description, "content": _content(ErrorBody)}
    operation: dict[str, Any] = {
        "operationId": route.operation,
        "summary": route.summary,
        "responses": responses,
    }
    if not route.needs_token:
        operation["security"] = []
    if route.body is not None:
        # An empty body is an empty object: required when that misses a field.
        required = any(field.is_required() for field in route.body.model_fields.values())
        operation["requestBody"] = {"required": required, "content": _content(route.body)}
        if route.raw_body is not None:
            raw = {"schema": {"type": "string", "format": "binary"}}
            operation["requestBody"]["content"][route.raw_body] = raw
    upgrade = UPGRADE_HEADERS if 101 in route.responses else []
    parameters = _parameters(route.path) + upgrade + [
        {"name": name, "in": "query", "required": query.required,
         "description": query.description, "schema": query.schema()}
        for name, query in route.query.items()
    ]  # fmt: skip
    if parameters:
        operation["parameters"] = parameters
    return operation


def document() -> dict[str, Any]:
    paths: dict[str, dict[str, Any]] = {}
    for route in ROUTES:
        paths.setdefault(route.path, {})[route.method.lower()] = _operation(route)
    return {
        "openapi": "3.1.0",
        "info": {"title": "poolkeeper", "version": __version__},
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": _schemas(),
        },
        "security": [{"bearer": []}],
        "paths": paths,
    }


def extended(document: dict[str, Any], part: dict[str, Any]) -> dict[str, Any]:
    """`document` with another API's paths, schemas and security schemes (names that
    are new: each API names its own)."""
    components = document["components"]
    return {
        **document,
        "paths": {**document["paths"], **part["paths"]},
        "components": {
            **components,
            "schemas": {**components["schemas"], **part["components"]["schemas"]},
            "securitySchemes": {
                **components["securitySchemes"],
                **part["components"]["securitySchemes"],
            },
        },
    }
