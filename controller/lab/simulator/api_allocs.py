"""Routes: allocations, evaluations and deployments."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web

from controller.lab.simulator.util import JSON, bad_request, not_found
from controller.lab.simulator.views import alloc_full, alloc_stub, eval_view, paginate
from controller.lab.simulator.wire import (
    ENCODE,
    AddRoute,
    block,
    namespace_of,
    parse_bool,
    parse_int,
    query_filter,
    reply,
    reply_raw,
    table_index,
)

if TYPE_CHECKING:
    from controller.lab.simulator.cluster import Simulator


class AllocRoutes:
    def __init__(self, sim: Simulator) -> None:
        self.sim = sim
        # Alloc ModifyIndex changes with every write, so it keys the encoded stub.
        self._stub_cache: dict[tuple[bool, bool], dict[str, tuple[int, bytes]]] = {}

    def register(self, r: AddRoute) -> None:
        r(r"/v1/allocations", GET=self.allocs_list)
        r(r"/v1/allocation/(?P<id>[^/]+)/stop", PUT=self.alloc_stop, POST=self.alloc_stop)
        r(r"/v1/allocation/(?P<id>[^/]+)", GET=self.alloc_read)
        r(r"/v1/evaluations", GET=self.evals_list)
        r(r"/v1/evaluation/(?P<id>[^/]+)/allocations", GET=self.eval_allocs)
        r(r"/v1/evaluation/(?P<id>[^/]+)", GET=self.eval_read)
        r(r"/v1/deployments", GET=self.deployments_list)
        r(r"/v1/deployment/(?P<id>[^/]+)", GET=self.deployment_read)

    def encoded_stubs(self, allocs: list[JSON], task_states: bool, resources: bool) -> bytes:
        """A JSON array of stubs; each stub is encoded once per alloc version and reused."""
        cache = self._stub_cache.setdefault((task_states, resources), {})
        parts: list[bytes] = []
        for alloc in allocs:
            hit = cache.get(alloc["ID"])
            if hit is None or hit[0] != alloc["ModifyIndex"]:
                encoded = ENCODE(alloc_stub(alloc, task_states, resources)).encode()
                hit = (alloc["ModifyIndex"], encoded)
                cache[alloc["ID"]] = hit
            parts.append(hit[1])
        return b"[" + b",".join(parts) + b"]"

    async def allocs_list(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        index = await block(self.sim, request, table_index(self.sim, "allocs"))
        keep = query_filter(request)
        ns = namespace_of(request)
        prefix = request.query.get("prefix", "")
        task_states = parse_bool(request, "task_states", True)
        resources = parse_bool(request, "resources")
        per_page = parse_int(request, "per_page") or 0
        reverse = request.query.get("reverse") == "true"
        visible = self.sim.namespace_filter(t, ns, "read-job")
        allocs: list[JSON] = list(self.sim.allocs.values())
        if ns != "*":
            allocs = [a for a in allocs if a["Namespace"] == ns]
        elif self.sim.acl_enabled:
            allocs = [a for a in allocs if visible(a["Namespace"])]
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

        index = await block(self.sim, request, index_of)
        alloc = self.sim.alloc(p["id"])
        self.sim.require(t, alloc["Namespace"], "read-job")
        return reply(alloc_full(alloc), index)

    async def alloc_stop(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        self.sim.require(t, self.sim.alloc(p["id"])["Namespace"], "alloc-lifecycle")
        out = self.sim.stop_allocation(p["id"], parse_bool(request, "reschedule"))
        return reply(out, out["Index"])

    async def evals_list(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        index = await block(self.sim, request, table_index(self.sim, "evals"))
        keep = query_filter(request)
        ns = namespace_of(request)
        prefix = request.query.get("prefix", "")
        visible = self.sim.namespace_filter(t, ns, "read-job")
        evals = [
            e
            for e in self.sim.evals.values()
            if (e["Namespace"] == ns or (ns == "*" and visible(e["Namespace"])))
            and e["ID"].startswith(prefix)
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

        index = await block(self.sim, request, index_of)
        ev = self.sim.evals.get(p["id"])
        if ev is None:
            raise not_found("eval")
        self.sim.require(t, ev["Namespace"], "read-job")
        return reply(eval_view(ev), index)

    async def eval_allocs(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        index = await block(self.sim, request, table_index(self.sim, "allocs"))
        allocs = [a for a in self.sim.allocs.values() if a["EvalID"] == p["id"]]
        ev = self.sim.evals.get(p["id"])
        if ev is not None:
            self.sim.require(t, ev["Namespace"], "read-job")
        return reply([alloc_stub(a) for a in allocs], index)

    async def deployments_list(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        index = await block(self.sim, request, table_index(self.sim, "deployment"))
        visible = self.sim.namespace_filter(t, namespace_of(request), "read-job")
        return reply([d for d in self.sim.deployments.values() if visible(d["Namespace"])], index)

    async def deployment_read(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        index = await block(self.sim, request, table_index(self.sim, "deployment"))
        dep = self.sim.deployments.get(p["id"])
        if dep is None:
            raise not_found("deployment")
        self.sim.require(t, dep["Namespace"], "read-job")
        return reply(dep, index)


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
