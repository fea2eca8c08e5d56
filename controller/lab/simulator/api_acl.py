"""Routes: /v1/acl (bootstrap, tokens, one-time tokens, policies, roles)."""

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
    write_reply,
)
from controller.lab.simulator.util import JSON, ApiError, bad_request
from controller.lab.simulator.wire import AddRoute, floored, read_json, reply


class AclRoutes(RouteGroup):
    def register(self, r: AddRoute) -> None:
        r(r"/v1/acl/bootstrap", **put_or_post(self.acl_bootstrap))
        r(r"/v1/acl/tokens", GET=self.acl_tokens)
        r(r"/v1/acl/token", **put_or_post(self.acl_token_write))
        r(r"/v1/acl/token/self", GET=self.acl_token_self)
        r(r"/v1/acl/token/onetime", **put_or_post(self.acl_one_time_token))
        r(r"/v1/acl/token/onetime/exchange", **put_or_post(self.acl_one_time_exchange))
        r(r"/v1/acl/roles", GET=self.acl_roles)
        r(r"/v1/acl/role", **put_or_post(self.acl_role_write))
        r(r"/v1/acl/role/name/(?P<name>[^/]+)", GET=self.acl_role_by_name)
        r(
            r"/v1/acl/role/(?P<id>[^/]+)",
            **object_methods(self.acl_role_read, self.acl_role_write, self.acl_role_delete),
        )
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
        body = await read_json(request, required=False) or {}
        secret = body.get("BootstrapSecret") if isinstance(body, dict) else None
        return reply(self.sim.acl.bootstrap(str(secret or "")), self.sim.index)

    async def acl_tokens(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        acl = self.sim.acl
        stubs = [
            {k: v for k, v in acl.shown(tok).items() if k != "SecretID"}
            for tok in self.sim.tokens.values()
        ]
        return reply(stubs, self.sim.table_index["acl_token"])

    async def acl_token_write(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        """Creates a token, or with the accessor ID in the path updates that one (or
        uploads one made elsewhere, with its AccessorID and SecretID)."""
        body = await read_object(request)
        accessor = p.get("id")
        if accessor is not None and body.get("AccessorID") not in (None, "", accessor):
            raise bad_request("ACL token accessor does not match request path")
        return reply(self.sim.create_token(body, accessor=accessor), self.sim.index)

    async def acl_token_self(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        if t is None:
            raise bad_request("ACL support disabled")
        return reply(self.sim.acl.shown(t), self.sim.table_index["acl_token"])

    async def acl_token_read(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        token = found(self.sim.tokens.get(p["id"]), "ACL token")
        return reply(self.sim.acl.shown(token), self.sim.table_index["acl_token"])

    async def acl_one_time_token(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        return write_reply(self.sim.acl.one_time_token(t))

    async def acl_one_time_exchange(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        body = await read_object(request)
        return write_reply(self.sim.acl.exchange_one_time_token(body.get("OneTimeSecretID")))

    async def acl_roles(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        prefix = request.query.get("prefix", "")
        roles = [
            r
            for r in self.sim.acl.roles.values()
            if r["ID"].startswith(prefix) and _may_read_role(t, r["ID"])
        ]
        return reply(roles, floored(self.sim.table_index["acl_roles"]))

    async def acl_role_write(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        body = await read_object(request)
        role_id = p.get("id", "")
        if role_id and body.get("ID") not in (None, "", role_id):
            raise bad_request("ACL role ID does not match request path")
        role = self.sim.acl.upsert_role(body, role_id)
        return reply(role, role["ModifyIndex"])

    async def acl_role_read(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        return self._role(t, self.sim.acl.roles.get(p["id"]))

    async def acl_role_by_name(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        return self._role(t, self.sim.acl.role_named(p["name"]))

    def _role(self, token: JSON | None, role: JSON | None) -> web.Response:
        if role is not None and not _may_read_role(token, role["ID"]):
            raise denied()
        index = self.sim.table_index["acl_roles"]
        if role is None:
            raise ApiError(404, "ACL role not found", index)
        return reply(role, role["ModifyIndex"])

    async def acl_role_delete(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        return index_reply(self.sim.acl.delete_role(p["id"]))

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


def _may_read_role(token: JSON | None, role_id: str) -> bool:
    """Management tokens read every role, client tokens the ones they link to."""
    if token is None or token["Type"] == "management":
        return True
    return any(link["ID"] == role_id for link in token.get("Roles") or ())


def _may_read_policy(token: JSON | None, name: str) -> bool:
    """Management tokens read every policy, client tokens the ones they carry."""
    return token is None or token["Type"] == "management" or name in (token["Policies"] or ())
