"""`poolkeeper validate`: check pool files exactly as `poolkeeper run` loads them, without
Nomad, for the CI of a GitOps repository. One line per problem, `file:document: field:
message`; exit 0 when every pool is valid, 2 otherwise: also when the files define no pool
(what `run` refuses to reload) or are over the limits `run` applies."""

from __future__ import annotations

import argparse
import sys

from controller.core.problems import prefix_owners
from controller.errors import EXIT_OK, EXIT_USAGE, UsageError
from controller.sources.files import (
    ConfigError,
    LimitExceeded,
    LoadLimits,
    LoadResult,
    PoolFileError,
    load_pools,
)


def problems(result: LoadResult) -> list[PoolFileError]:
    """Every problem `run` would report: the documents' own, and the pools it would refuse
    for a job prefix an earlier pool holds."""
    found = list(result.errors)
    owners = prefix_owners((p.key, p.nomad_namespace, p.job_prefix) for p in result.pools)
    for pool in result.pools:
        owner = owners.get(pool.key)
        if owner is not None:
            where = result.locations[pool.key]
            message = (
                f"job prefix {pool.job_prefix!r} in Nomad namespace {pool.nomad_namespace!r} "
                f"is already used by pool {owner}"
            )
            field = "spec.nomad.jobPrefix"
            found.append(PoolFileError(where.file, where.document, field, message, pool.key))
    return sorted(found, key=lambda e: (str(e.file), e.document))


def main(args: argparse.Namespace) -> int:
    try:
        result = load_pools(args.pools, LoadLimits.from_args(args))
    except (ConfigError, LimitExceeded) as error:
        raise UsageError(str(error)) from None
    found = problems(result)
    lines = [str(problem) for problem in found]
    if result.empty:
        lines.append(f"{args.pools}: defines no pool")
    for line in lines:
        print(line)
    refused = {p.key for p in found if p.key is not None}
    valid = sum(1 for pool in result.pools if pool.key not in refused)
    print(f"{valid} valid pools, {len(lines)} problems", file=sys.stderr)
    return EXIT_USAGE if lines else EXIT_OK
