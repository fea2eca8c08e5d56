"""The HTTP API: Nomad's /v1 routes plus the /_sim fault routes, on aiohttp."""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import re
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from aiohttp import web

from controller.lab.simulator.bexpr import FilterError, compile_filter
from controller.lab.simulator.events import StreamDropped, TopicFilter
from controller.lab.simulator.util import JSON, ApiError, bad_request, not_found, parse_go_duration
from controller.lab.simulator.views import (
    alloc_full,
    alloc_stub,
    eval_view,
    job_stub,
    node_stub,
    paginate,
)

if TYPE_CHECKING:
    from controller.lab.simulator.cluster import Simulator

Handler = Callable[[web.Request, dict[str, str], JSON | None], Awaitable[web.StreamResponse]]
MAX_WAIT = 300.0
_log = logging.getLogger("poolkeeper.simulator")
# One shared encoder: json.dumps(..., separators=...) would build a new one per call.
_ENCODE = json.JSONEncoder(separators=(",", ":")).encode
_BOOL_TRUE = {"1", "t", "T", "TRUE", "true", "True"}
_BOOL_FALSE = {"0", "f", "F", "FALSE", "false", "False"}
_READ_TOPICS = {"Job", "Allocation", "Evaluation", "Deployment", "Service", "Node", "Variables"}
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
    "fail_starts",
)


def text(status: int, message: str) -> web.Response:
    return web.Response(status=status, text=message, content_type="text/plain", charset="utf-8")


def reply(body: Any, index: int | None = None, status: int = 200) -> web.Response:
    headers = {"X-Nomad-KnownLeader": "true", "X-Nomad-LastContact": "0"}
    if index is not None:
        headers["X-Nomad-Index"] = str(index)
    return web.Response(
        status=status,
        body=_ENCODE(body).encode(),
        content_type="application/json",
        headers=headers,
    )


def reply_raw(body: bytes, index: int) -> web.Response:
    headers = {
        "X-Nomad-KnownLeader": "true",
        "X-Nomad-LastContact": "0",
        "X-Nomad-Index": str(index),
    }
    return web.Response(body=body, content_type="application/json", headers=headers)


def parse_bool(request: web.Request, name: str, default: bool = False) -> bool:
    raw = request.query.get(name)
    if raw is None or raw == "":
        return default
    if raw in _BOOL_TRUE:
        return True
    if raw in _BOOL_FALSE:
        return False
    raise bad_request(f'Failed to parse value of "{name}" ({raw}): invalid syntax')


def parse_int(request: web.Request, name: str) -> int | None:
    raw = request.query.get(name)
    if raw is None or raw == "":
        return None
    try:
        return int(raw)
    except ValueError:
        raise bad_request(f"Failed to parse value of {name!r} ({raw}): invalid syntax") from None


def namespace_of(request: web.Request) -> str:
    return request.query.get("namespace") or "default"


async def read_json(request: web.Request, required: bool = True) -> Any:
    try:
        raw = await request.read()
    except ConnectionResetError:
        # The client died mid-body (a SIGKILLed controller): nothing was applied, and the
        # answer reaches no one; say so instead of logging a traceback.
        raise bad_request("client closed the connection before sending the body") from None
    if not raw.strip():
        if required:
            raise bad_request("Request body is empty")
        return None
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise bad_request(f"Failed to decode request body: {type(exc).__name__}") from None


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
        # Alloc ModifyIndex changes with every write, so it keys the encoded stub.
        self._stub_cache: dict[tuple[bool, bool], dict[str, tuple[int, bytes]]] = {}
        self._job_cache: dict[bool, dict[tuple[str, str], tuple[tuple[int, int], bytes]]] = {}
        self.routes: list[tuple[re.Pattern[str], dict[str, Handler]]] = []
        r = self._route
        r(r"/v1/status/leader", GET=self.leader)
        r(r"/v1/status/peers", GET=self.peers)
        r(r"/v1/agent/self", GET=self.agent_self)
        r(r"/v1/regions", GET=self.regions)
        r(r"/v1/namespaces", GET=self.namespaces)
        r(r"/v1/jobs", GET=self.jobs_list, PUT=self.job_register, POST=self.job_register)
        reads = ("allocations", "evaluations", "versions", "summary", "deployments", "deployment")
        writes = ("evaluate", "plan", "dispatch", "revert", "stable", "scale")
        for suffix in reads + writes:
            handler = getattr(self, f"job_{suffix}")
            methods = {"GET": handler} if suffix in reads else {"PUT": handler, "POST": handler}
            if suffix == "scale":
                methods["GET"] = self.job_scale_status
            r(rf"/v1/job/(?P<id>.+)/{suffix}", **methods)
        r(
            r"/v1/job/(?P<id>.+)",
            GET=self.job_read,
            PUT=self.job_register,
            POST=self.job_register,
            DELETE=self.job_deregister,
        )
        r(r"/v1/allocations", GET=self.allocs_list)
        r(r"/v1/allocation/(?P<id>[^/]+)/stop", PUT=self.alloc_stop, POST=self.alloc_stop)
        r(r"/v1/allocation/(?P<id>[^/]+)", GET=self.alloc_read)
        r(r"/v1/evaluations", GET=self.evals_list)
        r(r"/v1/evaluation/(?P<id>[^/]+)/allocations", GET=self.eval_allocs)
        r(r"/v1/evaluation/(?P<id>[^/]+)", GET=self.eval_read)
        r(r"/v1/deployments", GET=self.deployments_list)
        r(r"/v1/deployment/(?P<id>[^/]+)", GET=self.deployment_read)
        r(r"/v1/nodes", GET=self.nodes_list)
        r(r"/v1/node/(?P<id>[^/]+)/allocations", GET=self.node_allocs)
        r(r"/v1/node/(?P<id>[^/]+)/drain", PUT=self.node_drain, POST=self.node_drain)
        r(r"/v1/node/(?P<id>[^/]+)/eligibility", PUT=self.node_elig, POST=self.node_elig)
        r(r"/v1/node/(?P<id>[^/]+)/evaluate", PUT=self.node_evaluate, POST=self.node_evaluate)
        r(r"/v1/node/(?P<id>[^/]+)", GET=self.node_read)
        r(r"/v1/event/stream", GET=self.event_stream)
        r(r"/v1/vars", GET=self.vars_list)
        r(r"/v1/var/(?P<path>.+)", GET=self.var_read, PUT=self.var_put, DELETE=self.var_delete)
        r(r"/v1/acl/bootstrap", PUT=self.acl_bootstrap, POST=self.acl_bootstrap)
        r(r"/v1/acl/tokens", GET=self.acl_tokens)
        r(r"/v1/acl/token", PUT=self.acl_token_create, POST=self.acl_token_create)
        r(r"/v1/acl/token/self", GET=self.acl_token_self)
        r(
            r"/v1/acl/token/(?P<id>[^/]+)",
            GET=self.acl_token_read,
            PUT=self.acl_token_update,
            POST=self.acl_token_update,
            DELETE=self.acl_token_delete,
        )
        r(r"/v1/acl/policies", GET=self.acl_policies)
        r(
            r"/v1/acl/policy/(?P<id>[^/]+)",
            GET=self.acl_policy_read,
            PUT=self.acl_policy_put,
            POST=self.acl_policy_put,
            DELETE=self.acl_policy_delete,
        )

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

    # ------------------------------------------------------------------ blocking
    async def block(self, request: web.Request, index_of: Callable[[], int]) -> int:
        """Blocking query: wait until index_of() > ?index or ?wait elapses."""
        raw_index = request.query.get("index")
        raw_wait = request.query.get("wait")
        stale = request.query.get("stale")
        if stale not in (None, "") and stale not in _BOOL_TRUE | _BOOL_FALSE:
            raise bad_request(
                f"Expect `true` or `false` for `stale` query string parameter, got {stale}"
            )
        min_index = 0
        if raw_index not in (None, ""):
            try:
                min_index = int(raw_index)
                if min_index < 0:
                    raise ValueError
            except ValueError:
                raise bad_request("Invalid index") from None
        wait = MAX_WAIT
        if raw_wait not in (None, ""):
            try:
                wait = parse_go_duration(raw_wait)
            except ValueError:
                raise bad_request("Invalid wait time") from None
            wait = MAX_WAIT if wait <= 0 else min(wait, MAX_WAIT)
        if min_index > 0:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + wait
            while index_of() <= min_index:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                await self.sim.wait_for_change(remaining)
        return max(index_of(), 1)

    def encoded_stubs(self, allocs: list[JSON], task_states: bool, resources: bool) -> bytes:
        """A JSON array of stubs; each stub is encoded once per alloc version and reused."""
        cache = self._stub_cache.setdefault((task_states, resources), {})
        parts: list[bytes] = []
        for alloc in allocs:
            hit = cache.get(alloc["ID"])
            if hit is None or hit[0] != alloc["ModifyIndex"]:
                encoded = _ENCODE(alloc_stub(alloc, task_states, resources)).encode()
                hit = (alloc["ModifyIndex"], encoded)
                cache[alloc["ID"]] = hit
            parts.append(hit[1])
        return b"[" + b",".join(parts) + b"]"

    def table(self, *names: str) -> Callable[[], int]:
        return lambda: max(self.sim.table_index[n] for n in names)

    def compile(self, request: web.Request) -> Callable[[Any], bool] | None:
        expr = request.query.get("filter")
        if not expr:
            return None
        try:
            return compile_filter(expr)
        except FilterError as exc:
            raise bad_request(
                f"failed to create result paginator: failed to read filter expression: {exc}"
            ) from None

    # ------------------------------------------------------------------ status / agent
    async def leader(self, request: web.Request, p: dict[str, str], t: JSON | None) -> web.Response:
        return reply(f"{self.sim.advertise}:4647")

    async def peers(self, request: web.Request, p: dict[str, str], t: JSON | None) -> web.Response:
        return reply([f"{self.sim.advertise}:4647"])

    async def regions(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        return reply(["global"])

    async def namespaces(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        names = sorted({"default", *(k[0] for k in self.sim.jobs)})
        return reply(
            [{"Name": n, "Description": "", "CreateIndex": 1, "ModifyIndex": 1} for n in names], 1
        )

    async def agent_self(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        return reply(
            {
                "config": {
                    "Region": "global",
                    "Datacenter": "dc1",
                    "NodeName": "sim-server",
                    "Version": {"Version": "1.9.7", "VersionPrerelease": "", "Revision": "sim"},
                    "ACL": {"Enabled": self.sim.acl_enabled},
                },
                "member": {
                    "Name": "sim-server.global",
                    "Addr": self.sim.advertise,
                    "Port": 4648,
                    "Status": "alive",
                    "Tags": {"region": "global", "dc": "dc1", "build": "1.9.7", "role": "nomad"},
                },
                "stats": {"nomad": {"leader": "true", "server": "true"}},
            }
        )

    # ------------------------------------------------------------------ jobs
    async def jobs_list(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        index = await self.block(request, self.table("jobs", "allocs", "evals"))
        keep = self.compile(request)
        ns = namespace_of(request)
        prefix = request.query.get("prefix", "")
        meta = parse_bool(request, "meta")
        per_page = parse_int(request, "per_page") or 0
        sim = self.sim
        records = [sim.jobs[k] for k in sim.job_keys(ns) if k[1].startswith(prefix)]
        page, next_token = paginate(
            records,
            lambda rec: f"{rec.key[0]}.{rec.key[1]}",
            request.query.get("next_token") or None,
            per_page,
            (lambda rec: keep(rec.job)) if keep else None,
        )
        cache = self._job_cache.setdefault(meta, {})
        parts: list[bytes] = []
        for rec in page:
            stamp = (rec.job["ModifyIndex"], sim.job_touched.get(rec.key, 0))
            hit = cache.get(rec.key)
            if hit is None or hit[0] != stamp:
                encoded = _ENCODE(job_stub(sim, rec, meta)).encode()
                hit = cache[rec.key] = (stamp, encoded)
            parts.append(hit[1])
        resp = reply_raw(b"[" + b",".join(parts) + b"]", index)
        if next_token is not None:
            resp.headers["X-Nomad-NextToken"] = next_token
        return resp

    async def _job_body(self, request: web.Request, job_id: str | None) -> JSON:
        body = await read_json(request)
        if not isinstance(body, dict):
            raise bad_request("Failed to decode request body: expected a JSON object")
        job = body.get("Job")
        if not isinstance(job, dict):
            raise bad_request("Job must be specified")
        if not job.get("ID"):
            raise bad_request("Job ID hasn't been provided")
        if job_id is not None and job["ID"] != job_id:
            raise bad_request("Job ID does not match name")
        return body

    async def job_register(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        body = await self._job_body(request, p.get("id"))
        enforce = body.get("EnforceIndex", False)
        jmi = body.get("JobModifyIndex", 0)
        if not isinstance(enforce, bool) or not isinstance(jmi, int):
            raise bad_request("Failed to decode request body: EnforceIndex/JobModifyIndex type")
        ns = request.query.get("namespace") or body["Job"].get("Namespace") or "default"
        out = self.sim.register_job(body["Job"], ns, enforce, jmi)
        return reply(out, out["Index"])

    async def job_read(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        key = (namespace_of(request), p["id"])

        def index_of() -> int:
            rec = self.sim.jobs.get(key)
            return int(rec.job["ModifyIndex"]) if rec else self.sim.table_index["jobs"]

        index = await self.block(request, index_of)
        rec = self.sim.jobs.get(key)
        if rec is None:
            raise not_found("job")
        return reply(rec.job, index)

    async def job_deregister(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        purge = parse_bool(request, "purge")
        out = self.sim.deregister_job(p["id"], namespace_of(request), purge)
        return reply(out, out["Index"] or self.sim.index)

    async def job_allocations(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        index = await self.block(request, self.table("allocs"))
        key = (namespace_of(request), p["id"])
        rec = self.sim.jobs.get(key)
        show_all = parse_bool(request, "all")
        allocs = [self.sim.allocs[a] for a in self.sim.job_allocs.get(key, ())]
        if rec is not None and not show_all:
            allocs = [a for a in allocs if a["Job"]["CreateIndex"] == rec.create_index]
        allocs.sort(key=lambda a: a["ID"])
        return reply([alloc_stub(a) for a in allocs], index)

    async def job_evaluations(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        index = await self.block(request, self.table("evals"))
        rec = self.sim.jobs.get((namespace_of(request), p["id"]))
        evals = [self.sim.evals[e] for e in rec.eval_ids] if rec else []
        return reply([eval_view(e) for e in evals], index)

    async def job_versions(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        index = await self.block(request, self.table("jobs"))
        rec = self.sim.jobs.get((namespace_of(request), p["id"]))
        if rec is None:
            raise not_found("job versions")
        return reply({"Versions": list(reversed(rec.versions)), "Diffs": None}, index)

    async def job_summary(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        index = await self.block(request, self.table("jobs", "allocs"))
        rec = self.sim.jobs.get((namespace_of(request), p["id"]))
        if rec is None:
            raise not_found("job summary")
        return reply(self.sim.job_summary(rec), index)

    async def job_deployments(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        index = await self.block(request, self.table("deployment"))
        rec = self.sim.jobs.get((namespace_of(request), p["id"]))
        deps = [self.sim.deployments[d] for d in reversed(rec.deployment_ids)] if rec else []
        return reply(deps, index)

    async def job_deployment(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        index = await self.block(request, self.table("deployment"))
        rec = self.sim.jobs.get((namespace_of(request), p["id"]))
        dep = self.sim.deployments[rec.deployment_ids[-1]] if rec and rec.deployment_ids else None
        return reply(dep, index)

    async def job_evaluate(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        await read_json(request, required=False)
        out = self.sim.evaluate_job(p["id"], namespace_of(request))
        return reply(out, out["Index"])

    async def job_plan(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        body = await self._job_body(request, p["id"])
        rec = self.sim.jobs.get((namespace_of(request), p["id"]))
        updates = {
            g.get("Name", ""): {
                "Place": g.get("Count", 1),
                "Ignore": 0,
                "Stop": 0,
                "Migrate": 0,
                "InPlaceUpdate": 0,
                "DestructiveUpdate": 0,
            }
            for g in body["Job"].get("TaskGroups") or []
            if isinstance(g, dict)
        }
        jmi = rec.job["JobModifyIndex"] if rec else 0
        return reply(
            {
                "Index": jmi,
                "JobModifyIndex": jmi,
                "Diff": {"Type": "None"} if body.get("Diff") else None,
                "Annotations": {"DesiredTGUpdates": updates, "PreemptedAllocs": None},
                "FailedTGAllocs": None,
                "CreatedEvals": None,
                "Warnings": "",
                "NextPeriodicLaunch": "0001-01-01T00:00:00Z",
            },
            self.sim.index,
        )

    async def job_dispatch(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        body = await read_json(request, required=False) or {}
        if not isinstance(body, dict):
            raise bad_request("Failed to decode request body: expected a JSON object")
        out = self.sim.dispatch_job(p["id"], namespace_of(request), body)
        return reply(out, out["Index"])

    async def job_revert(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        body = await read_json(request)
        if not isinstance(body, dict) or not isinstance(body.get("JobVersion"), int):
            raise bad_request("Failed to decode request body: JobVersion must be a number")
        out = self.sim.revert_job(
            p["id"], namespace_of(request), body["JobVersion"], body.get("EnforcePriorVersion")
        )
        return reply(out, out["Index"])

    async def job_stable(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        body = await read_json(request)
        if not isinstance(body, dict) or not isinstance(body.get("JobVersion"), int):
            raise bad_request("Failed to decode request body: JobVersion must be a number")
        out = self.sim.stable_job(
            p["id"], namespace_of(request), body["JobVersion"], bool(body.get("Stable"))
        )
        return reply(out, out["Index"])

    async def job_scale(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        body = await read_json(request)
        if not isinstance(body, dict):
            raise bad_request("Failed to decode request body: expected a JSON object")
        out = self.sim.scale_job(p["id"], namespace_of(request), body)
        return reply(out, out["Index"])

    async def job_scale_status(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        index = await self.block(request, self.table("jobs", "allocs"))
        rec = self.sim.jobs.get((namespace_of(request), p["id"]))
        if rec is None:
            raise not_found("job")
        summary = self.sim.job_summary(rec)["Summary"]
        groups = {
            g["Name"]: {
                "Desired": g["Count"],
                "Placed": sum(summary[g["Name"]][k] for k in ("Starting", "Running")),
                "Running": summary[g["Name"]]["Running"],
                "Healthy": summary[g["Name"]]["Running"],
                "Unhealthy": 0,
                "Events": None,
            }
            for g in rec.job["TaskGroups"]
        }
        return reply(
            {
                "JobID": rec.key[1],
                "Namespace": rec.key[0],
                "JobCreateIndex": rec.create_index,
                "JobModifyIndex": rec.job["JobModifyIndex"],
                "JobStopped": bool(rec.job.get("Stop")),
                "TaskGroups": groups,
            },
            index,
        )

    # ------------------------------------------------------------------ allocations
    async def allocs_list(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        index = await self.block(request, self.table("allocs"))
        keep = self.compile(request)
        ns = namespace_of(request)
        prefix = request.query.get("prefix", "")
        task_states = parse_bool(request, "task_states", True)
        resources = parse_bool(request, "resources")
        per_page = parse_int(request, "per_page") or 0
        reverse = request.query.get("reverse") == "true"
        allocs: list[JSON] = list(self.sim.allocs.values())
        if ns != "*":
            allocs = [a for a in allocs if a["Namespace"] == ns]
        token_of: Callable[[JSON], Any]
        if prefix:
            allocs = sorted(
                (a for a in allocs if a["ID"].startswith(prefix)), key=lambda a: a["ID"]
            )
            token_of = _id_token
            start: Any = request.query.get("next_token") or None
        else:
            token_of = _index_token
            allocs.sort(key=_index_token)  # nearly sorted already: cheap
            start = _parse_index_token(request.query.get("next_token"))
        if reverse:
            allocs.reverse()
            if start is not None:
                allocs = [a for a in allocs if token_of(a) <= start]
                start = None
        page, nxt = paginate(allocs, token_of, start, per_page, keep)
        resp = reply_raw(self.encoded_stubs(page, task_states, resources), index)
        if nxt is not None:
            resp.headers["X-Nomad-NextToken"] = nxt if prefix else f"{nxt[0]}.{nxt[1]}"
        return resp

    async def alloc_read(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        def index_of() -> int:
            alloc = self.sim.allocs.get(p["id"])
            return int(alloc["ModifyIndex"]) if alloc else self.sim.table_index["allocs"]

        index = await self.block(request, index_of)
        return reply(alloc_full(self.sim.alloc(p["id"])), index)

    async def alloc_stop(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        out = self.sim.stop_allocation(p["id"], parse_bool(request, "reschedule"))
        return reply(out, out["Index"])

    # ------------------------------------------------------------------ evaluations
    async def evals_list(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        index = await self.block(request, self.table("evals"))
        keep = self.compile(request)
        ns = namespace_of(request)
        prefix = request.query.get("prefix", "")
        evals = [
            e
            for e in self.sim.evals.values()
            if (ns == "*" or e["Namespace"] == ns) and e["ID"].startswith(prefix)
        ]
        if keep is not None:
            evals = [e for e in evals if keep(e)]
        return reply([eval_view(e) for e in evals], index)

    async def eval_read(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        def index_of() -> int:
            ev = self.sim.evals.get(p["id"])
            return int(ev["ModifyIndex"]) if ev else self.sim.table_index["evals"]

        index = await self.block(request, index_of)
        ev = self.sim.evals.get(p["id"])
        if ev is None:
            raise not_found("eval")
        return reply(eval_view(ev), index)

    async def eval_allocs(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        index = await self.block(request, self.table("allocs"))
        allocs = [a for a in self.sim.allocs.values() if a["EvalID"] == p["id"]]
        return reply([alloc_stub(a) for a in allocs], index)

    async def deployments_list(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        index = await self.block(request, self.table("deployment"))
        return reply(list(self.sim.deployments.values()), index)

    async def deployment_read(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        index = await self.block(request, self.table("deployment"))
        dep = self.sim.deployments.get(p["id"])
        if dep is None:
            raise not_found("deployment")
        return reply(dep, index)

    # ------------------------------------------------------------------ nodes
    async def nodes_list(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        index = await self.block(request, self.table("nodes"))
        prefix = request.query.get("prefix", "")
        resources = parse_bool(request, "resources")
        os_attr = parse_bool(request, "os")
        nodes = sorted(
            (n for n in self.sim.nodes.values() if n["ID"].startswith(prefix)),
            key=lambda n: n["ID"],
        )
        return reply([node_stub(n, resources, os_attr) for n in nodes], index)

    async def node_read(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        index = await self.block(request, self.table("nodes"))
        node = self.sim.nodes.get(p["id"])
        if node is None:
            raise not_found("node")
        return reply(node, index)

    async def node_allocs(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        index = await self.block(request, self.table("allocs"))
        if p["id"] not in self.sim.nodes:
            raise not_found("node")
        allocs = [self.sim.allocs[a] for a in self.sim.node_allocs[p["id"]]]
        return reply([alloc_full(a) for a in allocs], index)

    async def node_drain(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        if p["id"] not in self.sim.nodes:
            raise not_found("node")
        body = await read_json(request, required=False)
        if body is None:
            # Old clients send ?enable= without a body.
            enable, deadline, eligible = parse_bool(request, "enable"), 0.0, False
        elif isinstance(body, dict):
            spec = body.get("DrainSpec")
            if spec is not None and not isinstance(spec, dict):
                raise bad_request("Failed to decode request body: DrainSpec must be an object")
            enable = spec is not None
            raw_deadline = (spec or {}).get("Deadline", 0)
            if not isinstance(raw_deadline, int):
                raise bad_request("Failed to decode request body: Deadline must be a number")
            deadline = raw_deadline / 1e9
            eligible = bool(body.get("MarkEligible"))
        else:
            raise bad_request("Failed to decode request body: expected a JSON object")
        out = self.sim.drain(p["id"], deadline, enable, eligible)
        return reply(out, out["Index"])

    async def node_elig(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        if p["id"] not in self.sim.nodes:
            raise not_found("node")
        body = await read_json(request)
        value = body.get("Eligibility") if isinstance(body, dict) else None
        if value not in ("eligible", "ineligible"):
            raise bad_request(f'invalid scheduling eligibility "{value}"')
        out = self.sim.set_eligibility(p["id"], value == "eligible")
        return reply(out, out["Index"])

    async def node_evaluate(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        if p["id"] not in self.sim.nodes:
            raise not_found("node")
        out = self.sim.evaluate_node(p["id"])
        return reply(out, out["Index"])

    # ------------------------------------------------------------------ events
    async def event_stream(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.StreamResponse:
        topics: dict[str, set[str]] = {}
        for raw in request.query.getall("topic", []):
            if raw.count(":") > 1:
                raise bad_request(f"Invalid topic query: {raw}")
            topic, _, key = raw.partition(":")
            topics.setdefault(topic, set()).add(key or "*")
        if not topics:
            topics = {"*": {"*"}}
        if t is not None and t["Type"] != "management" and not set(topics) <= _READ_TOPICS:
            raise ApiError(403, "Permission denied")
        index = parse_int(request, "index") or 0
        filt = TopicFilter(topics, namespace_of(request))
        broker = self.sim.broker
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        await resp.prepare(request)
        loop = asyncio.get_running_loop()
        seq = broker.start_seq(index)
        generation = broker.generation
        try:
            await resp.write(b"{}\n")
            last_write = loop.time()
            while True:
                if broker.generation != generation:
                    if request.transport is not None:
                        request.transport.abort()  # a server restart, as the client sees it
                    return resp
                items = broker.read(seq)
                for item in items:
                    frame = filt.frame(item)
                    if frame is not None:
                        await resp.write(frame)
                        last_write = loop.time()
                    seq = item.seq + 1
                if items:
                    continue
                idle = loop.time() - last_write
                if idle >= self.sim.heartbeat_seconds:
                    await resp.write(b"{}\n")
                    last_write = loop.time()
                    continue
                await broker.wait(seq, self.sim.heartbeat_seconds - idle)
        except StreamDropped:
            return resp  # `event dropped from buffer`: the stream ends
        except (ConnectionResetError, ConnectionError):
            return resp

    # ------------------------------------------------------------------ variables
    async def vars_list(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        index = await self.block(request, self.table("vars"))
        keep = self.compile(request)
        keys = self.sim.var_keys(namespace_of(request), request.query.get("prefix", ""))
        metas = [self.sim.var_meta(self.sim.vars[k]) for k in keys]
        page, nxt = paginate(
            metas,
            lambda v: v["Path"],
            request.query.get("next_token") or None,
            parse_int(request, "per_page") or 0,
            keep,
        )
        resp = reply(page, index)
        if nxt is not None:
            resp.headers["X-Nomad-NextToken"] = nxt
        return resp

    async def var_read(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        key = (namespace_of(request), p["path"])

        def index_of() -> int:
            var = self.sim.vars.get(key)
            return int(var["ModifyIndex"]) if var else self.sim.table_index["vars"]

        index = await self.block(request, index_of)
        var = self.sim.vars.get(key)
        if var is None:
            raise not_found("variable")
        return reply(var, index)

    async def var_put(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        body = await read_json(request)
        if not isinstance(body, dict):
            raise bad_request("Failed to decode request body: expected a JSON object")
        ns = request.query.get("namespace") or body.get("Namespace") or "default"
        status, var = self.sim.put_variable(
            ns, p["path"], body.get("Items"), parse_int(request, "cas")
        )
        return reply(var, var["ModifyIndex"] or self.sim.index, status)

    async def var_delete(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        status, conflict = self.sim.delete_variable(
            namespace_of(request), p["path"], parse_int(request, "cas")
        )
        if conflict is not None:
            return reply(conflict, self.sim.index, status)
        return web.Response(status=200, headers={"X-Nomad-Index": str(self.sim.index)})

    # ------------------------------------------------------------------ ACL
    async def acl_bootstrap(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        return reply(self.sim.bootstrap(), self.sim.index)

    async def acl_tokens(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        stubs = [
            {k: v for k, v in tok.items() if k != "SecretID"} for tok in self.sim.tokens.values()
        ]
        return reply(stubs, self.sim.table_index["acl_token"])

    async def acl_token_create(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        body = await read_json(request)
        if not isinstance(body, dict):
            raise bad_request("Failed to decode request body: expected a JSON object")
        return reply(self.sim.create_token(body), self.sim.index)

    async def acl_token_update(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        body = await read_json(request)
        if not isinstance(body, dict):
            raise bad_request("Failed to decode request body: expected a JSON object")
        return reply(self.sim.create_token(body, accessor=p["id"]), self.sim.index)

    async def acl_token_self(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        if t is None:
            raise bad_request("ACL support disabled")
        return reply(t, self.sim.table_index["acl_token"])

    async def acl_token_read(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        token = self.sim.tokens.get(p["id"])
        if token is None:
            raise not_found("ACL token")
        return reply(token, self.sim.table_index["acl_token"])

    async def acl_token_delete(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        self.sim.delete_token(p["id"])
        return web.Response(status=200, headers={"X-Nomad-Index": str(self.sim.index)})

    async def acl_policies(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        stubs = [
            {k: v for k, v in pol.items() if k != "Rules"} for pol in self.sim.policies.values()
        ]
        return reply(stubs, self.sim.table_index["acl_policy"])

    async def acl_policy_read(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        pol = self.sim.policies.get(p["id"])
        if pol is None:
            raise not_found("ACL policy")
        return reply(pol, self.sim.table_index["acl_policy"])

    async def acl_policy_put(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        body = await read_json(request)
        if not isinstance(body, dict):
            raise bad_request("Failed to decode request body: expected a JSON object")
        self.sim.put_policy(p["id"], body)
        return web.Response(status=200, headers={"X-Nomad-Index": str(self.sim.index)})

    async def acl_policy_delete(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        self.sim.delete_policy(p["id"])
        return web.Response(status=200, headers={"X-Nomad-Index": str(self.sim.index)})

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


def _index_token(alloc: JSON) -> tuple[int, str]:
    return (alloc["CreateIndex"], alloc["ID"])


def _id_token(alloc: JSON) -> str:
    return str(alloc["ID"])


def _parse_index_token(raw: str | None) -> tuple[int, str] | None:
    if not raw:
        return None
    head, _, tail = raw.partition(".")
    try:
        return (int(head), tail)
    except ValueError:
        raise bad_request(f"failed to read result page: invalid next_token {raw!r}") from None


def build_app(sim: Simulator) -> web.Application:
    api = Api(sim)
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_route("*", "/{tail:.*}", api.handle)
    return app
