"""Plain data the pure engine works on: views of Nomad objects, claims, pool policies.

Nothing here performs I/O. Parsers read every optional Nomad field with a default,
because Nomad omits empty fields in some payloads (shared/reference/nomad-api.md §1).
"""

from __future__ import annotations

import dataclasses
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any

from controller.nomad.jobs import (
    META_POOL,
    META_TEMPLATE,
    RUNNER_ID_PATTERN,
    is_runner_id,
    runner_prefix,
)

CLAIMS_PREFIX = "poolkeeper/claims/"
REQUESTS_PREFIX = "poolkeeper/requests/"
TOMBSTONE_RETENTION = timedelta(minutes=10)

_RFC3339 = re.compile(
    r"^(\d{4}-\d{2}-\d{2})[Tt](\d{2}:\d{2}:\d{2})(?:\.(\d+))?([Zz]|[+-]\d{2}:\d{2})$"
)

# Claim items this module understands; anything else is kept in ClaimRecord.extra.
_ITEM_POOL = "pool"
_ITEM_ALLOCATION = "allocationId"
_ITEM_CLAIMED_AT = "claimedAt"
_ITEM_EXPIRES_AT = "expiresAt"
_ITEM_TIMEOUT = "inactivityTimeoutSeconds"
_ITEM_REQUEST = "requestId"
_ITEM_STATE = "state"
_ITEM_RESTARTS = "allocationRestarts"
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
    }
)


class RunnerState(StrEnum):
    STARTING = "starting"
    IDLE = "idle"
    OUTDATED = "outdated"
    CLAIMED = "claimed"
    EXPIRED = "expired"
    LOST = "lost"
    FAILED = "failed"
    TERMINATING = "terminating"


class ClaimState(StrEnum):
    CLAIMED = "claimed"
    RELEASED = "released"
    EXPIRED = "expired"
    LOST = "lost"
    RETIRED = "retired"


class PoolMode(StrEnum):
    ACTIVE = "active"
    DRAIN = "drain"
    DELETE = "delete"


class MalformedClaim(ValueError):
    """A claim variable whose required items are missing or unparseable."""


def claim_path(runner_id: str) -> str:
    return CLAIMS_PREFIX + runner_id


def request_path(request_id: str) -> str:
    return REQUESTS_PREFIX + request_id


def runner_id_from_claim_path(path: str) -> str | None:
    """The runner ID of a claim variable path, or None for any other path."""
    if not path.startswith(CLAIMS_PREFIX):
        return None
    runner_id = path[len(CLAIMS_PREFIX) :]
    return runner_id if RUNNER_ID_PATTERN.match(runner_id) else None


def format_time(dt: datetime) -> str:
    """RFC 3339 in UTC with a "Z"; fractions only when there are any."""
    if dt.tzinfo is None:
        raise ValueError("naive datetime: claim times must be timezone-aware")
    utc = dt.astimezone(UTC)
    text = utc.strftime("%Y-%m-%dT%H:%M:%S")
    if utc.microsecond:
        text += f".{utc.microsecond:06d}".rstrip("0")
    return text + "Z"


def parse_time(text: str) -> datetime:
    """Parse RFC 3339 (offset required, any number of fraction digits) into aware UTC."""
    match = _RFC3339.match(text.strip())
    if match is None:
        raise ValueError(f"not an RFC 3339 time: {text!r}")
    day, clock, fraction, offset = match.groups()
    # datetime takes at most microseconds; Go writes nanoseconds, so cut the rest off.
    micro = (fraction or "")[:6].ljust(6, "0")
    zone = "+00:00" if offset in ("Z", "z") else offset
    return datetime.fromisoformat(f"{day}T{clock}.{micro}{zone}").astimezone(UTC)


def _str(stub: Mapping[str, Any], key: str, default: str = "") -> str:
    value = stub.get(key)
    return value if isinstance(value, str) else default


def _int(stub: Mapping[str, Any], key: str) -> int:
    value = stub.get(key)
    # bool is an int subclass; a boolean is never a valid count or timestamp.
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


@dataclass(frozen=True, slots=True)
class JobView:
    id: str
    namespace: str
    pool: str
    template: str
    status: str
    stop: bool
    submit_time_ns: int

    @classmethod
    def from_stub(cls, stub: Mapping[str, Any]) -> JobView:
        """From one element of GET /v1/jobs?meta=true."""
        meta = stub.get("Meta")
        if not isinstance(meta, Mapping):
            meta = {}
        pool = meta.get(META_POOL)
        template = meta.get(META_TEMPLATE)
        return cls(
            id=_str(stub, "ID"),
            namespace=_str(stub, "Namespace", "default") or "default",
            pool=pool if isinstance(pool, str) else "",
            template=template if isinstance(template, str) else "",
            status=_str(stub, "Status", "pending"),
            stop=stub.get("Stop") is True,
            submit_time_ns=_int(stub, "SubmitTime"),
        )

    @property
    def dead(self) -> bool:
        return self.status == "dead"


@dataclass(frozen=True, slots=True)
class AllocationView:
    id: str
    job_id: str
    namespace: str
    node_name: str
    desired_status: str
    client_status: str
    create_time_ns: int
    modify_time_ns: int
    create_index: int
    restarts: int = 0

    @classmethod
    def from_stub(cls, stub: Mapping[str, Any]) -> AllocationView:
        """From an AllocListStub (GET /v1/allocations) or a full allocation."""
        restarts = 0
        task_states = stub.get("TaskStates")
        if isinstance(task_states, Mapping):
            for state in task_states.values():
                if isinstance(state, Mapping):
                    restarts += _int(state, "Restarts")
        return cls(
            id=_str(stub, "ID"),
            job_id=_str(stub, "JobID"),
            namespace=_str(stub, "Namespace", "default") or "default",
            node_name=_str(stub, "NodeName"),
            desired_status=_str(stub, "DesiredStatus"),
            client_status=_str(stub, "ClientStatus"),
            create_time_ns=_int(stub, "CreateTime"),
            modify_time_ns=_int(stub, "ModifyTime"),
            create_index=_int(stub, "CreateIndex"),
            restarts=restarts,
        )

    @property
    def live(self) -> bool:
        """Counts toward a runner: Nomad wants it to run and the client has not ended it.

        A desired-stop allocation never counts, whatever its client status says: that
        is the seed bug, where the old allocation still reported `running`.
        """
        return self.desired_status == "run" and self.client_status in ("pending", "running")


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
        return cls(
            runner_id=runner_id,
            namespace=_str(var, "Namespace", "default") or "default",
            modify_index=_int(var, "ModifyIndex"),
            modify_time_ns=_int(var, "ModifyTime"),
            pool=required(_ITEM_POOL),
            allocation_id=allocation_id,
            claimed_at=claimed_at,
            expires_at=expires_at,
            inactivity_timeout_seconds=timeout,
            request_id=request_id if isinstance(request_id, str) and request_id else None,
            state=state,
            allocation_restarts=restarts,
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
        )

    @property
    def path(self) -> str:
        return claim_path(self.runner_id)

    @property
    def is_tombstone(self) -> bool:
        return self.state is not ClaimState.CLAIMED

    def is_expired(self, now: datetime) -> bool:
        return now >= self.expires_at

    def with_state(self, state: ClaimState) -> ClaimRecord:
        return dataclasses.replace(self, state=state)

    def with_expiry(self, expires_at: datetime) -> ClaimRecord:
        return dataclasses.replace(self, expires_at=expires_at)

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
        return items


def _parse_count(text: str) -> int:
    if not text.isascii() or not text.isdigit():
        raise ValueError(f"not a non-negative decimal integer: {text!r}")
    return int(text)


@dataclass(frozen=True, slots=True)
class PoolPolicy:
    key: str
    nomad_namespace: str
    job_prefix: str
    desired_idle: int
    max_runners: int
    startup_timeout_seconds: int
    template_hash: str
    surge: int = 20
    mode: PoolMode = PoolMode.ACTIVE
    drain_deadline: datetime | None = None

    @property
    def name(self) -> str:
        return self.key.rpartition("/")[2]

    def owns_job(self, job: JobView) -> bool:
        return (
            job.namespace == self.nomad_namespace
            and job.pool == self.key
            and is_runner_id(self.job_prefix, job.id)
        )

    def owns_claim(self, claim: ClaimRecord) -> bool:
        return (
            claim.namespace == self.nomad_namespace
            and claim.pool == self.key
            and is_runner_id(self.job_prefix, claim.runner_id)
        )


@dataclass(frozen=True, slots=True)
class PoolObservation:
    jobs: tuple[JobView, ...] = ()
    allocations: Mapping[str, tuple[AllocationView, ...]] = field(default_factory=dict)
    claims: Mapping[str, ClaimRecord] = field(default_factory=dict)
    malformed_claims: frozenset[str] = frozenset()


def split_observation(
    policies: Sequence[PoolPolicy],
    jobs: Iterable[JobView],
    allocations: Iterable[AllocationView] | Mapping[str, Iterable[AllocationView]],
    claims: Iterable[ClaimRecord] | Mapping[str, ClaimRecord],
    malformed: Iterable[str | tuple[str, str]] = (),
) -> tuple[dict[str, PoolObservation], list[JobView]]:
    """Share one namespace-wide read among pools (CONTRACT.md §4 ownership).

    `allocations` and `claims` may be flat or keyed (keys are ignored: namespace and
    job ID come from the values). `malformed` holds runner IDs, or (namespace,
    runner ID) pairs when several namespaces are mixed; a malformed claim has no
    readable `pool` item, so it is attributed by namespace and job prefix alone.

    Returns each pool's observation and the orphans: runner-shaped jobs whose
    `poolkeeper_pool` names none of the given pools. A job whose Meta names a given
    pool but whose ID or namespace does not fit that pool is neither: it is left alone.
    """
    by_key = {policy.key: policy for policy in policies}
    by_prefix: dict[tuple[str, str], list[PoolPolicy]] = defaultdict(list)
    for policy in policies:
        by_prefix[(policy.nomad_namespace, policy.job_prefix)].append(policy)

    pool_jobs: dict[str, list[JobView]] = {key: [] for key in by_key}
    owner_of_job: dict[tuple[str, str], str] = {}
    orphans: list[JobView] = []
    for job in jobs:
        prefix = runner_prefix(job.id)
        if prefix is None or not job.pool:
            continue
        named = by_key.get(job.pool)
        if named is None:
            orphans.append(job)
        elif named.owns_job(job):
            pool_jobs[named.key].append(job)
            owner_of_job[(job.namespace, job.id)] = named.key

    alloc_values: Iterable[Iterable[AllocationView]] = (
        allocations.values() if isinstance(allocations, Mapping) else [allocations]
    )
    pool_allocs: dict[str, dict[str, list[AllocationView]]] = {key: {} for key in by_key}
    for group in alloc_values:
        for alloc in group:
            owner = owner_of_job.get((alloc.namespace, alloc.job_id))
            if owner is not None:
                pool_allocs[owner].setdefault(alloc.job_id, []).append(alloc)

    claim_values = claims.values() if isinstance(claims, Mapping) else claims
    pool_claims: dict[str, dict[str, ClaimRecord]] = {key: {} for key in by_key}
    for claim in claim_values:
        holder = by_key.get(claim.pool)
        if holder is not None and holder.owns_claim(claim):
            pool_claims[holder.key][claim.runner_id] = claim

    pool_malformed: dict[str, set[str]] = {key: set() for key in by_key}
    for entry in malformed:
        namespace, runner_id = (None, entry) if isinstance(entry, str) else entry
        prefix = runner_prefix(runner_id)
        if prefix is None:
            continue
        for (policy_ns, policy_prefix), matching in by_prefix.items():
            if policy_prefix == prefix and namespace in (None, policy_ns):
                for candidate in matching:
                    pool_malformed[candidate.key].add(runner_id)

    observations = {
        key: PoolObservation(
            jobs=tuple(pool_jobs[key]),
            allocations={job_id: tuple(a) for job_id, a in pool_allocs[key].items()},
            claims=pool_claims[key],
            malformed_claims=frozenset(pool_malformed[key]),
        )
        for key in by_key
    }
    return observations, orphans


@dataclass(frozen=True, slots=True)
class Runner:
    id: str
    state: RunnerState
    job: JobView
    allocation: AllocationView | None
    claim: ClaimRecord | None
    reason: str
    starting_since_ns: int
    # The claim variable exists but did not parse: kept as claimed, reported Degraded.
    malformed_claim: bool = False
