"""Jobs: registration, versions, deregistration, dispatch, scaling, summaries; the job fault."""

from __future__ import annotations

import bisect
import copy
import time
from typing import Any

from controller.lab.simulator.jobspec import canonicalize, spec_of
from controller.lab.simulator.scheduler import Scheduler
from controller.lab.simulator.store import JobKey, JobRecord, Store
from controller.lab.simulator.util import JSON, ApiError, bad_request, not_found, now_ns

ENFORCE_PREFIX = "Enforcing job modify index"


class JobRegistry:
    def __init__(self, store: Store, scheduler: Scheduler) -> None:
        self.store = store
        self.scheduler = scheduler
        self._keys: list[JobKey] = []  # sorted, for namespace and prefix listings

    def record(self, namespace: str, job_id: str) -> JobRecord:
        rec = self.store.jobs.get((namespace, job_id))
        if rec is None:
            raise not_found("job")
        return rec

    def job_keys(self, namespace: str) -> list[JobKey]:
        if namespace == "*":
            return self._keys
        lo = bisect.bisect_left(self._keys, (namespace, ""))
        hi = bisect.bisect_left(self._keys, (namespace + "\x00", ""))
        return self._keys[lo:hi]

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
    ) -> JSON:
        """Register (create or update) a job; returns the JobRegisterResponse body."""
        ns = namespace or (raw.get("Namespace") if isinstance(raw, dict) else None) or "default"
        job = canonicalize(raw, ns)
        key = (ns, job["ID"])
        rec = self.store.jobs.get(key)
        self.store.counters["register_calls"] += 1
        if enforce_index:
            _enforce(rec, job_modify_index)
        if rec is not None and spec_of(rec.job) == spec_of(job):
            # Unchanged spec: no new version, only an evaluation.
            eval_id, index = self._evaluate(rec, trigger)
            return _register_reply(eval_id, index, rec.job["ModifyIndex"], index)
        return self._upsert_job(rec, job, trigger, "JobRegistered")

    def _evaluate(self, rec: JobRecord, trigger: str) -> tuple[str, int]:
        """A new eval for the job as it is: (eval ID, index)."""
        txn = self.store.txn("EvaluationUpdated")
        ev = self.scheduler.new_eval(txn, rec.job, trigger)
        self.store.commit(txn)
        self.scheduler.schedule(ev["ID"])
        return ev["ID"], txn.index

    def _upsert_job(self, rec: JobRecord | None, job: JSON, trigger: str, etype: str) -> JSON:
        store = self.store
        key = (job["Namespace"], job["ID"])
        txn = store.txn(etype)
        if rec is None:
            rec = JobRecord(key, [], txn.index)
            store.jobs[key] = rec
            bisect.insort(self._keys, key)
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
        store.counters["job_versions"] += 1
        txn.job(job)
        store.commit(txn)
        if job.get("ParameterizedJob") or job.get("Periodic"):
            self._refresh_status(rec)
            return _register_reply("", 0, job["JobModifyIndex"], txn.index)
        # The eval is written in a second transaction with the same index.
        etxn = store.txn(etype, txn.index)
        ev = self.scheduler.new_eval(etxn, job, trigger)
        store.commit(etxn)
        self.scheduler.schedule(ev["ID"])
        return _register_reply(ev["ID"], txn.index, job["JobModifyIndex"], txn.index)

    def _refresh_status(self, rec: JobRecord) -> None:
        if self.store.job_status(rec) != rec.job["Status"]:
            txn = self.store.txn("JobRegistered")
            txn.jobs.add(rec.key)
            self.store.commit(txn)

    def deregister_job(self, job_id: str, namespace: str = "default", purge: bool = False) -> JSON:
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
        ev = self.scheduler.new_eval(etxn, job, "job-deregister")
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
        rec = self.store.jobs.get((namespace, job_id))
        if rec is None:
            raise ApiError(404, f'job "{job_id}" not found')
        target = body.get("Target") or {}
        group_name = target.get("Group")
        groups = [g for g in rec.job["TaskGroups"] if g["Name"] == group_name]
        if not groups:
            raise bad_request(
                f"task group {group_name!r} specified for scaling does not exist in job"
            )
        if body.get("JobModifyIndex"):
            _enforce(rec, int(body["JobModifyIndex"]))
        count = body.get("Count")
        if count is None:
            raise bad_request("scaling action without a count is not supported")
        if not isinstance(count, int) or count < 0:
            raise bad_request("scaling action count can't be negative")
        job = copy.deepcopy(rec.job)
        for group in job["TaskGroups"]:
            if group["Name"] == group_name:
                group["Count"] = count
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
