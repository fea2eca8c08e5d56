"""Routes: /v1/vars and /v1/var/:path."""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web

from controller.lab.simulator.acl_policy import Permissions
from controller.lab.simulator.authz import denied
from controller.lab.simulator.util import JSON, bad_request, not_found
from controller.lab.simulator.views import paginate
from controller.lab.simulator.wire import (
    AddRoute,
    block,
    namespace_of,
    parse_int,
    query_filter,
    read_json,
    reply,
    table_index,
)

if TYPE_CHECKING:
    from controller.lab.simulator.cluster import Simulator


# The query parameters that make a PUT a lock operation (`?lock-acquire`, no value).
LOCK_OPERATIONS = ("lock-acquire", "lock-renew", "lock-release")


class VariableRoutes:
    def __init__(self, sim: Simulator) -> None:
        self.sim = sim

    def register(self, r: AddRoute) -> None:
        r(r"/v1/vars", GET=self.vars_list)
        r(r"/v1/var/(?P<path>.+)", GET=self.var_read, PUT=self.var_put, DELETE=self.var_delete)

    async def vars_list(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        index = await block(self.sim, request, table_index(self.sim, "vars"))
        keep = query_filter(request)
        ns = namespace_of(request)
        permissions = self.sim.permissions(t)
        metas = [
            self._shown(self.sim.var_meta(self.sim.vars[k]), permissions, strip_lock=ns != "*")
            for k in self.sim.var_keys(ns, request.query.get("prefix", ""))
            if permissions is None or permissions.allow_variable_op(k[0], k[1], "list")
        ]
        page, nxt = paginate(
            metas,
            lambda v: v["Path"],
            request.query.get("next_token") or None,
            parse_int(request, "per_page") or 0,
            keep,
        )
        resp = reply(page, index)
        if nxt is not None:
            resp.headers["X-Nomad-NextToken"] = nxt
        return resp

    async def var_read(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        key = (namespace_of(request), p["path"])
        permissions = self._permitted(t, key[0], key[1], "read")

        def index_of() -> int:
            var = self.sim.vars.get(key)
            return int(var["ModifyIndex"]) if var else self.sim.table_index["vars"]

        index = await block(self.sim, request, index_of)
        var = self.sim.vars.get(key)
        if var is None:
            raise not_found("variable")
        return reply(self._shown(var, permissions), index)

    async def var_put(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        operations = [op for op in LOCK_OPERATIONS if op in request.query]
        if len(operations) > 1:
            raise bad_request("multiple lock operations")
        body = await read_json(request)
        if not isinstance(body, dict):
            raise bad_request("Failed to decode request body: expected a JSON object")
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
        return web.Response(status=200, headers={"X-Nomad-Index": str(self.sim.index)})

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
