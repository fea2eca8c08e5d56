"""The routes of the HTTP API, declared once: the app serves this table and the OpenAPI
document (openapi.py) is generated from it, so the two cannot drift apart."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aiohttp import web

from controller.api.auth import EVERY_POOL, Scope, scope
from controller.api.bodies import read_body, read_json, validated
from controller.api.claim_view import claim_answer, claim_view
from controller.api.execution_routes import EXECUTION_ROUTES
from controller.api.models import (
    Claim,
    ClaimAnswer,
    ClaimBody,
    ClaimList,
    PoolList,
    PoolsClaimBody,
)
from controller.api.route import (
    CLAIMS_KEY,
    DIRECTORY_KEY,
    NOT_CLAIMED,
    RUNNER_GONE,
    RUNNERS_KEY,
    Route,
    runner_in_scope,
)
from controller.core.readiness import Readiness
from controller.directory.view import PoolDirectory
from controller.errors import ErrorCode, ServiceError
from controller.metrics import Metrics

METRICS_KEY: web.AppKey[Metrics] = web.AppKey("metrics", Metrics)
READY_KEY: web.AppKey[Callable[[], Readiness]] = web.AppKey("ready")
OPENAPI_KEY: web.AppKey[dict[str, Any]] = web.AppKey("openapi")

# ---- handlers ----------------------------------------------------------------------------


def pool_in_scope(request: web.Request) -> tuple[str, str]:
    """The route's pool, which the request's token must cover (403 otherwise)."""
    namespace, name = request.match_info["namespace"], request.match_info["name"]
    scope(request).require(f"{namespace}/{name}")
    return namespace, name


# The options of a claim that names none (most): there is nothing to validate.
NO_OPTIONS = ClaimBody.model_validate({})


async def claim(request: web.Request) -> web.Response:
    namespace, name = pool_in_scope(request)
    raw = await read_json(request)
    body = validated(ClaimBody, raw) if raw else NO_OPTIONS
    claimed = await request.app[CLAIMS_KEY].claim(namespace, name, body.to_request())
    answer = claim_answer(claimed, request.app[DIRECTORY_KEY], body.count is not None)
    return web.json_response(answer, status=201 if claimed.created else 200)


async def claim_from_pools(request: web.Request) -> web.Response:
    body = await read_body(request, PoolsClaimBody)
    for key in body.pools:
        scope(request).require(key)
    claimed = await request.app[CLAIMS_KEY].claim_from(body.pools, body.to_request())
    answer = claim_answer(claimed, request.app[DIRECTORY_KEY], body.count is not None)
    return web.json_response(answer, status=201 if claimed.created else 200)


async def list_claims(request: web.Request) -> web.Response:
    records = await request.app[RUNNERS_KEY].pool_claims(*pool_in_scope(request))
    directory = request.app[DIRECTORY_KEY]
    return web.json_response({"claims": [claim_view(r, directory) for r in records]})


async def get_runner(request: web.Request) -> web.Response:
    record = await request.app[RUNNERS_KEY].get(runner_in_scope(request))
    return web.json_response(claim_view(record, request.app[DIRECTORY_KEY]))


async def keepalive(request: web.Request) -> web.Response:
    record = await request.app[RUNNERS_KEY].keepalive(runner_in_scope(request))
    return web.json_response(claim_view(record, request.app[DIRECTORY_KEY]))


async def release(request: web.Request) -> web.Response:
    await request.app[RUNNERS_KEY].release(runner_in_scope(request))
    return web.Response(status=204)


def pool_summaries(directory: PoolDirectory, visible: Scope = EVERY_POOL) -> list[dict[str, Any]]:
    """The pools as `GET /v1/pools` shows them, those in `visible` (also the demo's
    table)."""
    pools = []
    for key in sorted(directory.pools):
        entry = directory.pools[key]
        if not entry.active or entry.pool is None or not visible.allows(key):
            continue  # removed from the files (only its runners are being destroyed), or hidden
        namespace, name = key.split("/", 1)
        spec = entry.pool.spec
        pools.append(
            {
                "namespace": namespace,
                "name": name,
                "spec": {"idleRunners": spec.idle_runners, "maxRunners": spec.max_runners},
                "status": dict(entry.status),
            }
        )
    return pools


async def list_pools(request: web.Request) -> web.Response:
    directory = request.app[DIRECTORY_KEY]
    why = directory.available()
    if why is not None:  # never an answer from what was read before Nomad went away
        raise ServiceError(ErrorCode.NOMAD_UNAVAILABLE, why)
    return web.json_response({"pools": pool_summaries(directory, scope(request))})


async def healthz(_: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    readiness = request.app[READY_KEY]()
    return web.json_response(readiness.to_dict(), status=200 if readiness.ready else 503)


async def metrics(request: web.Request) -> web.Response:
    return web.Response(
        body=request.app[METRICS_KEY].exposition(),
        content_type="text/plain",
        charset="utf-8",
        headers={"Cache-Control": "no-store"},
    )


async def openapi(request: web.Request) -> web.Response:
    return web.json_response(request.app[OPENAPI_KEY])


# ---- the table ---------------------------------------------------------------------------

POOL_CLAIMS = "/v1/pools/{namespace}/{name}/claims"
RUNNER = "/v1/runners/{runnerId}"
CLAIMED = "a runner (or with count, the batch) was claimed"
REPEATED = "the answer to an earlier request with this requestId"
CLAIM_ERRORS = {
    400: "invalid request",
    404: "unknown pool, or a pool being removed",
    408: "the body did not arrive in time",
    409: "requestId used for another request (RequestIdConflict), or the pool's job "
    "prefix belongs to another pool (PrefixConflict)",
    410: "a runner of this requestId is gone",
    413: "body too large",
    503: "no pool has enough idle runners (PoolEmpty, with Retry-After; a batch takes "
    "none), or Nomad unavailable",
}

ROUTES: tuple[Route, ...] = (
    Route(
        "GET", "/v1/pools", "listPools", "every pool with its spec and status", list_pools,
        responses={200: ("every pool", PoolList)},
    ),
    Route(
        "POST", POOL_CLAIMS, "claimRunner",
        "claim an idle runner of the pool (with count, a batch: all or nothing)", claim,
        body=ClaimBody,
        responses={201: (CLAIMED, ClaimAnswer), 200: (REPEATED, ClaimAnswer)},
        errors=CLAIM_ERRORS,
    ),
    Route(
        "POST", "/v1/claims", "claimFromPools",
        "claim from the first pool of a list with idle runners (with count, a batch)",
        claim_from_pools,
        body=PoolsClaimBody,
        responses={201: (CLAIMED, ClaimAnswer), 200: (REPEATED, ClaimAnswer)},
        errors=CLAIM_ERRORS,
    ),
    Route(
        "GET", POOL_CLAIMS, "listClaims", "the pool's live claims", list_claims,
        responses={200: ("the pool's live claims", ClaimList)},
        errors={404: "unknown pool"},
    ),
    Route(
        "GET", RUNNER, "getRunner", "a claimed runner", get_runner,
        responses={200: ("the runner's live claim", Claim)},
        errors={404: NOT_CLAIMED, 410: RUNNER_GONE},
    ),
    Route(
        "DELETE", RUNNER, "releaseRunner", "release a runner: it is destroyed", release,
        responses={204: ("released; the runner is destroyed", None)},
        errors={404: NOT_CLAIMED, 410: RUNNER_GONE},
    ),
    Route(
        "POST", RUNNER + "/keepalive", "keepaliveRunner", "move the claim's deadline",
        keepalive,
        responses={200: ("the deadline moved", Claim)},
        errors={404: NOT_CLAIMED, 410: "the runner is gone (Expired once past its deadline)"},
    ),
    Route("GET", "/healthz", "healthz", "liveness", healthz, needs_token=False,
          responses={200: ("alive", None)}),
    Route(
        "GET", "/readyz", "readyz", "readiness", readyz, needs_token=False,
        responses={
            200: ("ready: what the process serves and reconciles", None),
            503: ("not ready: the pools not read yet, or reconciled by nobody", None),
        },
    ),
    Route("GET", "/metrics", "metrics", "Prometheus metrics", metrics, needs_token=False,
          responses={200: ("the metrics, Prometheus text format", None)}),
    Route("GET", "/openapi.json", "openapi", "this document", openapi, needs_token=False,
          responses={200: ("the OpenAPI document", None)}),
    *EXECUTION_ROUTES,
)  # fmt: skip
