"""Routes: /v1/nodes and /v1/node/:id (allocations, drain, eligibility, evaluate)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web

from controller.lab.simulator.util import JSON, bad_request, not_found
from controller.lab.simulator.views import alloc_full, node_stub
from controller.lab.simulator.wire import AddRoute, block, parse_bool, read_json, reply, table_index

if TYPE_CHECKING:
    from controller.lab.simulator.cluster import Simulator


class NodeRoutes:
    def __init__(self, sim: Simulator) -> None:
        self.sim = sim

    def register(self, r: AddRoute) -> None:
        r(r"/v1/nodes", GET=self.nodes_list)
        r(r"/v1/node/(?P<id>[^/]+)/allocations", GET=self.node_allocs)
        r(r"/v1/node/(?P<id>[^/]+)/drain", PUT=self.node_drain, POST=self.node_drain)
        r(r"/v1/node/(?P<id>[^/]+)/eligibility", PUT=self.node_elig, POST=self.node_elig)
        r(r"/v1/node/(?P<id>[^/]+)/evaluate", PUT=self.node_evaluate, POST=self.node_evaluate)
        r(r"/v1/node/(?P<id>[^/]+)", GET=self.node_read)

    async def nodes_list(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        index = await block(self.sim, request, table_index(self.sim, "nodes"))
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
        index = await block(self.sim, request, table_index(self.sim, "nodes"))
        node = self.sim.nodes.get(p["id"])
        if node is None:
            raise not_found("node")
        return reply(node, index)

    async def node_allocs(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        index = await block(self.sim, request, table_index(self.sim, "allocs"))
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
