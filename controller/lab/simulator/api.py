"""The HTTP API: dispatch of Nomad's /v1 routes, ACL checks, API faults and /_sim routes."""

from __future__ import annotations

import asyncio
import inspect
import logging
import re
import time
from typing import TYPE_CHECKING
from urllib.parse import unquote

from aiohttp import web

from controller.lab.simulator.acl import ANONYMOUS_TOKEN
from controller.lab.simulator.api_acl import AclRoutes
from controller.lab.simulator.api_agent import AgentRoutes
from controller.lab.simulator.api_allocs import AllocRoutes
from controller.lab.simulator.api_events import EventRoutes
from controller.lab.simulator.api_exec import ExecRoutes
from controller.lab.simulator.api_fs import FsRoutes
from controller.lab.simulator.api_jobs import JobRoutes
from controller.lab.simulator.api_nodes import NodeRoutes
from controller.lab.simulator.api_vars import VariableRoutes
from controller.lab.simulator.authz import RULES, Rule, check, denied
from controller.lab.simulator.util import JSON, ApiError, bad_request
from controller.lab.simulator.wire import Handler, namespace_of, read_json, reply, text

if TYPE_CHECKING:
    from controller.lab.simulator.cluster import Simulator

_log = logging.getLogger("poolkeeper.simulator")
_WRITE_METHODS = {"PUT", "POST", "DELETE"}
_DRY_RUN = re.compile(r"/v1/job/.+/plan$")  # a write method that applies nothing

# Faults callable over HTTP: POST /_sim/<name> with the keyword arguments as JSON.
SIM_FAULTS = (
    "reschedule_allocation",
    "node_down",
    "node_up",
    "drain_node",
    "oom_restart",
    "reannounce_allocation",
    "finish_allocation",
    "remove_job_silently",
    "disconnect_event_streams",
    "event_fault",
    "api_fault",
    "no_capacity",
    "set_start_delay",
    "advance_clock",
    "fail_starts",
    "set_write_latency",
    "lose_state",
)


API_FAULT_KINDS = ("no_leader", "refuse", "slow", "renew_error", "none")
# What a Nomad server answers when raft cannot take a write in time.
RENEW_ERROR = "rpc error: timed out enqueuing operation"


class ApiFaults:
    """The API fault in force: until it expires, every /v1 call fails or is slowed (or,
    with `renew_error`, only lock renewals fail)."""

    def __init__(self) -> None:
        self.kind = ""
        self.until = 0.0
        self.slow_ms = 0.0

    def inject(self, kind: str, seconds: float, slow_ms: float = 1000.0) -> None:
        if kind not in API_FAULT_KINDS:
            kinds = ", ".join(API_FAULT_KINDS)
            raise bad_request(f"unknown api fault {kind!r} ({kinds})")
        self.kind = "" if kind == "none" else kind
        self.until = time.monotonic() + seconds
        self.slow_ms = slow_ms

    def current(self) -> str:
        if self.kind and time.monotonic() < self.until:
            return self.kind
        return ""


class Api:
    def __init__(self, sim: Simulator) -> None:
        self.sim = sim
        self.routes: list[tuple[re.Pattern[str], dict[str, Handler]]] = []
        for group in (
            AgentRoutes(sim),
            JobRoutes(sim),
            AllocRoutes(sim),
            NodeRoutes(sim),
            EventRoutes(sim),
            VariableRoutes(sim),
            AclRoutes(sim),
            ExecRoutes(sim, self),
            FsRoutes(sim, self),
        ):
            group.register(self._route)

    def _route(self, pattern: str, **methods: Handler) -> None:
        for handler in methods.values():
            if handler.__qualname__ not in RULES:
                raise LookupError(f"no ACL rule for {handler.__qualname__} in authz.RULES")
        # IDs may hold any character, a newline (%0A) too.
        self.routes.append((re.compile(pattern + "$", re.DOTALL), methods))

    # ------------------------------------------------------------------ dispatch
    async def handle(self, request: web.Request) -> web.StreamResponse:
        path, sep, query = request.raw_path.partition("?")
        clean = clean_path(path)
        if clean != path:
            # As Go's ServeMux: a path with `//`, `.` or `..` is sent to its clean form
            # (307, so a write is sent again as it was: `/v1/job//scale` is a PUT of
            # `/v1/job/scale`, a job named "scale").
            return web.Response(status=307, headers={"Location": clean + sep + query})
        try:
            if path.startswith("/_sim/"):
                return await self.sim_route(request, path[len("/_sim/") :])
            self.sim.counters["http_requests"] += 1
            fault = self.sim.api_faults.current()
            if fault == "refuse":
                if request.transport is not None:
                    request.transport.abort()  # the client sees a reset, no response
                return web.Response(status=500)  # never written: the transport is gone
            if fault == "slow":
                await asyncio.sleep(self.sim.api_faults.slow_ms / 1000)
            if fault == "no_leader":
                return text(500, "No cluster leader")
            if fault == "renew_error" and "lock-renew" in request.query:
                return text(500, RENEW_ERROR)
            for pattern, methods in self.routes:
                m = pattern.match(path)
                if m is None:
                    continue
                handler = methods.get(request.method)
                if handler is None:
                    return text(405, "Invalid method")
                token = self.authenticate(request, _rule_of(handler))
                if request.method in _WRITE_METHODS and not _DRY_RUN.match(path):
                    await self.raft_commit()
                params = {k: unquote(v) for k, v in m.groupdict().items()}
                return await handler(request, params, token)
            return text(404, "404 page not found")
        except ApiError as exc:
            response = text(exc.status, exc.message)
            if exc.index is not None:
                response.headers["X-Nomad-Index"] = str(exc.index)
            return response
        except (ConnectionResetError, asyncio.CancelledError):
            raise
        except Exception as exc:
            # A simulator bug: logged with its traceback, answered like a Nomad RPC error.
            _log.exception("simulator error on %s %s", request.method, path)
            return text(500, f"rpc error: {exc}")

    async def raft_commit(self) -> None:
        """A write is answered once Raft would have committed it (`write_latency_ms`)."""
        if self.sim.write_latency_ms > 0:
            await asyncio.sleep(self.sim.write_latency_ms / 1000)

    def authenticate(self, request: web.Request, rule: Rule) -> JSON | None:
        """The caller's token (None with ACLs off); 403 unless the route's rule allows it.

        A request without a token is the anonymous token; an unknown token is refused.
        """
        if not self.sim.acl_enabled or rule.kind in ("public", "own_token"):
            return None
        token = self.resolve_token(self.secret_of(request))
        if rule.kind == "token" and token is ANONYMOUS_TOKEN:
            raise denied()
        permissions = self.sim.acl.permissions(token)
        assert permissions is not None
        check(rule, permissions, namespace_of(request))
        return token

    def secret_of(self, request: web.Request) -> str:
        """The secret of X-Nomad-Token, or else of `Authorization: Bearer`."""
        secret = request.headers.get("X-Nomad-Token", "")
        scheme, _, rest = request.headers.get("Authorization", "").partition(" ")
        if not secret and scheme.lower() == "bearer":
            secret = rest.strip().split(" ", 1)[0]
        return secret

    def resolve_token(self, secret: str) -> JSON | None:
        """The token of a secret (None with ACLs off; no secret: the anonymous token).

        A secret no token has is 403 Permission denied.
        """
        if not self.sim.acl_enabled:
            return None
        token = self.sim.token_for(secret) if secret else ANONYMOUS_TOKEN
        if token is None:
            raise denied()
        if self.sim.acl.expired(token):
            raise ApiError(403, "ACL token expired")
        return token

    def allows(self, token: JSON | None, namespace: str, capability: str) -> bool:
        """Whether `token`'s policies grant a namespace capability (always with ACLs off),
        for the routes that answer a refusal their own way (authz.OWN_TOKEN)."""
        permissions = self.sim.acl.permissions(token)
        return permissions is None or permissions.allow_namespace_op(namespace, capability)

    # ------------------------------------------------------------------ /_sim
    async def sim_route(self, request: web.Request, name: str) -> web.Response:
        if name == "state":
            if request.method != "GET":
                return text(405, "Invalid method")
            return reply(self.sim.snapshot(), self.sim.index)
        if name not in SIM_FAULTS:
            return text(404, f"unknown simulator action {name!r}")
        if request.method not in ("POST", "PUT"):
            return text(405, "Invalid method")
        body = await read_json(request, required=False) or {}
        if not isinstance(body, dict):
            raise bad_request("expected a JSON object of keyword arguments")
        method = getattr(self.sim, name)
        try:
            inspect.signature(method).bind(**body)
        except TypeError as exc:
            raise bad_request(f"{name}: {exc}") from None
        try:
            result = method(**body)
            if inspect.isawaitable(result):
                result = await result
        except (KeyError, ValueError, StopIteration) as exc:
            raise bad_request(f"{name}: {exc}") from None
        return reply({"Result": result}, self.sim.index)


def clean_path(path: str) -> str:
    """Go's cleanPath for a request: `path.Clean`, keeping a trailing slash."""
    if not path.startswith("/"):
        path = "/" + path
    parts: list[str] = []
    for part in path.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if parts:
                parts.pop()
            continue
        parts.append(part)
    clean = "/" + "/".join(parts)
    if path.endswith("/") and clean != "/":
        clean += "/"
    return clean


def _rule_of(handler: Handler) -> Rule:
    return RULES[handler.__qualname__]


def build_app(sim: Simulator) -> web.Application:
    api = Api(sim)
    app = web.Application(client_max_size=64 * 1024 * 1024)
    # Every path, a newline in it too: the API's own dispatch answers unknown routes.
    app.router.add_route("*", r"/{tail:[\s\S]*}", api.handle)
    return app
