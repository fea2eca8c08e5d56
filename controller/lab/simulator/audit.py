"""Who wrote each runner job, and who held the pool's lease at that moment.

poolkeeper's controllers say who they are in their User-Agent (`poolkeeper/<version>
(<host/pid>)`), the identity their leases carry. Every registration and purge of a runner
job (a job with a `poolkeeper_pool` Meta) is recorded with the holder of that pool's lease
as the simulator's variables say at that instant, so a soak can prove that no pool was
written by two holders. Simulator-only: real Nomad keeps no such log.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

from controller.core.paths import lease_path
from controller.core.runner_ids import META_POOL
from controller.lab.simulator.util import JSON

_IDENTITY = re.compile(r"^poolkeeper/\S+ \((?P<identity>[^)]+)\)")


@dataclass(frozen=True)
class RunnerWrite:
    at: float  # time.time()
    writer: str  # the writer's identity ("" when its User-Agent names none)
    kind: str  # "register" | "purge"
    namespace: str
    job_id: str
    pool: str
    holder: str  # who held the pool's lease ("" when nobody did)

    @property
    def by_non_holder(self) -> bool:
        """A write only the lease holder may make: every write of a runner job (a release
        leaves the purge to the holder too)."""
        return bool(self.writer) and self.writer != self.holder


class WriteAudit:
    def __init__(self, variables: dict[tuple[str, str], JSON]) -> None:
        self._vars = variables
        self.writes: list[RunnerWrite] = []

    def record(
        self, user_agent: str, kind: str, namespace: str, job_id: str, job: JSON | None
    ) -> None:
        meta = (job or {}).get("Meta") or {}
        pool = meta.get(META_POOL) if isinstance(meta, dict) else None
        if not isinstance(pool, str) or not pool:
            return  # not a runner job
        match = _IDENTITY.match(user_agent)
        lease = self._vars.get((namespace, lease_path(pool)))
        holder = ""
        if lease is not None and lease.get("Lock"):
            holder = str((lease.get("Items") or {}).get("holder", ""))
        self.writes.append(
            RunnerWrite(
                time.time(),
                match["identity"] if match else "",
                kind,
                namespace,
                job_id,
                pool,
                holder,
            )
        )

    def by_non_holders(self) -> list[RunnerWrite]:
        return [write for write in self.writes if write.by_non_holder]
