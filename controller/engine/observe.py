"""Observe: read one Nomad namespace as it is now, with as few calls as possible.

One pass lists the namespace's jobs (with Meta), its allocations, the metadata of its
claim variables and the client nodes, concurrently; the claim store reads again only the
claim variables whose ModifyIndex changed since it last saw them (Nomad's variable list
carries no Items), and a draining node is read once per change of it (the list carries
no drain deadline).

Job and allocation views are kept between passes and rebuilt only for stubs whose
ModifyIndex moved (Nomad bumps it on every change of a job or an allocation, client
updates included), so a steady-state pass over thousands of runners does not rebuild
thousands of identical views.

A reconciler that shares a namespace's pools with others (by lease) observes only the
pools it holds: the lists are narrowed to their job prefixes (a job prefix, an allocation
filter on JobID, a variable prefix per pool), so its pass shrinks with its share. Only a
whole listing of the jobs and claims sees orphans and every claim; the reconciler asks
for one now and then (reconcile.py), with the allocations still narrowed.

Reading the nodes is optional (`node { policy = "read" }`, which a namespace-scoped token
lacks): without it pools are reconciled without drain awareness (NodeAccess).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from controller.core.claims import ClaimRecord
from controller.core.paths import claim_path
from controller.core.runner_ids import META_POOL
from controller.core.views import AllocationView, JobView, NodeView
from controller.engine.offload import compute
from controller.nomad.errors import NomadPermissionDenied
from controller.nomad.port import NomadPort
from controller.records.claims import ClaimStore

log = logging.getLogger(__name__)

# How often a token that may not read the nodes is tried again (the capability may be
# granted at any time; each try is one list call refused).
NODE_RETRY_SECONDS = 60.0


@dataclass(frozen=True)
class NamespaceObservation:
    """Everything poolkeeper needs of one Nomad namespace at one moment."""

    namespace: str
    jobs: tuple[JobView, ...]
    allocations: dict[str, tuple[AllocationView, ...]]
    claims: dict[str, ClaimRecord]
    malformed_claims: frozenset[str]
    nodes: tuple[NodeView, ...] = ()

    @property
    def leaving_nodes(self) -> frozenset[str]:
        return frozenset(node.id for node in self.nodes if node.leaving)


@dataclass
class ViewCache:
    """The job, allocation and node views observe built so far in one namespace, keyed by
    ID (rebuilt only when ModifyIndex moves)."""

    jobs: dict[str, tuple[int, JobView]] = field(default_factory=dict)
    allocations: dict[str, tuple[int, AllocationView]] = field(default_factory=dict)
    nodes: dict[str, tuple[int, NodeView]] = field(default_factory=dict)


def _views(
    job_stubs: list[dict[str, Any]],
    alloc_stubs: list[dict[str, Any]],
    known_jobs: dict[str, tuple[int, JobView]],
    known_allocs: dict[str, tuple[int, AllocationView]],
) -> tuple[
    tuple[JobView, ...],
    dict[str, tuple[AllocationView, ...]],
    dict[str, tuple[int, JobView]],
    dict[str, tuple[int, AllocationView]],
]:
    """Views of the runner jobs and their allocations, reusing the known ones whose
    ModifyIndex did not move; also returns what to know next time. Runs in a worker
    thread, so it changes nothing: the caller stores the new caches."""
    jobs, seen_jobs = _job_views(job_stubs, known_jobs)
    wanted = {job.id for job in jobs}
    by_job: defaultdict[str, list[AllocationView]] = defaultdict(list)
    seen: dict[str, tuple[int, AllocationView]] = {}
    for stub in alloc_stubs:
        job_id = stub.get("JobID")
        if job_id not in wanted:
            continue
        alloc_id, index = stub.get("ID"), stub.get("ModifyIndex")
        hit = known_allocs.get(alloc_id) if isinstance(alloc_id, str) else None
        if hit is None or hit[0] != index or not isinstance(index, int):
            view = AllocationView.from_stub(stub)
            hit = (index if isinstance(index, int) else -1, view)
        if isinstance(alloc_id, str):
            seen[alloc_id] = hit
        by_job[job_id].append(hit[1])
    allocations = {job_id: tuple(allocs) for job_id, allocs in by_job.items()}
    return jobs, allocations, seen_jobs, seen


@dataclass
class NodeAccess:
    """Whether the Nomad token may read the client nodes. Without it (403) passes see no
    node, so nothing counts as draining: pools are reconciled without drain awareness.
    The nodes are asked for again every NODE_RETRY_SECONDS; each change is said once."""

    readable: bool = True
    _retry_at: float = field(default=0.0, init=False)  # time.monotonic()

    async def views(self, port: NomadPort, cache: ViewCache) -> tuple[NodeView, ...]:
        if not self.readable and time.monotonic() < self._retry_at:
            return ()
        try:
            nodes = await _node_views(port, await port.list_nodes(), cache)
        except NomadPermissionDenied as denied:
            self._retry_at = time.monotonic() + NODE_RETRY_SECONDS
            if self.readable:
                self.readable = False
                log.warning(
                    "the Nomad token may not read nodes, so pools are reconciled without "
                    "drain awareness (idle runners on draining nodes are not replaced ahead "
                    "of the drain); asked again every %g s: %s",
                    NODE_RETRY_SECONDS,
                    denied,
                )
            return ()
        if not self.readable:
            self.readable = True
            log.info("the Nomad token may read nodes again: drain awareness is on again")
        return nodes


async def observe_namespace(
    port: NomadPort,
    store: ClaimStore,
    namespace: str,
    cache: ViewCache,
    node_access: NodeAccess,
    scope: Sequence[str] | None = None,
    *,
    whole: bool = True,
) -> NamespaceObservation:
    """The namespace as it is now; with `scope`, only the allocations of the runners
    whose IDs start with one of those job prefixes, and unless `whole`, only those
    runners' jobs and claims too (orphans and every claim show only in a whole listing)."""
    prefixes = None if scope is None else tuple(sorted(set(scope)))
    listed = None if whole else prefixes
    job_stubs, alloc_stubs, variable_metas, nodes = await asyncio.gather(
        _list_jobs(port, namespace, listed),
        _list_allocations(port, namespace, prefixes),
        store.list(namespace, listed),
        node_access.views(port, cache),
    )
    jobs, allocations, seen_jobs, seen_allocs = await compute(
        len(job_stubs), _views, job_stubs, alloc_stubs, cache.jobs, cache.allocations
    )
    # Views of runners not listed now stay for the next listing that has them.
    if listed is None:
        cache.jobs = seen_jobs
    else:
        cache.jobs.update(seen_jobs)
    if prefixes is None:
        cache.allocations = seen_allocs
    else:
        cache.allocations.update(seen_allocs)
    claim_paths = None if listed is None else [claim_path(p) for p in listed]
    claims, malformed = await store.read_all(namespace, variable_metas, within=claim_paths)
    return NamespaceObservation(
        namespace=namespace,
        jobs=jobs,
        allocations=allocations,
        claims=claims,
        malformed_claims=frozenset(malformed),
        nodes=nodes,
    )


async def _list_jobs(
    port: NomadPort, namespace: str, prefixes: tuple[str, ...] | None
) -> list[dict[str, Any]]:
    if prefixes is None:
        return await port.list_jobs(namespace)
    lists = await asyncio.gather(*(port.list_jobs(namespace, p) for p in prefixes))
    return _unique(lists, "ID")


async def _list_allocations(
    port: NomadPort, namespace: str, prefixes: tuple[str, ...] | None
) -> list[dict[str, Any]]:
    if prefixes == ():
        return []
    return await port.list_allocations(namespace, prefixes)


def _unique(lists: Sequence[list[dict[str, Any]]], key: str) -> list[dict[str, Any]]:
    """The items of several lists, each once: one prefix may begin another ("a-", "a-b-"),
    and then both lists hold the longer one's items."""
    if len(lists) == 1:
        return lists[0]
    seen: dict[Any, dict[str, Any]] = {}
    for items in lists:
        for item in items:
            seen.setdefault(item.get(key), item)
    return list(seen.values())


async def _node_views(
    port: NomadPort, stubs: list[dict[str, Any]], cache: ViewCache
) -> tuple[NodeView, ...]:
    """Views of the nodes, reusing unchanged ones; a draining node whose stub changed is
    read for its deadline."""
    seen: dict[str, tuple[int, NodeView]] = {}
    for stub in stubs:
        node_id, index = stub.get("ID"), stub.get("ModifyIndex")
        if not isinstance(node_id, str):
            continue
        hit = cache.nodes.get(node_id)
        if hit is None or hit[0] != index or not isinstance(index, int):
            detail = await port.read_node(node_id) if stub.get("Drain") is True else None
            hit = (index if isinstance(index, int) else -1, NodeView.from_stub(stub, detail))
        seen[node_id] = hit
    cache.nodes = seen
    return tuple(view for _, view in seen.values())


def _job_views(
    stubs: list[dict[str, Any]], known: dict[str, tuple[int, JobView]]
) -> tuple[tuple[JobView, ...], dict[str, tuple[int, JobView]]]:
    """Views of the runner-looking jobs (those with a pool Meta), reusing unchanged ones."""
    seen: dict[str, tuple[int, JobView]] = {}
    views: list[JobView] = []
    for stub in stubs:
        if not (stub.get("Meta") or {}).get(META_POOL):
            continue
        job_id, index = stub.get("ID"), stub.get("ModifyIndex")
        hit = known.get(job_id) if isinstance(job_id, str) else None
        if hit is None or hit[0] != index or not isinstance(index, int):
            hit = (index if isinstance(index, int) else -1, JobView.from_stub(stub))
        if isinstance(job_id, str):
            seen[job_id] = hit
        views.append(hit[1])
    return tuple(views), seen
