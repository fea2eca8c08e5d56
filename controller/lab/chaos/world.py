"""The soak's pools, and what Nomad holds of them: read from the simulator, never from
the controller, so that every check is independent of what the controller believes."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, TypedDict

from controller.core.catalog import CatalogError, WaitingRecord
from controller.core.paths import CATALOG_PREFIX, DOORBELL_PATH, WAITING_PREFIX, lease_path
from controller.lab.simulator import Simulator

NAMESPACE = "default"
CLAIMS_PREFIX = "poolkeeper/claims/"
REQUESTS_PREFIX = "poolkeeper/requests/"
META_POOL = "poolkeeper_pool"
NODES = ("sim-node-1", "sim-node-2", "sim-node-3", "sim-node-4")
START_DELAY = 0.2  # seconds the simulator takes to start an allocation (but in slow_starts)


@dataclass(frozen=True)
class PoolSpec:
    name: str
    idle: int
    max_runners: int

    @property
    def key(self) -> str:
        return f"{NAMESPACE}/{self.name}"

    @property
    def prefix(self) -> str:
        return f"{self.name}-"


POOLS = (PoolSpec("chaos-py", 3, 8), PoolSpec("chaos-node", 2, 6), PoolSpec("chaos-go", 4, 10))


def many_pools(count: int) -> tuple[PoolSpec, ...]:
    """`count` small pools (1 or 2 idle runners, at most 5): the shared reconcilers' soak."""
    return tuple(PoolSpec(f"shared-{n:02d}", 1 + n % 2, 5) for n in range(count))


# Runner ID -> the items of its claim variable, plus the variable's `_modify_time` (ns).
Claims = dict[str, dict[str, str]]


class PoolState(TypedDict):
    idle: int
    starting: int
    claimed: int
    terminating: int  # claim tombstoned, job not yet purged
    broken: int  # stopped without a claim, or claimed without its live allocation
    dangling_claims: int  # live claim variables whose job is gone
    total: int  # non-dead jobs


def converged(pool: PoolSpec, state: PoolState) -> bool:
    return bool(
        state["idle"] == pool.idle
        and state["starting"] == 0
        and state["terminating"] == 0
        and state["broken"] == 0
        and state["dangling_claims"] == 0
        and state["total"] <= pool.max_runners
    )


class World:
    """Nomad's jobs, allocations and variables of the soak's pools (`pools`), from the
    simulator."""

    def __init__(self, sim: Simulator, pools: tuple[PoolSpec, ...] = POOLS) -> None:
        self.sim = sim
        self.pools = pools

    def pool_jobs(self, pool: PoolSpec) -> list[dict[str, Any]]:
        pattern = re.compile(re.escape(pool.prefix) + "[0-9a-f]{12}")
        return [
            job
            for job in self.sim.job_list(NAMESPACE)
            if pattern.fullmatch(job["ID"]) and (job.get("Meta") or {}).get(META_POOL) == pool.key
        ]

    def runner_job_ids(self) -> list[str]:
        """Every pool's runner jobs, dead or not, sorted."""
        return sorted(job["ID"] for pool in self.pools for job in self.pool_jobs(pool))

    def runners(self, pool: PoolSpec) -> int:
        """The pool's non-dead runner jobs: what `maxRunners` bounds."""
        return sum(1 for job in self.pool_jobs(pool) if job.get("Status") != "dead")

    def unstopped_job_ids(self) -> set[str]:
        return {job["ID"] for job in self.sim.job_list(NAMESPACE) if not job.get("Stop")}

    def claims(self) -> Claims:
        return {
            path.removeprefix(CLAIMS_PREFIX): dict(var.get("Items") or {})
            | {"_modify_time": str(var.get("ModifyTime", 0))}
            for path, var in self.sim.variables(NAMESPACE).items()
            if path.startswith(CLAIMS_PREFIX)
        }

    def request_records(self) -> dict[str, dict[str, Any]]:
        """requestId -> the items of its request record, in the order of their paths."""
        return {
            path.removeprefix(REQUESTS_PREFIX): dict(var.get("Items") or {})
            for path, var in sorted(self.sim.variables(NAMESPACE).items())
            if path.startswith(REQUESTS_PREFIX)
        }

    def waiting_records(self) -> dict[str, WaitingRecord | None]:
        """The API replicas' waiting records by path (None: one that does not decode)."""
        found: dict[str, WaitingRecord | None] = {}
        for path, var in self.sim.variables(NAMESPACE).items():
            if path.startswith(WAITING_PREFIX):
                try:
                    found[path] = WaitingRecord.from_items(var.get("Items") or {})
                except CatalogError:
                    found[path] = None
        return found

    def records_left(self) -> dict[str, int]:
        """How many of each kind of poolkeeper's own variables Nomad holds."""
        claims = self.claims()
        paths = self.sim.variables(NAMESPACE)
        return {
            "claim tombstones": sum(
                1 for c in claims.values() if c.get("state", "claimed") != "claimed"
            ),
            "request records": len(self.request_records()),
            "waiting records": sum(1 for p in paths if p.startswith(WAITING_PREFIX)),
            "catalog records": sum(1 for p in paths if p.startswith(CATALOG_PREFIX)),
            "doorbell": sum(1 for p in paths if p == DOORBELL_PATH),
        }

    def lease_holders(self) -> dict[str, str]:
        """Pool key -> the holder identity of its lease, for every pool whose lease is locked."""
        variables = self.sim.variables(NAMESPACE)
        holders = {}
        for pool in self.pools:
            lease = variables.get(lease_path(pool.key))
            if lease is not None and lease.get("Lock"):
                holders[pool.key] = str((lease.get("Items") or {}).get("holder", ""))
        return holders

    def running_allocations(self) -> list[dict[str, Any]]:
        """The running allocations of every pool's runners, sorted by allocation ID."""
        allocs = [
            a
            for job_id in self.runner_job_ids()
            for a in self.sim.allocations(job_id, NAMESPACE)
            if a["DesiredStatus"] == "run" and a["ClientStatus"] == "running"
        ]
        return sorted(allocs, key=lambda a: str(a["ID"]))

    def runners_on_node(self, node: str) -> list[str]:
        """The jobs with an allocation, of any status, on `node`; sorted."""
        return sorted(
            {
                str(a["JobID"])
                for a in self.sim.allocations(None, NAMESPACE)
                if a.get("NodeName") == node or a.get("NodeID") == self.sim.node_id(node)
            }
        )

    def _live_allocs(self, job_id: str) -> list[dict[str, Any]]:
        return [
            a
            for a in self.sim.allocations(job_id, NAMESPACE)
            if a["DesiredStatus"] == "run" and a["ClientStatus"] in ("pending", "running")
        ]

    def pool_state(self, pool: PoolSpec, claims: Claims) -> PoolState:
        """The pool as Nomad holds it, classified independently of the controller."""
        idle = starting = claimed = terminating = broken = 0
        total = 0
        job_ids = set()
        for job in self.pool_jobs(pool):
            job_ids.add(job["ID"])
            if job.get("Status") != "dead":
                total += 1
            claim = claims.get(job["ID"])
            live = self._live_allocs(job["ID"])
            if claim is not None and claim.get("state", "claimed") != "claimed":
                terminating += 1
            elif claim is not None:
                if any(a["ID"] == claim.get("allocationId") for a in live):
                    claimed += 1
                else:
                    broken += 1  # its allocation is gone: must become a `lost` tombstone
            elif job.get("Stop"):
                broken += 1
            elif any(a["ClientStatus"] == "running" for a in live):
                idle += 1
            else:
                starting += 1
        dangling = sum(
            1
            for runner_id, items in claims.items()
            if items.get("pool") == pool.key
            and items.get("state", "claimed") == "claimed"
            and runner_id not in job_ids
        )
        return {
            "idle": idle,
            "starting": starting,
            "claimed": claimed,
            "terminating": terminating,
            "broken": broken,
            "dangling_claims": dangling,
            "total": total,
        }
