"""Claim and runner routes of CONTRACT.md §6, thin over ClaimService.

ClaimErrors raised here become error bodies in the app's error middleware.
"""

from __future__ import annotations

from aiohttp import web

from controller.api.common import ApiError, read_json
from controller.claims.service import ClaimError, ClaimRequest, ClaimService

CLAIMS_KEY: web.AppKey[ClaimService] = web.AppKey("claims", ClaimService)

STATUS_BY_KIND = {
    "InvalidRequest": 400,
    "PoolNotFound": 404,
    "RunnerNotFound": 404,
    "RequestIdConflict": 409,
    "RunnerGone": 410,
    "PoolEmpty": 503,
    "NomadUnavailable": 503,
}


def api_error(error: ClaimError) -> ApiError:
    status = STATUS_BY_KIND[error.kind]
    return ApiError(
        status,
        error.kind,
        error.message,
        extra={"reason": error.reason} if error.reason else None,
        headers={"Retry-After": "1"} if status == 503 else None,
    )


async def claim(request: web.Request) -> web.Response:
    claim_request = ClaimRequest.from_body(await read_json(request))
    view, created = await request.app[CLAIMS_KEY].claim(
        request.match_info["namespace"], request.match_info["name"], claim_request
    )
    return web.json_response(view, status=201 if created else 200)


async def list_claims(request: web.Request) -> web.Response:
    claims = await request.app[CLAIMS_KEY].pool_claims(
        request.match_info["namespace"], request.match_info["name"]
    )
    return web.json_response({"claims": claims})


async def get_runner(request: web.Request) -> web.Response:
    return web.json_response(await request.app[CLAIMS_KEY].get(request.match_info["runner_id"]))


async def keepalive(request: web.Request) -> web.Response:
    view = await request.app[CLAIMS_KEY].keepalive(request.match_info["runner_id"])
    return web.json_response(view)


async def release(request: web.Request) -> web.Response:
    await request.app[CLAIMS_KEY].release(request.match_info["runner_id"])
    return web.Response(status=204)


def add_routes(app: web.Application, service: ClaimService) -> None:
    app[CLAIMS_KEY] = service
    pool = "/v1/pools/{namespace}/{name}/claims"
    app.router.add_post(pool, claim)
    app.router.add_get(pool, list_claims)
    app.router.add_get("/v1/runners/{runner_id}", get_runner)
    app.router.add_post("/v1/runners/{runner_id}/keepalive", keepalive)
    app.router.add_delete("/v1/runners/{runner_id}", release)
