"""The Simulator: one in-memory Nomad cluster, assembled from its parts."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from controller.lab.simulator.acl import Acl
from controller.lab.simulator.acl_policy import Permissions
from controller.lab.simulator.api import ApiFaults
from controller.lab.simulator.audit import WriteAudit
from controller.lab.simulator.clients import Clients
from controller.lab.simulator.deployments import Deployments
from controller.lab.simulator.jobs import JobRegistry
from controller.lab.simulator.keyring import Keyring
from controller.lab.simulator.namespaces import NamespaceRegistry
from controller.lab.simulator.nodes import NodeRegistry
from controller.lab.simulator.operator import SchedulerConfig
from controller.lab.simulator.sandbox import Sandboxes
from controller.lab.simulator.scheduler import Scheduler
from controller.lab.simulator.store import JobKey, JobRecord, Store
from controller.lab.simulator.util import JSON, WALL_CLOCK, now_ns
from controller.lab.simulator.variables import VariableRegistry, VarKey, var_meta

DEFAULT_NODES = ("sim-node-1", "sim-node-2", "sim-node-3")


class Simulator:
    """An in-memory Nomad: see docs/simulator.md for the behaviour and the faults.

    A facade: every part holds the shared `store` (index, tables, transactions, event
    frames) and does one thing, with the faults that break it. This class wires them
    together and keeps the public methods and attributes in one place.
    """

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
        lock_time_scale: float = 1.0,
        exec_mode: str = "none",
        write_latency_ms: float = 0.0,
    ) -> None:
        self.store = Store(seed, event_buffer_size)
        self.scheduler = Scheduler(self.store, algorithm)
        self.clients = Clients(self.store, self.scheduler, start_delay)
        self.node_registry = NodeRegistry(self.store, self.scheduler, self.clients)
        # The two edges that point back: the scheduler hands its placements to the
        # clients, and a client's last stop on a draining node ends the drain.
        self.scheduler.clients = self.clients
        self.clients.nodes = self.node_registry
        self.job_registry = JobRegistry(self.store, self.scheduler)
        # The registry's own method: a delegation would only repeat its long signature.
        self.register_job = self.job_registry.register_job
        self.variable_registry = VariableRegistry(self.store, lock_time_scale)
        self.acl = Acl(self.store, acl_enabled)
        self.keyring = Keyring(seed)
        self.deployment_ops = Deployments(self.store, self.scheduler)
        self.namespace_registry = NamespaceRegistry(self.store, lambda: self.variable_registry.vars)
        self.job_registry.namespace_exists = lambda ns: ns in self.namespace_registry.namespaces
        # Written with the default namespace, in the leader's first apply.
        first = self.namespace_registry.namespaces["default"]["CreateIndex"]
        self.scheduler_config = SchedulerConfig(self.store, self.scheduler, first)
        self.api_faults = ApiFaults()
        # The clients' allocation directories; `local` runs execs there as real processes.
        self.sandboxes = Sandboxes(self.store, exec_mode)
        self.clients.write_log = self.sandboxes.write_log  # a mock_driver task's output
        self.write_latency_ms = write_latency_ms
        self.heartbeat_seconds = heartbeat_seconds  # of the event stream
        self.advertise = "127.0.0.1"
        # The tables, shared with their parts: they are changed in place, never replaced.
        self.table_index = self.store.table_index
        self.counters = self.store.counters
        self.broker = self.store.broker
        self.nodes = self.store.nodes
        self.jobs = self.store.jobs
        self.allocs = self.store.allocs
        self.evals = self.store.evals
        self.deployments = self.store.deployments
        self.job_allocs = self.store.job_allocs
        self.node_allocs = self.store.node_allocs
        self.job_touched = self.store.job_touched
        self.blocked = self.scheduler.blocked
        self.fail_images = self.clients.fail_images
        self.vars = self.variable_registry.vars
        self.audit = WriteAudit(self.vars)
        self.tokens = self.acl.tokens
        self.policies = self.acl.policies
        for name in DEFAULT_NODES if nodes is None else nodes:
            self.node_registry.register(name, node_cpu, node_memory_mb)

    # ------------------------------------------------------------------ settings
    @property
    def acl_enabled(self) -> bool:
        return self.acl.enabled

    @property
    def start_delay(self) -> float:
        return self.clients.start_delay

    @start_delay.setter
    def start_delay(self, seconds: float) -> None:
        self.clients.start_delay = seconds

    @property
    def exec_mode(self) -> str:
        return self.sandboxes.exec_mode

    @property
    def write_latency_ms(self) -> float:
        """How long after a write's arrival it is applied and answered (a Raft commit)."""
        return self._write_latency_ms

    @write_latency_ms.setter
    def write_latency_ms(self, ms: float) -> None:
        if not ms >= 0:  # also refuses NaN
            raise ValueError(f"invalid write latency {ms!r} ms (expected a number >= 0)")
        self._write_latency_ms = float(ms)

    @property
    def algorithm(self) -> str:
        return self.scheduler.placement.algorithm

    @algorithm.setter
    def algorithm(self, algorithm: str) -> None:
        self.scheduler.placement.algorithm = algorithm

    # ------------------------------------------------------------------ state
    @property
    def index(self) -> int:
        return self.store.index

    async def wait_for_change(self, seconds: float) -> None:
        await self.store.wait_for_change(seconds)

    def shutdown(self) -> None:
        """Kill the processes of `--exec local` and remove the allocation directories."""
        self.sandboxes.shutdown()

    # ------------------------------------------------------------------ jobs
    def deregister_job(
        self,
        job_id: str,
        namespace: str = "default",
        purge: bool = False,
        eval_priority: int = 0,
        no_shutdown_delay: bool = False,
    ) -> JSON:
        return self.job_registry.deregister_job(
            job_id, namespace, purge, eval_priority, no_shutdown_delay
        )

    def evaluate_job(self, job_id: str, namespace: str = "default") -> JSON:
        return self.job_registry.evaluate_job(job_id, namespace)

    def dispatch_job(self, job_id: str, namespace: str, body: JSON) -> JSON:
        return self.job_registry.dispatch_job(job_id, namespace, body)

    def revert_job(self, job_id: str, namespace: str, version: int, enforce: Any) -> JSON:
        return self.job_registry.revert_job(job_id, namespace, version, enforce)

    def stable_job(self, job_id: str, namespace: str, version: int, stable: bool) -> JSON:
        return self.job_registry.stable_job(job_id, namespace, version, stable)

    def scale_job(self, job_id: str, namespace: str, body: JSON) -> JSON:
        return self.job_registry.scale_job(job_id, namespace, body)

    def job_summary(self, rec: JobRecord) -> JSON:
        return self.job_registry.job_summary(rec)

    def job_keys(self, namespace: str, prefix: str = "") -> list[JobKey]:
        return self.job_registry.job_keys(namespace, prefix)

    # ------------------------------------------------------------------ allocations
    def alloc(self, alloc_id: str) -> JSON:
        return self.store.alloc(alloc_id)

    def stop_allocation(
        self, alloc_id: str, reschedule: bool = False, no_shutdown_delay: bool = False
    ) -> JSON:
        return self.clients.stop_allocation(alloc_id, reschedule, no_shutdown_delay)

    # ------------------------------------------------------------------ nodes
    def node_id(self, name_or_id: str) -> str:
        return self.node_registry.node_id(name_or_id)

    async def drain_node(
        self,
        node_name: str,
        deadline_seconds: float | None = 3600.0,
        enable: bool = True,
        mark_eligible: bool = False,
        meta: dict[str, str] | None = None,
        accessor_id: str = "",
    ) -> JSON:
        """Drain a node, or with `enable=False` stop draining it: the drain API, and a
        fault (/_sim/drain_node)."""
        if enable:
            return self.node_registry.start_drain(node_name, deadline_seconds, meta, accessor_id)
        return self.node_registry.stop_drain(node_name, mark_eligible, meta, accessor_id)

    def set_eligibility(self, node_id: str, eligible: bool) -> JSON:
        return self.node_registry.set_eligibility(node_id, eligible)

    def evaluate_node(self, node_id: str) -> JSON:
        return self.node_registry.evaluate_node(node_id)

    # ------------------------------------------------------------------ variables
    def var_meta(self, var: JSON) -> JSON:
        return var_meta(var)

    def put_variable(
        self, namespace: str, path: str, items: Any, cas: int | None, lock: Any = None
    ) -> tuple[int, JSON]:
        return self.variable_registry.put_variable(namespace, path, items, cas, lock)

    def delete_variable(
        self, namespace: str, path: str, cas: int | None
    ) -> tuple[int, JSON | None]:
        return self.variable_registry.delete_variable(namespace, path, cas)

    def var_keys(self, namespace: str, prefix: str) -> list[VarKey]:
        return self.variable_registry.var_keys(namespace, prefix)

    def acquire_lock(self, namespace: str, path: str, items: Any, lock: Any) -> tuple[int, JSON]:
        return self.variable_registry.acquire_lock(namespace, path, items, lock)

    def renew_lock(self, namespace: str, path: str, lock_id: Any) -> JSON:
        return self.variable_registry.renew_lock(namespace, path, lock_id)

    def release_lock(self, namespace: str, path: str, lock: Any, items: Any) -> tuple[int, JSON]:
        return self.variable_registry.release_lock(namespace, path, lock, items)

    # ------------------------------------------------------------------ ACL
    def bootstrap(self) -> JSON:
        return self.acl.bootstrap()

    def create_token(self, body: JSON, accessor: str | None = None) -> JSON:
        return self.acl.create_token(body, accessor)

    def delete_token(self, accessor: str) -> None:
        self.acl.delete_token(accessor)

    def token_for(self, secret: str) -> JSON | None:
        return self.acl.token_for(secret)

    def put_policy(self, name: str, body: JSON) -> None:
        self.acl.put_policy(name, body)

    def delete_policy(self, name: str) -> None:
        self.acl.delete_policy(name)

    def permissions(self, token: JSON | None) -> Permissions | None:
        """What a route's `token` argument may do; None when ACLs are off."""
        return self.acl.permissions(token)

    def namespace_filter(
        self, token: JSON | None, namespace: str, capability: str
    ) -> Callable[[str], bool]:
        return self.acl.namespace_filter(token, namespace, capability)

    def require(self, token: JSON | None, namespace: str, capability: str) -> None:
        """For routes: 403 `Permission denied` unless the token has the namespace
        capability (`alloc-exec`, `read-fs`, ...); nothing when ACLs are off."""
        self.acl.require(token, namespace, capability)

    # ================================================================== faults
    # The /_sim/<name> routes call these by name with their keyword arguments.
    async def reschedule_allocation(self, alloc_id: str) -> str:
        return self.clients.reschedule_allocation(alloc_id)

    async def node_down(self, node_name: str) -> None:
        self.node_registry.node_down(node_name)

    async def node_up(self, node_name: str) -> None:
        self.node_registry.node_up(node_name)

    async def oom_restart(self, alloc_id: str) -> None:
        self.clients.oom_restart(alloc_id)

    async def reannounce_allocation(self, alloc_id: str) -> None:
        self.clients.reannounce_allocation(alloc_id)

    async def finish_allocation(self, alloc_id: str, failed: bool = False) -> None:
        self.clients.finish_allocation(alloc_id, failed)

    def collect_garbage(self) -> None:
        self.job_registry.collect_garbage()

    async def remove_job_silently(self, job_id: str, namespace: str = "default") -> None:
        self.job_registry.remove_job_silently(job_id, namespace)

    def disconnect_event_streams(self) -> None:
        self.store.broker.disconnect_all()

    def event_fault(self, kind: str, seconds: float, delay_ms: float = 500.0) -> None:
        self.store.broker.inject_fault(kind, seconds, delay_ms)

    def api_fault(self, kind: str, seconds: float, slow_ms: float = 1000.0) -> None:
        self.api_faults.inject(kind, seconds, slow_ms)

    def no_capacity(self, on: bool) -> None:
        self.scheduler.placement.no_capacity(on)

    def set_start_delay(self, seconds: float) -> None:
        self.clients.start_delay = seconds

    def advance_clock(self, seconds: float) -> None:
        """Move the reported time forward (WallClock: the process's clock)."""
        WALL_CLOCK.advance(seconds)

    def fail_starts(self, image: str = "*", on: bool = True) -> None:
        self.clients.fail_starts(image, on)

    def set_write_latency(self, ms: float) -> None:
        self.write_latency_ms = ms

    async def lose_state(self) -> None:
        """The servers lose their state, as a restarted dev agent does (or a snapshot
        restored from before any of it was written)."""
        self.store.lose_state()
        self.scheduler.lose_state()
        self.job_registry.lose_state()
        self.variable_registry.lose_state()
        self.namespace_registry.lose_state()
        self.node_registry.rejoin()

    # ================================================================== inspection
    def job_list(self, namespace: str = "*") -> list[JSON]:
        return [self.store.jobs[k].job for k in self.job_registry.job_keys(namespace)]

    def get_job(self, job_id: str, namespace: str = "default") -> JSON | None:
        rec = self.store.jobs.get((namespace, job_id))
        return rec.job if rec else None

    def allocations(self, job_id: str | None = None, namespace: str = "default") -> list[JSON]:
        if job_id is None:
            return list(self.store.allocs.values())
        return [self.store.allocs[a] for a in self.store.job_allocs.get((namespace, job_id), ())]

    def variables(self, namespace: str = "default") -> dict[str, JSON]:
        """Path -> stored variable (with Items) in a namespace ("*": all, keyed by path)."""
        registry = self.variable_registry
        return {k[1]: registry.vars[k] for k in registry.var_keys(namespace, "")}

    def registrations(self) -> int:
        """Job registrations that created a new job (not updates, not re-registrations)."""
        return self.store.counters["jobs_created"]

    def node_names(self) -> list[str]:
        return list(self.store.node_by_name)

    def metrics_summary(self) -> JSON:
        """`/v1/metrics` (go-metrics' summary of the current 10 s interval): the simulator
        keeps no telemetry, so it has a timestamp and no values."""
        interval = now_ns() // 10**10 * 10
        stamp = time.strftime("%Y-%m-%d %H:%M:%S +0000 UTC", time.gmtime(interval))
        return {"Timestamp": stamp, "Gauges": [], "Points": [], "Counters": [], "Samples": []}

    def snapshot(self) -> JSON:
        """Counts and counters, for /_sim/state and benchmarks."""
        store = self.store
        statuses = Counter(a["ClientStatus"] for a in store.allocs.values())
        return {
            "Index": store.index,
            "Jobs": len(store.jobs),
            "Allocations": dict(statuses),
            "Evaluations": len(store.evals),
            "Variables": len(self.variable_registry.vars),
            "BlockedEvals": len(self.scheduler.blocked),
            "Counters": dict(store.counters),
            "Events": store.broker.stats(),
        }
