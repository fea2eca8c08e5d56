"""Jobs: registration, versions, deregistration, dispatch, scaling, summaries; the job fault."""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from controller.lab.simulator.deployments import ACTIVE
from controller.lab.simulator.jobspec import canonicalize, spec_of
from controller.lab.simulator.keys import SortedKeys
from controller.lab.simulator.scheduler import Scheduler
from controller.lab.simulator.store import TERMINAL, JobKey, JobRecord, Store
from controller.lab.simulator.util import JSON, ApiError, bad_request, not_found, now_ns

ENFORCE_PREFIX = "Enforcing job modify index"
SCALING_EVENTS_KEPT = 20  # per task group (Nomad's JobTrackedScalingEvents)


class JobRegistry:
    # Set by the Simulator: whether a namespace exists (a job may only be in one that does).
    namespace_exists: Callable[[str], bool] = staticmethod(lambda namespace: True)

    def __init__(self, store: Store, scheduler: Scheduler) -> None:
        self.store = store
        self.scheduler = scheduler
        self._keys = SortedKeys()

    def record(self, namespace: str, job_id: str) -> JobRecord:
        rec = self.store.jobs.get((namespace, job_id))
        if rec is None:
            raise not_found("job")
        return rec

    def job_keys(self, namespace: str, prefix: str = "") -> list[JobKey]:
        return self._keys.listed(namespace, prefix)

    def lose_state(self) -> None:
        """Store.lose_state: no job."""
        self._keys.clear()

    def _forget(self, key: JobKey) -> None:
        del self.store.jobs[key]
        self._keys.remove(key)
        self.scheduler.blocked.pop(key, None)

    # ------------------------------------------------------------------ writes
    def register_job(
        self,
        raw: Any,
        namespace: str | None = None,
        enforce_index: bool = False,
        job_modify_index: int = 0,
        trigger: str = "job-register",
        options: RegisterOptions | None = None,
    ) -> JSON:
        """Register (create or update) a job; returns the JobRegisterResponse body."""
        options = options or RegisterOptions()
        ns = namespace or (raw.get("Namespace") if isinstance(raw, dict) else None) or "default"
        job = canonicalize(raw, ns)
        self.admit(job)
        key = (ns, job["ID"])
        rec = self.store.jobs.get(key)
        self.store.counters["register_calls"] += 1
        if enforce_index:
            _enforce(rec, job_modify_index)
        if rec is not None:
            _preserve(job, rec.job, options)
        if rec is not None and spec_of(rec.job) == spec_of(job):
            # Unchanged spec: no new version, only an evaluation.
            eval_id, index = self._evaluate(rec, trigger, options.eval_priority)
            return _register_reply(eval_id, index, rec.job["ModifyIndex"], index)
        return self._upsert_job(rec, job, trigger, "JobRegistered", options)

    def admit(self, job: JSON) -> None:
        """Nomad's admission check of a job to register or plan: its namespace exists."""
        if not self.namespace_exists(job["Namespace"]):
            raise ApiError(
                500, f'job "{job["ID"]}" is in nonexistent namespace "{job["Namespace"]}"'
            )

    def _evaluate(self, rec: JobRecord, trigger: str, priority: int = 0) -> tuple[str, int]:
        """A new eval for the job as it is: (eval ID, index)."""
        txn = self.store.txn("EvaluationUpdated")
        ev = self.scheduler.new_eval(txn, rec.job, trigger, **_priority(priority))
        self.store.commit(txn)
        self.scheduler.schedule(ev["ID"])
        return ev["ID"], txn.index

    def submission(self, namespace: str, job_id: str, version: int) -> JSON | None:
        """The source a version of the job was registered from, if it came with one."""
        rec = self.store.jobs.get((namespace, job_id))
        return rec.submissions.get(version) if rec is not None else None

    def _upsert_job(
        self,
        rec: JobRecord | None,
        job: JSON,
        trigger: str,
        etype: str,
        options: RegisterOptions | None = None,
    ) -> JSON:
        options = options or RegisterOptions()
        store = self.store
        key = (job["Namespace"], job["ID"])
        txn = store.txn(etype)
        if rec is None:
            rec = JobRecord(key, [], txn.index)
            store.jobs[key] = rec
            self._keys.add(key)
            store.counters["jobs_created"] += 1
        job.update(
            Version=rec.job["Version"] + 1 if rec.versions else 0,
            CreateIndex=rec.create_index,
            ModifyIndex=txn.index,
            JobModifyIndex=txn.index,
            SubmitTime=now_ns(),
            Stable=False,
            Status=rec.job["Status"] if rec.versions else "pending",
            StatusDescription="",
        )
        rec.versions.append(job)
        if options.submission is not None:
            rec.submissions[job["Version"]] = {
                **options.submission,
                "Namespace": key[0],
                "JobID": key[1],
                "Version": job["Version"],
                "JobModifyIndex": txn.index,
            }
        store.counters["job_versions"] += 1
        txn.job(job)
        store.commit(txn)
        if job.get("ParameterizedJob") or job.get("Periodic"):
            self._refresh_status(rec)
            return _register_reply("", 0, job["JobModifyIndex"], txn.index)
        # The eval is written in a second transaction with the same index.
        etxn = store.txn(etype, txn.index)
        ev = self.scheduler.new_eval(etxn, job, trigger, **_priority(options.eval_priority))
        store.commit(etxn)
        self.scheduler.schedule(ev["ID"])
        return _register_reply(ev["ID"], txn.index, job["JobModifyIndex"], txn.index)

    def _refresh_status(self, rec: JobRecord) -> None:
        if self.store.job_status(rec) != rec.job["Status"]:
            txn = self.store.txn("JobRegistered")
            txn.jobs.add(rec.key)
            self.store.commit(txn)

    def deregister_job(
        self,
        job_id: str,
        namespace: str = "default",
        purge: bool = False,
        eval_priority: int = 0,
        no_shutdown_delay: bool = False,
    ) -> JSON:
        store = self.store
        key = (namespace, job_id)
        rec = store.jobs.get(key)
        store.counters["deregister_calls"] += 1
        if rec is None:
            return {
                "EvalID": "",
                "EvalCreateIndex": 0,
                "JobModifyIndex": 0,
                "VolumeEvalID": "",
                "VolumeEvalIndex": 0,
                "Index": 0,
            }
        txn = store.txn("JobDeregistered")
        job = rec.job
        if no_shutdown_delay:
            # In the same apply, every allocation of the job is told to skip its delay.
            for alloc_id in store.job_allocs.get(key, ()):
                alloc = store.allocs[alloc_id]
                alloc["DesiredTransition"] = {**alloc["DesiredTransition"], "NoShutdownDelay": True}
                txn.alloc(alloc)
        if purge:
            self._forget(key)
            txn.job(job)
        else:
            job = {**job, "Stop": True}
            job.update(
                Version=rec.job["Version"] + 1,
                ModifyIndex=txn.index,
                JobModifyIndex=txn.index,
                SubmitTime=now_ns(),
            )
            rec.versions.append(job)
            txn.job(job)
        store.commit(txn)
        etxn = store.txn("JobDeregistered", txn.index)
        ev = self.scheduler.new_eval(etxn, job, "job-deregister", **_priority(eval_priority))
        store.commit(etxn)
        self.scheduler.schedule(ev["ID"])
        return {
            "EvalID": ev["ID"],
            "EvalCreateIndex": txn.index,
            "JobModifyIndex": txn.index,
            "VolumeEvalID": "",
            "VolumeEvalIndex": 0,
            "Index": txn.index,
        }

    def evaluate_job(self, job_id: str, namespace: str = "default") -> JSON:
        rec = self.record(namespace, job_id)
        eval_id, index = self._evaluate(rec, "job-register")
        return _register_reply(eval_id, index, rec.job["JobModifyIndex"], index)

    def dispatch_job(self, job_id: str, namespace: str, body: JSON) -> JSON:
        rec = self.record(namespace, job_id)
        parent = rec.job
        spec = parent.get("ParameterizedJob")
        if not spec or parent.get("Stop"):
            raise bad_request("Specified job is not a parameterized job")
        meta = body.get("Meta") or {}
        if not isinstance(meta, dict):
            raise bad_request("Meta must be an object")
        required = set(spec.get("MetaRequired") or [])
        optional = set(spec.get("MetaOptional") or [])
        missing = sorted(required - set(meta))
        if missing:
            raise bad_request(f"Dispatch did not provide required meta keys: {missing}")
        extra = sorted(set(meta) - required - optional)
        if extra:
            raise bad_request(f"Dispatch provided unpermitted meta keys: {extra}")
        if spec.get("Payload") == "required" and not body.get("Payload"):
            raise bad_request("Payload is not provided but required by parameterized job")
        prefix = body.get("IdPrefixTemplate")
        suffix = f"{int(time.time())}-{self.store.new_id()[:8]}"
        child_id = (
            f"{job_id}/dispatch-{prefix}-{suffix}" if prefix else f"{job_id}/dispatch-{suffix}"
        )
        child = {
            k: v
            for k, v in parent.items()
            if k not in ("ParameterizedJob", "Version", "Status", "CreateIndex", "ModifyIndex")
        }
        child.update(
            ID=child_id,
            Name=child_id,
            ParentID=job_id,
            Dispatched=True,
            Meta={**(parent.get("Meta") or {}), **meta},
            Payload=body.get("Payload"),
        )
        reply = self._upsert_job(
            None, canonicalize(child, namespace), "job-register", "JobRegistered"
        )
        return {
            "Index": reply["Index"],
            "JobCreateIndex": reply["JobModifyIndex"],
            "EvalCreateIndex": reply["EvalCreateIndex"],
            "EvalID": reply["EvalID"],
            "DispatchedJobID": child_id,
            "KnownLeader": True,
            "LastContact": 0,
        }

    def force_periodic(self, job_id: str, namespace: str) -> JSON:
        """Nomad's Periodic.Force: launch the periodic job now, as a child job
        `<id>/periodic-<unix time>` (the periodic block removed) with its eval. A second
        launch in the same second is the same child: registered again, a new eval."""
        rec = self.store.jobs.get((namespace, job_id))
        if rec is None:
            raise ApiError(500, "job not found")
        parent = rec.job
        if not parent.get("Periodic"):
            raise ApiError(500, "can't force launch non-periodic job")
        if parent.get("Stop") or not parent["Periodic"].get("Enabled", True):
            raise ApiError(
                500,
                f'force launch for job "{job_id}" failed: '
                f'can\'t force run non-tracked job "{job_id}" ({namespace})',
            )
        child_id = f"{job_id}/periodic-{now_ns() // 10**9}"
        child = {
            k: v
            for k, v in parent.items()
            if k not in ("Periodic", "Version", "Status", "CreateIndex", "ModifyIndex")
        }
        child.update(ID=child_id, Name=child_id, ParentID=job_id)
        out = self.register_job(copy.deepcopy(child), namespace, trigger="periodic-job")
        return {
            "EvalID": out["EvalID"],
            "EvalCreateIndex": out["EvalCreateIndex"],
            "Index": out["EvalCreateIndex"],
        }

    def revert_job(self, job_id: str, namespace: str, version: int, enforce: Any) -> JSON:
        rec = self.record(namespace, job_id)
        if enforce is not None and enforce != rec.job["Version"]:
            raise bad_request(
                f"Current job has version {rec.job['Version']}; enforcing version {enforce}"
            )
        target = next((v for v in rec.versions if v["Version"] == version), None)
        if target is None:
            raise bad_request(
                f"job {job_id!r} in namespace {namespace!r} at version {version} not found"
            )
        if version == rec.job["Version"]:
            raise bad_request(f"can't revert to current version {version}")
        return self._upsert_job(rec, dict(target), "job-register", "JobRegistered")

    def stable_job(self, job_id: str, namespace: str, version: int, stable: bool) -> JSON:
        rec = self.record(namespace, job_id)
        target = next((v for v in rec.versions if v["Version"] == version), None)
        if target is None:
            raise not_found("job version")
        txn = self.store.txn("JobRegistered")
        target["Stable"] = bool(stable)
        target["ModifyIndex"] = txn.index
        txn.job(target)
        self.store.commit(txn)
        return {"JobModifyIndex": txn.index, "Index": txn.index}

    def scale_job(self, job_id: str, namespace: str, body: JSON) -> JSON:
        """Nomad's Job.Scale: with a Count, a new version with the group's count and an
        eval; without one (or with Error), only a scaling event. Every call records an
        event in the group's history (ScaleStatus shows the 20 newest, newest first)."""
        target = body.get("Target") or {}
        if not isinstance(target, dict):
            raise bad_request("Failed to decode request body: Target must be an object")
        if target.get("Job", "") not in ("", job_id):
            raise bad_request("job ID in payload did not match URL")
        if target.get("Namespace", "") not in ("", namespace):
            raise bad_request("namespace in payload did not match header")
        group_name = target.get("Group") or ""
        if not group_name:
            raise bad_request("missing task group name for scaling action")
        count = body.get("Count")
        if count is not None:
            if isinstance(count, bool) or not isinstance(count, int):
                raise bad_request("Failed to decode request body: Count must be a number")
            if count < 0:
                raise bad_request("scaling action count can't be negative")
            if body.get("Error"):
                raise bad_request("scaling action should not contain count if error is true")
        rec = self.store.jobs.get((namespace, job_id))
        if rec is None:
            raise ApiError(404, f'job "{job_id}" not found')
        group = next((g for g in rec.job["TaskGroups"] if g["Name"] == group_name), None)
        if group is None:
            raise bad_request(
                f'task group "{group_name}" specified for scaling does not exist in job'
            )
        event: JSON = {
            "Time": now_ns(),
            "Count": count,
            "PreviousCount": group["Count"],
            "Message": body.get("Message") or "",
            "Error": bool(body.get("Error")),
            "Meta": body.get("Meta"),
            "EvalID": None,
        }
        out = _register_reply("", 0, rec.job["ModifyIndex"], 0)
        if count is not None:
            out = self._scale_count(rec, group, count, body)
            event["EvalID"] = out["EvalID"] or None
        # The event is a write of its own (Nomad's ScalingEventRegisterRequest).
        txn = self.store.txn("ScalingEventRegistered")
        event["CreateIndex"] = txn.index
        history = rec.scaling_events.setdefault(group_name, [])
        history.insert(0, event)
        del history[SCALING_EVENTS_KEPT:]
        rec.scaling_index = txn.index
        txn.tables.add("scaling_event")
        self.store.commit(txn)
        return {**out, "Index": txn.index}

    def _scale_count(self, rec: JobRecord, group: JSON, count: int, body: JSON) -> JSON:
        """The new version of a scaling with a count, and its eval."""
        policy = group.get("Scaling") or {}
        if policy.get("Min") is not None and count < policy["Min"]:
            raise bad_request(
                f"group count was less than scaling policy minimum: {count} < {policy['Min']}"
            )
        if policy.get("Max") is not None and policy["Max"] < count:
            raise bad_request(
                f"group count was greater than scaling policy maximum: {count} > {policy['Max']}"
            )
        if rec.deployment_ids:
            latest = self.store.deployments[rec.deployment_ids[-1]]
            if latest["Status"] in ACTIVE and (latest["JobCreateIndex"] == rec.create_index):
                raise bad_request("job scaling blocked due to active deployment")
        if body.get("JobModifyIndex"):
            _enforce(rec, int(body["JobModifyIndex"]))
        job = copy.deepcopy(rec.job)
        for scaled in job["TaskGroups"]:
            if scaled["Name"] == group["Name"]:
                scaled["Count"] = count
        return self._upsert_job(rec, job, "job-scaling", "JobRegistered")

    # ------------------------------------------------------------------ reads
    def job_summary(self, rec: JobRecord) -> JSON:
        summary: dict[str, dict[str, int]] = {}
        for group in rec.job["TaskGroups"]:
            summary[group["Name"]] = {
                "Queued": rec.queued.get(group["Name"], 0),
                "Complete": 0,
                "Failed": 0,
                "Running": 0,
                "Starting": 0,
                "Lost": 0,
                "Unknown": 0,
            }
        names = {
            "pending": "Starting",
            "running": "Running",
            "complete": "Complete",
            "failed": "Failed",
            "lost": "Lost",
            "unknown": "Unknown",
        }
        for alloc_id in self.store.job_allocs.get(rec.key, ()):
            alloc = self.store.allocs[alloc_id]
            row = summary.get(alloc["TaskGroup"])
            if row is not None:
                row[names[alloc["ClientStatus"]]] += 1
        return {
            "JobID": rec.key[1],
            "Namespace": rec.key[0],
            "Summary": summary,
            "Children": {"Pending": 0, "Running": 0, "Dead": 0},
            "CreateIndex": rec.create_index,
            "ModifyIndex": rec.job["ModifyIndex"],
        }

    # ------------------------------------------------------------------ garbage
    def collect_garbage(self) -> None:
        """What Nomad's forced garbage collection (`PUT /v1/system/gc`: the core
        scheduler's passes with no age threshold) removes: stopped jobs that are dead;
        terminal allocations nothing runs any more (their job gone or stopped, told to
        stop, or replaced); terminal evaluations and deployments none of whose allocations
        is left. Reaping publishes no event; the tables' indexes move."""
        store = self.store
        txn = store.txn("GarbageCollected")
        for key, rec in list(store.jobs.items()):
            if rec.job.get("Stop") and store.job_status(rec) == "dead":
                self._forget(key)
                txn.tables.add("jobs")
        for key, alloc_ids in list(store.job_allocs.items()):
            for alloc_id in list(alloc_ids):
                if self._collectable(store.allocs[alloc_id], store.jobs.get(key)):
                    alloc = store.allocs.pop(alloc_id)
                    del alloc_ids[alloc_id]
                    store.node_allocs[alloc["NodeID"]].pop(alloc_id, None)
                    self.scheduler.placement.release(alloc_id)
                    txn.tables.add("allocs")
            if not alloc_ids:
                del store.job_allocs[key]
        kept = {alloc["EvalID"] for alloc in store.allocs.values()}
        kept_deployments = {alloc.get("DeploymentID") for alloc in store.allocs.values()}
        for eval_id, ev in list(store.evals.items()):
            if ev["Status"] in ("complete", "failed", "canceled") and eval_id not in kept:
                del store.evals[eval_id]
                txn.tables.add("evals")
        for deployment_id, deployment in list(store.deployments.items()):
            if deployment["Status"] in ("successful", "failed", "cancelled") and (
                deployment_id not in kept_deployments
            ):
                del store.deployments[deployment_id]
                txn.tables.add("deployment")
        if txn.tables:
            store.commit(txn)
        else:
            store.discard(txn)

    @staticmethod
    def _collectable(alloc: JSON, rec: JobRecord | None) -> bool:
        return alloc["ClientStatus"] in TERMINAL and (
            rec is None
            or bool(rec.job.get("Stop"))
            or alloc["DesiredStatus"] != "run"
            or bool(alloc.get("NextAllocation"))
        )

    # ------------------------------------------------------------------ fault
    def remove_job_silently(self, job_id: str, namespace: str = "default") -> None:
        """The job vanishes with only a JobDeregistered event; its allocs are gone."""
        store = self.store
        key = (namespace, job_id)
        rec = self.record(namespace, job_id)
        txn = store.txn("JobDeregistered")
        self._forget(key)
        for alloc_id in store.job_allocs.pop(key, {}):
            alloc = store.allocs.pop(alloc_id)
            store.node_allocs[alloc["NodeID"]].pop(alloc_id, None)
            self.scheduler.placement.release(alloc_id)
        txn.job(rec.job)
        txn.tables.add("allocs")
        store.commit(txn)


@dataclass(frozen=True)
class RegisterOptions:
    """What a registration may ask beyond the job (JobRegisterRequest)."""

    # Keep the current version's counts (of the groups it has) and task resources.
    preserve_counts: bool = False
    preserve_resources: bool = False
    eval_priority: int = 0  # the eval's priority instead of the job's (1-100; 0: the job's)
    submission: JSON | None = None  # the source the job came from (Source, Format, ...)


def _priority(eval_priority: int) -> JSON:
    """The eval fields of an eval priority asked for (none: the job's priority)."""
    return {"Priority": eval_priority} if eval_priority > 0 else {}


def _preserve(job: JSON, current: JSON, options: RegisterOptions) -> None:
    """Nomad's updatePreservedValues: group counts and task resources kept from the current
    version, for the groups (and tasks) it has."""
    groups = {g["Name"]: g for g in current["TaskGroups"]}
    for group in job["TaskGroups"]:
        before = groups.get(group["Name"])
        if before is None:
            continue
        if options.preserve_counts:
            group["Count"] = before["Count"]
        if options.preserve_resources:
            tasks = {t["Name"]: t for t in before["Tasks"]}
            for task in group["Tasks"]:
                if task["Name"] in tasks:
                    task["Resources"] = copy.deepcopy(tasks[task["Name"]]["Resources"])


def _enforce(rec: JobRecord | None, expected: int) -> None:
    """The job check-and-set: `expected` 0 means the job must not exist yet."""
    if expected == 0 and rec is not None:
        raise ApiError(500, f"{ENFORCE_PREFIX} 0: job already exists")
    if expected != 0 and rec is None:
        raise ApiError(500, f"{ENFORCE_PREFIX} {expected}: job does not exist")
    if rec is not None and rec.job["JobModifyIndex"] != expected:
        raise ApiError(
            500,
            f"{ENFORCE_PREFIX} {expected}: job exists with conflicting job modify index: "
            f"{rec.job['JobModifyIndex']}",
        )


def _register_reply(eval_id: str, eval_index: int, job_modify_index: int, index: int) -> JSON:
    return {
        "EvalID": eval_id,
        "EvalCreateIndex": eval_index,
        "JobModifyIndex": job_modify_index,
        "Warnings": "",
        "Index": index,
        "LastContact": 0,
        "KnownLeader": True,
    }
