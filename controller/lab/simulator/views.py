"""How stored objects are shown on the wire: stubs, full objects, list pages."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from controller.lab.simulator.store import ALWAYS, JobRecord
from controller.lab.simulator.util import JSON, omit_empty

if TYPE_CHECKING:
    from controller.lab.simulator.cluster import Simulator

_STUB_FIELDS = (
    "ID",
    "EvalID",
    "Name",
    "Namespace",
    "NodeID",
    "NodeName",
    "JobID",
)


def alloc_stub(alloc: JSON, task_states: bool = True, resources: bool = False) -> JSON:
    """AllocListStub: no omitempty, never PreviousAllocation."""
    stub = {k: alloc[k] for k in _STUB_FIELDS}
    job = alloc["Job"]
    stub["JobType"] = job["Type"]
    stub["JobVersion"] = alloc["JobVersion"]
    stub["TaskGroup"] = alloc["TaskGroup"]
    if resources:
        stub["AllocatedResources"] = alloc["AllocatedResources"]
    stub["DesiredStatus"] = alloc["DesiredStatus"]
    stub["DesiredDescription"] = alloc["DesiredDescription"]
    stub["ClientStatus"] = alloc["ClientStatus"]
    stub["ClientDescription"] = alloc["ClientDescription"]
    stub["DesiredTransition"] = alloc["DesiredTransition"]
    if task_states:
        stub["TaskStates"] = alloc["TaskStates"]
    stub["DeploymentStatus"] = alloc["DeploymentStatus"]
    stub["FollowupEvalID"] = alloc["FollowupEvalID"]
    stub["NextAllocation"] = alloc["NextAllocation"]
    stub["RescheduleTracker"] = alloc["RescheduleTracker"]
    stub["PreemptedAllocations"] = alloc["PreemptedAllocations"]
    stub["PreemptedByAllocation"] = alloc["PreemptedByAllocation"]
    stub["CreateIndex"] = alloc["CreateIndex"]
    stub["ModifyIndex"] = alloc["ModifyIndex"]
    stub["CreateTime"] = alloc["CreateTime"]
    stub["ModifyTime"] = alloc["ModifyTime"]
    return stub


def alloc_full(alloc: JSON) -> JSON:
    return omit_empty(alloc, ALWAYS)


def eval_view(ev: JSON) -> JSON:
    return omit_empty(ev)


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
        "LastDrain": None,
        "CreateIndex": node["CreateIndex"],
        "ModifyIndex": node["ModifyIndex"],
    }
    if resources:
        stub["NodeResources"] = node["NodeResources"]
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
