"""Share one namespace-wide observation among the pools that live in it."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence

from controller.core.claims import ClaimRecord
from controller.core.runner_ids import runner_prefix
from controller.core.views import AllocationView, JobView, PoolObservation, PoolPolicy


def split_observation(
    policies: Sequence[PoolPolicy],
    jobs: Iterable[JobView],
    allocations: Iterable[AllocationView] | Mapping[str, Iterable[AllocationView]],
    claims: Iterable[ClaimRecord] | Mapping[str, ClaimRecord],
    malformed: Iterable[str | tuple[str, str]] = (),
    leaving_nodes: frozenset[str] = frozenset(),
) -> tuple[dict[str, PoolObservation], list[JobView]]:
    """Share one namespace-wide read among pools (the ownership rule of docs/reference.md).

    `allocations` and `claims` may be flat or keyed (keys are ignored: namespace and
    job ID come from the values). `malformed` holds runner IDs, or (namespace,
    runner ID) pairs when several namespaces are mixed; a malformed claim has no
    readable `pool` item, so it is attributed by namespace and job prefix alone.

    `leaving_nodes` (draining or ineligible nodes) is the same for every pool.

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
            leaving_nodes=leaving_nodes,
        )
        for key in by_key
    }
    return observations, orphans
