"""Plain data the pure core works on: views of Nomad's jobs and allocations, one pool's
share of an observation, its policy, and the runners classified from them.

Parsers read every optional Nomad field with a default, because Nomad omits empty
fields in some payloads.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

from controller.core.claims import ClaimRecord
from controller.core.fields import int_field, str_field
from controller.core.runner_ids import META_POOL, META_TEMPLATE, is_runner_id
from controller.core.schedule import ScheduleWindow
from controller.core.times import parse_time, to_ns


class RunnerState(StrEnum):
    STARTING = "starting"
    IDLE = "idle"
    OUTDATED = "outdated"
    CLAIMED = "claimed"
    EXPIRED = "expired"
    LOST = "lost"
    FAILED = "failed"
    TERMINATING = "terminating"


class Failure(StrEnum):
    """Why a runner is FAILED. Only the first two are failed starts (the circuit breaker
    counts them): a runner that ran and then ended, or that someone else stopped, is
    replaced without counting against the pool's image or capacity."""

    STARTUP_TIMEOUT = "startup_timeout"  # never running within startupTimeoutSeconds
    FAILED_TO_START = "failed_to_start"  # an allocation failed before any task started
    ENDED = "ended"  # ran, then its job ended (drained, finished, lost with its node)
    STOPPED = "stopped"  # its job was stopped outside poolkeeper

    @property
    def failed_start(self) -> bool:
        return self in (Failure.STARTUP_TIMEOUT, Failure.FAILED_TO_START)


class PoolMode(StrEnum):
    """What the engine does with a pool: keep it at its targets, drain it (claimed
    runners finish first), or delete its runners at once."""

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
    node_id: str = ""
    # When its first task started (Unix ns), 0 if none has: a runner that once ran and
    # then ended (drained, lost with its node, finished) did not fail to start, and start
    # times are measured from it.
    started_time_ns: int = 0
    # Why a task failed, from its task events ("Driver Failure: Failed to pull ..."), if any.
    failure: str = ""

    @classmethod
    def from_stub(cls, stub: Mapping[str, Any]) -> AllocationView:
        """From an AllocListStub (GET /v1/allocations?task_states=true) or a full one."""
        restarts = 0
        started: list[int] = []
        failure = ""
        task_states = stub.get("TaskStates")
        if isinstance(task_states, Mapping):
            for state in task_states.values():
                if isinstance(state, Mapping):
                    restarts += int_field(state, "Restarts")
                    started.extend(_started_ns(state))
                    failure = _last_failure(state) or failure
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
            node_id=str_field(stub, "NodeID"),
            started_time_ns=min(started, default=0),
            failure=failure,
        )

    @property
    def started(self) -> bool:
        return self.started_time_ns > 0

    @property
    def live(self) -> bool:
        """Counts toward a runner: Nomad wants it to run and the client has not ended it.

        A desired-stop allocation never counts, whatever its client status says: that
        is the seed bug, where the old allocation still reported `running`.
        """
        return self.desired_status == "run" and self.client_status in ("pending", "running")


# Task event types that mean the task could not be started.
_START_FAILURES = frozenset({"Driver Failure", "Setup Failure", "Failed Validation"})
# Task event types that say why a task failed. Nomad's restart tracker then adds the
# event that fails the task ("Not Restarting: Error was unrecoverable", "... Exceeded
# allowed attempts ..."), which says only that the failure is final.
_CAUSES = _START_FAILURES | {
    "Task hook failed",
    "Failed Artifact Download",
    "Disk Resources Exceeded",
    "Sibling Task Failed",
    "Failed Restoring Task",
}
_NOT_RESTARTING = "Not Restarting"
# Where an event without a DisplayMessage says what went wrong: its Details (Nomad 0.10+),
# then the older fields of the same meaning.
_DETAILS = ("driver_error", "setup_error", "validation_error", "kill_reason", "kill_error",
            "download_error", "restart_reason")  # fmt: skip
_FIELDS = ("DriverError", "SetupError", "ValidationError", "KillReason", "KillError",
           "DownloadError", "RestartReason", "Message")  # fmt: skip


def _last_failure(task_state: Mapping[str, Any]) -> str:
    """Why the task failed, as `nomad alloc status` shows it: the newest event that says
    why (a driver failure with its message, a failed hook, a kill that failed the task, a
    non-zero exit), else the newest event that failed the task; "" when none did."""
    events = task_state.get("Events")
    if not isinstance(events, list):
        return ""
    events = [event for event in events if isinstance(event, Mapping)]
    failing = [e for e in events if _fails(e) or str_field(e, "Type") in _START_FAILURES]
    if not failing:
        return ""
    causes = [e for e in events if _says_why(e)]
    chosen = causes[-1] if causes else failing[-1]
    kind, text = str_field(chosen, "Type"), _description(chosen)
    return f"{kind}: {text}" if text else kind


def _fails(event: Mapping[str, Any]) -> bool:
    details = event.get("Details")
    flagged = isinstance(details, Mapping) and details.get("fails_task") == "true"
    return event.get("FailsTask") is True or flagged


def _says_why(event: Mapping[str, Any]) -> bool:
    kind = str_field(event, "Type")
    if kind in _CAUSES:
        return True
    if kind == "Terminated":
        return int_field(event, "ExitCode") != 0 or _fails(event)
    return _fails(event) and kind != _NOT_RESTARTING


def _description(event: Mapping[str, Any]) -> str:
    text = str_field(event, "DisplayMessage")
    details = event.get("Details")
    if not text and isinstance(details, Mapping):
        text = next((str(details[k]) for k in _DETAILS if details.get(k)), "")
    return text or next((str_field(event, k) for k in _FIELDS if str_field(event, k)), "")


def placement_failure(evaluations: Iterable[Mapping[str, Any]]) -> str:
    """Why Nomad could not place a job, from its newest evaluation that failed to place
    an allocation (`FailedTGAllocs`), e.g. `no placement: 3 of 3 nodes exhausted (memory
    3)`; empty when none says so."""
    failed = [
        ev
        for ev in evaluations
        if isinstance(ev, Mapping) and isinstance(ev.get("FailedTGAllocs"), Mapping)
    ]
    if not failed:
        return ""
    newest = max(failed, key=lambda ev: int_field(ev, "ModifyIndex"))
    parts = []
    for metric in newest["FailedTGAllocs"].values():
        if not isinstance(metric, Mapping):
            continue
        evaluated = int_field(metric, "NodesEvaluated")
        part = f"no placement: {int_field(metric, 'NodesExhausted')} of {evaluated} nodes exhausted"
        dimensions = metric.get("DimensionExhausted")
        if isinstance(dimensions, Mapping) and dimensions:
            part += " (" + ", ".join(f"{k} {v}" for k, v in sorted(dimensions.items())) + ")"
        parts.append(part)
    return "; ".join(parts)


def _started_ns(task_state: Mapping[str, Any]) -> list[int]:
    """A task state's StartedAt in Unix ns; nothing for Go's zero time or no time."""
    text = task_state.get("StartedAt")
    if not isinstance(text, str) or not text:
        return []
    try:
        started = to_ns(parse_time(text))
    except ValueError:
        return []
    return [started] if started > 0 else []


@dataclass(frozen=True, slots=True)
class NodeView:
    """A client node, from GET /v1/nodes (the deadline from the node itself)."""

    id: str
    name: str
    draining: bool
    eligible: bool
    drain_deadline: datetime | None = None

    @classmethod
    def from_stub(cls, stub: Mapping[str, Any], node: Mapping[str, Any] | None = None) -> NodeView:
        """From a NodeListStub; `node` (GET /v1/node/:id) adds a drain's deadline."""
        strategy = node.get("DrainStrategy") if node is not None else None
        deadline = None
        if isinstance(strategy, Mapping):
            text = strategy.get("ForceDeadline")
            # Go's zero time (year 1) means a drain without a deadline.
            if isinstance(text, str) and text and not text.startswith("0001-"):
                try:
                    deadline = parse_time(text)
                except ValueError:
                    deadline = None
        return cls(
            id=str_field(stub, "ID"),
            name=str_field(stub, "Name"),
            draining=stub.get("Drain") is True,
            eligible=str_field(stub, "SchedulingEligibility", "eligible") != "ineligible",
            drain_deadline=deadline,
        )

    @property
    def leaving(self) -> bool:
        """Its allocations are to move away: it drains, or takes no new placements."""
        return self.draining or not self.eligible


@dataclass(frozen=True, slots=True)
class DemandPolicy:
    """`spec.demand`: the buffer sized by the measured claim rate (core/demand.py)."""

    max_idle_runners: int | None = None
    window_seconds: int = 300
    cover_seconds: int | None = None


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
    demand: DemandPolicy | None = None
    schedule: tuple[ScheduleWindow, ...] = ()

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
    # IDs of the nodes whose allocations are to move away (NodeView.leaving).
    leaving_nodes: frozenset[str] = frozenset()


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
    # Why a FAILED runner is unusable; None for the other states.
    failure: Failure | None = None
