"""Routes: /v1/acl (bootstrap, tokens, policies)."""

from __future__ import annotations

from aiohttp import web

from controller.lab.simulator.authz import denied
from controller.lab.simulator.routes import (
    RouteGroup,
    found,
    index_reply,
    object_methods,
    put_or_post,
    read_object,
)
from controller.lab.simulator.util import JSON, bad_request
from controller.lab.simulator.wire import AddRoute, floored, reply


class AclRoutes(RouteGroup):
    def register(self, r: AddRoute) -> None:
        r(r"/v1/acl/bootstrap", **put_or_post(self.acl_bootstrap))
        r(r"/v1/acl/tokens", GET=self.acl_tokens)
        r(r"/v1/acl/token", **put_or_post(self.acl_token_write))
        r(r"/v1/acl/token/self", GET=self.acl_token_self)
        r(
            r"/v1/acl/token/(?P<id>[^/]+)",
            **object_methods(self.acl_token_read, self.acl_token_write, self.acl_token_delete),
        )
        r(r"/v1/acl/policies", GET=self.acl_policies)
        r(
            r"/v1/acl/policy/(?P<id>[^/]+)",
            **object_methods(self.acl_policy_read, self.acl_policy_put, self.acl_policy_delete),
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

    async def acl_token_write(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        """Creates a token, or with the accessor ID in the path updates that one."""
        body = await read_object(request)
        return reply(self.sim.create_token(body, accessor=p.get("id")), self.sim.index)

    async def acl_token_self(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        if t is None:
            raise bad_request("ACL support disabled")
        return reply(t, self.sim.table_index["acl_token"])

    async def acl_token_read(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        token = found(self.sim.tokens.get(p["id"]), "ACL token")
        return reply(token, self.sim.table_index["acl_token"])

    async def acl_token_delete(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        self.sim.delete_token(p["id"])
        return index_reply(self.sim.index)

    async def acl_policies(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        stubs = [
            {k: v for k, v in pol.items() if k != "Rules"}
            for pol in self.sim.policies.values()
            if _may_read_policy(t, pol["Name"])
        ]
        return reply(stubs, floored(self.sim.table_index["acl_policy"]))

    async def acl_policy_read(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        if not _may_read_policy(t, p["id"]):
            raise denied()
        pol = found(self.sim.policies.get(p["id"]), "ACL policy")
        return reply(pol, self.sim.table_index["acl_policy"])

    async def acl_policy_put(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        self.sim.put_policy(p["id"], await read_object(request))
        return index_reply(self.sim.index)

    async def acl_policy_delete(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        self.sim.delete_policy(p["id"])
        return index_reply(self.sim.index)


def _may_read_policy(token: JSON | None, name: str) -> bool:
    """Management tokens read every policy, client tokens the ones they carry."""
    return token is None or token["Type"] == "management" or name in (token["Policies"] or ())
