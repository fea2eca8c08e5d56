"""The scheduler: evaluations, blocked evals, the reconciler and its plans, deployments."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from controller.lab.simulator.jobspec import group_key, group_resources
from controller.lab.simulator.placement import Placement
from controller.lab.simulator.store import TERMINAL, JobKey, Store, Txn
from controller.lab.simulator.util import JSON, ApiError, now_ns

if TYPE_CHECKING:
    from controller.lab.simulator.clients import Clients

STOP_MIGRATING = "alloc is being migrated"
STOP_LOST = "alloc is lost since its node is down"
STOP_RESCHEDULED = "alloc was rescheduled because it failed"
STOP_UPDATED = "alloc is being updated due to job update"
STOP_NOT_NEEDED = "alloc not needed due to job update"


class Scheduler:
    # Set by the Simulator: the clients start what a plan places (and point back here).
    clients: Clients

    def __init__(self, store: Store, algorithm: str) -> None:
        self.store = store
        self.placement = Placement(store, algorithm, self.request_unblock)
        self.blocked: dict[JobKey, str] = {}  # job -> its blocked eval
        self.broker_paused = False  # the operator paused the eval broker: nothing is processed
        self._unblock_pending = False
        self._resched_due: dict[str, float] = {}  # follow-up eval -> WaitUntil (monotonic)

    def lose_state(self) -> None:
        """Store.lose_state: no blocked or delayed evaluation, nothing placed."""
        self.blocked.clear()
        self._resched_due.clear()
        self.placement.lose_state()

    # ------------------------------------------------------------------ evaluations
    def new_eval(self, txn: Txn, job: JSON, trigger: str, **extra: Any) -> JSON:
        ev: JSON = {
            "ID": self.store.new_id(),
            "Namespace": job["Namespace"],
            "Priority": job.get("Priority", 50),
            "Type": job.get("Type", "service"),
            "TriggeredBy": trigger,
            "JobID": job["ID"],
            "JobModifyIndex": job.get("JobModifyIndex", 0),
            "Status": "pending",
            "StatusDescription": "",
            "CreateIndex": txn.index,
            "CreateTime": now_ns(),
            **extra,
        }
        self.store.evals[ev["ID"]] = ev
        self.store.counters["evals_created"] += 1
        rec = self.store.jobs.get((job["Namespace"], job["ID"]))
        if rec is not None:
            rec.eval_ids.append(ev["ID"])
            rec.open_evals.add(ev["ID"])
        txn.eval(ev)
        return ev

    def close_eval(self, txn: Txn, ev: JSON, status: str = "complete", **extra: Any) -> None:
        ev.update(Status=status, **extra)
        rec = self.store.jobs.get((ev["Namespace"], ev["JobID"]))
        if rec is not None and status not in ("pending", "blocked"):
            rec.open_evals.discard(ev["ID"])
        txn.eval(ev)

    def schedule(self, eval_id: str, delay: float = 0.0) -> None:
        self.store.later(delay, self._process_eval, eval_id)

    def delete_evals(self, eval_ids: list[str], keep: Any) -> JSON:
        """Nomad's Eval.Delete (the broker must be paused): the named evals, each safe to
        delete (no live allocation came from it), or those a filter matches that are."""
        store = self.store
        if eval_ids:
            for eval_id in eval_ids:
                ev = store.evals.get(eval_id)
                if ev is None:
                    raise ApiError(500, "eval not found")
                if not self._deletable(ev):
                    raise ApiError(500, f"eval {eval_id} is not safe to delete")
            doomed = list(eval_ids)
        else:
            doomed = [e["ID"] for e in store.evals.values() if keep(e) and self._deletable(e)]
        txn = store.txn("EvaluationDeleted")
        txn.tables.add("evals")
        for eval_id in doomed:
            ev = store.evals.pop(eval_id)
            rec = store.jobs.get((ev["Namespace"], ev["JobID"]))
            if rec is not None:
                rec.open_evals.discard(eval_id)
                if eval_id in rec.eval_ids:
                    rec.eval_ids.remove(eval_id)
            if self.blocked.get((ev["Namespace"], ev["JobID"])) == eval_id:
                del self.blocked[(ev["Namespace"], ev["JobID"])]
        store.commit(txn)
        return {"Count": len(doomed), "Index": txn.index}

    def _deletable(self, ev: JSON) -> bool:
        return not any(
            a["EvalID"] == ev["ID"] and a["ClientStatus"] not in TERMINAL
            for a in self.store.allocs.values()
        )

    def related_evals(self, ev: JSON) -> list[JSON]:
        """The evals linked to `ev` through NextEval, PreviousEval and BlockedEval, and
        theirs in turn (Nomad's EvalsRelatedToID), without `ev` itself."""
        seen = {ev["ID"]}
        todo = [ev]
        related: list[JSON] = []
        while todo:
            current = todo.pop()
            for link in ("NextEval", "PreviousEval", "BlockedEval"):
                other = self.store.evals.get(current.get(link) or "")
                if other is not None and other["ID"] not in seen:
                    seen.add(other["ID"])
                    related.append(other)
                    todo.append(other)
        return sorted(related, key=lambda e: e["CreateIndex"])

    def resume_broker(self) -> None:
        """The eval broker runs again: what waited in it is processed."""
        self.broker_paused = False
        for ev in list(self.store.evals.values()):
            if ev["Status"] == "pending":
                self.schedule(ev["ID"])
        self.request_unblock()

    def request_unblock(self) -> None:
        if self.blocked and not self._unblock_pending:
            self._unblock_pending = True
            self.store.later(0, self._unblock)

    def _unblock(self) -> None:
        self._unblock_pending = False
        for eval_id in list(self.blocked.values()):
            self._process_eval(eval_id)

    # ------------------------------------------------------------------ plans
    def _process_eval(self, eval_id: str) -> None:
        """Reconcile one job and apply the plan as one PlanResult. An evaluation that
        cannot place everything (and is not itself a blocked one) then writes the blocked
        eval, then its own completion: three applies, as Nomad's scheduler makes them."""
        store = self.store
        ev = store.evals.get(eval_id)
        if ev is None or ev["Status"] not in ("pending", "blocked") or self.broker_paused:
            return
        wait_until = self._resched_due.get(eval_id)
        if wait_until is not None and time.monotonic() < wait_until:
            return
        key = (ev["Namespace"], ev["JobID"])
        rec = store.jobs.get(key)
        job = rec.job if rec is not None else None
        txn = store.txn("PlanResult")
        placed, stopped, followups, missing = self._reconcile(txn, key, job, ev)
        was_blocked = ev["Status"] == "blocked"
        if missing and was_blocked and not txn.rows:
            store.discard(txn)  # nothing changed: the blocked eval stays as it is
            return
        if rec is not None:
            rec.queued = dict(missing)
        if missing and not was_blocked:
            self._block(txn, ev, missing, job, key)
        else:
            if missing:
                ev["FailedTGAllocs"] = {tg: self.failed_metric(n) for tg, n in missing.items()}
                txn.eval(ev)
            else:
                if self.blocked.get(key) == ev["ID"] or not was_blocked:
                    self.close_eval(txn, ev)
                if self.blocked.get(key) == ev["ID"]:
                    del self.blocked[key]
            if not placed and not stopped and not followups:
                txn.etype = "EvaluationUpdated"
            store.commit(txn)
        for alloc in placed:
            self.clients.start_soon(alloc["ID"])
        for alloc in stopped:
            if alloc["ClientStatus"] not in TERMINAL:
                self.clients.stop_soon(alloc["ID"])
        for follow_id, delay in followups:
            self.schedule(follow_id, delay)

    def _block(
        self, plan: Txn, ev: JSON, missing: dict[str, int], job: JSON | None, key: JobKey
    ) -> None:
        """The plan (if it holds anything: a deployment, what could be placed), then the
        blocked eval, then the evaluation's completion, each an apply of its own."""
        store = self.store
        if not plan.rows:
            store.discard(plan)  # no plan to apply: Nomad submits none
        else:
            store.commit(plan)
        txn = store.txn("EvaluationUpdated")
        failed = {tg: self.failed_metric(n) for tg, n in missing.items()}
        blocked = self.new_eval(
            txn,
            job or {"Namespace": key[0], "ID": key[1]},
            "queued-allocs",
            Status="blocked",
            StatusDescription="created to place remaining allocations",
            PreviousEval=ev["ID"],
            FailedTGAllocs=failed,
        )
        stale = self.blocked.get(key)
        if stale is not None and stale in store.evals:
            self.close_eval(txn, store.evals[stale], "canceled")
        self.blocked[key] = blocked["ID"]
        store.commit(txn)
        txn = store.txn("EvaluationUpdated")
        self.close_eval(txn, ev, FailedTGAllocs=failed, BlockedEval=blocked["ID"])
        store.commit(txn)

    def failed_metric(self, failures: int) -> JSON:
        """The AllocMetric of a group's failed placements (FailedTGAllocs)."""
        nodes = len(self.store.nodes)
        return {
            "NodesEvaluated": nodes,
            "NodesExhausted": nodes,
            "DimensionExhausted": {"cpu or memory": failures},
            "CoalescedFailures": failures - 1,
        }

    def plan(self, job: JSON, current: JSON | None) -> JSON:
        """What registering `job` would do now, applying nothing (Nomad's Job.Plan): the
        updates per group, the placements that would fail, and the blocked eval that
        would then be created. `current` is the registered version, if any."""
        key = (job["Namespace"], job["ID"])
        allocs = self.store.allocs
        live = [
            allocs[a]
            for a in self.store.job_allocs.get(key, ())
            if allocs[a]["DesiredStatus"] == "run" and allocs[a]["ClientStatus"] not in TERMINAL
        ]
        updates: JSON = {}
        failed: JSON = {}
        for group in job["TaskGroups"]:
            name, count = group["Name"], group["Count"]
            mine = [a for a in live if a["TaskGroup"] == name]
            kept = min(len(mine), count)
            changed = current is not None and group_key(current, name) != group_key(job, name)
            place = 0 if job.get("Stop") else max(count - len(mine), 0)
            updates[name] = {
                "Ignore": 0 if changed or job.get("Stop") else kept,
                "Place": place,
                "Migrate": 0,
                "Stop": len(mine) if job.get("Stop") else len(mine) - kept,
                "InPlaceUpdate": 0,
                "DestructiveUpdate": kept if changed and not job.get("Stop") else 0,
                "Canary": 0,
                "Preemptions": 0,
            }
            cpu, mem = group_resources(group)
            failures = place - self.placement.count_fitting(place, cpu, mem)
            if failures > 0:
                failed[name] = self.failed_metric(failures)
        created = None
        if failed:
            created = [
                {
                    "ID": self.store.new_id(),
                    "Namespace": job["Namespace"],
                    "Priority": job["Priority"],
                    "Type": job["Type"],
                    "TriggeredBy": "queued-allocs",
                    "JobID": job["ID"],
                    "JobModifyIndex": current["JobModifyIndex"] if current else 0,
                    "Status": "blocked",
                    "StatusDescription": "created to place remaining allocations",
                    "FailedTGAllocs": failed,
                }
            ]
        return {
            "Annotations": {"DesiredTGUpdates": updates, "PreemptedAllocs": None},
            "FailedTGAllocs": failed or None,
            "CreatedEvals": created,
        }

    def _reconcile(
        self, txn: Txn, key: JobKey, job: JSON | None, ev: JSON
    ) -> tuple[list[JSON], list[JSON], list[tuple[str, float]], dict[str, int]]:
        allocs = self.store.allocs
        placed: list[JSON] = []
        stopped: list[JSON] = []
        followups: list[tuple[str, float]] = []
        missing: dict[str, int] = {}
        active = [
            allocs[a]
            for a in self.store.job_allocs.get(key, ())
            if allocs[a]["DesiredStatus"] == "run"
        ]
        if job is None or job.get("Stop") or job.get("ParameterizedJob") or job.get("Periodic"):
            for alloc in active:
                if alloc["ClientStatus"] not in TERMINAL:
                    self.stop(txn, alloc, STOP_NOT_NEEDED)
                    stopped.append(alloc)
            return placed, stopped, followups, missing
        deployment: JSON | None = None
        for group in job["TaskGroups"]:
            name = group["Name"]
            mine = [a for a in active if a["TaskGroup"] == name]
            keep: list[JSON] = []
            replace: list[tuple[JSON, str]] = []
            for alloc in mine:
                reason = self._replacement_reason(txn, alloc, job, group, ev, followups)
                if reason:
                    replace.append((alloc, reason))
                else:
                    # None: healthy; "": failed and waiting (follow-up, or out of attempts),
                    # which still holds its slot so the count is not refilled behind it.
                    keep.append(alloc)
            count = group["Count"]
            keep.sort(key=name_index)
            for alloc in keep[count:]:
                if alloc["ClientStatus"] not in TERMINAL:
                    self.stop(txn, alloc, STOP_NOT_NEEDED)
                    stopped.append(alloc)
            keep = keep[:count]
            needed = max(count - len(keep), 0)
            for alloc, reason in replace[needed:]:
                self.stop(txn, alloc, reason, lost=reason == STOP_LOST)
                stopped.append(alloc)
            used_names = {name_index(a) for a in keep}
            slots: list[tuple[int, JSON | None, str]] = []
            for alloc, reason in replace[:needed]:
                slots.append((name_index(alloc), alloc, reason))
                used_names.add(name_index(alloc))
            free_names = (i for i in range(10**9) if i not in used_names)
            while len(keep) + len(slots) < count:
                slots.append((next(free_names), None, ""))
            slots.sort(key=lambda s: s[0])
            cpu, mem = group_resources(group)
            new_allocs: list[tuple[JSON, JSON | None, str]] = []
            if slots and deployment is None and job["Type"] == "service":
                # The plan holds the version's deployment, whether or not its placements
                # find room (then the deployment waits for them).
                deployment = self._deployment_for(txn, job)
            for idx, old, reason in slots:
                node = self.placement.pick_node(cpu, mem, old["ID"] if old is not None else None)
                if node is None:
                    missing[name] = missing.get(name, 0) + 1
                    if old is not None and reason == STOP_LOST:
                        self.stop(txn, old, reason, lost=True)  # lost even without a new home
                    continue
                alloc = self.new_alloc(txn, job, group, idx, node, ev, old, deployment)
                self.placement.hold(alloc, cpu, mem)
                new_allocs.append((alloc, old, reason))
            # Plan order: new placements first, then the stops of what they replace.
            for alloc, _, _ in sorted(new_allocs, key=lambda t: t[0]["ID"]):
                txn.alloc(alloc)
                placed.append(alloc)
            for alloc, old, reason in new_allocs:
                if old is not None:
                    old["NextAllocation"] = alloc["ID"]
                    self.stop(txn, old, reason, lost=reason == STOP_LOST)
                    stopped.append(old)
        return placed, stopped, followups, missing

    def _replacement_reason(
        self,
        txn: Txn,
        alloc: JSON,
        job: JSON,
        group: JSON,
        ev: JSON,
        followups: list[tuple[str, float]],
    ) -> str | None:
        """None: keep it. A stop description: replace it. "": leave it alone."""
        node = self.store.nodes[alloc["NodeID"]]
        status = alloc["ClientStatus"]
        if status == "failed":
            return self._failed_reason(txn, alloc, group, ev, followups)
        if status in TERMINAL:
            return None
        if node["Status"] == "down":
            return STOP_LOST
        transition = alloc["DesiredTransition"]
        if transition.get("Migrate"):
            if transition.get("MigrateDisablePlacement"):
                return ""
            return STOP_MIGRATING
        if alloc["JobVersion"] != job["Version"]:
            if group_key(alloc["Job"], group["Name"]) != group_key(job, group["Name"]):
                return STOP_UPDATED
            alloc["Job"] = job
            alloc["JobVersion"] = job["Version"]
            alloc["AllocModifyIndex"] = txn.index
            txn.alloc(alloc)
        return None

    def _failed_reason(
        self,
        txn: Txn,
        alloc: JSON,
        group: JSON,
        ev: JSON,
        followups: list[tuple[str, float]],
    ) -> str | None:
        """The reschedule policy: replace now, wait for a follow-up eval, or give up."""
        if alloc.get("NextAllocation"):
            return None
        policy = group.get("ReschedulePolicy") or {}
        events = (alloc.get("RescheduleTracker") or {}).get("Events") or []
        interval_ns = int(policy.get("Interval") or 0)
        now = now_ns()
        recent = [e for e in events if not interval_ns or now - e["RescheduleTime"] < interval_ns]
        if not policy.get("Unlimited") and len(recent) >= int(policy.get("Attempts") or 0):
            return ""
        delay_ns = int(policy.get("Delay") or 0)
        if policy.get("DelayFunction") in ("exponential", "fibonacci") and events:
            delay_ns = delay_ns * 2 ** len(events)
        if policy.get("MaxDelay"):
            delay_ns = min(delay_ns, int(policy["MaxDelay"]))
        follow_id = alloc.get("FollowupEvalID")
        if follow_id and follow_id == ev["ID"]:
            return STOP_RESCHEDULED
        if follow_id:
            return ""
        if delay_ns <= 0:
            return STOP_RESCHEDULED
        follow = self.new_eval(
            txn,
            alloc["Job"],
            "alloc-failure",
            WaitUntil=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now / 1e9 + delay_ns / 1e9)),
            PreviousEval=ev["ID"],
        )
        self._resched_due[follow["ID"]] = time.monotonic() + delay_ns / 1e9
        alloc["FollowupEvalID"] = follow["ID"]
        txn.alloc(alloc)
        followups.append((follow["ID"], delay_ns / 1e9))
        return ""

    def new_alloc(
        self,
        txn: Txn,
        job: JSON,
        group: JSON,
        idx: int,
        node: JSON,
        ev: JSON,
        previous: JSON | None,
        deployment: JSON | None,
    ) -> JSON:
        tasks = {
            t["Name"]: {
                "Cpu": {"CpuShares": (t.get("Resources") or {}).get("CPU", 0)},
                "Memory": {"MemoryMB": (t.get("Resources") or {}).get("MemoryMB", 0)},
                "Networks": None,
            }
            for t in group["Tasks"]
        }
        now = now_ns()
        alloc: JSON = {
            "ID": self.store.new_id(),
            "Namespace": job["Namespace"],
            "EvalID": ev["ID"],
            "Name": f"{job['ID']}.{group['Name']}[{idx}]",
            "NodeID": node["ID"],
            "NodeName": node["Name"],
            "JobID": job["ID"],
            "Job": job,
            "JobVersion": job["Version"],
            "TaskGroup": group["Name"],
            "AllocatedResources": {
                "Tasks": tasks,
                "Shared": {"DiskMB": (group.get("EphemeralDisk") or {}).get("SizeMB", 0)},
            },
            "DesiredStatus": "run",
            "DesiredDescription": "",
            "DesiredTransition": {},
            "ClientStatus": "pending",
            "ClientDescription": "",
            "TaskStates": None,
            "DeploymentID": deployment["ID"] if deployment else "",
            "DeploymentStatus": None,
            "PreviousAllocation": previous["ID"] if previous else "",
            "NextAllocation": "",
            "RescheduleTracker": None,
            "FollowupEvalID": "",
            "PreemptedAllocations": None,
            "PreemptedByAllocation": "",
            "CreateIndex": txn.index,
            "ModifyIndex": txn.index,
            "AllocModifyIndex": txn.index,
            "CreateTime": now,
            "ModifyTime": now,
        }
        if previous is not None and previous["ClientStatus"] == "failed":
            prior = (previous.get("RescheduleTracker") or {}).get("Events") or []
            alloc["RescheduleTracker"] = {
                "Events": [
                    *prior,
                    {
                        "RescheduleTime": now,
                        "PrevAllocID": previous["ID"],
                        "PrevNodeID": previous["NodeID"],
                        "Delay": 0,
                    },
                ],
                "LastReschedule": "ok",
            }
        self.store.allocs[alloc["ID"]] = alloc
        self.store.job_allocs.setdefault((job["Namespace"], job["ID"]), {})[alloc["ID"]] = None
        self.store.node_allocs[node["ID"]][alloc["ID"]] = None
        self.store.counters["allocs_placed"] += 1
        return alloc

    def stop(self, txn: Txn, alloc: JSON, reason: str, lost: bool = False) -> None:
        alloc["DesiredStatus"] = "stop"
        alloc["DesiredDescription"] = reason
        alloc["AllocModifyIndex"] = txn.index
        if lost:
            alloc["ClientStatus"] = "lost"
        txn.alloc(alloc)
        self.placement.release(alloc["ID"])

    # ------------------------------------------------------------------ deployments
    def _deployment_for(self, txn: Txn, job: JSON) -> JSON:
        rec = self.store.jobs[(job["Namespace"], job["ID"])]
        if rec.deployment_ids:
            last = self.store.deployments[rec.deployment_ids[-1]]
            if last["JobVersion"] == job["Version"]:
                return last
        dep: JSON = {
            "ID": self.store.new_id(),
            "Namespace": job["Namespace"],
            "JobID": job["ID"],
            "JobVersion": job["Version"],
            "JobModifyIndex": job["JobModifyIndex"],
            "JobSpecModifyIndex": job["JobModifyIndex"],
            "JobCreateIndex": job["CreateIndex"],
            "IsMultiregion": False,
            "TaskGroups": {
                g["Name"]: {"DesiredTotal": g["Count"], "PlacedAllocs": 0, "HealthyAllocs": 0}
                for g in job["TaskGroups"]
            },
            "Status": "running",
            "StatusDescription": "Deployment is running",
            "CreateIndex": txn.index,
            "ModifyIndex": txn.index,
        }
        self.store.deployments[dep["ID"]] = dep
        rec.deployment_ids.append(dep["ID"])
        txn.deployment(dep)
        return dep

    def deployment_progress(self, dep_id: str) -> None:
        """A deployment is successful once all of its allocs run (no health checks)."""
        store = self.store
        dep = store.deployments.get(dep_id)
        if dep is None or dep["Status"] != "running":
            return
        job_allocs = store.job_allocs.get((dep["Namespace"], dep["JobID"]), {})
        mine = [
            store.allocs[a] for a in job_allocs if store.allocs[a].get("DeploymentID") == dep_id
        ]
        wanted = sum(g["DesiredTotal"] for g in dep["TaskGroups"].values())
        running = [a for a in mine if a["ClientStatus"] == "running"]
        if len(running) < wanted:
            return
        txn = store.txn("DeploymentStatusUpdate")
        dep["Status"] = "successful"
        dep["StatusDescription"] = "Deployment completed successfully"
        txn.deployment(dep)
        store.commit(txn)


def name_index(alloc: JSON) -> int:
    """The N of an alloc named `job.group[N]`."""
    name = alloc["Name"]
    return int(name[name.rindex("[") + 1 : -1])
