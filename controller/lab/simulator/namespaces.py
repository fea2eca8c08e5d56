"""Namespaces: the `default` one a cluster starts with, and those an operator adds.

A write is one apply (no event: Nomad's stream has no namespace topic). As in Nomad, a
namespace that still holds live jobs, allocations or variables cannot be deleted, nor can
`default`, and a job may only be registered into a namespace that exists (the job
registry asks); variables may be written into any namespace name.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any

from controller.lab.simulator.jobspec import multierror
from controller.lab.simulator.store import TERMINAL, Store
from controller.lab.simulator.util import JSON, ApiError, bad_request

DEFAULT = "default"
_VALID_NAME = re.compile(r"^[a-zA-Z0-9-]{1,128}$")
_MAX_DESCRIPTION = 256


class NamespaceRegistry:
    def __init__(self, store: Store, variables: Callable[[], Iterable[tuple[str, str]]]) -> None:
        self.store = store
        self._variables_keys = variables  # (namespace, path) of every variable
        self.namespaces: dict[str, JSON] = {}
        self._create_default()

    def lose_state(self) -> None:
        """Store.lose_state: only the default namespace, written again."""
        self._create_default()

    def _create_default(self) -> None:
        """The leader's first write: the default namespace (then the clients register)."""
        txn = self.store.txn("NamespaceUpserted")
        body = {"Name": DEFAULT, "Description": "Default shared namespace"}
        self.namespaces = {DEFAULT: _namespace(body, txn.index, txn.index)}
        txn.tables.add("namespaces")
        self.store.commit(txn)

    def upsert(self, body: Any) -> int:
        if not isinstance(body, dict):
            raise bad_request("Failed to decode request body: expected a JSON object")
        name = body.get("Name")
        errors = []
        if not isinstance(name, str) or not _VALID_NAME.match(name):
            errors.append(f'invalid name "{name}". Must match regex {_VALID_NAME.pattern}')
        if len(str(body.get("Description") or "")) > _MAX_DESCRIPTION:
            errors.append(f"description longer than {_MAX_DESCRIPTION}")
        if errors or not isinstance(name, str):
            raise ApiError(500, f'Invalid namespace "{name}": {multierror(errors)}')
        txn = self.store.txn("NamespaceUpserted")
        old = self.namespaces.get(name)
        namespace = _namespace(body, old["CreateIndex"] if old else txn.index, txn.index)
        self.namespaces[name] = namespace
        txn.tables.add("namespaces")  # Nomad's event stream has no namespace topic
        self.store.commit(txn)
        return txn.index

    def delete(self, name: str) -> int:
        if name == DEFAULT:
            raise ApiError(500, "can not delete default namespace")
        if name in self.namespaces:
            problems = [
                f'namespace "{name}" has {what} in regions: [global]'
                for what, present in (
                    ("non-terminal jobs", self._live_jobs(name)),
                    ("non-terminal allocations", self._live_allocs(name)),
                    ("variables associated with it", self._variables(name)),
                )
                if present
            ]
            if problems:
                raise ApiError(500, multierror(problems))
        txn = self.store.txn("NamespaceDeleted")
        self.namespaces.pop(name, None)
        txn.tables.add("namespaces")
        self.store.commit(txn)
        return txn.index

    def _live_jobs(self, name: str) -> bool:
        return any(
            key[0] == name and self.store.job_status(rec) != "dead"
            for key, rec in self.store.jobs.items()
        )

    def _live_allocs(self, name: str) -> bool:
        return any(
            a["Namespace"] == name and a["ClientStatus"] not in TERMINAL
            for a in self.store.allocs.values()
        )

    def _variables(self, name: str) -> bool:
        return any(key[0] == name for key in self._variables_keys())


def _namespace(body: JSON, create_index: int, modify_index: int) -> JSON:
    return {
        "Name": body["Name"],
        "Description": body.get("Description") or "",
        "Quota": body.get("Quota") or "",
        "Capabilities": body.get("Capabilities"),
        "NodePoolConfiguration": body.get("NodePoolConfiguration"),
        "VaultConfiguration": body.get("VaultConfiguration"),
        "ConsulConfiguration": body.get("ConsulConfiguration"),
        "Meta": body.get("Meta") or None,
        "CreateIndex": create_index,
        "ModifyIndex": modify_index,
    }
