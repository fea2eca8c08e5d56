"""Routes: status, agent, regions and namespaces."""

from __future__ import annotations

from aiohttp import web

from controller.lab.simulator.authz import denied
from controller.lab.simulator.routes import (
    RouteGroup,
    index_reply,
    object_methods,
    put_or_post,
    read_object,
    write_reply,
)
from controller.lab.simulator.util import JSON, ApiError, bad_request
from controller.lab.simulator.wire import AddRoute, block, floored, reply, text


class AgentRoutes(RouteGroup):
    def register(self, r: AddRoute) -> None:
        r(r"/v1/status/leader", GET=self.leader)
        r(r"/v1/status/peers", GET=self.peers)
        r(r"/v1/agent/self", GET=self.agent_self)
        r(r"/v1/agent/health", GET=self.agent_health)
        r(r"/v1/agent/members", GET=self.agent_members)
        r(r"/v1/regions", GET=self.regions)
        r(r"/v1/namespaces", GET=self.namespaces)
        r(r"/v1/namespace", **put_or_post(self.namespace_write))
        r(
            r"/v1/namespace/(?P<name>.*)",
            **object_methods(self.namespace_read, self.namespace_write, self.namespace_delete),
        )
        r(r"/\.well-known/jwks\.json", GET=self.jwks)
        r(
            r"/v1/operator/scheduler/configuration",
            GET=self.scheduler_config,
            **put_or_post(self.scheduler_config_set),
        )
        r(r"/v1/metrics", GET=self.metrics)
        r(r"/v1/system/gc", **put_or_post(self.system_gc))
        r(r"/v1/system/reconcile/summaries", **put_or_post(self.reconcile_summaries))

    async def system_gc(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        self.sim.collect_garbage()
        return web.Response(status=200)

    async def reconcile_summaries(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        # Job summaries are counted from the allocations when read: nothing to reconcile.
        return web.Response(status=200)

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
        index = await self.block_on_tables(request, "namespaces")
        permissions = self.sim.permissions(t)
        prefix = request.query.get("prefix", "")
        listed = [
            ns
            for name, ns in sorted(self.sim.namespace_registry.namespaces.items())
            if name.startswith(prefix)
            and (permissions is None or permissions.allow_namespace(name))
        ]
        return reply(listed, floored(index))

    async def namespace_read(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        name = _namespace_name(p)
        permissions = self.sim.permissions(t)
        if permissions is not None and not permissions.allow_namespace(name):
            raise denied()
        namespaces = self.sim.namespace_registry.namespaces

        def index_of() -> int:
            found = namespaces.get(name)
            return (
                int(found["ModifyIndex"]) if found else floored(self.sim.table_index["namespaces"])
            )

        index = await block(self.sim, request, index_of)
        if name not in namespaces:
            raise ApiError(404, "Namespace not found", index)
        return reply(namespaces[name], index)

    async def namespace_write(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        body = await read_object(request)
        if "name" in p and body.get("Name") != _namespace_name(p):
            raise bad_request("Namespace name does not match request path")
        return index_reply(self.sim.namespace_registry.upsert(body))

    async def namespace_delete(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        return index_reply(self.sim.namespace_registry.delete(_namespace_name(p)))

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

    async def scheduler_config(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        config = self.sim.scheduler_config.config
        index = config["ModifyIndex"]
        return reply({"SchedulerConfig": config, "Index": index, "KnownLeader": True}, index)

    async def scheduler_config_set(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        cas = None
        if "cas" in request.query:
            try:
                cas = int(request.query["cas"])
            except ValueError:
                raise bad_request(
                    f"Error parsing cas value: strconv.ParseUint: parsing "
                    f'"{request.query["cas"]}": invalid syntax'
                ) from None
        out = self.sim.scheduler_config.set(await read_object(request), cas)
        return write_reply(out)

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
                "member": self._member(),
                "stats": {"nomad": {"leader": "true", "server": "true"}},
            }
        )

    def _member(self) -> JSON:
        """The one server, as its gossip (serf) member."""
        return {
            "Name": "sim-server.global",
            "Addr": self.sim.advertise,
            "Port": 4648,
            "Status": "alive",
            "Tags": {"region": "global", "dc": "dc1", "build": "1.9.7", "role": "nomad"},
        }

    async def agent_members(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        return reply(
            {
                "ServerName": "sim-server",
                "ServerRegion": "global",
                "ServerDC": "dc1",
                "Members": [self._member()],
            }
        )

    async def agent_health(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        """The agent's health: its server, and its client when it runs one (a node)."""
        healthy = {"ok": True, "message": "ok"}
        body: JSON = {"server": healthy}
        if self.sim.nodes:
            body["client"] = healthy
        return reply(body)


def _namespace_name(p: dict[str, str]) -> str:
    if not p["name"]:
        raise bad_request("Missing Namespace Name")
    return p["name"]
