"""The simulated cluster: state store, scheduler, clients and faults on one event loop.

Objects are stored as JSON-ready dicts. Nested values are never mutated in place
(they are replaced), so shallow copies taken for events stay true to their index.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import copy
import random
import re
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from controller.lab.simulator.events import Event, EventBroker
from controller.lab.simulator.jobspec import (
    canonicalize,
    group_images,
    group_key,
    group_resources,
    spec_of,
)
from controller.lab.simulator.util import (
    JSON,
    ApiError,
    bad_request,
    iso_after,
    iso_now,
    not_found,
    now_ns,
    omit_empty,
)

TERMINAL = frozenset({"complete", "failed", "lost"})
ALWAYS = frozenset({"DesiredTransition"})
ENFORCE_PREFIX = "Enforcing job modify index"
VAR_PATH = re.compile(r"^[a-zA-Z0-9\-_~/]{1,128}$")

STOP_MIGRATING = "alloc is being migrated"
STOP_LOST = "alloc is lost since its node is down"
STOP_RESCHEDULED = "alloc was rescheduled because it failed"
STOP_UPDATED = "alloc is being updated due to job update"
STOP_NOT_NEEDED = "alloc not needed due to job update"

JobKey = tuple[str, str]
_PLAN_RANK = {"Deployment": 0, "Evaluation": 0, "Allocation": 1, "Job": 2}


@dataclass
class JobRecord:
    key: JobKey
    versions: list[JSON]
    create_index: int
    eval_ids: list[str] = field(default_factory=list)
    open_evals: set[str] = field(default_factory=set)
    deployment_ids: list[str] = field(default_factory=list)
    queued: dict[str, int] = field(default_factory=dict)

    @property
    def job(self) -> JSON:
        return self.versions[-1]


class _Txn:
    """One Raft apply: the rows it writes become one frame of events of one Type."""

    def __init__(self, sim: Simulator, etype: str, index: int) -> None:
        self.sim = sim
        self.etype = etype
        self.index = index
        self.rows: dict[tuple[str, str], JSON] = {}
        self.tables: set[str] = set()
        self.jobs: set[JobKey] = set()

    def put(self, topic: str, key: str, obj: JSON, table: str) -> None:
        # A row written twice sits at the position of its last write.
        self.rows.pop((topic, key), None)
        self.rows[(topic, key)] = obj
        self.tables.add(table)

    def alloc(self, alloc: JSON) -> None:
        alloc["ModifyIndex"] = self.index
        alloc["ModifyTime"] = now_ns()
        self.put("Allocation", alloc["ID"], alloc, "allocs")
        self.jobs.add((alloc["Namespace"], alloc["JobID"]))

    def eval(self, ev: JSON) -> None:
        ev["ModifyIndex"] = self.index
        ev["ModifyTime"] = now_ns()
        self.put("Evaluation", ev["ID"], ev, "evals")
        self.jobs.add((ev["Namespace"], ev["JobID"]))

    def job(self, job: JSON) -> None:
        self.put("Job", job["ID"], job, "jobs")

    def node(self, node: JSON) -> None:
        node["ModifyIndex"] = self.index
        self.put("Node", node["ID"], node, "nodes")

    def deployment(self, dep: JSON) -> None:
        dep["ModifyIndex"] = self.index
        self.put("Deployment", dep["ID"], dep, "deployment")


class Simulator:
    """An in-memory Nomad: see docs/simulator.md for the behaviour and the faults."""

    def __init__(
        self,
        nodes: Iterable[str] | None = None,
        seed: int = 0,
        acl_enabled: bool = False,
        start_delay: float = 0.05,
        node_cpu: int = 100_000,
        node_memory_mb: int = 1_000_000,
        heartbeat_seconds: float = 30.0,
        event_buffer_size: int = 100,
        algorithm: str = "binpack",
    ) -> None:
        if algorithm not in ("binpack", "spread"):
            raise ValueError(f"unknown placement algorithm {algorithm!r}")
        self.rng = random.Random(seed)
        self.acl_enabled = acl_enabled
        self.start_delay = start_delay
        self.heartbeat_seconds = heartbeat_seconds
        self.algorithm = algorithm
        self.advertise = "127.0.0.1"
        self.index = 0
        self.table_index: Counter[str] = Counter()
        self.broker = EventBroker(event_buffer_size)
        self.counters: Counter[str] = Counter()
        self._changed = asyncio.Event()

        self.nodes: dict[str, JSON] = {}
        self.node_by_name: dict[str, str] = {}
        self.node_used: dict[str, list[int]] = {}
        self.jobs: dict[JobKey, JobRecord] = {}
        self._job_keys: list[JobKey] = []
        self.job_allocs: dict[JobKey, dict[str, None]] = {}
        self.node_allocs: dict[str, dict[str, None]] = {}
        self.allocs: dict[str, JSON] = {}
        self._alloc_res: dict[str, tuple[str, int, int]] = {}
        self.evals: dict[str, JSON] = {}
        self.deployments: dict[str, JSON] = {}
        self.vars: dict[tuple[str, str], JSON] = {}
        self._var_keys: list[tuple[str, str]] = []
        self.tokens: dict[str, JSON] = {}  # by AccessorID
        self.token_by_secret: dict[str, str] = {}
        self.policies: dict[str, JSON] = {}
        self.acl_bootstrapped = False
        self.blocked: dict[JobKey, str] = {}
        self.job_touched: dict[JobKey, int] = {}
        self._unblock_pending = False
        self._resched_due: dict[str, float] = {}
        self._draining: dict[str, float | None] = {}  # node id -> batch deadline (monotonic)

        # Faults.
        self.no_capacity_on = False
        self.fail_images: set[str] = set()
        self.api_fault_kind = ""
        self.api_fault_until = 0.0
        self.api_slow_ms = 0.0

        for name in nodes or ["sim-node-1", "sim-node-2", "sim-node-3"]:
            self._register_node(name, node_cpu, node_memory_mb)

    # ------------------------------------------------------------------ ids, index
    def new_id(self) -> str:
        h = f"{self.rng.getrandbits(128):032x}"
        return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"

    def _bump(self) -> int:
        self.index += 1
        return self.index

    def _txn(self, etype: str, index: int | None = None) -> _Txn:
        return _Txn(self, etype, self._bump() if index is None else index)

    def _finish(self, txn: _Txn) -> None:
        for key in txn.jobs:
            self.job_touched[key] = txn.index  # its allocs or evals changed (summary cache key)
            rec = self.jobs.get(key)
            if rec is None:
                continue
            status = self._job_status(rec)
            if status != rec.job.get("Status"):
                rec.job["Status"] = status
                rec.job["ModifyIndex"] = txn.index
                txn.job(rec.job)
        for table in txn.tables:
            self.table_index[table] = txn.index
        rows = txn.rows.items()
        if txn.etype == "PlanResult":
            # A plan writes deployment and eval first, then allocs, then the job.
            rows = sorted(rows, key=lambda row: _PLAN_RANK.get(row[0][0], 1))  # type: ignore[assignment]
        events = [self._event(txn.etype, topic, key, obj) for (topic, key), obj in rows]
        self.broker.publish(txn.index, events)
        self._changed.set()
        self._changed = asyncio.Event()

    def _event(self, etype: str, topic: str, key: str, obj: JSON) -> Event:
        ns = obj.get("Namespace", "")
        if topic == "Allocation":
            body = {k: v for k, v in obj.items() if k != "Job"}
            payload: JSON = {"Allocation": omit_empty(body, ALWAYS)}
            fkeys: list[str] | None = [obj["JobID"], obj.get("DeploymentID", "")]
        elif topic == "Evaluation":
            payload = {"Evaluation": omit_empty(obj)}
            fkeys = [obj["JobID"], obj.get("DeploymentID", "")]
        elif topic == "Deployment":
            payload = {"Deployment": dict(obj)}
            fkeys = [obj["JobID"]]
        elif topic == "Job":
            payload = {"Job": dict(obj)}
            fkeys = None
        elif topic == "Node":
            payload = {"Node": dict(obj)}
            fkeys, ns = None, ""
        elif topic == "Variables":
            payload = {"Variable": dict(obj)}
            fkeys = None
        else:
            payload = {topic: dict(obj)}
            fkeys = None
        return Event(topic, etype, key, ns, fkeys, payload)

    async def wait_for_change(self, seconds: float) -> None:
        changed = self._changed
        # asyncio.timeout: Python 3.11's wait_for can swallow a cancel (gh-86296).
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await changed.wait()

    def _later(self, delay: float, fn: Callable[..., None], *args: Any) -> None:
        loop = asyncio.get_running_loop()
        if delay <= 0:
            loop.call_soon(fn, *args)
        else:
            loop.call_later(delay, fn, *args)

    # ------------------------------------------------------------------ nodes
    def _register_node(self, name: str, cpu: int, mem: int) -> None:
        if name in self.node_by_name:
            raise ValueError(f"duplicate node name {name!r}")
        node_id = self.new_id()
        txn = self._txn("NodeRegistration")
        node: JSON = {
            "ID": node_id,
            "Name": name,
            "Datacenter": "dc1",
            "NodeClass": "",
            "NodePool": "default",
            "HTTPAddr": "127.0.0.1:4646",
            "TLSEnabled": False,
            "Status": "ready",
            "StatusDescription": "",
            "SchedulingEligibility": "eligible",
            "Drain": False,
            "DrainStrategy": None,
            "Attributes": {
                "os.name": "linux",
                "kernel.name": "linux",
                "cpu.arch": "amd64",
                "nomad.version": "1.9.7",
                "driver.docker": "1",
                "unique.hostname": name,
            },
            "Meta": {},
            "NodeResources": {
                "Cpu": {"CpuShares": cpu},
                "Memory": {"MemoryMB": mem},
                "Disk": {"DiskMB": 100_000},
                "Networks": None,
            },
            "Drivers": {"docker": {"Detected": True, "Healthy": True}},
            "Version": "1.9.7",
            "CreateIndex": txn.index,
            "ModifyIndex": txn.index,
        }
        self.nodes[node_id] = node
        self.node_by_name[name] = node_id
        self.node_used[node_id] = [0, 0]
        self.node_allocs[node_id] = {}
        txn.node(node)
        self._finish(txn)

    def node_id(self, name_or_id: str) -> str:
        if name_or_id in self.nodes:
            return name_or_id
        if name_or_id in self.node_by_name:
            return self.node_by_name[name_or_id]
        raise not_found("node")

    def _node_usable(self, node: JSON) -> bool:
        return (
            node["Status"] == "ready"
            and node["SchedulingEligibility"] == "eligible"
            and not node["Drain"]
        )

    def _pick_node(self, cpu: int, mem: int) -> JSON | None:
        if self.no_capacity_on:
            return None
        fits = []
        for node in self.nodes.values():
            if not self._node_usable(node):
                continue
            used = self.node_used[node["ID"]]
            res = node["NodeResources"]
            free_cpu = res["Cpu"]["CpuShares"] - used[0] - cpu
            free_mem = res["Memory"]["MemoryMB"] - used[1] - mem
            if free_cpu >= 0 and free_mem >= 0:
                fill = (
                    1
                    - (
                        free_cpu / max(res["Cpu"]["CpuShares"], 1)
                        + free_mem / max(res["Memory"]["MemoryMB"], 1)
                    )
                    / 2
                )
                fits.append((fill, node))
        if not fits:
            return None
        # Seeded shuffle first, so ties between equal nodes are broken reproducibly.
        self.rng.shuffle(fits)
        best = max if self.algorithm == "binpack" else min
        return best(fits, key=lambda pair: pair[0])[1]

    def _hold(self, alloc: JSON, cpu: int, mem: int) -> None:
        self._alloc_res[alloc["ID"]] = (alloc["NodeID"], cpu, mem)
        used = self.node_used[alloc["NodeID"]]
        used[0] += cpu
        used[1] += mem

    def _adjust(self, held: tuple[str, int, int], sign: int) -> None:
        used = self.node_used[held[0]]
        used[0] += sign * held[1]
        used[1] += sign * held[2]

    def _release(self, alloc_id: str) -> None:
        held = self._alloc_res.pop(alloc_id, None)
        if held is None:
            return
        self._adjust(held, -1)
        self._request_unblock()

    # ------------------------------------------------------------------ job status
    def _job_status(self, rec: JobRecord) -> str:
        job = rec.job
        if job.get("ParameterizedJob") or job.get("Periodic"):
            return "dead" if job.get("Stop") else "running"
        for alloc_id in self.job_allocs.get(rec.key, ()):
            alloc = self.allocs[alloc_id]
            if alloc["DesiredStatus"] == "run" and alloc["ClientStatus"] not in TERMINAL:
                return "running"
        if rec.open_evals:
            return "pending"
        return "dead"

    # ------------------------------------------------------------------ evaluations
    def _new_eval(self, txn: _Txn, job: JSON, trigger: str, **extra: Any) -> JSON:
        ev: JSON = {
            "ID": self.new_id(),
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
        self.evals[ev["ID"]] = ev
        self.counters["evals_created"] += 1
        rec = self.jobs.get((job["Namespace"], job["ID"]))
        if rec is not None:
            rec.eval_ids.append(ev["ID"])
            rec.open_evals.add(ev["ID"])
        txn.eval(ev)
        return ev

    def _close_eval(self, txn: _Txn, ev: JSON, status: str = "complete", **extra: Any) -> None:
        ev.update(Status=status, **extra)
        rec = self.jobs.get((ev["Namespace"], ev["JobID"]))
        if rec is not None and status not in ("pending", "blocked"):
            rec.open_evals.discard(ev["ID"])
        txn.eval(ev)

    def _schedule(self, eval_id: str, delay: float = 0.0) -> None:
        self._later(delay, self._process_eval, eval_id)

    def _request_unblock(self) -> None:
        if self.blocked and not self._unblock_pending:
            self._unblock_pending = True
            self._later(0, self._unblock)

    def _unblock(self) -> None:
        self._unblock_pending = False
        for eval_id in list(self.blocked.values()):
            self._process_eval(eval_id)

    def _process_eval(self, eval_id: str) -> None:
        """The scheduler: reconcile one job and apply the plan as one PlanResult."""
        ev = self.evals.get(eval_id)
        if ev is None or ev["Status"] not in ("pending", "blocked"):
            return
        wait_until = self._resched_due.get(eval_id)
        if wait_until is not None and time.monotonic() < wait_until:
            return
        key = (ev["Namespace"], ev["JobID"])
        rec = self.jobs.get(key)
        job = rec.job if rec is not None else None
        txn = self._txn("PlanResult")
        placed, stopped, followups, missing = self._reconcile(txn, key, job, ev)
        was_blocked = ev["Status"] == "blocked"
        if missing and was_blocked and not txn.rows:
            self.index -= 1  # nothing changed: the blocked eval stays as it is, no apply
            return
        if not placed and not stopped and not followups:
            txn.etype = "EvaluationUpdated"
        if missing:
            failed = {
                tg: {
                    "NodesEvaluated": len(self.nodes),
                    "NodesExhausted": len(self.nodes),
                    "DimensionExhausted": {"cpu or memory": n},
                    "CoalescedFailures": n - 1,
                }
                for tg, n in missing.items()
            }
            if rec is not None:
                rec.queued = dict(missing)
            if was_blocked:
                ev["FailedTGAllocs"] = failed
                txn.eval(ev)
            else:
                blocked = self._new_eval(
                    txn,
                    job or {"Namespace": key[0], "ID": key[1]},
                    "queued-allocs",
                    Status="blocked",
                    StatusDescription="created to place remaining allocations",
                    PreviousEval=ev["ID"],
                )
                stale = self.blocked.get(key)
                if stale is not None and stale in self.evals:
                    self._close_eval(txn, self.evals[stale], "canceled")
                self.blocked[key] = blocked["ID"]
                self._close_eval(txn, ev, FailedTGAllocs=failed, BlockedEval=blocked["ID"])
        else:
            if rec is not None:
                rec.queued = {}
            if self.blocked.get(key) == ev["ID"] or not was_blocked:
                self._close_eval(txn, ev)
            if self.blocked.get(key) == ev["ID"]:
                del self.blocked[key]
        self._finish(txn)
        for alloc in placed:
            self._later(self.start_delay, self._client_start, alloc["ID"])
        for alloc in stopped:
            if alloc["ClientStatus"] not in TERMINAL:
                self._later(self.start_delay, self._client_stop, alloc["ID"])
        for follow_id, delay in followups:
            self._schedule(follow_id, delay)

    def _reconcile(
        self, txn: _Txn, key: JobKey, job: JSON | None, ev: JSON
    ) -> tuple[list[JSON], list[JSON], list[tuple[str, float]], dict[str, int]]:
        placed: list[JSON] = []
        stopped: list[JSON] = []
        followups: list[tuple[str, float]] = []
        missing: dict[str, int] = {}
        active = [
            self.allocs[a]
            for a in self.job_allocs.get(key, ())
            if self.allocs[a]["DesiredStatus"] == "run"
        ]
        if job is None or job.get("Stop") or job.get("ParameterizedJob") or job.get("Periodic"):
            for alloc in active:
                if alloc["ClientStatus"] not in TERMINAL:
                    self._stop(txn, alloc, STOP_NOT_NEEDED)
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
            keep.sort(key=_name_index)
            for alloc in keep[count:]:
                if alloc["ClientStatus"] not in TERMINAL:
                    self._stop(txn, alloc, STOP_NOT_NEEDED)
                    stopped.append(alloc)
            keep = keep[:count]
            needed = max(count - len(keep), 0)
            for alloc, reason in replace[needed:]:
                self._stop(txn, alloc, reason, lost=reason == STOP_LOST)
                stopped.append(alloc)
            used_names = {_name_index(a) for a in keep}
            slots: list[tuple[int, JSON | None, str]] = []
            for alloc, reason in replace[:needed]:
                slots.append((_name_index(alloc), alloc, reason))
                used_names.add(_name_index(alloc))
            free_names = (i for i in range(10**9) if i not in used_names)
            while len(keep) + len(slots) < count:
                slots.append((next(free_names), None, ""))
            slots.sort(key=lambda s: s[0])
            cpu, mem = group_resources(group)
            new_allocs: list[tuple[JSON, JSON | None, str]] = []
            for idx, old, reason in slots:
                # Stops in a plan free their resources for the placements of that plan.
                held = self._alloc_res.pop(old["ID"], None) if old is not None else None
                if held is not None:
                    self._adjust(held, -1)
                node = self._pick_node(cpu, mem)
                if node is None and held is not None and old is not None:
                    self._alloc_res[old["ID"]] = held
                    self._adjust(held, 1)
                if node is None:
                    missing[name] = missing.get(name, 0) + 1
                    if old is not None and reason == STOP_LOST:
                        self._stop(txn, old, reason, lost=True)  # lost even without a new home
                    continue
                if deployment is None and job["Type"] == "service":
                    deployment = self._deployment_for(txn, job)
                alloc = self._new_alloc(txn, job, group, idx, node, ev, old, deployment)
                self._hold(alloc, cpu, mem)
                new_allocs.append((alloc, old, reason))
            # Plan order: new placements first, then the stops of what they replace.
            for alloc, _, _ in sorted(new_allocs, key=lambda t: t[0]["ID"]):
                txn.alloc(alloc)
                placed.append(alloc)
            for alloc, old, reason in new_allocs:
                if old is not None:
                    old["NextAllocation"] = alloc["ID"]
                    self._stop(txn, old, reason, lost=reason == STOP_LOST)
                    stopped.append(old)
        return placed, stopped, followups, missing

    def _replacement_reason(
        self,
        txn: _Txn,
        alloc: JSON,
        job: JSON,
        group: JSON,
        ev: JSON,
        followups: list[tuple[str, float]],
    ) -> str | None:
        """None: keep it. A stop description: replace it. "": leave it alone."""
        node = self.nodes[alloc["NodeID"]]
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
        txn: _Txn,
        alloc: JSON,
        group: JSON,
        ev: JSON,
        followups: list[tuple[str, float]],
    ) -> str | None:
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
        follow = self._new_eval(
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

    def _new_alloc(
        self,
        txn: _Txn,
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
            "ID": self.new_id(),
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
        self.allocs[alloc["ID"]] = alloc
        self.job_allocs.setdefault((job["Namespace"], job["ID"]), {})[alloc["ID"]] = None
        self.node_allocs[node["ID"]][alloc["ID"]] = None
        self.counters["allocs_placed"] += 1
        return alloc

    def _stop(self, txn: _Txn, alloc: JSON, reason: str, lost: bool = False) -> None:
        alloc["DesiredStatus"] = "stop"
        alloc["DesiredDescription"] = reason
        alloc["AllocModifyIndex"] = txn.index
        if lost:
            alloc["ClientStatus"] = "lost"
        txn.alloc(alloc)
        self._release(alloc["ID"])

    def _deployment_for(self, txn: _Txn, job: JSON) -> JSON:
        rec = self.jobs[(job["Namespace"], job["ID"])]
        if rec.deployment_ids:
            last = self.deployments[rec.deployment_ids[-1]]
            if last["JobVersion"] == job["Version"]:
                return last
        dep: JSON = {
            "ID": self.new_id(),
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
        self.deployments[dep["ID"]] = dep
        rec.deployment_ids.append(dep["ID"])
        txn.deployment(dep)
        return dep

    # ------------------------------------------------------------------ clients
    def _task_states(self, alloc: JSON, state: str, failed: bool, events: list[JSON]) -> JSON:
        previous = alloc.get("TaskStates") or {}
        out: JSON = {}
        for task in alloc["Job"]["TaskGroups"]:
            if task["Name"] != alloc["TaskGroup"]:
                continue
            for t in task["Tasks"]:
                old = previous.get(t["Name"]) or {}
                out[t["Name"]] = {
                    "State": state,
                    "Failed": failed,
                    "Restarts": old.get("Restarts", 0),
                    "LastRestart": old.get("LastRestart"),
                    "StartedAt": old.get("StartedAt")
                    or (iso_now() if state == "running" else None),
                    "FinishedAt": iso_now() if state == "dead" else None,
                    "Events": [*(old.get("Events") or []), *events],
                }
        return out

    def _client_update(self, alloc: JSON, status: str, description: str, tasks: JSON) -> None:
        txn = self._txn("AllocationUpdated")
        alloc["ClientStatus"] = status
        alloc["ClientDescription"] = description
        alloc["TaskStates"] = tasks
        txn.alloc(alloc)
        if status in TERMINAL:
            self._release(alloc["ID"])
        retry: JSON | None = None
        if status == "failed" and alloc["DesiredStatus"] == "run":
            # The client update for a failed alloc carries the alloc-failure eval.
            retry = self._new_eval(txn, alloc["Job"], "alloc-failure")
        self._finish(txn)
        if retry is not None:
            self._schedule(retry["ID"])
        if status in TERMINAL:
            self._check_drain_done(alloc["NodeID"])
        if status == "running" and alloc.get("DeploymentID"):
            self._later(0, self._deployment_progress, alloc["DeploymentID"])

    def _client_start(self, alloc_id: str) -> None:
        alloc = self.allocs.get(alloc_id)
        if alloc is None or alloc["ClientStatus"] != "pending" or alloc["DesiredStatus"] != "run":
            return
        if self.nodes[alloc["NodeID"]]["Status"] == "down":
            return
        group = next(g for g in alloc["Job"]["TaskGroups"] if g["Name"] == alloc["TaskGroup"])
        now = now_ns()
        received = _task_event("Received", now, "Task received by client")
        if "*" in self.fail_images or self.fail_images & set(group_images(group)):
            failure = _task_event("Driver Failure", now, "simulated start failure", fails=True)
            failure["DriverError"] = "simulated start failure"
            tasks = self._task_states(alloc, "dead", True, [received, failure])
            self._client_update(alloc, "failed", "Failed tasks", tasks)
            return
        started = _task_event("Started", now, "Task started by client")
        tasks = self._task_states(alloc, "running", False, [received, started])
        self._client_update(alloc, "running", "Tasks are running", tasks)

    def _client_stop(self, alloc_id: str) -> None:
        alloc = self.allocs.get(alloc_id)
        if alloc is None or alloc["ClientStatus"] in TERMINAL:
            return
        if self.nodes[alloc["NodeID"]]["Status"] == "down":
            return
        now = now_ns()
        killing = _task_event("Killing", now, "Sent interrupt")
        killed = _task_event("Killed", now, "Task successfully killed")
        tasks = self._task_states(alloc, "dead", False, [killing, killed])
        self._client_update(alloc, "complete", "All tasks have completed", tasks)

    def _deployment_progress(self, dep_id: str) -> None:
        dep = self.deployments.get(dep_id)
        if dep is None or dep["Status"] != "running":
            return
        job_allocs = self.job_allocs.get((dep["Namespace"], dep["JobID"]), {})
        mine = [self.allocs[a] for a in job_allocs if self.allocs[a].get("DeploymentID") == dep_id]
        wanted = sum(g["DesiredTotal"] for g in dep["TaskGroups"].values())
        running = [a for a in mine if a["ClientStatus"] == "running"]
        if len(running) < wanted:
            return
        txn = self._txn("DeploymentStatusUpdate")
        dep["Status"] = "successful"
        dep["StatusDescription"] = "Deployment completed successfully"
        txn.deployment(dep)
        self._finish(txn)

    # ------------------------------------------------------------------ jobs API
    def _job_record(self, namespace: str, job_id: str) -> JobRecord:
        rec = self.jobs.get((namespace, job_id))
        if rec is None:
            raise not_found("job")
        return rec

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
        rec = self.jobs.get(key)
        self.counters["register_calls"] += 1
        if enforce_index:
            self._enforce(rec, job_modify_index)
        if rec is not None and spec_of(rec.job) == spec_of(job):
            # Unchanged spec: no new version, only an evaluation.
            txn = self._txn("EvaluationUpdated")
            ev = self._new_eval(txn, rec.job, trigger)
            self._finish(txn)
            self._schedule(ev["ID"])
            return _register_reply(ev["ID"], txn.index, rec.job["ModifyIndex"], txn.index)
        return self._upsert_job(rec, job, trigger, "JobRegistered")

    def _enforce(self, rec: JobRecord | None, expected: int) -> None:
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

    def _upsert_job(self, rec: JobRecord | None, job: JSON, trigger: str, etype: str) -> JSON:
        key = (job["Namespace"], job["ID"])
        txn = self._txn(etype)
        if rec is None:
            rec = JobRecord(key, [], txn.index)
            self.jobs[key] = rec
            bisect.insort(self._job_keys, key)
            self.counters["jobs_created"] += 1
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
        self.counters["job_versions"] += 1
        txn.job(job)
        self._finish(txn)
        if job.get("ParameterizedJob") or job.get("Periodic"):
            self._refresh_status(rec)
            return _register_reply("", 0, job["JobModifyIndex"], txn.index)
        # The eval is written in a second transaction with the same index.
        etxn = self._txn(etype, txn.index)
        ev = self._new_eval(etxn, job, trigger)
        self._finish(etxn)
        self._schedule(ev["ID"])
        return _register_reply(ev["ID"], txn.index, job["JobModifyIndex"], txn.index)

    def _refresh_status(self, rec: JobRecord) -> None:
        status = self._job_status(rec)
        if status != rec.job["Status"]:
            txn = self._txn("JobRegistered")
            txn.jobs.add(rec.key)
            self._finish(txn)

    def deregister_job(self, job_id: str, namespace: str = "default", purge: bool = False) -> JSON:
        key = (namespace, job_id)
        rec = self.jobs.get(key)
        self.counters["deregister_calls"] += 1
        if rec is None:
            return {
                "EvalID": "",
                "EvalCreateIndex": 0,
                "JobModifyIndex": 0,
                "VolumeEvalID": "",
                "VolumeEvalIndex": 0,
                "Index": 0,
            }
        txn = self._txn("JobDeregistered")
        job = rec.job
        if purge:
            del self.jobs[key]
            self._job_keys.remove(key)
            self.blocked.pop(key, None)
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
        self._finish(txn)
        etxn = self._txn("JobDeregistered", txn.index)
        ev = self._new_eval(etxn, job, "job-deregister")
        self._finish(etxn)
        self._schedule(ev["ID"])
        return {
            "EvalID": ev["ID"],
            "EvalCreateIndex": txn.index,
            "JobModifyIndex": txn.index,
            "VolumeEvalID": "",
            "VolumeEvalIndex": 0,
            "Index": txn.index,
        }

    def evaluate_job(self, job_id: str, namespace: str = "default") -> JSON:
        rec = self._job_record(namespace, job_id)
        txn = self._txn("EvaluationUpdated")
        ev = self._new_eval(txn, rec.job, "job-register")
        self._finish(txn)
        self._schedule(ev["ID"])
        return _register_reply(ev["ID"], txn.index, rec.job["JobModifyIndex"], txn.index)

    def dispatch_job(self, job_id: str, namespace: str, body: JSON) -> JSON:
        rec = self._job_record(namespace, job_id)
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
        suffix = f"{int(time.time())}-{self.new_id()[:8]}"
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
        rec = self._job_record(namespace, job_id)
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
        rec = self._job_record(namespace, job_id)
        target = next((v for v in rec.versions if v["Version"] == version), None)
        if target is None:
            raise not_found("job version")
        txn = self._txn("JobRegistered")
        target["Stable"] = bool(stable)
        target["ModifyIndex"] = txn.index
        txn.job(target)
        self._finish(txn)
        return {"JobModifyIndex": txn.index, "Index": txn.index}

    def scale_job(self, job_id: str, namespace: str, body: JSON) -> JSON:
        rec = self.jobs.get((namespace, job_id))
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
            self._enforce(rec, int(body["JobModifyIndex"]))
        count = body.get("Count")
        if count is None:
            raise bad_request("scaling action without a count is not supported")
        if not isinstance(count, int) or count < 0:
            raise bad_request("scaling action count can't be negative")
        job = _deep_copy_job(rec.job)
        for group in job["TaskGroups"]:
            if group["Name"] == group_name:
                group["Count"] = count
        return self._upsert_job(rec, job, "job-scaling", "JobRegistered")

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
        for alloc_id in self.job_allocs.get(rec.key, ()):
            alloc = self.allocs[alloc_id]
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

    def job_keys(self, namespace: str) -> list[JobKey]:
        if namespace == "*":
            return self._job_keys
        lo = bisect.bisect_left(self._job_keys, (namespace, ""))
        hi = bisect.bisect_left(self._job_keys, (namespace + "\x00", ""))
        return self._job_keys[lo:hi]

    # ------------------------------------------------------------------ allocations API
    def alloc(self, alloc_id: str) -> JSON:
        alloc = self.allocs.get(alloc_id)
        if alloc is None:
            raise not_found("alloc")
        return alloc

    def stop_allocation(self, alloc_id: str, reschedule: bool = False) -> JSON:
        alloc = self.alloc(alloc_id)
        txn = self._txn("AllocationUpdateDesiredStatus")
        transition = {**alloc["DesiredTransition"], "Migrate": True}
        if reschedule:
            transition["Reschedule"] = True
        alloc["DesiredTransition"] = transition
        txn.alloc(alloc)
        ev = self._new_eval(txn, alloc["Job"], "alloc-stop")
        self._finish(txn)
        self._schedule(ev["ID"])
        return {"EvalID": ev["ID"], "Index": txn.index}

    # ------------------------------------------------------------------ nodes API
    async def drain_node(
        self,
        node_name: str,
        deadline_seconds: float | None = 3600.0,
        enable: bool = True,
        mark_eligible: bool = False,
    ) -> JSON:
        """Drain (or stop draining) a node: service allocs migrate, batch allocs wait.

        deadline_seconds < 0 forces the drain now; 0 or None means no deadline.
        """
        return self.drain(node_name, deadline_seconds, enable, mark_eligible)

    def drain(
        self,
        node_name: str,
        deadline_seconds: float | None = 3600.0,
        enable: bool = True,
        mark_eligible: bool = False,
    ) -> JSON:
        """The drain itself (also behind POST /v1/node/:id/drain)."""
        node = self.nodes[self.node_id(node_name)]
        txn = self._txn("NodeDrain")
        if enable:
            deadline_ns = int((deadline_seconds or 0) * 1e9)
            node["Drain"] = True
            node["SchedulingEligibility"] = "ineligible"
            node["DrainStrategy"] = {
                "DrainSpec": {"Deadline": deadline_ns, "IgnoreSystemJobs": False},
                "ForceDeadline": iso_after(deadline_seconds) if deadline_ns > 0 else None,
                "StartedAt": iso_now(),
            }
        else:
            node["Drain"] = False
            node["DrainStrategy"] = None
            if mark_eligible:
                node["SchedulingEligibility"] = "eligible"
        txn.node(node)
        self._finish(txn)
        if enable:
            due = None
            if deadline_seconds is not None and deadline_seconds != 0:
                due = max(deadline_seconds, 0.0)
            self._draining[node["ID"]] = due
            self._later(0, self._drain_step, node["ID"])
            if due is not None:
                self._later(due, self._drain_deadline, node["ID"])
        else:
            self._draining.pop(node["ID"], None)
            self._request_unblock()
        return {
            "EvalIDs": None,
            "EvalCreateIndex": 0,
            "NodeModifyIndex": txn.index,
            "Index": txn.index,
        }

    def _drain_step(self, node_id: str, force: bool = False) -> None:
        if node_id not in self._draining:
            return
        txn = self._txn("AllocationUpdateDesiredStatus")
        evals: list[JSON] = []
        seen_jobs: set[JobKey] = set()
        for alloc_id in self.node_allocs[node_id]:
            alloc = self.allocs[alloc_id]
            if alloc["DesiredStatus"] != "run" or alloc["ClientStatus"] in TERMINAL:
                continue
            if alloc["DesiredTransition"].get("Migrate"):
                continue
            is_batch = alloc["Job"]["Type"] == "batch"
            if is_batch and not force:
                continue  # batch allocs are left to finish until the deadline
            transition = {**alloc["DesiredTransition"], "Migrate": True}
            if is_batch:
                transition["MigrateDisablePlacement"] = True
            alloc["DesiredTransition"] = transition
            txn.alloc(alloc)
            key = (alloc["Namespace"], alloc["JobID"])
            if key not in seen_jobs:
                seen_jobs.add(key)
                evals.append(self._new_eval(txn, alloc["Job"], "node-drain", NodeID=node_id))
        if not txn.rows:
            self.index -= 1
            self._check_drain_done(node_id)
            return
        self._finish(txn)
        for ev in evals:
            self._schedule(ev["ID"])
        if force:
            self._later(0, self._stop_disabled_placements, node_id)

    def _stop_disabled_placements(self, node_id: str) -> None:
        txn = self._txn("PlanResult")
        stopped = []
        for alloc_id in self.node_allocs[node_id]:
            alloc = self.allocs[alloc_id]
            t = alloc["DesiredTransition"]
            if alloc["DesiredStatus"] == "run" and t.get("MigrateDisablePlacement"):
                self._stop(txn, alloc, STOP_MIGRATING)
                stopped.append(alloc)
        if not stopped:
            self.index -= 1
            return
        self._finish(txn)
        for alloc in stopped:
            self._later(self.start_delay, self._client_stop, alloc["ID"])

    def _drain_deadline(self, node_id: str) -> None:
        self._drain_step(node_id, force=True)

    def _check_drain_done(self, node_id: str) -> None:
        if node_id not in self._draining:
            return
        for alloc_id in self.node_allocs[node_id]:
            if self.allocs[alloc_id]["ClientStatus"] not in TERMINAL:
                return
        del self._draining[node_id]
        node = self.nodes[node_id]
        txn = self._txn("NodeDrain")
        node["Drain"] = False
        node["DrainStrategy"] = None
        txn.node(node)
        self._finish(txn)

    def set_eligibility(self, node_id: str, eligible: bool) -> JSON:
        node = self.nodes[self.node_id(node_id)]
        if eligible and node["Drain"]:
            raise bad_request(
                "can not set node's scheduling eligibility to eligible while draining"
            )
        txn = self._txn("NodeDrain")  # NodeEligibility at HEAD; NodeDrain through v1.10.x
        node["SchedulingEligibility"] = "eligible" if eligible else "ineligible"
        txn.node(node)
        self._finish(txn)
        if eligible:
            self._request_unblock()
        return {
            "EvalIDs": None,
            "EvalCreateIndex": 0,
            "NodeModifyIndex": txn.index,
            "Index": txn.index,
        }

    def evaluate_node(self, node_id: str) -> JSON:
        node = self.nodes[self.node_id(node_id)]
        txn = self._txn("NodeStreamEvent")
        evals = self._node_evals(txn, node["ID"], "node-update")
        if not txn.rows:
            txn.node(node)
        self._finish(txn)
        for ev in evals:
            self._schedule(ev["ID"])
        return {
            "EvalIDs": [e["ID"] for e in evals] or None,
            "EvalCreateIndex": txn.index if evals else 0,
            "NodeModifyIndex": node["ModifyIndex"],
            "Index": txn.index,
        }

    def _node_evals(self, txn: _Txn, node_id: str, trigger: str) -> list[JSON]:
        evals = []
        seen: set[JobKey] = set()
        for alloc_id in self.node_allocs[node_id]:
            alloc = self.allocs[alloc_id]
            key = (alloc["Namespace"], alloc["JobID"])
            if alloc["DesiredStatus"] == "run" and key not in seen:
                seen.add(key)
                evals.append(self._new_eval(txn, alloc["Job"], trigger, NodeID=node_id))
        return evals

    # ------------------------------------------------------------------ variables
    def _check_var_path(self, path: str) -> None:
        if not VAR_PATH.match(path):
            raise bad_request(f'invalid path "{path}"')
        if path.startswith("nomad/") and not (
            path == "nomad/jobs" or path.startswith("nomad/jobs/")
        ):
            raise bad_request(
                '"nomad" is a reserved top-level directory path, '
                'but you may write variables to "nomad/jobs" or below'
            )

    def var_meta(self, var: JSON) -> JSON:
        return {k: v for k, v in var.items() if k != "Items"}

    def put_variable(
        self, namespace: str, path: str, items: Any, cas: int | None
    ) -> tuple[int, JSON]:
        """(200, variable) or (409, current variable or zero value)."""
        self._check_var_path(path)
        if not isinstance(items, dict) or not items:
            raise bad_request("variable missing Items")
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in items.items()):
            raise bad_request("variable Items must be a map of strings")
        key = (namespace, path)
        current = self.vars.get(key)
        if cas is not None and (current["ModifyIndex"] if current else 0) != cas:
            return 409, dict(current) if current else _zero_var()
        txn = self._txn("VariableUpserted")
        now = now_ns()
        var = {
            "Namespace": namespace,
            "Path": path,
            "CreateIndex": current["CreateIndex"] if current else txn.index,
            "CreateTime": current["CreateTime"] if current else now,
            "ModifyIndex": txn.index,
            "ModifyTime": now,
            "Items": dict(items),
        }
        if current is None:
            bisect.insort(self._var_keys, key)
        self.vars[key] = var
        self.counters["variable_writes"] += 1
        txn.put("Variables", path, self.var_meta(var), "vars")
        self._finish(txn)
        return 200, var

    def delete_variable(
        self, namespace: str, path: str, cas: int | None
    ) -> tuple[int, JSON | None]:
        self._check_var_path(path)
        key = (namespace, path)
        current = self.vars.get(key)
        if cas is not None and (current["ModifyIndex"] if current else 0) != cas:
            return 409, dict(current) if current else _zero_var()
        if current is None:
            return 200, None
        txn = self._txn("VariableDeleted")
        del self.vars[key]
        self._var_keys.remove(key)
        self.counters["variable_writes"] += 1
        txn.put("Variables", path, self.var_meta(current), "vars")
        self._finish(txn)
        return 200, None

    def var_keys(self, namespace: str, prefix: str) -> list[tuple[str, str]]:
        keys = (
            self._var_keys if namespace == "*" else [k for k in self._var_keys if k[0] == namespace]
        )
        return [k for k in keys if k[1].startswith(prefix)]

    # ------------------------------------------------------------------ ACL
    def bootstrap(self) -> JSON:
        if not self.acl_enabled:
            raise bad_request("ACL support disabled")
        if self.acl_bootstrapped:
            raise bad_request(
                f"ACL bootstrap already done (reset index: {self.table_index['acl_token']})"
            )
        self.acl_bootstrapped = True
        return self.create_token({"Name": "Bootstrap Token", "Type": "management", "Global": True})

    def create_token(self, body: JSON, accessor: str | None = None) -> JSON:
        token_type = body.get("Type") or "client"
        if token_type not in ("client", "management"):
            raise bad_request(f'token type must be "client" or "management", got "{token_type}"')
        if token_type == "client" and not body.get("Policies") and not body.get("Roles"):
            raise bad_request("client token missing policy or role links")
        txn = self._txn("ACLTokenUpserted")
        old = self.tokens.get(accessor or "")
        if accessor is not None and old is None:
            raise not_found("ACL token")
        token: JSON = {
            "AccessorID": old["AccessorID"] if old else self.new_id(),
            "SecretID": old["SecretID"] if old else self.new_id(),
            "Name": body.get("Name", ""),
            "Type": token_type,
            "Policies": body.get("Policies"),
            "Roles": body.get("Roles"),
            "Global": bool(body.get("Global")),
            "CreateTime": old["CreateTime"] if old else iso_now(),
            "ExpirationTime": None,
            "CreateIndex": old["CreateIndex"] if old else txn.index,
            "ModifyIndex": txn.index,
        }
        self.tokens[token["AccessorID"]] = token
        self.token_by_secret[token["SecretID"]] = token["AccessorID"]
        txn.put("ACLToken", token["AccessorID"], _token_stub(token), "acl_token")
        self._finish(txn)
        return token

    def delete_token(self, accessor: str) -> None:
        token = self.tokens.pop(accessor, None)
        if token is None:
            raise not_found("ACL token")
        self.token_by_secret.pop(token["SecretID"], None)
        txn = self._txn("ACLTokenDeleted")
        txn.put("ACLToken", accessor, _token_stub(token), "acl_token")
        self._finish(txn)

    def token_for(self, secret: str) -> JSON | None:
        accessor = self.token_by_secret.get(secret)
        return self.tokens.get(accessor) if accessor else None

    def put_policy(self, name: str, body: JSON) -> None:
        txn = self._txn("ACLPolicyUpserted")
        old = self.policies.get(name)
        self.policies[name] = {
            "Name": name,
            "Description": body.get("Description", ""),
            "Rules": body.get("Rules", ""),
            "CreateIndex": old["CreateIndex"] if old else txn.index,
            "ModifyIndex": txn.index,
        }
        txn.put("ACLPolicy", name, self.policies[name], "acl_policy")
        self._finish(txn)

    def delete_policy(self, name: str) -> None:
        if self.policies.pop(name, None) is None:
            raise not_found("ACL policy")
        txn = self._txn("ACLPolicyDeleted")
        txn.put("ACLPolicy", name, {"Name": name}, "acl_policy")
        self._finish(txn)

    # ================================================================== faults
    async def reschedule_allocation(self, alloc_id: str) -> str:
        """Instant migration (the Poseidon seed); returns the new alloc's ID.

        One PlanResult frame: the new alloc N (pending, PreviousAllocation=O) before
        O's stop (NextAllocation=N); then client updates O complete / N running as
        two AllocationUpdated frames in an order chosen by the seeded RNG.
        """
        old = self.alloc(alloc_id)
        if old["DesiredStatus"] != "run" or old["ClientStatus"] in TERMINAL:
            raise bad_request("alloc is not running")
        job = old["Job"]
        group = next(g for g in job["TaskGroups"] if g["Name"] == old["TaskGroup"])
        cpu, mem = group_resources(group)
        node = self._pick_node(cpu, mem) or self.nodes[old["NodeID"]]
        txn = self._txn("PlanResult")
        ev = self._new_eval(txn, job, "alloc-stop")
        new = self._new_alloc(txn, job, group, _name_index(old), node, ev, old, None)
        self._hold(new, cpu, mem)
        self._close_eval(txn, ev)
        txn.alloc(new)
        old["NextAllocation"] = new["ID"]
        self._stop(txn, old, STOP_MIGRATING)
        self._finish(txn)
        order = [(self._client_stop, old["ID"]), (self._client_start, new["ID"])]
        if self.rng.random() < 0.5:
            order.reverse()  # the two clients report independently

        def report() -> None:
            for update, target in order:
                update(target)

        self._later(self.start_delay, report)
        return str(new["ID"])

    async def node_down(self, node_name: str) -> None:
        """Missed heartbeat: node down, evals node-update, allocs lost and replaced."""
        node = self.nodes[self.node_id(node_name)]
        txn = self._txn("NodeStreamEvent")
        node["Status"] = "down"
        node["StatusDescription"] = "node heartbeat missed"
        txn.node(node)
        evals = self._node_evals(txn, node["ID"], "node-update")
        self._finish(txn)
        for ev in evals:
            self._schedule(ev["ID"])

    async def node_up(self, node_name: str) -> None:
        node = self.nodes[self.node_id(node_name)]
        txn = self._txn("NodeStreamEvent")
        node["Status"] = "ready"
        node["StatusDescription"] = ""
        txn.node(node)
        self._finish(txn)
        self._request_unblock()

    async def oom_restart(self, alloc_id: str) -> None:
        """OOM kill and in-place restart: same alloc, Restarts+1, an oom_killed event."""
        alloc = self.alloc(alloc_id)
        if alloc["ClientStatus"] != "running":
            raise bad_request("alloc is not running")
        now = now_ns()
        terminated = _task_event("Terminated", now, "Exit Code: 137, Exit Message: OOM Killed")
        terminated["Details"] = {"exit_code": "137", "oom_killed": "true", "signal": "0"}
        terminated["ExitCode"] = 137
        restarting = _task_event("Restarting", now, "Task restarting in 0s")
        restarting["RestartReason"] = "Restart within policy"
        started = _task_event("Started", now, "Task started by client")
        tasks: JSON = {}
        for name, state in (alloc.get("TaskStates") or {}).items():
            tasks[name] = {
                **state,
                "Restarts": state.get("Restarts", 0) + 1,
                "LastRestart": iso_now(),
                "Events": [*state.get("Events", []), terminated, restarting, started],
            }
        self._client_update(alloc, "running", "Tasks are running", tasks)

    async def reannounce_allocation(self, alloc_id: str) -> None:
        """The client re-sends an unchanged alloc (AllocationUpdated, same content)."""
        alloc = self.alloc(alloc_id)
        txn = self._txn("AllocationUpdated")
        txn.alloc(alloc)
        self._finish(txn)

    async def finish_allocation(self, alloc_id: str, failed: bool = False) -> None:
        """The task exits by itself (complete, or failed and rescheduled per policy)."""
        alloc = self.alloc(alloc_id)
        if alloc["ClientStatus"] in TERMINAL:
            raise bad_request("alloc is already terminal")
        now = now_ns()
        ev = _task_event("Terminated", now, f"Exit Code: {1 if failed else 0}", fails=failed)
        ev["ExitCode"] = 1 if failed else 0
        tasks = self._task_states(alloc, "dead", failed, [ev])
        if failed:
            self._client_update(alloc, "failed", "Failed tasks", tasks)
        else:
            self._client_update(alloc, "complete", "All tasks have completed", tasks)

    async def remove_job_silently(self, job_id: str, namespace: str = "default") -> None:
        """The job vanishes with only a JobDeregistered event; its allocs are gone."""
        key = (namespace, job_id)
        rec = self._job_record(namespace, job_id)
        txn = self._txn("JobDeregistered")
        del self.jobs[key]
        self._job_keys.remove(key)
        self.blocked.pop(key, None)
        for alloc_id in self.job_allocs.pop(key, {}):
            alloc = self.allocs.pop(alloc_id)
            self.node_allocs[alloc["NodeID"]].pop(alloc_id, None)
            self._release(alloc_id)
        txn.job(rec.job)
        txn.tables.add("allocs")
        self._finish(txn)

    def disconnect_event_streams(self) -> None:
        self.broker.disconnect_all()

    def event_fault(self, kind: str, seconds: float, delay_ms: float = 500.0) -> None:
        self.broker.inject_fault(kind, seconds, delay_ms)

    def api_fault(self, kind: str, seconds: float, slow_ms: float = 1000.0) -> None:
        if kind not in ("no_leader", "refuse", "slow", "none"):
            raise bad_request(f"unknown api fault {kind!r} (no_leader, refuse, slow, none)")
        self.api_fault_kind = "" if kind == "none" else kind
        self.api_fault_until = time.monotonic() + seconds
        self.api_slow_ms = slow_ms

    def current_api_fault(self) -> str:
        if self.api_fault_kind and time.monotonic() < self.api_fault_until:
            return self.api_fault_kind
        return ""

    def no_capacity(self, on: bool) -> None:
        self.no_capacity_on = on
        if not on:
            self._request_unblock()

    def set_start_delay(self, seconds: float) -> None:
        self.start_delay = seconds

    def fail_starts(self, image: str = "*", on: bool = True) -> None:
        """New allocs whose task image is `image` ("*": every image) fail to start."""
        if on:
            self.fail_images.add(image)
        else:
            self.fail_images.discard(image)

    # ================================================================== inspection
    def job_list(self, namespace: str = "*") -> list[JSON]:
        return [self.jobs[k].job for k in self.job_keys(namespace)]

    def get_job(self, job_id: str, namespace: str = "default") -> JSON | None:
        rec = self.jobs.get((namespace, job_id))
        return rec.job if rec else None

    def allocations(self, job_id: str | None = None, namespace: str = "default") -> list[JSON]:
        if job_id is None:
            return list(self.allocs.values())
        return [self.allocs[a] for a in self.job_allocs.get((namespace, job_id), ())]

    def variables(self, namespace: str = "default") -> dict[str, JSON]:
        """Path -> stored variable (with Items) in a namespace ("*": all, keyed by path)."""
        return {k[1]: self.vars[k] for k in self.var_keys(namespace, "")}

    def registrations(self) -> int:
        """Job registrations that created a new job (not updates, not re-registrations)."""
        return self.counters["jobs_created"]

    def node_names(self) -> list[str]:
        return list(self.node_by_name)

    def snapshot(self) -> JSON:
        """Counts and counters, for /_sim/state and benchmarks."""
        statuses = Counter(a["ClientStatus"] for a in self.allocs.values())
        return {
            "Index": self.index,
            "Jobs": len(self.jobs),
            "Allocations": dict(statuses),
            "Evaluations": len(self.evals),
            "Variables": len(self.vars),
            "BlockedEvals": len(self.blocked),
            "Counters": dict(self.counters),
            "Events": self.broker.stats(),
        }


def _name_index(alloc: JSON) -> int:
    name = alloc["Name"]
    return int(name[name.rindex("[") + 1 : -1])


def _task_event(kind: str, now: int, message: str, fails: bool = False) -> JSON:
    return {
        "Type": kind,
        "Time": now,
        "DisplayMessage": message,
        "Message": "",
        "Details": {},
        "FailsTask": fails,
        "ExitCode": 0,
        "DriverError": "",
        "RestartReason": "",
    }


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


def _zero_var() -> JSON:
    return {
        "Namespace": "",
        "Path": "",
        "CreateIndex": 0,
        "CreateTime": 0,
        "ModifyIndex": 0,
        "ModifyTime": 0,
        "Items": None,
    }


def _token_stub(token: JSON) -> JSON:
    return {k: v for k, v in token.items() if k != "SecretID"}


def _deep_copy_job(job: JSON) -> JSON:
    return copy.deepcopy(job)
