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

from controller.lab.simulator.api_acl import AclRoutes
from controller.lab.simulator.api_agent import AgentRoutes
from controller.lab.simulator.api_allocs import AllocRoutes
from controller.lab.simulator.api_events import EventRoutes
from controller.lab.simulator.api_jobs import JobRoutes
from controller.lab.simulator.api_nodes import NodeRoutes
from controller.lab.simulator.api_vars import VariableRoutes
from controller.lab.simulator.util import JSON, ApiError, bad_request
from controller.lab.simulator.wire import Handler, read_json, reply, text

if TYPE_CHECKING:
    from controller.lab.simulator.cluster import Simulator

_log = logging.getLogger("poolkeeper.simulator")
_WRITE_METHODS = {"PUT", "POST", "DELETE"}

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
)


class ApiFaults:
    """The API fault in force: until it expires, every /v1 call fails or is slowed."""

    def __init__(self) -> None:
        self.kind = ""
        self.until = 0.0
        self.slow_ms = 0.0

    def inject(self, kind: str, seconds: float, slow_ms: float = 1000.0) -> None:
        if kind not in ("no_leader", "refuse", "slow", "none"):
            raise bad_request(f"unknown api fault {kind!r} (no_leader, refuse, slow, none)")
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
        ):
            group.register(self._route)

    def _route(self, pattern: str, **methods: Handler) -> None:
        self.routes.append((re.compile(pattern + "$"), methods))

    # ------------------------------------------------------------------ dispatch
    async def handle(self, request: web.Request) -> web.StreamResponse:
        path = request.raw_path.split("?", 1)[0]
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
            for pattern, methods in self.routes:
                m = pattern.match(path)
                if m is None:
                    continue
                handler = methods.get(request.method)
                if handler is None:
                    return text(405, "Invalid method")
                token = self.authenticate(request, path)
                params = {k: unquote(v) for k, v in m.groupdict().items()}
                return await handler(request, params, token)
            return text(404, "404 page not found")
        except ApiError as exc:
            return text(exc.status, exc.message)
        except (ConnectionResetError, asyncio.CancelledError):
            raise
        except Exception as exc:
            # A simulator bug: logged with its traceback, answered like a Nomad RPC error.
            _log.exception("simulator error on %s %s", request.method, path)
            return text(500, f"rpc error: {exc}")

    def authenticate(self, request: web.Request, path: str) -> JSON | None:
        """The caller's token; 403 when ACLs are on and it is missing or unknown."""
        if not self.sim.acl_enabled or path.startswith(("/v1/status/", "/v1/acl/bootstrap")):
            return None
        secret = request.headers.get("X-Nomad-Token", "")
        auth = request.headers.get("Authorization", "")
        if not secret and auth.startswith("Bearer "):
            secret = auth[len("Bearer ") :].strip()
        token = self.sim.token_for(secret) if secret else None
        if token is None:
            raise ApiError(403, "Permission denied")
        if token["Type"] != "management":
            # Client tokens are treated as read-only (no policy language is simulated).
            is_acl = path.startswith("/v1/acl/") and path != "/v1/acl/token/self"
            if request.method in _WRITE_METHODS or is_acl:
                raise ApiError(403, "Permission denied")
        return token

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


def build_app(sim: Simulator) -> web.Application:
    api = Api(sim)
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_route("*", "/{tail:.*}", api.handle)
    return app
