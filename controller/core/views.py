"""Plain data the pure core works on: views of Nomad's jobs and allocations, one pool's
share of an observation, its policy, and the runners classified from them.

Parsers read every optional Nomad field with a default, because Nomad omits empty
fields in some payloads.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

from controller.core.claims import ClaimRecord
from controller.core.fields import int_field, str_field
from controller.core.runner_ids import META_POOL, META_TEMPLATE, is_runner_id


class RunnerState(StrEnum):
    STARTING = "starting"
    IDLE = "idle"
    OUTDATED = "outdated"
    CLAIMED = "claimed"
    EXPIRED = "expired"
    LOST = "lost"
    FAILED = "failed"
    TERMINATING = "terminating"


class PoolMode(StrEnum):
    ACTIVE = "active"
    DRAIN = "drain"
    DELETE = "delete"


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
            id=str_field(stub, "ID"),
            namespace=str_field(stub, "Namespace", "default") or "default",
            pool=pool if isinstance(pool, str) else "",
            template=template if isinstance(template, str) else "",
            status=str_field(stub, "Status", "pending"),
            stop=stub.get("Stop") is True,
            submit_time_ns=int_field(stub, "SubmitTime"),
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
                    restarts += int_field(state, "Restarts")
        return cls(
            id=str_field(stub, "ID"),
            job_id=str_field(stub, "JobID"),
            namespace=str_field(stub, "Namespace", "default") or "default",
            node_name=str_field(stub, "NodeName"),
            desired_status=str_field(stub, "DesiredStatus"),
            client_status=str_field(stub, "ClientStatus"),
            create_time_ns=int_field(stub, "CreateTime"),
            modify_time_ns=int_field(stub, "ModifyTime"),
            create_index=int_field(stub, "CreateIndex"),
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

    @classmethod
    def without_spec(cls, key: str, nomad_namespace: str = "", job_prefix: str = "") -> PoolPolicy:
        """The policy of a pool known without a valid spec (a drain resumed from Nomad, a
        pruned orphan, an object that was never valid): it wants no runner."""
        return cls(key, nomad_namespace, job_prefix, 0, 0, 1, "")

    def removed(self, mode: PoolMode, deadline: datetime) -> PoolPolicy:
        """This pool's policy once it is being drained or deleted."""
        return dataclasses.replace(self, mode=mode, drain_deadline=deadline)

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
