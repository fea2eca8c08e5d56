"""One route of the HTTP API, as the route table (routes.py) declares it: the app serves
the table and the OpenAPI document (openapi.py) is generated from it. Also what every
runner route starts with: the runner, checked against the token's scope."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Handler
from pydantic import BaseModel

from controller.api.auth import scope
from controller.claims.runners import RunnerClaims
from controller.claims.service import ClaimService
from controller.directory.view import PoolDirectory

RUNNER_GONE = "the runner is gone; `reason` says why"
NOT_CLAIMED = "not a claimed runner (idle, foreign, unknown or malformed ID)"

CLAIMS_KEY: web.AppKey[ClaimService] = web.AppKey("claims", ClaimService)
RUNNERS_KEY: web.AppKey[RunnerClaims] = web.AppKey("runners", RunnerClaims)
DIRECTORY_KEY: web.AppKey[PoolDirectory] = web.AppKey("directory")


def runner_in_scope(request: web.Request) -> str:
    """The route's runner, whose pool the request's token must cover (403 otherwise)."""
    runner_id = request.match_info["runnerId"]
    scope(request).require(request.app[RUNNERS_KEY].pool_of_runner(runner_id).key)
    return runner_id


@dataclass(frozen=True)
class Query:
    """A query parameter: a string, one of `values` or of `pattern` when given."""

    description: str
    required: bool = False
    values: tuple[str, ...] = ()
    pattern: str | None = None

    def schema(self) -> dict[str, Any]:
        if self.values:
            return {"type": "string", "enum": list(self.values)}
        schema: dict[str, Any] = {"type": "string"}
        if self.pattern is not None:
            schema["pattern"] = self.pattern
        return schema


@dataclass(frozen=True)
class Route:
    method: str
    path: str
    operation: str
    summary: str
    handler: Handler
    body: type[BaseModel] | None = None
    # A content type the route takes instead of `body`'s JSON (its bytes as they are).
    raw_body: str | None = None
    query: dict[str, Query] = field(default_factory=dict)
    # status -> (description, body model or None)
    responses: dict[int, tuple[str, type[BaseModel] | None]] = field(default_factory=dict)
    # status -> description; their body is the error object
    errors: dict[int, str] = field(default_factory=dict)
    needs_token: bool = True
