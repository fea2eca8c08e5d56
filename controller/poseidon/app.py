"""The Poseidon API as an aiohttp application, mounted under `/api/v1/` beside the
poolkeeper API: its routes, its `Poseidon-Token` check and its answers.

As Poseidon's router does: an unknown path is 404 and a wrong method 405, both with an
empty body and before any token is checked; every route but `/health` and `/version`
needs the token (401, empty body, without one). A token's scope (docs/reference.md,
"API tokens") limits the environments it sees: one outside it is unknown (404 for
environments, 410 for their runners), as Poseidon has no 403.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Final

from aiohttp import web
from aiohttp.typedefs import Handler

from controller import __version__
from controller.api.auth import SCOPE_KEY, Scope, TokenSet, scope
from controller.api.routing import add_routes
from controller.claims.service import ClaimRequest
from controller.core.environments import Environment
from controller.core.gojson import GoStruct, go_bool, go_int
from controller.directory.view import PoolEntry
from controller.errors import ErrorCode as ServiceCode
from controller.errors import ServiceError
from controller.model import POSEIDON_ENVIRONMENT_LABEL
from controller.nomad.errors import NomadError
from controller.poseidon import executions, files
from controller.poseidon.context import (
    NO_ENVIRONMENT,
    NO_IDLE_RUNNER,
    POSEIDON_KEY,
    PREFIX,
    Poseidon,
    claimed_runner,
    from_service_error,
    poseidon,
)
from controller.poseidon.environments import depleting, described, environment_body, statistics
from controller.poseidon.wire import (
    ENVIRONMENT_REQUEST,
    EXECUTION_REQUEST,
    RUNNER_REQUEST,
    UPDATE_FILE_SYSTEM_REQUEST,
    ErrorCode,
    PoseidonError,
    answer,
    bad_request,
    read_struct,
)
from controller.sources.environments import UNKEPT, EnvironmentInvalid, EnvironmentTaken

log = logging.getLogger(__name__)

TOKEN_HEADER: Final = "Poseidon-Token"


# ---- environments ----------------------------------------------------------------------


def environment_id(request: web.Request) -> int:
    """The route's environment ID, which Poseidon parses as a Go int."""
    try:
        return go_int(request.match_info["id"])
    except ValueError as error:
        raise bad_request(str(error).replace("ParseInt", "Atoi")) from None


async def health(request: web.Request) -> web.Response:
    context = poseidon(request)
    low = depleting(context.serving(), context.settings.depleting_threshold)
    if low:
        raise PoseidonError(
            503,
            "the prewarming pool is depleting: environments " + ", ".join(map(str, low)),
            ErrorCode.PREWARMING_POOL_DEPLETING,
        )
    return web.Response(status=204)


async def version(_: web.Request) -> web.Response:
    return answer(f"poolkeeper@{__version__}")


async def environment_statistics(request: web.Request) -> web.Response:
    return answer(statistics(poseidon(request).serving(scope(request))))


async def fetch_first(request: web.Request) -> None:
    """`?fetch=true`: read the managed environments from Nomad again before answering
    (pools of the files and resources are always current)."""
    raw = request.query.get("fetch", "")
    try:
        fetch = go_bool(raw) if raw else False
    except ValueError as error:
        raise bad_request(f"could not parse fetch parameter: {error}") from None
    store = poseidon(request).store
    if fetch and store is not None:
        try:
            await store.refresh()
        except NomadError as error:
            raise PoseidonError(500, str(error), ErrorCode.UNKNOWN) from None


async def list_environments(request: web.Request) -> web.Response:
    await fetch_first(request)
    environments = poseidon(request).environments(scope(request)).values()
    return answer({"executionEnvironments": [environment_body(e) for e in environments]})


async def get_environment(request: web.Request) -> web.Response:
    env_id = environment_id(request)
    await fetch_first(request)
    environment = poseidon(request).environments(scope(request)).get(env_id)
    if environment is None:
        raise PoseidonError(404, None)
    return answer(environment_body(environment))


async def put_environment(request: web.Request) -> web.Response:
    env_id = environment_id(request)
    body = await read_struct(request, ENVIRONMENT_REQUEST)
    wanted = Environment(
        id=env_id,
        prewarming_pool_size=body["prewarmingPoolSize"],
        cpu_limit=body["cpuLimit"],
        memory_limit=body["memoryLimit"],
        image=body["image"],
        network_access=body["networkAccess"],
        exposed_ports=tuple(body["exposedPorts"] or ()),
    )
    context = poseidon(request)
    view, store = context.serving().get(env_id), context.store
    if view is not None and not context.is_managed(view):
        if scope(request).allows(view.key):
            differences = described(view).differences(wanted)
            if not differences:
                return web.Response(status=204)
            raise PoseidonError(
                409,
                f"execution environment {env_id} is pool {view.key}, where "
                f"{'; '.join(differences)}: change the pool, not the environment",
            )
        if store is not None:  # a managed copy would only shadow the pool
            raise PoseidonError(409, f"this token may not act on execution environment {env_id}")
    if store is None:
        raise PoseidonError(
            409,
            f"no pool serves execution environment {env_id}: give a pool the label "
            f'{POSEIDON_ENVIRONMENT_LABEL}: "{env_id}" (environments are read-only here)',
        )
    key = store.template.key(env_id)
    if not scope(request).allows(key):
        raise PoseidonError(409, f"this token may not act on pool {key}")
    try:
        created = await store.put(wanted)
    except EnvironmentInvalid as error:
        raise bad_request(str(error)) from None
    except EnvironmentTaken as error:
        raise PoseidonError(409, str(error)) from None
    except NomadError as error:
        raise PoseidonError(500, str(error), ErrorCode.UNKNOWN) from None
    return web.Response(status=201 if created else 204)


async def delete_environment(request: web.Request) -> web.Response:
    env_id = environment_id(request)
    context = poseidon(request)
    view = context.serving(scope(request)).get(env_id)
    if view is not None and not context.is_managed(view):
        raise PoseidonError(
            409,
            f"execution environment {env_id} is pool {view.key}: remove the pool or its "
            "label instead",
        )
    store = context.store
    if store is None or (view is None and not scope(request).allows(store.template.key(env_id))):
        raise PoseidonError(404, None)
    try:
        removed = await store.delete(env_id)
    except NomadError as error:
        raise PoseidonError(500, str(error), ErrorCode.UNKNOWN) from None
    if not removed:
        raise PoseidonError(404, None)
    return web.Response(status=204)


# ---- runners ---------------------------------------------------------------------------


async def claim_runner(request: web.Request) -> web.Response:
    body = await read_struct(request, RUNNER_REQUEST)
    env_id, timeout = body["executionEnvironmentId"], body["inactivityTimeout"]
    context = poseidon(request)
    view = context.serving(scope(request)).get(env_id)
    if view is None:
        store = context.store
        if (
            store is not None
            and store.serves(env_id)
            and scope(request).allows(store.template.key(env_id))
        ):
            if not store.kept:  # and none will be: say so (the store logged it)
                raise PoseidonError(500, UNKEPT, ErrorCode.UNKNOWN)
            # Written, not yet run by its reconciler: none available, as Poseidon answers
            # for an environment whose runners are still starting.
            raise PoseidonError(500, NO_IDLE_RUNNER, ErrorCode.NOMAD_OVERLOAD)
        raise PoseidonError(404, NO_ENVIRONMENT)
    limit = longest_inactivity(view)
    if timeout < 0:
        raise bad_request(f"inactivityTimeout {timeout} must not be negative")
    if timeout > limit:
        raise bad_request(
            f"inactivityTimeout {timeout} exceeds the maximum of execution environment "
            f"{env_id} ({limit} s)"
        )
    if not view.observed:  # registered, not read from Nomad yet: none of its runners ran
        raise PoseidonError(500, NO_IDLE_RUNNER, ErrorCode.NOMAD_OVERLOAD)
    namespace, name = view.key.split("/", 1)
    try:
        claimed = await context.claims.claim(
            namespace, name, ClaimRequest(inactivity_timeout_seconds=timeout or limit)
        )
    except ServiceError as error:
        raise from_service_error(error) from None
    return answer({"runnerId": claimed.records[0].runner_id, "mappedPorts": []})


def longest_inactivity(view: PoolEntry) -> int:
    """The longest inactivity timeout the pool allows (also what 0 means)."""
    assert view.pool is not None
    return view.pool.spec.claims.max_inactivity_timeout_seconds


async def delete_runner(request: web.Request) -> web.Response:
    runner_id = await claimed_runner(request)
    try:
        await poseidon(request).runners.release(runner_id)
    except ServiceError as error:
        if error.code is ServiceCode.NOMAD_UNAVAILABLE:
            raise PoseidonError(
                500, f"cannot return runner: {error.message}", ErrorCode.NOMAD_INTERNAL_SERVER_ERROR
            ) from None
        raise from_service_error(error) from None
    return web.Response(status=204)


# ---- the application -------------------------------------------------------------------


@dataclass(frozen=True)
class PoseidonRoute:
    """One route of the Poseidon API, as the app serves it and the OpenAPI document
    (poseidon/openapi.py) describes it."""

    method: str
    path: str  # under PREFIX, in aiohttp's syntax
    operation: str
    summary: str
    handler: Handler
    body: GoStruct | None = None
    query: tuple[str, ...] = ()  # names of query parameters, described in openapi.py
    # status -> what it means; the document gives each its body
    answers: dict[int, str] = field(default_factory=dict)
    empty: frozenset[int] = frozenset()  # error statuses answered without a body
    needs_token: bool = True


ENVIRONMENT = "/execution-environments/{id:[0-9]+}"
RUNNER = "/runners/{runnerId}"
NOMAD = "Nomad is unavailable, or another failure (errorCode says which)"
GONE = "no such claimed runner (abstract manager wrapped: no runner found with this id)"
TOO_LARGE = "the body is too large"
# Poseidon's router takes digits only for an environment's ID: -1 or 1.5 is no route.
NOT_DIGITS = "or an ID that is not digits: no such route (as Poseidon's router)"

ROUTES: Final = (
    PoseidonRoute("GET", "/health", "poseidonHealth", "health", health, needs_token=False,
                  answers={204: "healthy", 503: "a prewarming pool is depleting"}),
    PoseidonRoute("GET", "/version", "poseidonVersion", "the version", version,
                  needs_token=False, answers={200: "poolkeeper@VERSION"}),
    PoseidonRoute("GET", "/statistics/execution-environments", "poseidonStatistics",
                  "idle and used runners per environment", environment_statistics,
                  answers={200: "keyed by environment ID"}),
    PoseidonRoute("GET", "/execution-environments", "poseidonListEnvironments",
                  "the environments", list_environments, query=("fetch",),
                  answers={200: "the environments", 400: "fetch is no boolean",
                           500: "reading the managed environments failed"}),
    PoseidonRoute("GET", ENVIRONMENT, "poseidonGetEnvironment", "one environment",
                  get_environment, query=("fetch",),
                  answers={200: "the environment", 400: "an ID or fetch that cannot be read",
                           404: "no such environment, " + NOT_DIGITS,
                           500: "reading the managed environments failed"},
                  empty=frozenset({404})),
    PoseidonRoute("PUT", ENVIRONMENT, "poseidonPutEnvironment",
                  "create or replace an environment (managed), or check one (readonly)",
                  put_environment, body=ENVIRONMENT_REQUEST,
                  answers={201: "created", 204: "replaced, or as the pool says",
                           400: "a body or ID that cannot be read, or no valid pool (managed: "
                                "exposedPorts need networkAccess)",
                           404: NOT_DIGITS.removeprefix("or "),
                           409: "the environment is a pool of the files or resources, or "
                                "read-only here", 413: TOO_LARGE,
                           500: "writing the environment failed"},
                  empty=frozenset({404})),
    PoseidonRoute("DELETE", ENVIRONMENT, "poseidonDeleteEnvironment",
                  "delete a managed environment", delete_environment,
                  answers={204: "deleted", 400: "an ID that cannot be read",
                           404: "no such managed environment, " + NOT_DIGITS,
                           409: "the environment is a pool of the files or resources",
                           500: "deleting the environment failed"},
                  empty=frozenset({404})),
    PoseidonRoute("POST", "/runners", "poseidonClaimRunner",
                  "claim a runner of an environment", claim_runner, body=RUNNER_REQUEST,
                  answers={200: "the runner", 400: "a body that cannot be read, or an "
                           "inactivity timeout beyond the environment's",
                           404: "no such environment", 413: TOO_LARGE,
                           500: "no idle runner (NOMAD_OVERLOAD), or " + NOMAD}),
    PoseidonRoute("DELETE", RUNNER, "poseidonReleaseRunner", "release a runner",
                  delete_runner,
                  answers={204: "released", 410: GONE, 500: "the release failed: " + NOMAD}),
    PoseidonRoute("GET", RUNNER + "/files", "poseidonListFiles", "list a runner's files",
                  files.list_files, query=("path", "recursive"),
                  answers={200: "the files", 410: GONE,
                           424: "the path cannot be listed", 500: NOMAD}),
    PoseidonRoute("PATCH", RUNNER + "/files", "poseidonPatchFiles",
                  "delete, then write files", files.patch_files,
                  body=UPDATE_FILE_SYSTEM_REQUEST,
                  answers={204: "done", 400: "a body that cannot be read, or a path that "
                           "leaves the working directory", 410: GONE, 413: TOO_LARGE,
                           500: NOMAD}),
    PoseidonRoute("GET", RUNNER + "/files/raw", "poseidonDownloadFile", "a file's bytes",
                  files.download_file, query=("path",),
                  answers={200: "the bytes", 410: GONE, 424: "the file cannot be read",
                           500: NOMAD}),
    PoseidonRoute("POST", RUNNER + "/execute", "poseidonExecute",
                  "store a command; its WebSocket runs it", executions.execute,
                  body=EXECUTION_REQUEST,
                  answers={200: "the WebSocket URL to run it", 400: "a body that cannot "
                           "be read, a forbidden character, a time limit beyond the "
                           "pool's, or too many stored", 410: GONE, 413: TOO_LARGE,
                           500: NOMAD}),
    PoseidonRoute("GET", RUNNER + "/websocket", "poseidonWebSocket",
                  "run a stored command over a WebSocket", executions.websocket,
                  query=("executionID",),
                  answers={101: "the command runs; frames as docs/poseidon.md says",
                           400: "not a WebSocket upgrade", 404: "no such stored command",
                           409: "maxConcurrent executions run already", 410: GONE,
                           500: NOMAD}),
)  # fmt: skip
OPEN_ROUTES: Final = frozenset(route.path for route in ROUTES if not route.needs_token)


def token_scope(tokens: TokenSet, request: web.Request) -> Scope:
    """The scope of the request's Poseidon-Token; 401 with an empty body without one."""
    found = tokens.scope_of(request.headers.get(TOKEN_HEADER, ""))
    if found is None:
        raise PoseidonError(401, None)
    return found


@web.middleware
async def poseidon_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    refused = request.match_info.http_exception
    if refused is not None:  # unknown path or method: the router's answer, empty
        return web.Response(status=refused.status)
    try:
        resource = request.match_info.route.resource
        path = resource.canonical.removeprefix(PREFIX) if resource is not None else ""
        if path not in OPEN_ROUTES:
            request[SCOPE_KEY] = token_scope(poseidon(request).tokens, request)
        return await handler(request)
    except PoseidonError as error:
        return error.response()
    except ServiceError as error:
        return from_service_error(error).response()
    except web.HTTPException as error:  # aiohttp's own refusals, as a Go server's: empty
        return web.Response(status=error.status)
    except Exception:
        log.exception("unhandled error on %s %s", request.method, request.path)
        return PoseidonError(500, "internal error", ErrorCode.UNKNOWN).response()


def create_poseidon_app(context: Poseidon) -> web.Application:
    """The application to mount at PREFIX."""
    app = web.Application(middlewares=[poseidon_middleware])
    app[POSEIDON_KEY] = context
    add_routes(app, ROUTES)
    return app
