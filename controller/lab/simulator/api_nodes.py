"""Routes: /v1/nodes and /v1/node/:id (allocations, drain, eligibility, evaluate)."""

from __future__ import annotations

from aiohttp import web

from controller.lab.simulator.hoststats import host_stats
from controller.lab.simulator.routes import (
    NOT_AN_OBJECT,
    RouteGroup,
    found,
    put_or_post,
    write_reply,
)
from controller.lab.simulator.util import JSON, ApiError, bad_request, not_found
from controller.lab.simulator.views import alloc_full, node_stub
from controller.lab.simulator.wire import (
    AddRoute,
    block,
    floored,
    parse_bool,
    read_json,
    reply,
)


class NodeRoutes(RouteGroup):
    def register(self, r: AddRoute) -> None:
        r(r"/v1/nodes", GET=self.nodes_list)
        r(r"/v1/node/(?P<id>[^/]+)/allocations", GET=self.node_allocs)
        r(r"/v1/node/(?P<id>[^/]+)/drain", **put_or_post(self.node_drain))
        r(r"/v1/node/(?P<id>[^/]+)/eligibility", **put_or_post(self.node_elig))
        r(r"/v1/node/(?P<id>[^/]+)/evaluate", **put_or_post(self.node_evaluate))
        r(r"/v1/node/(?P<id>[^/]+)/purge", **put_or_post(self.node_purge))
        r(r"/v1/node/(?P<id>[^/]+)", GET=self.node_read)
        r(r"/v1/client/stats", GET=self.client_stats)

    def _node_id(self, p: dict[str, str]) -> str:
        """The ID of the node the path names; 404 unless that node exists."""
        if p["id"] not in self.sim.nodes:
            raise not_found("node")
        return p["id"]

    async def nodes_list(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        index = await self.block_on_tables(request, "nodes")
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
        index = await self.block_on_tables(request, "nodes")
        return reply(found(self.sim.nodes.get(p["id"]), "node"), index)

    async def node_allocs(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        sim = self.sim

        def allocs() -> list[JSON]:
            # An unknown node has no allocations: 200 [], as a known one without any.
            return [sim.allocs[a] for a in sim.node_allocs.get(p["id"], ())]

        def index_of() -> int:
            # The newest of the node's allocations, or the table's when it has none.
            mine = allocs()
            if mine:
                return max(int(a["ModifyIndex"]) for a in mine)
            return floored(sim.table_index["allocs"])

        index = await block(sim, request, index_of)
        # Node read lets a token list them, and it sees those of the namespaces it may read.
        permissions = sim.permissions(t)
        shown = [
            alloc_full(a)
            for a in allocs()
            if permissions is None or permissions.allow_namespace_op(a["Namespace"], "read-job")
        ]
        return reply(shown, index)

    async def node_drain(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        node_id = self._node_id(p)
        body = await read_json(request, required=False)
        meta: dict[str, str] | None = None
        if body is None:
            # Old clients send ?enable= without a body.
            enable, deadline, eligible = parse_bool(request, "enable"), 0.0, False
        elif isinstance(body, dict):
            meta = body.get("Meta") or None
            if meta is not None and not (
                isinstance(meta, dict) and all(isinstance(v, str) for v in meta.values())
            ):
                raise bad_request("Failed to decode request body: Meta must map strings")
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
            raise bad_request(NOT_AN_OBJECT)
        accessor = t["AccessorID"] if t is not None else ""
        out = await self.sim.drain_node(node_id, deadline, enable, eligible, meta, accessor)
        return write_reply(out)

    async def node_elig(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        node_id = self._node_id(p)
        body = await read_json(request)
        value = body.get("Eligibility") if isinstance(body, dict) else None
        if value not in ("eligible", "ineligible"):
            raise bad_request(f'invalid scheduling eligibility "{value}"')
        out = self.sim.set_eligibility(node_id, value == "eligible")
        return write_reply(out)

    async def node_evaluate(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        out = self.sim.evaluate_node(self._node_id(p))
        return write_reply(out)

    async def node_purge(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        return write_reply(self.sim.node_registry.purge(p["id"]))

    async def client_stats(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        """A client's host statistics, through the server: the simulated clients all run
        on this host, so these are this host's memory and the disk of the allocation
        directories (no per-CPU figures)."""
        node_id = request.query.get("node_id", "")
        if not node_id:
            raise bad_request("No local Node and node_id not provided")
        node = self.sim.nodes.get(node_id)
        if node is None:
            raise ApiError(404, f"Unknown node {node_id}")
        if node["Status"] == "down":
            raise ApiError(404, "No path to node")
        return reply(host_stats(self.sim.sandboxes.root_dir()))
