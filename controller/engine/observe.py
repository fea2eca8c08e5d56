"""Observe: read one Nomad namespace as it is now, with as few calls as possible.

One pass lists the namespace's jobs (with Meta), its allocations and the metadata of its
claim variables, concurrently; only claim variables whose ModifyIndex changed since the
last pass are read again (Nomad's variable list carries no Items).
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from controller.engine.types import (
    CLAIMS_PREFIX,
    AllocationView,
    ClaimRecord,
    JobView,
    MalformedClaim,
)
from controller.nomad.client import NomadClient
from controller.nomad.jobs import META_POOL

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class NamespaceObservation:
    """Everything poolkeeper needs of one Nomad namespace at one moment."""

    namespace: str
    jobs: tuple[JobView, ...]
    allocations: dict[str, tuple[AllocationView, ...]]
    claims: dict[str, ClaimRecord]
    malformed_claims: frozenset[str]


@dataclass
class _CachedClaim:
    modify_index: int
    record: ClaimRecord | None  # None: the variable did not parse


@dataclass
class ClaimCache:
    """Claim variables read so far, keyed by path; re-read only when ModifyIndex moves."""

    entries: dict[str, _CachedClaim] = field(default_factory=dict)

    def remember(self, record: ClaimRecord) -> None:
        """Take a variable this process just wrote, saving the next pass a read."""
        self.entries[CLAIMS_PREFIX + record.runner_id] = _CachedClaim(record.modify_index, record)


async def observe_namespace(
    client: NomadClient, namespace: str, cache: ClaimCache
) -> NamespaceObservation:
    job_stubs, alloc_stubs, variable_metas = await asyncio.gather(
        client.list_jobs(namespace),
        client.list_allocations(namespace),
        client.list_variables(CLAIMS_PREFIX, namespace),
    )
    jobs = tuple(
        JobView.from_stub(stub) for stub in job_stubs if (stub.get("Meta") or {}).get(META_POOL)
    )
    wanted = {job.id for job in jobs}
    by_job: defaultdict[str, list[AllocationView]] = defaultdict(list)
    for stub in alloc_stubs:
        if stub.get("JobID") in wanted:
            by_job[stub["JobID"]].append(AllocationView.from_stub(stub))
    claims, malformed = await read_claims(client, namespace, cache, variable_metas)
    return NamespaceObservation(
        namespace=namespace,
        jobs=jobs,
        allocations={job_id: tuple(allocs) for job_id, allocs in by_job.items()},
        claims=claims,
        malformed_claims=frozenset(malformed),
    )


async def read_claims(
    client: NomadClient,
    namespace: str,
    cache: ClaimCache,
    metas: list[dict[str, Any]] | None = None,
) -> tuple[dict[str, ClaimRecord], set[str]]:
    """The namespace's claim variables (and the runner IDs of malformed ones), reading only
    what changed since the cache last saw it."""
    if metas is None:
        metas = await client.list_variables(CLAIMS_PREFIX, namespace)
    present = {meta["Path"]: int(meta.get("ModifyIndex", 0)) for meta in metas}
    for path in list(cache.entries):
        if path not in present:
            del cache.entries[path]
    stale = [
        path
        for path, index in present.items()
        if (cached := cache.entries.get(path)) is None or cached.modify_index != index
    ]
    variables = await asyncio.gather(*(client.read_variable(path, namespace) for path in stale))
    for path, variable in zip(stale, variables, strict=True):
        if variable is None:  # deleted between the list and the read
            present.pop(path, None)
            continue
        try:
            record: ClaimRecord | None = ClaimRecord.from_variable(variable)
        except MalformedClaim as error:
            log.warning(
                "claim variable %s in namespace %s is malformed: %s", path, namespace, error
            )
            record = None
        cache.entries[path] = _CachedClaim(int(variable.get("ModifyIndex", 0)), record)
    claims: dict[str, ClaimRecord] = {}
    malformed: set[str] = set()
    for path in present:
        cached = cache.entries[path]
        runner_id = path.removeprefix(CLAIMS_PREFIX)
        if cached.record is None:
            malformed.add(runner_id)
        else:
            claims[runner_id] = cached.record
    return claims, malformed
