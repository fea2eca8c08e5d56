"""Routes: /v1/vars and /v1/var/:path."""

from __future__ import annotations

from aiohttp import web

from controller.lab.simulator.acl_policy import Permissions
from controller.lab.simulator.authz import denied
from controller.lab.simulator.routes import (
    RouteGroup,
    index_reply,
    read_object,
    with_next_token,
)
from controller.lab.simulator.util import JSON, ApiError, bad_request
from controller.lab.simulator.views import paginate
from controller.lab.simulator.wire import (
    AddRoute,
    floored,
    namespace_of,
    parse_int,
    reply,
)

# The query parameters that make a PUT a lock operation (`?lock-acquire`, no value).
LOCK_OPERATIONS = ("lock-acquire", "lock-renew", "lock-release")


class VariableRoutes(RouteGroup):
    def register(self, r: AddRoute) -> None:
        r(r"/v1/vars", GET=self.vars_list)
        r(r"/v1/var/(?P<path>.+)", GET=self.var_read, PUT=self.var_put, DELETE=self.var_delete)

    async def vars_list(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        query = await self.list_query(request, "vars")
        ns = query.namespace
        permissions = self.sim.permissions(t)
        metas = [
            self._shown(self.sim.var_meta(self.sim.vars[k]), permissions, strip_lock=ns != "*")
            for k in self.sim.var_keys(ns, query.prefix)
            if permissions is None or permissions.allow_variable_op(k[0], k[1], "list")
        ]
        page, nxt = paginate(
            metas,
            lambda v: v["Path"],
            request.query.get("next_token") or None,
            parse_int(request, "per_page") or 0,
            query.keep,
        )
        return with_next_token(reply(page, floored(query.index)), nxt)

    async def var_read(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        key = (namespace_of(request), p["path"])
        permissions = self._permitted(t, key[0], key[1], "read")
        index = await self.block_on_object(request, "vars", lambda: self.sim.vars.get(key))
        var = self.sim.vars.get(key)
        if var is None:
            # With the index of the variables table (at least 1): a blocking read can go
            # on from it until the variable comes.
            raise ApiError(404, "variable not found", floored(index))
        return reply(self._shown(var, permissions), index)

    async def var_put(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        operations = [op for op in LOCK_OPERATIONS if op in request.query]
        if len(operations) > 1:
            raise bad_request("multiple lock operations")
        body = await read_object(request)
        ns = request.query.get("namespace") or body.get("Namespace") or "default"
        path, items, lock = p["path"], body.get("Items"), body.get("Lock")
        # Every write, lock operations included, needs `write` on the path.
        permissions = self._permitted(t, ns, path, "write")
        operation = operations[0] if operations else None
        if operation == "lock-renew":
            lock_id = lock.get("ID") if isinstance(lock, dict) else None
            meta = self.sim.renew_lock(ns, path, lock_id)
            return reply(meta, meta["ModifyIndex"])
        if operation == "lock-acquire":
            status, var = self.sim.acquire_lock(ns, path, items, lock)
        elif operation == "lock-release":
            status, var = self.sim.release_lock(ns, path, lock, items)
        else:
            status, var = self.sim.put_variable(ns, path, items, parse_int(request, "cas"), lock)
        index = var["ModifyIndex"] or self.sim.index
        if status == 409:
            return reply(self._conflict(var, permissions, ns, path), index, status)
        # The holder (the request names the lock) and management tokens see the lock.
        owner = isinstance(lock, dict) and lock.get("ID") == var.get("Lock", {}).get("ID")
        return reply(var if owner or operation else self._shown(var, permissions), index)

    async def var_delete(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        ns = namespace_of(request)
        permissions = self._permitted(t, ns, p["path"], "destroy")
        status, conflict = self.sim.delete_variable(ns, p["path"], parse_int(request, "cas"))
        if conflict is not None:
            shown = self._conflict(conflict, permissions, ns, p["path"])
            return reply(shown, self.sim.index, status)
        return index_reply(self.sim.index)

    def _permitted(
        self, token: JSON | None, namespace: str, path: str, capability: str
    ) -> Permissions | None:
        permissions = self.sim.permissions(token)
        if permissions is not None and not permissions.allow_variable_op(
            namespace, path, capability
        ):
            raise denied()
        return permissions

    @staticmethod
    def _shown(var: JSON, permissions: Permissions | None, strip_lock: bool = True) -> JSON:
        """What a reader sees: only management tokens see a variable's lock."""
        if permissions is None or permissions.management or not strip_lock or "Lock" not in var:
            return var
        return {k: v for k, v in var.items() if k != "Lock"}

    @staticmethod
    def _conflict(
        conflict: JSON, permissions: Permissions | None, namespace: str, path: str
    ) -> JSON:
        """A conflict shows its Items only to callers that may read the variable."""
        if permissions is None or permissions.allow_variable_op(namespace, path, "read"):
            return conflict
        return {**conflict, "Items": None}
