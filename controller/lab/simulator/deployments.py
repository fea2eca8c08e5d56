"""What an operator does to a deployment (Nomad's deployment watcher): fail it, pause or
resume it, promote its canaries, set its allocations' health.

Each is one apply (`DeploymentStatusUpdate`, or `DeploymentAllocHealth`) that writes the
deployment and, where Nomad's watcher makes one, a `deployment-watcher` eval. The
simulator places no canaries and reverts no job (`auto_revert`): a promotion finds no
canary, a failed deployment stays at its version.
"""

from __future__ import annotations

from typing import Any

from controller.lab.simulator.scheduler import Scheduler
from controller.lab.simulator.store import Store, Txn
from controller.lab.simulator.util import JSON, ApiError, bad_request, now_ns

# structs.Deployment.Active
ACTIVE = frozenset({"running", "paused", "pending", "blocked", "unblocking"})


class Deployments:
    def __init__(self, store: Store, scheduler: Scheduler) -> None:
        self.store = store
        self.scheduler = scheduler

    def fail(self, dep_id: str) -> JSON:
        dep = self._active(dep_id, "can't fail terminal deployment")
        return self._update(dep, "failed", "Deployment marked as failed", evaluate=True)

    def pause(self, dep_id: str, pause: bool) -> JSON:
        if pause:
            dep = self._active(dep_id, "can't pause terminal deployment")
            return self._update(dep, "paused", "Deployment is paused", evaluate=False)
        dep = self._active(dep_id, "can't resume terminal deployment")
        return self._update(dep, "running", "Deployment is running", evaluate=True)

    def promote(self, dep_id: str, promote_all: bool, groups: Any) -> JSON:
        self._active(dep_id, "can't promote terminal deployment")
        if not promote_all and not groups:
            raise bad_request("must specify either the groups to promote or all")
        raise ApiError(500, "no canaries to promote")

    def set_alloc_health(self, dep_id: str, healthy: list[str], unhealthy: list[str]) -> JSON:
        dep = self._active(dep_id, "can't set health of allocations for a terminal deployment")
        if not healthy and not unhealthy:
            raise bad_request("must specify at least one healthy/unhealthy allocation ID")
        for alloc_id in [*healthy, *unhealthy]:
            alloc = self.store.allocs.get(alloc_id)
            if alloc is None or alloc.get("DeploymentID") != dep_id:
                raise ApiError(500, f'Allocation "{alloc_id}" is not part of deployment')
        txn = self.store.txn("DeploymentAllocHealth")
        for alloc_id, is_healthy in [(a, True) for a in healthy] + [(a, False) for a in unhealthy]:
            alloc = self.store.allocs[alloc_id]
            alloc["DeploymentStatus"] = {
                **(alloc.get("DeploymentStatus") or {}),
                "Healthy": is_healthy,
                "Timestamp": now_ns(),
                "Canary": False,
                "ModifyIndex": txn.index,
            }
            txn.alloc(alloc)
        if unhealthy:
            self._set_status(txn, dep, "failed", "Failed due to unhealthy allocations")
        ev = self._eval(txn, dep)
        return self._commit(txn, dep, ev)

    # ------------------------------------------------------------------ helpers
    def _active(self, dep_id: str, refusal: str) -> JSON:
        dep = self.store.deployments.get(dep_id)
        if dep is None:
            raise ApiError(500, "deployment not found")
        if dep["Status"] not in ACTIVE:
            raise ApiError(500, refusal)
        return dep

    def _update(self, dep: JSON, status: str, description: str, evaluate: bool) -> JSON:
        txn = self.store.txn("DeploymentStatusUpdate")
        self._set_status(txn, dep, status, description)
        ev = self._eval(txn, dep) if evaluate else None
        return self._commit(txn, dep, ev)

    @staticmethod
    def _set_status(txn: Txn, dep: JSON, status: str, description: str) -> None:
        dep["Status"] = status
        dep["StatusDescription"] = description
        txn.deployment(dep)

    def _eval(self, txn: Txn, dep: JSON) -> JSON | None:
        """The deployment watcher's eval of the job, in the same apply."""
        rec = self.store.jobs.get((dep["Namespace"], dep["JobID"]))
        if rec is None:
            return None
        return self.scheduler.new_eval(txn, rec.job, "deployment-watcher", DeploymentID=dep["ID"])

    def _commit(self, txn: Txn, dep: JSON, ev: JSON | None) -> JSON:
        self.store.commit(txn)
        if ev is not None:
            self.scheduler.schedule(ev["ID"])
        return {
            "EvalID": ev["ID"] if ev else "",
            "EvalCreateIndex": txn.index if ev else 0,
            "DeploymentModifyIndex": dep["ModifyIndex"],
            "RevertedJobVersion": None,
            "Index": txn.index,
        }
