"""The HTTP API of `run` and `operator`: one listener for API, health and metrics."""

from __future__ import annotations

import hmac
import logging
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any

from aiohttp import web

from controller.api import claims_routes
from controller.api.common import ApiError
from controller.api.openapi import document
from controller.claims.service import ClaimError, ClaimService
from controller.core.views import PoolMode
from controller.engine.reconciler import Engine
from controller.metrics import Metrics

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 64 * 1024
ENGINE_KEY: web.AppKey[Engine] = web.AppKey("engine", Engine)
METRICS_KEY: web.AppKey[Metrics] = web.AppKey("metrics", Metrics)
TOKENS_KEY: web.AppKey[TokenSet] = web.AppKey("tokens")
READY_KEY: web.AppKey[Callable[[], list[str]]] = web.AppKey("ready")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
OPENAPI = document()


class TokenSet:
    """API bearer tokens; None means --insecure-no-auth."""

    def __init__(self, tokens: Iterable[str] | None) -> None:
        self._tokens: tuple[bytes, ...] | None = None
        self.replace(tokens)

    def replace(self, tokens: Iterable[str] | None) -> None:
        self._tokens = None if tokens is None else tuple(t.encode() for t in tokens if t)

    @property
    def enabled(self) -> bool:
        return self._tokens is not None

    def allows(self, presented: str) -> bool:
        if self._tokens is None:
            return True
        candidate = presented.encode()
        # Compare against every token so timing does not tell which one nearly matched.
        matched = False
        for token in self._tokens:
            matched |= hmac.compare_digest(candidate, token)
        return matched


def read_token_file(path: Path) -> list[str]:
    return [line.strip() for line in path.read_text().splitlines() if line.strip()]


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except ApiError as error:
        return error.response()
    except ClaimError as error:
        return claims_routes.api_error(error).response()
    except web.HTTPRequestEntityTooLarge:
        return ApiError(
            413, "PayloadTooLarge", f"request bodies are limited to {MAX_BODY_BYTES} bytes"
        ).response()
    except web.HTTPMethodNotAllowed as error:
        return ApiError(
            405,
            "MethodNotAllowed",
            f"{request.method} is not allowed on {request.path}",
            headers={"Allow": ",".join(sorted(error.allowed_methods))},
        ).response()
    except web.HTTPNotFound:
        return ApiError(404, "NotFound", f"no route {request.path}").response()
    except web.HTTPException as error:
        return ApiError(error.status, "InvalidRequest", error.reason).response()
    except Exception:
        log.exception("unhandled error on %s %s", request.method, request.path)
        return ApiError(500, "InternalError", "internal error").response()


@web.middleware
async def auth_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    if request.path.startswith("/v1/") or request.path == "/v1":
        tokens = request.app[TOKENS_KEY]
        if tokens.enabled:
            header = request.headers.get("Authorization", "")
            scheme, _, presented = header.partition(" ")
            if scheme.lower() != "bearer" or not tokens.allows(presented.strip()):
                raise ApiError(401, "Unauthorized", "a valid bearer token is required")
    return await handler(request)


async def healthz(_: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    unready = request.app[READY_KEY]()
    if unready:
        return web.json_response({"status": "unready", "pools": unready}, status=503)
    return web.json_response({"status": "ready"})


async def metrics(request: web.Request) -> web.Response:
    return web.Response(
        body=request.app[METRICS_KEY].exposition(),
        content_type="text/plain",
        charset="utf-8",
        headers={"Cache-Control": "no-store"},
    )


async def openapi(_: web.Request) -> web.Response:
    return web.json_response(OPENAPI)


def pool_summaries(engine: Engine) -> list[dict[str, Any]]:
    """The pools as `GET /v1/pools` shows them (also the demo's table)."""
    pools = []
    for managed in sorted(engine.pools.values(), key=lambda m: m.key):
        if managed.pool is None or managed.policy.mode is not PoolMode.ACTIVE:
            continue  # removed from the files; only its runners are still being destroyed
        namespace, name = managed.key.split("/", 1)
        pools.append(
            {
                "namespace": namespace,
                "name": name,
                "spec": {
                    "idleRunners": managed.policy.desired_idle,
                    "maxRunners": managed.policy.max_runners,
                },
                "status": managed.status.to_dict() if managed.status else {},
            }
        )
    return pools


async def list_pools(request: web.Request) -> web.Response:
    return web.json_response({"pools": pool_summaries(request.app[ENGINE_KEY])})


def create_app(
    engine: Engine,
    metrics_: Metrics,
    tokens: TokenSet,
    ready: Callable[[], list[str]],
    claims: ClaimService,
) -> web.Application:
    app = web.Application(
        middlewares=[error_middleware, auth_middleware], client_max_size=MAX_BODY_BYTES
    )
    app[ENGINE_KEY] = engine
    app[METRICS_KEY] = metrics_
    app[TOKENS_KEY] = tokens
    app[READY_KEY] = ready
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/openapi.json", openapi)
    app.router.add_get("/v1/pools", list_pools)
    claims_routes.add_routes(app, claims)
    return app
