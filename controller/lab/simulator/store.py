"""The state store: one Raft-like index, the cluster's tables, and writes as event frames.

Objects are stored as JSON-ready dicts. Nested values are never mutated in place
(they are replaced), so shallow copies taken for events stay true to their index.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from controller.lab.simulator.events import Event, EventBroker
from controller.lab.simulator.util import JSON, not_found, now_ns, omit_empty

TERMINAL = frozenset({"complete", "failed", "lost"})
# Fields an Allocation keeps even when empty (Go's omitempty does not apply to them).
ALWAYS = frozenset({"DesiredTransition"})

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
    submissions: dict[int, JSON] = field(default_factory=dict)  # version -> its source
    scaling_events: dict[str, list[JSON]] = field(default_factory=dict)  # group -> newest first
    scaling_index: int = 0  # the index of the last scaling event

    @property
    def job(self) -> JSON:
        return self.versions[-1]


class Txn:
    """One Raft apply: the rows it writes become one frame of events of one Type."""

    def __init__(self, etype: str, index: int) -> None:
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


class Store:
    """The index, the tables every part reads, the seeded RNG and the change waiters."""

    def __init__(self, seed: int, event_buffer_size: int) -> None:
        self.rng = random.Random(seed)
        self.index = 0
        self.table_index: Counter[str] = Counter()
        self.broker = EventBroker(event_buffer_size)
        self.counters: Counter[str] = Counter()
        self._changed = asyncio.Event()

        self.nodes: dict[str, JSON] = {}
        self.node_by_name: dict[str, str] = {}
        self.jobs: dict[JobKey, JobRecord] = {}
        self.job_allocs: dict[JobKey, dict[str, None]] = {}
        self.node_allocs: dict[str, dict[str, None]] = {}
        self.allocs: dict[str, JSON] = {}
        self.evals: dict[str, JSON] = {}
        self.deployments: dict[str, JSON] = {}
        self.job_touched: dict[JobKey, int] = {}
        # Called with every committed apply, after its frame is published (the client
        # directories end their processes here when an allocation stops or its node goes).
        self.after_commit: list[Callable[[Txn], None]] = []

    def new_id(self) -> str:
        h = f"{self.rng.getrandbits(128):032x}"
        return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"

    def alloc(self, alloc_id: str) -> JSON:
        alloc = self.allocs.get(alloc_id)
        if alloc is None:
            raise not_found("alloc")
        return alloc

    # ------------------------------------------------------------------ writes
    def txn(self, etype: str, index: int | None = None) -> Txn:
        """A new apply at the next index, or at `index` (a second frame of the same apply)."""
        if index is None:
            self.index += 1
            index = self.index
        return Txn(etype, index)

    def discard(self, txn: Txn) -> None:
        """An apply that wrote nothing is not applied: its index is given back."""
        assert txn.index == self.index and not txn.rows, "only the newest, empty apply"
        self.index -= 1

    def commit(self, txn: Txn) -> None:
        for key in txn.jobs:
            self.job_touched[key] = txn.index  # its allocs or evals changed (summary cache key)
            rec = self.jobs.get(key)
            if rec is None:
                continue
            status = self.job_status(rec)
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
        events = [_event(txn.etype, topic, key, obj) for (topic, key), obj in rows]
        self.broker.publish(txn.index, events)
        self._changed.set()
        self._changed = asyncio.Event()
        for hook in self.after_commit:
            hook(txn)

    def job_status(self, rec: JobRecord) -> str:
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

    def lose_state(self) -> None:
        """What a dev agent restarted keeps of its state store: no job, allocation,
        evaluation or deployment, the index back at 0, an empty event buffer and every
        stream cut. The nodes stay for their clients to register again."""
        self.index = 0
        self.table_index.clear()
        for table in (self.jobs, self.job_allocs, self.allocs, self.evals, self.deployments):
            table.clear()
        self.job_touched.clear()
        for allocs in self.node_allocs.values():
            allocs.clear()
        self.broker.restart()

    # ------------------------------------------------------------------ time
    async def wait_for_change(self, seconds: float) -> None:
        changed = self._changed
        # asyncio.timeout: Python 3.11's wait_for can swallow a cancel (gh-86296).
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await changed.wait()

    def later(self, delay: float, fn: Callable[..., None], *args: Any) -> asyncio.Handle:
        """Run `fn` after `delay` seconds; the handle cancels it (a renewed lock's timer)."""
        loop = asyncio.get_running_loop()
        if delay <= 0:
            return loop.call_soon(fn, *args)
        return loop.call_later(delay, fn, *args)


def _event(etype: str, topic: str, key: str, obj: JSON) -> Event:
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
