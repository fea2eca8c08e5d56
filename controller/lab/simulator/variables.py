"""Nomad variables: paths, items, the check-and-set on writes and deletes, and locks.

A lock lives inside its variable (`Lock`: `ID`, `TTL`, `LockDelay`); the holder proves it
holds the lock with the `ID`. docs/simulator.md ("Variable locks") says which parts come
from Nomad's source and which are inferred.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass
from typing import Any

from controller.lab.simulator.keys import SortedKeys
from controller.lab.simulator.store import Store
from controller.lab.simulator.util import (
    JSON,
    ApiError,
    bad_request,
    format_go_duration,
    now_ns,
    parse_go_duration,
)

VAR_PATH = re.compile(r"^[a-zA-Z0-9\-_~/]{1,128}$")
VarKey = tuple[str, str]  # (namespace, path)

# nomad/structs/variables.go: the TTL bounds and the defaults an empty field gets.
MIN_LOCK_TTL = 10.0
MAX_LOCK_TTL = 24 * 3600.0
DEFAULT_LOCK_TTL = 15.0
DEFAULT_LOCK_DELAY = 15.0
# Nomad's lock timer waits twice the TTL (nomad/locks.go: a grace period for the holder).
TTL_GRACE_FACTOR = 2


@dataclass
class HeldLock:
    """The server side of a lock: its timer. `ttl_timer` is None once the TTL ran out
    unrenewed: the lock delay is running and the lock can no longer be renewed."""

    lock_id: str
    ttl: float
    delay: float
    ttl_timer: asyncio.Handle | None


class VariableRegistry:
    def __init__(self, store: Store, lock_time_scale: float = 1.0) -> None:
        self.store = store
        self.vars: dict[VarKey, JSON] = {}
        self._keys = SortedKeys()
        self.locks: dict[VarKey, HeldLock] = {}
        # Real seconds per lock second: tests shrink Nomad's 10 s minimum TTL this way.
        self.lock_time_scale = lock_time_scale

    def var_keys(self, namespace: str, prefix: str) -> list[VarKey]:
        return self._keys.listed(namespace, prefix)

    def lose_state(self) -> None:
        """Store.lose_state: no variable, no lock (their timers stop)."""
        for key in list(self.locks):
            self._drop_lock(key)
        self.vars.clear()
        self._keys.clear()

    # ------------------------------------------------------------------ plain writes
    def put_variable(
        self, namespace: str, path: str, items: Any, cas: int | None, lock: Any = None
    ) -> tuple[int, JSON]:
        """(200, variable) or (409, current variable or zero value).

        `lock` is the request's `Lock` object: a locked variable takes writes only from
        the holder, who names the lock's `ID`.
        """
        _check_path(path)
        _check_items(items, allow_empty=False)
        key = (namespace, path)
        current = self.vars.get(key)
        if current is None and lock is not None:
            raise bad_request("variable should not contain lock definition")
        if current is not None and not _names_held_lock(current, lock):
            return 409, _zero_var(namespace, path)
        conflict = _cas_conflict(current, cas, namespace, path)
        if conflict is not None:
            return 409, conflict
        return 200, self._write(key, current, dict(items), current.get("Lock") if current else None)

    def delete_variable(
        self, namespace: str, path: str, cas: int | None
    ) -> tuple[int, JSON | None]:
        """(200, None) or (409, current variable or zero value)."""
        _check_path(path)
        key = (namespace, path)
        current = self.vars.get(key)
        if current is not None and "Lock" in current:
            # A DELETE carries no lock ID: a locked variable is released before it goes.
            return 409, _zero_var(namespace, path)
        conflict = _cas_conflict(current, cas, namespace, path)
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

    # ------------------------------------------------------------------ locks
    def acquire_lock(self, namespace: str, path: str, items: Any, lock: Any) -> tuple[int, JSON]:
        """(200, variable with its new Lock) or (409, zero value) when a lock is held.

        A new variable may be created without items; items given replace the old ones.
        """
        _check_path(path)
        if items is not None:
            _check_items(items, allow_empty=True)
        spec = lock if isinstance(lock, dict) else {}
        ttl = _lock_duration(spec.get("TTL"), DEFAULT_LOCK_TTL)
        delay = _lock_duration(spec.get("LockDelay"), DEFAULT_LOCK_DELAY)
        if ttl < 0 or delay < 0:
            raise ApiError(500, "Lock delay and TTL must be positive")
        if not MIN_LOCK_TTL <= ttl <= MAX_LOCK_TTL:
            raise ApiError(500, "TTL must be between 10 seconds and 24 hours")
        key = (namespace, path)
        current = self.vars.get(key)
        if current is not None and "Lock" in current:
            return 409, _zero_var(namespace, path)
        lock_id = spec.get("ID") or self.store.new_id()
        kept = current["Items"] if current else {}
        new_lock = {
            "ID": lock_id,
            "TTL": format_go_duration(ttl),
            "LockDelay": format_go_duration(delay),
        }
        var = self._write(key, current, dict(items) if items else dict(kept), new_lock)
        timer = self._later(ttl * TTL_GRACE_FACTOR, self._ttl_expired, key, lock_id)
        self.locks[key] = HeldLock(lock_id, ttl, delay, timer)
        return 200, var

    def renew_lock(self, namespace: str, path: str, lock_id: Any) -> JSON:
        """The variable's metadata; nothing is written (the index stays)."""
        if not isinstance(lock_id, str) or not lock_id:
            raise bad_request("missing lock ID")
        key = (namespace, path)
        current = self._locked(key)
        held = self.locks.get(key)
        if current["Lock"]["ID"] != lock_id or held is None or held.ttl_timer is None:
            # A lock whose TTL ran out is still in the variable until the lock delay ends.
            raise ApiError(409, "attempting to modify locked variable")
        held.ttl_timer.cancel()
        held.ttl_timer = self._later(held.ttl * TTL_GRACE_FACTOR, self._ttl_expired, key, lock_id)
        return var_meta(current)

    def release_lock(self, namespace: str, path: str, lock: Any, items: Any) -> tuple[int, JSON]:
        """(200, the variable without its lock and items) or (409, zero value)."""
        if items:
            raise bad_request("lock release operation doesn't take variable items")
        lock_id = lock.get("ID") if isinstance(lock, dict) else None
        if not lock_id:
            raise bad_request("missing lock information")
        _check_path(path)
        key = (namespace, path)
        current = self._locked(key)
        if current["Lock"]["ID"] != lock_id:
            return 409, _zero_var(namespace, path)
        self._drop_lock(key)
        released = var_meta(self._write(key, current, current["Items"], None))
        return 200, released

    def _locked(self, key: VarKey) -> JSON:
        """The variable at `key`, which must hold a lock (renew and release)."""
        current = self.vars.get(key)
        if current is None:
            raise ApiError(404, "variable doesn't exist")
        if "Lock" not in current:
            raise ApiError(409, "variable doesn't hold a lock")
        return current

    def _ttl_expired(self, key: VarKey, lock_id: str) -> None:
        held = self.locks.get(key)
        if held is None or held.lock_id != lock_id:
            return
        held.ttl_timer = None
        self._later(held.delay, self._lock_delay_over, key, lock_id)

    def _lock_delay_over(self, key: VarKey, lock_id: str) -> None:
        held = self.locks.get(key)
        current = self.vars.get(key)
        if held is None or held.lock_id != lock_id or current is None:
            return  # released (or re-acquired) during the delay
        self._drop_lock(key)
        self._write(key, current, current["Items"], None)

    def _drop_lock(self, key: VarKey) -> None:
        held = self.locks.pop(key)
        if held.ttl_timer is not None:
            held.ttl_timer.cancel()

    def _later(self, lock_seconds: float, fn: Any, *args: Any) -> asyncio.Handle:
        return self.store.later(lock_seconds * self.lock_time_scale, fn, *args)

    # ------------------------------------------------------------------ the one write
    def _write(
        self, key: VarKey, current: JSON | None, items: dict[str, str], lock: JSON | None
    ) -> JSON:
        """Store the variable (one apply, one `VariableUpserted` event) and return it."""
        txn = self.store.txn("VariableUpserted")
        now = now_ns()
        var: JSON = {
            "Namespace": key[0],
            "Path": key[1],
            "CreateIndex": current["CreateIndex"] if current else txn.index,
            "CreateTime": current["CreateTime"] if current else now,
            "ModifyIndex": txn.index,
            "ModifyTime": now,
            "Items": items,
        }
        if lock is not None:
            var["Lock"] = lock
        if current is None:
            self._keys.add(key)
        self.vars[key] = var
        self.store.counters["variable_writes"] += 1
        txn.put("Variables", key[1], var_meta(var), "vars")
        self.store.commit(txn)
        return var


def var_meta(var: JSON) -> JSON:
    """The variable without its Items (list entries, events, renew answers)."""
    return {k: v for k, v in var.items() if k != "Items"}


def _check_path(path: str) -> None:
    if not VAR_PATH.match(path):
        raise bad_request(f'invalid path "{path}"')
    if path.startswith("nomad/") and not (path == "nomad/jobs" or path.startswith("nomad/jobs/")):
        raise bad_request(
            '"nomad" is a reserved top-level directory path, '
            'but you may write variables to "nomad/jobs" or below'
        )


def _check_items(items: Any, allow_empty: bool) -> None:
    if not isinstance(items, dict) or not (items or allow_empty):
        raise bad_request("variable missing required Items object")
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in items.items()):
        raise bad_request("variable Items must be a map of strings")


def _names_held_lock(current: JSON, lock: Any) -> bool:
    """Whether a write may touch `current`: it is unlocked, or the request names its lock."""
    held = current.get("Lock")
    return held is None or (isinstance(lock, dict) and lock.get("ID") == held["ID"])


def _lock_duration(raw: Any, default: float) -> float:
    """A lock's TTL or LockDelay: a Go duration string or nanoseconds; empty or 0 is the
    default (VariableLock.Canonicalize)."""
    if raw in (None, "", 0):
        return default
    if isinstance(raw, bool) or not isinstance(raw, str | int | float):
        raise bad_request("Failed to decode request body: lock durations are strings")
    try:
        seconds = parse_go_duration(raw) if isinstance(raw, str) else raw / 1e9
    except ValueError as exc:
        raise bad_request(f"Failed to decode request body: {exc}") from None
    return seconds or default


def _cas_conflict(current: JSON | None, cas: int | None, namespace: str, path: str) -> JSON | None:
    """What a mismatched check-and-set answers: the current variable, or the zero value."""
    if cas is None or (current["ModifyIndex"] if current else 0) == cas:
        return None
    return dict(current) if current else _zero_var(namespace, path)


def _zero_var(namespace: str, path: str) -> JSON:
    """The conflict body that shows nothing of a variable but where it is."""
    return {
        "Namespace": namespace,
        "Path": path,
        "CreateIndex": 0,
        "CreateTime": 0,
        "ModifyIndex": 0,
        "ModifyTime": 0,
        "Items": None,
        "Lock": None,
    }
