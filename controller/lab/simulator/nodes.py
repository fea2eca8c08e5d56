"""Client nodes: registration, eligibility, drains, and the node faults (down, up)."""

from __future__ import annotations

from controller.lab.simulator.clients import Clients
from controller.lab.simulator.scheduler import STOP_MIGRATING, Scheduler
from controller.lab.simulator.store import TERMINAL, JobKey, Store, Txn
from controller.lab.simulator.util import (
    JSON,
    ApiError,
    bad_request,
    iso_after,
    iso_now,
    iso_seconds,
    not_found,
    now_ns,
)

# A client node's dynamic port range and how many node events Nomad keeps.
MIN_DYNAMIC_PORT, MAX_DYNAMIC_PORT = 20_000, 32_000
MAX_NODE_EVENTS = 10


class NodeRegistry:
    def __init__(self, store: Store, scheduler: Scheduler, clients: Clients) -> None:
        self.store = store
        self.scheduler = scheduler
        self.clients = clients
        self._draining: dict[str, float | None] = {}  # node id -> seconds to its deadline
        # Where the nodes' clients serve their HTTP API (exec and fs reach them there):
        # the simulator's own address, once it listens.
        self.http_addr = "127.0.0.1:4646"

    def register(self, name: str, cpu: int, mem: int) -> None:
        store = self.store
        if name in store.node_by_name:
            raise ValueError(f"duplicate node name {name!r}")
        node_id = store.new_id()
        txn = store.txn("NodeRegistration")
        node: JSON = {
            "ID": node_id,
            "Name": name,
            "Datacenter": "dc1",
            "NodeClass": "",
            "NodePool": "default",
            "HTTPAddr": self.http_addr,
            "SecretID": "",  # Nomad never shows a node's secret
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
                "MinDynamicPort": MIN_DYNAMIC_PORT,
                "MaxDynamicPort": MAX_DYNAMIC_PORT,
            },
            "ReservedResources": {
                "Cpu": {"CpuShares": 0},
                "Memory": {"MemoryMB": 0},
                "Disk": {"DiskMB": 0},
                "Networks": {"ReservedHostPorts": ""},
            },
            "Drivers": {
                "docker": {"Detected": True, "Healthy": True},
                "mock_driver": {"Detected": True, "Healthy": True},
            },
            "Version": "1.9.7",
            "StatusUpdatedAt": now_ns() // 10**9,
            "Events": [_node_event("Node registered", "Cluster", txn.index)],
            "LastDrain": None,
            "CreateIndex": txn.index,
            "ModifyIndex": txn.index,
        }
        store.nodes[node_id] = node
        store.node_by_name[name] = node_id
        store.node_allocs[node_id] = {}
        self.scheduler.placement.add_node(node_id)
        txn.node(node)
        store.commit(txn)

    def serve_clients_at(self, http_addr: str) -> None:
        """The address the nodes' clients serve at: the simulator's, once it listens. It
        is what they registered with (Nomad's Go client dials it first for exec and fs),
        so it is no write of its own."""
        self.http_addr = http_addr
        for node in self.store.nodes.values():
            node["HTTPAddr"] = http_addr

    def rejoin(self) -> None:
        """After Store.lose_state: every client registers again with its node ID, at a new
        index, without the drain or eligibility the lost state held (a down node stays
        down: its client is not there to register)."""
        self._draining.clear()
        for node in self.store.nodes.values():
            txn = self.store.txn("NodeRegistration")
            node.update(Drain=False, DrainStrategy=None, SchedulingEligibility="eligible")
            node["CreateIndex"] = txn.index
            txn.node(node)
            self.store.commit(txn)

    def node_id(self, name_or_id: str) -> str:
        if name_or_id in self.store.nodes:
            return name_or_id
        if name_or_id in self.store.node_by_name:
            return self.store.node_by_name[name_or_id]
        raise not_found("node")

    def _node(self, name_or_id: str) -> JSON:
        return self.store.nodes[self.node_id(name_or_id)]

    # ------------------------------------------------------------------ API
    def set_eligibility(self, node_id: str, eligible: bool) -> JSON:
        node = self._node(node_id)
        if eligible and node["Drain"]:
            raise bad_request(
                "can not set node's scheduling eligibility to eligible while draining"
            )
        txn = self.store.txn("NodeDrain")  # NodeEligibility at HEAD; NodeDrain through v1.10.x
        node["SchedulingEligibility"] = "eligible" if eligible else "ineligible"
        txn.node(node)
        self.store.commit(txn)
        if eligible:
            self.scheduler.request_unblock()
        return _node_reply(txn)

    def evaluate_node(self, node_id: str) -> JSON:
        node = self._node(node_id)
        txn = self.store.txn("NodeStreamEvent")
        evals = self._node_evals(txn, node["ID"], "node-update")
        if not txn.rows:
            txn.node(node)
        self._commit_and_schedule(txn, evals)
        return {
            "EvalIDs": [e["ID"] for e in evals] or None,
            "EvalCreateIndex": txn.index if evals else 0,
            "NodeModifyIndex": node["ModifyIndex"],
            "Index": txn.index,
        }

    def _node_evals(self, txn: Txn, node_id: str, trigger: str) -> list[JSON]:
        """One eval per job with allocs that should run on the node."""
        evals = []
        seen: set[JobKey] = set()
        for alloc_id in self.store.node_allocs[node_id]:
            alloc = self.store.allocs[alloc_id]
            key = (alloc["Namespace"], alloc["JobID"])
            if alloc["DesiredStatus"] == "run" and key not in seen:
                seen.add(key)
                evals.append(self.scheduler.new_eval(txn, alloc["Job"], trigger, NodeID=node_id))
        return evals

    def _commit_and_schedule(self, txn: Txn, evals: list[JSON]) -> None:
        """Commit the frame that created the evals, then hand them to the scheduler."""
        self.store.commit(txn)
        for ev in evals:
            self.scheduler.schedule(ev["ID"])

    # ------------------------------------------------------------------ drains
    def start_drain(
        self,
        node_name: str,
        deadline_seconds: float | None,
        meta: dict[str, str] | None = None,
        accessor_id: str = "",
    ) -> JSON:
        """Drain a node: service allocs migrate, batch allocs wait.

        deadline_seconds < 0 forces the drain now; 0 or None means no deadline. `meta`
        and the caller's token accessor go into the node's LastDrain.
        """
        node = self._node(node_name)
        txn = self.store.txn("NodeDrain")
        deadline_ns = int((deadline_seconds or 0) * 1e9)
        started = node["DrainStrategy"] is None
        node["Drain"] = True
        node["SchedulingEligibility"] = "ineligible"
        node["DrainStrategy"] = {
            "DrainSpec": {"Deadline": deadline_ns, "IgnoreSystemJobs": False},
            "ForceDeadline": iso_after(deadline_seconds) if deadline_ns > 0 else None,
            "StartedAt": iso_now(),
        }
        _drain_record(node, txn.index, "draining", started, meta, accessor_id)
        txn.node(node)
        self.store.commit(txn)
        due = None
        if deadline_seconds is not None and deadline_seconds != 0:
            due = max(deadline_seconds, 0.0)
        self._draining[node["ID"]] = due
        self.store.later(0, self._drain_step, node["ID"])
        if due is not None:
            self.store.later(due, self._drain_deadline, node["ID"])
        return _node_reply(txn)

    def stop_drain(
        self,
        node_name: str,
        mark_eligible: bool,
        meta: dict[str, str] | None = None,
        accessor_id: str = "",
    ) -> JSON:
        """Stop draining a node, and with `mark_eligible` let it take placements again."""
        node = self._node(node_name)
        txn = self._clear_drain(node, mark_eligible, "canceled", meta, accessor_id)
        self._draining.pop(node["ID"], None)
        self.scheduler.request_unblock()
        return _node_reply(txn)

    def _clear_drain(
        self,
        node: JSON,
        mark_eligible: bool,
        status: str,
        meta: dict[str, str] | None = None,
        accessor_id: str = "",
    ) -> Txn:
        """One NodeDrain frame: the node's drain strategy is gone; its LastDrain says
        whether the drain completed or was canceled."""
        txn = self.store.txn("NodeDrain")
        was_draining = node["DrainStrategy"] is not None
        node["Drain"] = False
        node["DrainStrategy"] = None
        if mark_eligible:
            node["SchedulingEligibility"] = "eligible"
        if was_draining:
            _drain_record(node, txn.index, status, False, meta, accessor_id)
        txn.node(node)
        self.store.commit(txn)
        return txn

    def _drain_step(self, node_id: str, force: bool = False) -> None:
        if node_id not in self._draining:
            return
        store = self.store
        txn = store.txn("AllocationUpdateDesiredStatus")
        evals: list[JSON] = []
        seen_jobs: set[JobKey] = set()
        for alloc_id in store.node_allocs[node_id]:
            alloc = store.allocs[alloc_id]
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
                evals.append(
                    self.scheduler.new_eval(txn, alloc["Job"], "node-drain", NodeID=node_id)
                )
        if not txn.rows:
            store.discard(txn)
            self.check_drain_done(node_id)
            return
        self._commit_and_schedule(txn, evals)
        if force:
            store.later(0, self._stop_disabled_placements, node_id)

    def _stop_disabled_placements(self, node_id: str) -> None:
        txn = self.store.txn("PlanResult")
        stopped = []
        for alloc_id in self.store.node_allocs[node_id]:
            alloc = self.store.allocs[alloc_id]
            t = alloc["DesiredTransition"]
            if alloc["DesiredStatus"] == "run" and t.get("MigrateDisablePlacement"):
                self.scheduler.stop(txn, alloc, STOP_MIGRATING)
                stopped.append(alloc)
        if not stopped:
            self.store.discard(txn)
            return
        self.store.commit(txn)
        for alloc in stopped:
            self.clients.stop_soon(alloc["ID"])

    def _drain_deadline(self, node_id: str) -> None:
        self._drain_step(node_id, force=True)

    def check_drain_done(self, node_id: str) -> None:
        """A draining node whose allocs are all terminal is done: its strategy is cleared."""
        if node_id not in self._draining:
            return
        for alloc_id in self.store.node_allocs[node_id]:
            if self.store.allocs[alloc_id]["ClientStatus"] not in TERMINAL:
                return
        del self._draining[node_id]
        self._clear_drain(self.store.nodes[node_id], mark_eligible=False, status="complete")

    # ------------------------------------------------------------------ faults
    def node_down(self, node_name: str) -> None:
        """Missed heartbeat: node down, evals node-update, allocs lost and replaced."""
        node, txn = self._new_status(node_name, "down", "node heartbeat missed")
        evals = self._node_evals(txn, node["ID"], "node-update")
        self._commit_and_schedule(txn, evals)

    def purge(self, node_id: str) -> JSON:
        """Nomad's Node.Deregister: the node is gone (a NodeDeregistration), its jobs get
        node-update evals that find its allocations lost. Its client, still running,
        registers the node again at its next heartbeat (here: after the start delay),
        with the same ID; until then reads still show the node, marked down."""
        node = self.store.nodes.get(node_id)
        if node is None:
            raise ApiError(500, "node not found")
        txn = self.store.txn("NodeDeregistration")
        node["Status"] = "down"
        node["StatusDescription"] = "node deregistered"
        txn.node(node)
        evals = self._node_evals(txn, node_id, "node-update")
        self._commit_and_schedule(txn, evals)
        self._draining.pop(node_id, None)
        self.store.later(self.clients.start_delay, self._register_again, node_id)
        return {
            "EvalIDs": [e["ID"] for e in evals] or None,
            "EvalCreateIndex": txn.index if evals else 0,
            "NodeModifyIndex": txn.index,
            "Index": txn.index,
        }

    def _register_again(self, node_id: str) -> None:
        node = self.store.nodes[node_id]
        txn = self.store.txn("NodeRegistration")
        node.update(
            Status="ready",
            StatusDescription="",
            Drain=False,
            DrainStrategy=None,
            SchedulingEligibility="eligible",
            CreateIndex=txn.index,
            StatusUpdatedAt=now_ns() // 10**9,
            Events=[_node_event("Node registered", "Cluster", txn.index)],
        )
        txn.node(node)
        self.store.commit(txn)
        self.scheduler.request_unblock()

    def node_up(self, node_name: str) -> None:
        _, txn = self._new_status(node_name, "ready", "")
        self.store.commit(txn)
        self.scheduler.request_unblock()

    def _new_status(self, node_name: str, status: str, description: str) -> tuple[JSON, Txn]:
        """The node with its new status, written in a NodeStreamEvent frame to commit."""
        node = self._node(node_name)
        txn = self.store.txn("NodeStreamEvent")
        node["Status"] = status
        node["StatusDescription"] = description
        txn.node(node)
        return node, txn


def _node_event(message: str, subsystem: str, index: int) -> JSON:
    return {
        "Message": message,
        "Subsystem": subsystem,
        "Details": None,
        "Timestamp": iso_seconds(),
        "CreateIndex": index,
    }


def _drain_record(
    node: JSON,
    index: int,
    status: str,
    started: bool,
    meta: dict[str, str] | None,
    accessor_id: str,
) -> None:
    """Nomad's updateNodeDrainImpl: LastDrain (a new one when a drain starts, else the
    last one updated: its status, time, and the meta and accessor when given), the node's
    StatusUpdatedAt, and a node event."""
    now = iso_seconds()
    last = node.get("LastDrain")
    if started or last is None:
        last = {"StartedAt": now, "AccessorID": "", "Meta": meta}
    last = {**last, "UpdatedAt": now, "Status": status}
    if meta:
        last["Meta"] = meta
    if accessor_id:
        last["AccessorID"] = accessor_id
    node["LastDrain"] = last
    node["StatusUpdatedAt"] = now_ns() // 10**9
    if status == "draining":
        message = "Node drain strategy set" if started else "Node drain strategy updated"
    else:
        message = "Node drain complete" if status == "complete" else "Node drain disabled"
    events = [*(node.get("Events") or []), _node_event(message, "Drain", index)]
    node["Events"] = events[-MAX_NODE_EVENTS:]


def _node_reply(txn: Txn) -> JSON:
    """The NodeDrain/NodeEligibility update response: no evals are created directly."""
    return {
        "EvalIDs": None,
        "EvalCreateIndex": 0,
        "NodeModifyIndex": txn.index,
        "Index": txn.index,
    }
