"""Writing shared records with check-and-set, written once for all of them.

A check-and-set names the ModifyIndex the writer last saw (0: the variable must not
exist); Nomad refuses it when another write came between (409, with the variable as it is
now). Which records are written how:

- created once, never over another's (`create`): claims, request records, drain records;
- written over what was last read, again over a newer one (`write_over`): catalog records
  (another holder's, after a lease moved), managed environments;
- written whatever is there (`cas=None`): a process's own member and waiting records,
  the doorbell;
- deleted only as last read (`delete_unchanged`): a record another process wrote again
  meanwhile is theirs and stays.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from controller.nomad.errors import NomadConflict
from controller.nomad.port import Variables


async def create(
    port: Variables, path: str, items: dict[str, str], namespace: str
) -> tuple[dict[str, Any], bool]:
    """Write a new record (cas=0). Returns the variable and True when this call created
    it, or the variable Nomad holds and False when it existed (it may be only a path
    when the token may not read it)."""
    try:
        return await port.put_variable(path, items, namespace, cas=0), True
    except NomadConflict as conflict:
        return dict(conflict.current or {"Path": path}), False


async def write_over(
    port: Variables,
    path: str,
    items: dict[str, str],
    namespace: str,
    *,
    cas: int,
    attempts: int,
) -> tuple[dict[str, Any] | None, int]:
    """Write `items` over the version with ModifyIndex `cas`, and where another write came
    between, over that one: at most `attempts` times. Returns the stored variable (None:
    it kept changing) and the index it was written over (0: it was created)."""
    for _ in range(attempts):
        try:
            return await port.put_variable(path, items, namespace, cas=cas), cas
        except NomadConflict as conflict:
            cas = index_of(conflict.current)
    return None, cas


async def delete_unchanged(port: Variables, path: str, namespace: str, index: int) -> bool:
    """Delete a record unless it changed since ModifyIndex `index`; False when it did."""
    try:
        await port.delete_variable(path, namespace, cas=index)
    except NomadConflict:
        return False
    return True


def index_of(variable: Mapping[str, Any] | None) -> int:
    """A variable's ModifyIndex (0 for none: a check-and-set that creates)."""
    return int((variable or {}).get("ModifyIndex", 0))
