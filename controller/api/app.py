"""The HTTP API of `run` and `operator`: one listener for API, health and metrics.

Errors are `{"error": {"code", "message"[, "reason"]}}` with the code's status; never a
stack trace, never a 500 for bad input.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Handler

from controller.api.access_log import access_log
from controller.api.auth import TokenSet, auth_middleware
from controller.api.execution_routes import EXECUTIONS_KEY, FILES_KEY
from controller.api.openapi import document
from controller.api.route import CLAIMS_KEY, DIRECTORY_KEY, RUNNERS_KEY
from controller.api.routes import METRICS_KEY, OPENAPI_KEY, READY_KEY, ROUTES
from controller.api.routing import add_routes
from controller.claims.runners import RunnerClaims
from controller.claims.service import ClaimService
from controller.core.readiness import Readiness
from controller.directory.view import PoolDirectory
from controller.errors import ErrorCode, ServiceError
from controller.executions.files import FileOperations
from controller.executions.manager import ExecutionManager
from controller.metrics import Metrics

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 64 * 1024


def error_response(
    code: ErrorCode,
    message: str,
    *,
    reason: str | None = None,
    headers: dict[str, str] | None = None,
) -> web.Response:
    body: dict[str, Any] = {"code": code.value, "message": message}
    if reason is not None:
        body["reason"] = reason
    if code.status == 503:
        headers = {"Retry-After": "1", **(headers or {})}
    return web.json_response({"error": body}, status=code.status, headers=headers)


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except ServiceError as error:
        return error_response(error.code, error.message, reason=error.reason)
    except web.HTTPRequestEntityTooLarge:
        return error_response(
            ErrorCode.PAYLOAD_TOO_LARGE, f"request bodies are limited to {MAX_BODY_BYTES} bytes"
        )
    except web.HTTPMethodNotAllowed as error:
        return error_response(
            ErrorCode.METHOD_NOT_ALLOWED,
            f"{request.method} is not allowed on {request.path}",
            headers={"Allow": ",".join(sorted(error.allowed_methods))},
        )
    except web.HTTPNotFound:
        return error_response(ErrorCode.NOT_FOUND, f"no route {request.path}")
    except web.HTTPException as error:
        return web.json_response(
            {"error": {"code": ErrorCode.INVALID_REQUEST.value, "message": error.reason}},
            status=error.status,
        )
    except Exception:
        log.exception("unhandled error on %s %s", request.method, request.path)
        return error_response(ErrorCode.INTERNAL_ERROR, "internal error")


def create_app(
    directory: PoolDirectory,
    metrics: Metrics,
    tokens: TokenSet,
    ready: Callable[[], Readiness],
    claims: ClaimService,
    runners: RunnerClaims,
    executions: ExecutionManager,
    files: FileOperations,
    *,
    log_requests: bool = False,
) -> web.Application:
    """With `log_requests`, one access-log line per request (api/access_log.py)."""
    open_paths = frozenset(r.path for r in ROUTES if not r.needs_token)
    middlewares = [error_middleware, auth_middleware(tokens, open_paths)]
    if log_requests:
        middlewares.insert(0, access_log)  # outermost: it logs the status answered
    app = web.Application(middlewares=middlewares, client_max_size=MAX_BODY_BYTES)
    app[DIRECTORY_KEY] = directory
    app[CLAIMS_KEY] = claims
    app[RUNNERS_KEY] = runners
    app[EXECUTIONS_KEY] = executions
    app[FILES_KEY] = files
    app[METRICS_KEY] = metrics
    app[READY_KEY] = ready
    app[OPENAPI_KEY] = document()
    add_routes(app, ROUTES)
    return app
