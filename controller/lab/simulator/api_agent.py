"""Routes: status, agent, regions and namespaces."""

from __future__ import annotations

from aiohttp import web

from controller.lab.simulator.routes import RouteGroup
from controller.lab.simulator.util import JSON
from controller.lab.simulator.wire import AddRoute, reply, text


class AgentRoutes(RouteGroup):
    def register(self, r: AddRoute) -> None:
        r(r"/v1/status/leader", GET=self.leader)
        r(r"/v1/status/peers", GET=self.peers)
        r(r"/v1/agent/self", GET=self.agent_self)
        r(r"/v1/regions", GET=self.regions)
        r(r"/v1/namespaces", GET=self.namespaces)
        r(r"/\.well-known/jwks\.json", GET=self.jwks)
        r(r"/v1/metrics", GET=self.metrics)

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
        permissions = self.sim.permissions(t)
        names = sorted(
            name
            for name in {"default", *(k[0] for k in self.sim.jobs)}
            if permissions is None or permissions.allow_namespace(name)
        )
        return reply(
            [{"Name": n, "Description": "", "CreateIndex": 1, "ModifyIndex": 1} for n in names], 1
        )

    async def jwks(self, request: web.Request, p: dict[str, str], t: JSON | None) -> web.Response:
        response = reply(self.sim.keyring.public_keys(), 1)
        response.headers["Cache-Control"] = f"max-age={self.sim.keyring.max_age_seconds()}"
        return response

    async def metrics(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        if request.query.get("format") == "prometheus":
            return text(415, "Prometheus is not enabled")
        return reply(self.sim.metrics_summary())

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
