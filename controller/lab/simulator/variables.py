"""Nomad variables: paths, items and the check-and-set on writes and deletes."""

from __future__ import annotations

import bisect
import re
from typing import Any

from controller.lab.simulator.store import Store
from controller.lab.simulator.util import JSON, bad_request, now_ns

VAR_PATH = re.compile(r"^[a-zA-Z0-9\-_~/]{1,128}$")
VarKey = tuple[str, str]  # (namespace, path)


class VariableRegistry:
    def __init__(self, store: Store) -> None:
        self.store = store
        self.vars: dict[VarKey, JSON] = {}
        self._keys: list[VarKey] = []  # sorted, for namespace and prefix listings

    def var_keys(self, namespace: str, prefix: str) -> list[VarKey]:
        keys = self._keys if namespace == "*" else [k for k in self._keys if k[0] == namespace]
        return [k for k in keys if k[1].startswith(prefix)]

    def put_variable(
        self, namespace: str, path: str, items: Any, cas: int | None
    ) -> tuple[int, JSON]:
        """(200, variable) or (409, current variable or zero value)."""
        _check_path(path)
        if not isinstance(items, dict) or not items:
            raise bad_request("variable missing Items")
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in items.items()):
            raise bad_request("variable Items must be a map of strings")
        key = (namespace, path)
        current = self.vars.get(key)
        conflict = _cas_conflict(current, cas)
        if conflict is not None:
            return 409, conflict
        txn = self.store.txn("VariableUpserted")
        now = now_ns()
        var = {
            "Namespace": namespace,
            "Path": path,
            "CreateIndex": current["CreateIndex"] if current else txn.index,
            "CreateTime": current["CreateTime"] if current else now,
            "ModifyIndex": txn.index,
            "ModifyTime": now,
            "Items": dict(items),
        }
        if current is None:
            bisect.insort(self._keys, key)
        self.vars[key] = var
        self.store.counters["variable_writes"] += 1
        txn.put("Variables", path, var_meta(var), "vars")
        self.store.commit(txn)
        return 200, var

    def delete_variable(
        self, namespace: str, path: str, cas: int | None
    ) -> tuple[int, JSON | None]:
        """(200, None) or (409, current variable or zero value)."""
        _check_path(path)
        key = (namespace, path)
        current = self.vars.get(key)
        conflict = _cas_conflict(current, cas)
        if conflict is not None:
            return 409, conflict
        if current is None:
            return 200, None
        txn = self.store.txn("VariableDeleted")
        del self.vars[key]
        self._keys.remove(key)
        self.store.counters["variable_writes"] += 1
        txn.put("Variables", path, var_meta(current), "vars")
        self.store.commit(txn)
        return 200, None


def var_meta(var: JSON) -> JSON:
    """The variable without its Items (list entries and events)."""
    return {k: v for k, v in var.items() if k != "Items"}


def _check_path(path: str) -> None:
    if not VAR_PATH.match(path):
        raise bad_request(f'invalid path "{path}"')
    if path.startswith("nomad/") and not (path == "nomad/jobs" or path.startswith("nomad/jobs/")):
        raise bad_request(
            '"nomad" is a reserved top-level directory path, '
            'but you may write variables to "nomad/jobs" or below'
        )


def _cas_conflict(current: JSON | None, cas: int | None) -> JSON | None:
    """What a mismatched check-and-set answers: the current variable, or the zero value."""
    if cas is None or (current["ModifyIndex"] if current else 0) == cas:
        return None
    return dict(current) if current else _zero_var()


def _zero_var() -> JSON:
    return {
        "Namespace": "",
        "Path": "",
        "CreateIndex": 0,
        "CreateTime": 0,
        "ModifyIndex": 0,
        "ModifyTime": 0,
        "Items": None,
    }
