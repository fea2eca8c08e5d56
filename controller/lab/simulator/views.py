"""How stored objects are shown on the wire: stubs, full objects, list pages."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from controller.lab.simulator.store import ALWAYS, JobRecord
from controller.lab.simulator.util import JSON, omit_empty

if TYPE_CHECKING:
    from controller.lab.simulator.cluster import Simulator

# AllocListStub's fields in Nomad's order; JobType is the job's Type, and the two
# optional ones are there only when asked for.
_STUB_FIELDS = (
    "ID",
    "EvalID",
    "Name",
    "Namespace",
    "NodeID",
    "NodeName",
    "JobID",
    "JobType",
    "JobVersion",
    "TaskGroup",
    "AllocatedResources",
    "DesiredStatus",
    "DesiredDescription",
    "ClientStatus",
    "ClientDescription",
    "DesiredTransition",
    "TaskStates",
    "DeploymentStatus",
    "FollowupEvalID",
    "NextAllocation",
    "RescheduleTracker",
    "PreemptedAllocations",
    "PreemptedByAllocation",
    "CreateIndex",
    "ModifyIndex",
    "CreateTime",
    "ModifyTime",
)


def alloc_stub(alloc: JSON, task_states: bool = True, resources: bool = False) -> JSON:
    """AllocListStub: no omitempty, never PreviousAllocation."""
    left_out: set[str] = set()
    if not task_states:
        left_out.add("TaskStates")
    if not resources:
        left_out.add("AllocatedResources")
    shown = {**alloc, "JobType": alloc["Job"]["Type"]}
    return {k: shown[k] for k in _STUB_FIELDS if k not in left_out}


def alloc_full(alloc: JSON) -> JSON:
    return omit_empty(alloc, ALWAYS)


def eval_view(ev: JSON) -> JSON:
    return omit_empty(ev)


_EVAL_STUB_FIELDS = (
    "ID", "Namespace", "Priority", "Type", "TriggeredBy", "JobID", "NodeID", "DeploymentID",
    "Status", "StatusDescription", "WaitUntil", "NextEval", "PreviousEval", "BlockedEval",
    "CreateIndex", "ModifyIndex", "CreateTime", "ModifyTime",
)  # fmt: skip


def eval_stub(ev: JSON) -> JSON:
    """EvaluationStub, as a related eval is shown (no omitempty)."""
    empty: JSON = {"WaitUntil": "0001-01-01T00:00:00Z"}
    return {k: ev.get(k, empty.get(k, "")) for k in _EVAL_STUB_FIELDS}


def job_stub(sim: Simulator, rec: JobRecord, meta: bool) -> JSON:
    job = rec.job
    stub: JSON = {
        "ID": job["ID"],
        "ParentID": job.get("ParentID", ""),
        "Name": job["Name"],
        "Namespace": job["Namespace"],
        "Datacenters": job.get("Datacenters"),
        "NodePool": job.get("NodePool", "default"),
        "Multiregion": job.get("Multiregion"),
        "Type": job["Type"],
        "Priority": job["Priority"],
        "Periodic": bool(job.get("Periodic")),
        "ParameterizedJob": bool(job.get("ParameterizedJob")),
        "Stop": bool(job.get("Stop")),
        "Status": job["Status"],
        "StatusDescription": job.get("StatusDescription", ""),
        "JobSummary": sim.job_summary(rec),
        "CreateIndex": job["CreateIndex"],
        "ModifyIndex": job["ModifyIndex"],
        "JobModifyIndex": job["JobModifyIndex"],
        "SubmitTime": job["SubmitTime"],
    }
    if meta:
        stub["Meta"] = job.get("Meta")
    return stub


def node_stub(node: JSON, resources: bool, os_attr: bool) -> JSON:
    stub: JSON = {
        "Address": "127.0.0.1",
        "ID": node["ID"],
        "Attributes": {"os.name": node["Attributes"]["os.name"]} if os_attr else None,
        "Datacenter": node["Datacenter"],
        "Name": node["Name"],
        "NodeClass": node["NodeClass"],
        "NodePool": node["NodePool"],
        "Version": node["Version"],
        "Drain": node["Drain"],
        "SchedulingEligibility": node["SchedulingEligibility"],
        "Status": node["Status"],
        "StatusDescription": node["StatusDescription"],
        "Drivers": node["Drivers"],
        "LastDrain": node.get("LastDrain"),
        "CreateIndex": node["CreateIndex"],
        "ModifyIndex": node["ModifyIndex"],
    }
    if resources:
        stub["NodeResources"] = node["NodeResources"]
        stub["ReservedResources"] = node["ReservedResources"]
    return stub


def paginate(
    items: Iterable[Any],
    token_of: Callable[[Any], Any],
    start: Any | None,
    per_page: int,
    keep: Callable[[Any], bool] | None,
) -> tuple[list[Any], Any | None]:
    """Nomad's paginator: skip to the token, filter, cut at per_page.

    The next token is the token of the first item left out.
    """
    out: list[Any] = []
    it: Iterator[Any] = iter(items)
    for item in it:
        if start is not None and token_of(item) < start:
            continue
        if keep is not None and not keep(item):
            continue
        if per_page and len(out) == per_page:
            return out, token_of(item)
        out.append(item)
    return out, None
