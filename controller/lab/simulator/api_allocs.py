"""Routes: allocations, evaluations and deployments."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web

from controller.lab.simulator.bexpr import FilterError, compile_filter
from controller.lab.simulator.routes import (
    EncodedStubs,
    RouteGroup,
    found,
    put_or_post,
    read_object,
    write_reply,
)
from controller.lab.simulator.util import JSON, bad_request
from controller.lab.simulator.views import alloc_full, alloc_stub, eval_stub, eval_view, paginate
from controller.lab.simulator.wire import (
    AddRoute,
    namespace_of,
    parse_bool,
    parse_int,
    reply,
    reply_raw,
)

if TYPE_CHECKING:
    from controller.lab.simulator.cluster import Simulator


class AllocRoutes(RouteGroup):
    def __init__(self, sim: Simulator) -> None:
        super().__init__(sim)
        # An alloc's ModifyIndex changes with every write to it: it versions the stub.
        self._stubs = EncodedStubs[JSON](lambda a: a["ID"], lambda a: a["ModifyIndex"])

    def register(self, r: AddRoute) -> None:
        r(r"/v1/allocations", GET=self.allocs_list)
        r(r"/v1/allocation/(?P<id>[^/]+)/stop", **put_or_post(self.alloc_stop))
        r(r"/v1/allocation/(?P<id>[^/]+)", GET=self.alloc_read)
        r(r"/v1/evaluations", GET=self.evals_list, DELETE=self.evals_delete)
        r(r"/v1/evaluation/(?P<id>[^/]+)/allocations", GET=self.eval_allocs)
        r(r"/v1/evaluation/(?P<id>[^/]+)", GET=self.eval_read)
        r(r"/v1/deployments", GET=self.deployments_list)
        r(r"/v1/deployment/allocations/(?P<id>[^/]+)", GET=self.deployment_allocs)
        r(
            r"/v1/deployment/(?P<op>fail|pause|promote|allocation-health)/(?P<id>[^/]+)",
            **put_or_post(self.deployment_update),
        )
        r(r"/v1/deployment/(?P<id>[^/]+)", GET=self.deployment_read)

    async def allocs_list(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        query = await self.list_query(request, "allocs")
        ns, prefix = query.namespace, query.prefix
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
        if prefix:
            allocs = [a for a in allocs if a["ID"].startswith(prefix)]
        page, nxt = _page(request, allocs, prefix, reverse, per_page, query.keep)
        stubs = self._stubs.array(
            page, (task_states, resources), lambda a: alloc_stub(a, task_states, resources)
        )
        return _with_next_token(reply_raw(stubs, query.index), nxt)

    async def alloc_read(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        index = await self.block_on_object(request, "allocs", lambda: self.sim.allocs.get(p["id"]))
        alloc = self.sim.alloc(p["id"])
        self.sim.require(t, alloc["Namespace"], "read-job")
        return reply(alloc_full(alloc), index)

    async def alloc_stop(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        self.sim.require(t, self.sim.alloc(p["id"])["Namespace"], "alloc-lifecycle")
        return write_reply(
            self.sim.stop_allocation(
                p["id"],
                parse_bool(request, "reschedule"),
                parse_bool(request, "no_shutdown_delay"),
            )
        )

    async def evals_list(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        query = await self.list_query(request, "evals")
        ns, prefix = query.namespace, query.prefix
        per_page = parse_int(request, "per_page") or 0
        visible = self.sim.namespace_filter(t, ns, "read-job")
        evals = [
            e
            for e in self.sim.evals.values()
            if (e["Namespace"] == ns or (ns == "*" and visible(e["Namespace"])))
            and e["ID"].startswith(prefix)
        ]
        reverse = parse_bool(request, "reverse")
        page, nxt = _page(request, evals, prefix, reverse, per_page, query.keep)
        return _with_next_token(reply([eval_view(e) for e in page], query.index), nxt)

    async def evals_delete(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        body = await read_object(request)
        eval_ids, expression = body.get("EvalIDs") or [], body.get("Filter") or ""
        if expression and eval_ids:
            raise bad_request("evals cannot be deleted by both ID and filter")
        if not expression and not eval_ids:
            raise bad_request("evals must be deleted by either ID or filter")
        if len(eval_ids) > MAX_UUIDS_PER_WRITE:
            raise bad_request(
                f"request includes {len(eval_ids)} evaluation IDs, must be "
                f"{MAX_UUIDS_PER_WRITE} or fewer"
            )
        keep = None
        if expression:
            try:
                keep = compile_filter(expression)
            except FilterError as exc:
                raise bad_request(f"failed to read filter expression: {exc}") from None
        self.sim.scheduler_config.require_paused_broker()
        out = self.sim.scheduler.delete_evals(_ids(eval_ids), keep)
        return write_reply(out)

    async def eval_read(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        index = await self.block_on_object(request, "evals", lambda: self.sim.evals.get(p["id"]))
        ev = found(self.sim.evals.get(p["id"]), "eval")
        self.sim.require(t, ev["Namespace"], "read-job")
        shown = eval_view(ev)
        if parse_bool(request, "related"):
            shown["RelatedEvals"] = [eval_stub(e) for e in self.sim.scheduler.related_evals(ev)]
        return reply(shown, index)

    async def eval_allocs(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        index = await self.block_on_tables(request, "allocs")
        allocs = [a for a in self.sim.allocs.values() if a["EvalID"] == p["id"]]
        ev = self.sim.evals.get(p["id"])
        if ev is not None:
            self.sim.require(t, ev["Namespace"], "read-job")
        return reply([alloc_stub(a) for a in allocs], index)

    async def deployments_list(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        index = await self.block_on_tables(request, "deployment")
        ns = namespace_of(request)
        visible = self.sim.namespace_filter(t, ns, "read-job")
        prefix = request.query.get("prefix", "")
        listed = [
            d
            for d in self.sim.deployments.values()
            if (d["Namespace"] == ns or (ns == "*" and visible(d["Namespace"])))
            and d["ID"].startswith(prefix)
        ]
        return reply(listed, index)

    async def deployment_allocs(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        index = await self.block_on_tables(request, "allocs")
        dep = self.sim.deployments.get(p["id"])
        if dep is not None:
            self.sim.require(t, dep["Namespace"], "read-job")
        allocs = [a for a in self.sim.allocs.values() if a.get("DeploymentID") == p["id"]]
        return reply([alloc_stub(a) for a in allocs], index)

    async def deployment_update(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        """Fail, pause (or resume), promote a deployment, or set its allocations' health;
        each needs submit-job in the deployment's namespace."""
        op, dep_id = p["op"], p["id"]
        body: JSON = {}
        if op != "fail":
            body = await read_object(request)
            if not body.get("DeploymentID"):
                raise bad_request("DeploymentID must be specified")
            if body["DeploymentID"] != dep_id:
                raise bad_request("Deployment ID does not match")
        dep = self.sim.deployments.get(dep_id)
        if dep is not None:
            self.sim.require(t, dep["Namespace"], "submit-job")
        deployments = self.sim.deployment_ops
        if op == "fail":
            out = deployments.fail(dep_id)
        elif op == "pause":
            out = deployments.pause(dep_id, bool(body.get("Pause")))
        elif op == "promote":
            out = deployments.promote(dep_id, bool(body.get("All")), body.get("Groups"))
        else:
            out = deployments.set_alloc_health(
                dep_id,
                _ids(body.get("HealthyAllocationIDs")),
                _ids(body.get("UnhealthyAllocationIDs")),
            )
        return write_reply(out)

    async def deployment_read(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        index = await self.block_on_tables(request, "deployment")
        dep = found(self.sim.deployments.get(p["id"]), "deployment")
        self.sim.require(t, dep["Namespace"], "read-job")
        return reply(dep, index)


MAX_UUIDS_PER_WRITE = 7281  # structs.MaxUUIDsPerWriteRequest


def _ids(value: Any) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise bad_request("Failed to decode request body: allocation IDs must be strings")
    return value


def _page(
    request: web.Request,
    items: list[JSON],
    prefix: str,
    reverse: bool,
    per_page: int,
    keep: Callable[[JSON], bool] | None,
) -> tuple[list[JSON], str | None]:
    """One page as Nomad's paginator cuts it: oldest first (by ID with a prefix, else by
    CreateIndex), `reverse` the other way, from the request's next_token; and the token of
    the next page (None on the last)."""
    token_of: Callable[[JSON], Any] = _id_token if prefix else _index_token
    start: Any = request.query.get("next_token") or None
    if not prefix:
        start = _parse_index_token(start)
    items = sorted(items, key=token_of, reverse=reverse)
    if reverse and start is not None:
        items = [i for i in items if token_of(i) <= start]
        start = None
    page, nxt = paginate(items, token_of, start, per_page, keep)
    if nxt is None:
        return page, None
    return page, nxt if prefix else f"{nxt[0]}.{nxt[1]}"


def _with_next_token(resp: web.Response, token: str | None) -> web.Response:
    if token is not None:
        resp.headers["X-Nomad-NextToken"] = token
    return resp


def _index_token(obj: JSON) -> tuple[int, str]:
    return (obj["CreateIndex"], obj["ID"])


def _id_token(obj: JSON) -> str:
    return str(obj["ID"])


def _parse_index_token(raw: str | None) -> tuple[int, str] | None:
    if not raw:
        return None
    head, _, tail = raw.partition(".")
    try:
        return (int(head), tail)
    except ValueError:
        raise bad_request(f"failed to read result page: invalid next_token {raw!r}") from None
