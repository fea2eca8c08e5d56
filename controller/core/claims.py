"""Claim records: the Nomad variable `poolkeeper/claims/<runnerId>` that says a runner is
held, by whom and until when, and the changes a claim goes through.

A claim is created with check-and-set 0 and every later change is a check-and-set on the
ModifyIndex last read (docs/reference.md, "What poolkeeper keeps in Nomad"); the I/O of
that lives in `controller.records.claims`. Everything here is pure.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from controller.core.fields import int_field, str_field
from controller.core.paths import CLAIMS_PREFIX, REQUESTS_PREFIX, claim_path, request_path
from controller.core.runner_ids import RUNNER_ID_PATTERN
from controller.core.times import format_time, parse_time

TOMBSTONE_RETENTION = timedelta(minutes=10)

# Claim items this module understands; anything else is kept in ClaimRecord.extra.
_ITEM_POOL = "pool"
_ITEM_ALLOCATION = "allocationId"
_ITEM_CLAIMED_AT = "claimedAt"
_ITEM_EXPIRES_AT = "expiresAt"
_ITEM_TIMEOUT = "inactivityTimeoutSeconds"
_ITEM_REQUEST = "requestId"
_ITEM_STATE = "state"
_ITEM_RESTARTS = "allocationRestarts"
_ITEM_NODE = "nodeName"
# Items of request records, not of claims.
_ITEM_RUNNER = "runnerId"
_ITEM_RUNNERS = "runnerIds"  # a batch: its runners, comma-separated
_ITEM_POOLS = "pools"  # a claim from a list of pools: the list, comma-separated
_ITEM_COUNT = "count"  # a batch: how many runners it claims
# When its claimer answers at the latest (its wait, and a grace); an empty record past it
# belongs to a claimer that died, and whoever repeats the request takes it over.
_ITEM_SERVED_UNTIL = "servedUntil"
_REQUEST_ITEMS = frozenset(
    {_ITEM_POOL, _ITEM_RUNNER, _ITEM_RUNNERS, _ITEM_POOLS, _ITEM_COUNT, _ITEM_SERVED_UNTIL}
)
_KNOWN_ITEMS = frozenset(
    {
        _ITEM_POOL,
        _ITEM_ALLOCATION,
        _ITEM_CLAIMED_AT,
        _ITEM_EXPIRES_AT,
        _ITEM_TIMEOUT,
        _ITEM_REQUEST,
        _ITEM_STATE,
        _ITEM_RESTARTS,
        _ITEM_NODE,
    }
)


class ClaimState(StrEnum):
    CLAIMED = "claimed"
    RELEASED = "released"
    EXPIRED = "expired"
    LOST = "lost"
    RETIRED = "retired"


class MalformedClaim(ValueError):
    """A claim variable whose required items are missing or unparseable."""


def runner_id_from_claim_path(path: str) -> str | None:
    """The runner ID of a claim variable path, or None for any other path."""
    if not path.startswith(CLAIMS_PREFIX):
        return None
    runner_id = path[len(CLAIMS_PREFIX) :]
    return runner_id if RUNNER_ID_PATTERN.match(runner_id) else None


@dataclass(frozen=True, slots=True)
class ClaimRecord:
    runner_id: str
    namespace: str
    modify_index: int
    modify_time_ns: int
    pool: str
    allocation_id: str
    claimed_at: datetime
    expires_at: datetime
    inactivity_timeout_seconds: int
    request_id: str | None = None
    state: ClaimState = ClaimState.CLAIMED
    allocation_restarts: int | None = None
    node_name: str = ""  # where the claimed allocation runs, as seen at claim time
    extra: dict[str, str] = field(default_factory=dict, hash=False)

    @classmethod
    def from_variable(cls, var: Mapping[str, Any]) -> ClaimRecord:
        """From a Nomad variable read: {"Namespace","Path","ModifyIndex","ModifyTime","Items"}."""
        path = var.get("Path")
        runner_id = runner_id_from_claim_path(path) if isinstance(path, str) else None
        if runner_id is None:
            raise MalformedClaim(f"not a claim variable path: {path!r}")
        items = var.get("Items")
        if not isinstance(items, Mapping):
            raise MalformedClaim(f"claim {runner_id}: no Items")

        def required(key: str) -> str:
            value = items.get(key)
            if not isinstance(value, str) or not value:
                raise MalformedClaim(f"claim {runner_id}: item {key!r} missing")
            return value

        try:
            claimed_at = parse_time(required(_ITEM_CLAIMED_AT))
            expires_at = parse_time(required(_ITEM_EXPIRES_AT))
            timeout = _parse_count(required(_ITEM_TIMEOUT))
            restarts_text = items.get(_ITEM_RESTARTS)
            restarts = (
                _parse_count(restarts_text)
                if isinstance(restarts_text, str) and restarts_text
                else None
            )
            state_text = items.get(_ITEM_STATE)
            # Unknown states (a newer writer?) are refused rather than guessed: a
            # malformed claim keeps its runner untouched and reported.
            state = ClaimState(state_text) if state_text else ClaimState.CLAIMED
        except ValueError as error:
            raise MalformedClaim(f"claim {runner_id}: {error}") from error
        allocation_id = items.get(_ITEM_ALLOCATION)
        # A tombstone may name no allocation: a runner retired before it was ever placed.
        # A live claim always names the allocation it was made on.
        if not isinstance(allocation_id, str) or (
            not allocation_id and state is ClaimState.CLAIMED
        ):
            raise MalformedClaim(f"claim {runner_id}: item {_ITEM_ALLOCATION!r} missing")
        request_id = items.get(_ITEM_REQUEST)
        node_name = items.get(_ITEM_NODE)
        return cls(
            runner_id=runner_id,
            namespace=str_field(var, "Namespace", "default") or "default",
            modify_index=int_field(var, "ModifyIndex"),
            modify_time_ns=int_field(var, "ModifyTime"),
            pool=required(_ITEM_POOL),
            allocation_id=allocation_id,
            claimed_at=claimed_at,
            expires_at=expires_at,
            inactivity_timeout_seconds=timeout,
            request_id=request_id if isinstance(request_id, str) and request_id else None,
            state=state,
            allocation_restarts=restarts,
            node_name=node_name if isinstance(node_name, str) else "",
            extra={
                str(k): v for k, v in items.items() if k not in _KNOWN_ITEMS and isinstance(v, str)
            },
        )

    @classmethod
    def new(
        cls,
        *,
        runner_id: str,
        namespace: str,
        pool: str,
        allocation_id: str,
        now: datetime,
        inactivity_timeout_seconds: int,
        request_id: str | None = None,
        allocation_restarts: int | None = None,
        node_name: str = "",
    ) -> ClaimRecord:
        """A fresh claim, to be written with cas=0."""
        return cls(
            runner_id=runner_id,
            namespace=namespace,
            modify_index=0,
            modify_time_ns=0,
            pool=pool,
            allocation_id=allocation_id,
            claimed_at=now,
            expires_at=now + timedelta(seconds=inactivity_timeout_seconds),
            inactivity_timeout_seconds=inactivity_timeout_seconds,
            request_id=request_id,
            allocation_restarts=allocation_restarts,
            node_name=node_name,
        )

    @property
    def path(self) -> str:
        return claim_path(self.runner_id)

    @property
    def is_tombstone(self) -> bool:
        return self.state is not ClaimState.CLAIMED

    def is_expired(self, now: datetime) -> bool:
        return now >= self.expires_at

    def stored(self, modify_index: int, modify_time_ns: int) -> ClaimRecord:
        """The record as Nomad stored it, with the index and time of that write: what
        `from_variable` reads back, without parsing it (every claim makes one; built
        directly, at half the cost of `dataclasses.replace`)."""
        return ClaimRecord(
            runner_id=self.runner_id,
            namespace=self.namespace,
            modify_index=modify_index,
            modify_time_ns=modify_time_ns,
            pool=self.pool,
            allocation_id=self.allocation_id,
            claimed_at=self.claimed_at,
            expires_at=self.expires_at,
            inactivity_timeout_seconds=self.inactivity_timeout_seconds,
            request_id=self.request_id,
            state=self.state,
            allocation_restarts=self.allocation_restarts,
            node_name=self.node_name,
            extra=self.extra,
        )

    def with_state(self, state: ClaimState) -> ClaimRecord:
        return dataclasses.replace(self, state=state)

    def kept_alive(self, now: datetime) -> ClaimRecord:
        """The claim with its deadline moved to now + its inactivity timeout."""
        return dataclasses.replace(
            self, expires_at=now + timedelta(seconds=self.inactivity_timeout_seconds)
        )

    def to_items(self) -> dict[str, str]:
        # Unknown items first so a known item can never be shadowed by a stale copy.
        items = dict(self.extra)
        items.update(
            {
                _ITEM_POOL: self.pool,
                _ITEM_ALLOCATION: self.allocation_id,
                _ITEM_CLAIMED_AT: format_time(self.claimed_at),
                _ITEM_EXPIRES_AT: format_time(self.expires_at),
                _ITEM_TIMEOUT: str(self.inactivity_timeout_seconds),
                _ITEM_STATE: str(self.state),
            }
        )
        if self.request_id is not None:
            items[_ITEM_REQUEST] = self.request_id
        if self.allocation_restarts is not None:
            items[_ITEM_RESTARTS] = str(self.allocation_restarts)
        if self.node_name:
            items[_ITEM_NODE] = self.node_name
        return items

    @property
    def gone_reason(self) -> str:
        """Why a tombstoned runner is gone, as the API reports it (410 `reason`)."""
        return GONE_REASONS.get(self.state, "Released")


GONE_REASONS = {
    ClaimState.RELEASED: "Released",
    ClaimState.EXPIRED: "Expired",
    ClaimState.LOST: "AllocationLost",
    ClaimState.RETIRED: "Retired",
}


def _parse_count(text: str) -> int:
    if not text.isascii() or not text.isdigit():
        raise ValueError(f"not a non-negative decimal integer: {text!r}")
    return int(text)


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """`poolkeeper/requests/<requestId>`: what a requestId asked for and, once known, which
    runners it claimed. Created with cas=0 before the claims, so a requestId claims at
    most once per Nomad namespace.

    Items: `pool` (the pool claimed from; until then the first pool asked for), `pools`
    (a claim from a list of pools: the list), `count` (a batch: how many runners) and,
    once the claims are written, `runnerId` (one runner) or `runnerIds` (a batch);
    `servedUntil`, when its claimer answers at the latest."""

    request_id: str
    namespace: str
    pool: str
    pools: tuple[str, ...] = ()  # only for a list of more than one pool
    count: int | None = None  # None: one runner, not a batch
    runner_ids: tuple[str, ...] = ()
    modify_index: int = 0
    extra: dict[str, str] = field(default_factory=dict, hash=False)
    served_until: datetime | None = None  # None: written by a version that did not say

    @classmethod
    def new(
        cls,
        request_id: str,
        namespace: str,
        pools: tuple[str, ...],
        count: int | None,
        served_until: datetime | None = None,
    ) -> RequestRecord:
        many = pools if len(pools) > 1 else ()
        return cls(request_id, namespace, pools[0], many, count, served_until=served_until)

    def abandoned(self, now: datetime) -> bool:
        """Empty past the time its claimer would have answered: the claimer died."""
        return not self.runner_ids and self.served_until is not None and now > self.served_until

    @classmethod
    def from_variable(cls, var: Mapping[str, Any]) -> RequestRecord:
        path = str_field(var, "Path")
        items = var.get("Items")
        items = items if isinstance(items, Mapping) else {}
        runners = items.get(_ITEM_RUNNERS) or items.get(_ITEM_RUNNER)
        pools = items.get(_ITEM_POOLS)
        count = items.get(_ITEM_COUNT)
        served = items.get(_ITEM_SERVED_UNTIL)
        try:
            served_until = parse_time(served) if isinstance(served, str) else None
        except ValueError:
            served_until = None
        return cls(
            request_id=path.removeprefix(REQUESTS_PREFIX),
            namespace=str_field(var, "Namespace", "default") or "default",
            pool=str(items.get(_ITEM_POOL, "")),
            pools=tuple(pools.split(",")) if isinstance(pools, str) and pools else (),
            count=int(count) if isinstance(count, str) and count.isdigit() else None,
            runner_ids=tuple(runners.split(",")) if isinstance(runners, str) and runners else (),
            modify_index=int_field(var, "ModifyIndex"),
            extra={
                str(k): v
                for k, v in items.items()
                if k not in _REQUEST_ITEMS and isinstance(v, str)
            },
            served_until=served_until,
        )

    @property
    def path(self) -> str:
        return request_path(self.request_id)

    @property
    def asked(self) -> tuple[tuple[str, ...], int | None]:
        """What the request asked for: the pools in order and the batch size. A repeat
        must ask for the same."""
        return (self.pools or (self.pool,), self.count)

    def completed(self, pool: str, runner_ids: tuple[str, ...]) -> RequestRecord:
        return dataclasses.replace(self, pool=pool, runner_ids=runner_ids)

    def to_items(self) -> dict[str, str]:
        items = {**self.extra, _ITEM_POOL: self.pool}
        if self.pools:
            items[_ITEM_POOLS] = ",".join(self.pools)
        if self.count is not None:
            items[_ITEM_COUNT] = str(self.count)
        if self.runner_ids:
            key = _ITEM_RUNNER if self.count is None else _ITEM_RUNNERS
            items[key] = ",".join(self.runner_ids)
        if self.served_until is not None:
            items[_ITEM_SERVED_UNTIL] = format_time(self.served_until)
        return items
