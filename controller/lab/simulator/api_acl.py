"""Routes: /v1/acl (bootstrap, tokens, policies)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web

from controller.lab.simulator.authz import denied
from controller.lab.simulator.util import JSON, bad_request, not_found
from controller.lab.simulator.wire import AddRoute, read_json, reply

if TYPE_CHECKING:
    from controller.lab.simulator.cluster import Simulator


class AclRoutes:
    def __init__(self, sim: Simulator) -> None:
        self.sim = sim

    def register(self, r: AddRoute) -> None:
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
            {k: v for k, v in pol.items() if k != "Rules"}
            for pol in self.sim.policies.values()
            if _may_read_policy(t, pol["Name"])
        ]
        return reply(stubs, self.sim.table_index["acl_policy"])

    async def acl_policy_read(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        if not _may_read_policy(t, p["id"]):
            raise denied()
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


def _may_read_policy(token: JSON | None, name: str) -> bool:
    """Management tokens read every policy, client tokens the ones they carry."""
    return token is None or token["Type"] == "management" or name in (token["Policies"] or ())
