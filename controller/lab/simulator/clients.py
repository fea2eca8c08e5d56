"""The simulated clients: they run allocations and report back; the allocation faults."""

from __future__ import annotations

from typing import TYPE_CHECKING

from controller.lab.simulator.jobspec import group_images, group_resources
from controller.lab.simulator.scheduler import STOP_MIGRATING, Scheduler, name_index
from controller.lab.simulator.store import TERMINAL, Store
from controller.lab.simulator.util import JSON, bad_request, iso_now, now_ns

if TYPE_CHECKING:
    from controller.lab.simulator.nodes import NodeRegistry


class Clients:
    # Set by the Simulator: a drain ends when its node's last alloc stops (and nodes point back).
    nodes: NodeRegistry

    def __init__(self, store: Store, scheduler: Scheduler, start_delay: float) -> None:
        self.store = store
        self.scheduler = scheduler
        self.start_delay = start_delay  # from placement or stop to the client's report
        self.fail_images: set[str] = set()

    def start_soon(self, alloc_id: str) -> None:
        self.store.later(self.start_delay, self._start, alloc_id)

    def stop_soon(self, alloc_id: str) -> None:
        self.store.later(self.start_delay, self._stop, alloc_id)

    def _start(self, alloc_id: str) -> None:
        alloc = self.store.allocs.get(alloc_id)
        if alloc is None or alloc["ClientStatus"] != "pending" or alloc["DesiredStatus"] != "run":
            return
        if self.store.nodes[alloc["NodeID"]]["Status"] == "down":
            return
        group = next(g for g in alloc["Job"]["TaskGroups"] if g["Name"] == alloc["TaskGroup"])
        now = now_ns()
        received = _task_event("Received", now, "Task received by client")
        images = group_images(group)
        if "*" in self.fail_images or self.fail_images & set(images):
            events = _failed_start(images[0] if images else "", now)
            tasks = _task_states(alloc, "dead", True, [received, *events])
            self._update(alloc, "failed", "Failed tasks", tasks)
            return
        started = _task_event("Started", now, "Task started by client")
        tasks = _task_states(alloc, "running", False, [received, started])
        self._update(alloc, "running", "Tasks are running", tasks)

    def _stop(self, alloc_id: str) -> None:
        alloc = self.store.allocs.get(alloc_id)
        if alloc is None or alloc["ClientStatus"] in TERMINAL:
            return
        if self.store.nodes[alloc["NodeID"]]["Status"] == "down":
            return
        now = now_ns()
        killing = _task_event("Killing", now, "Sent interrupt")
        killed = _task_event("Killed", now, "Task successfully killed")
        tasks = _task_states(alloc, "dead", False, [killing, killed])
        self._update(alloc, "complete", "All tasks have completed", tasks)

    def _update(self, alloc: JSON, status: str, description: str, tasks: JSON) -> None:
        txn = self.store.txn("AllocationUpdated")
        alloc["ClientStatus"] = status
        alloc["ClientDescription"] = description
        alloc["TaskStates"] = tasks
        txn.alloc(alloc)
        if status in TERMINAL:
            self.scheduler.placement.release(alloc["ID"])
        retry: JSON | None = None
        if status == "failed" and alloc["DesiredStatus"] == "run":
            # The client update for a failed alloc carries the alloc-failure eval.
            retry = self.scheduler.new_eval(txn, alloc["Job"], "alloc-failure")
        self.store.commit(txn)
        if retry is not None:
            self.scheduler.schedule(retry["ID"])
        if status in TERMINAL:
            self.nodes.check_drain_done(alloc["NodeID"])
        if status == "running" and alloc.get("DeploymentID"):
            self.store.later(0, self.scheduler.deployment_progress, alloc["DeploymentID"])

    # ------------------------------------------------------------------ API
    def stop_allocation(
        self, alloc_id: str, reschedule: bool = False, no_shutdown_delay: bool = False
    ) -> JSON:
        alloc = self.store.alloc(alloc_id)
        txn = self.store.txn("AllocationUpdateDesiredStatus")
        # As Nomad's Alloc.Stop: all three set, each as asked.
        alloc["DesiredTransition"] = {
            **alloc["DesiredTransition"],
            "Migrate": True,
            "Reschedule": reschedule,
            "NoShutdownDelay": no_shutdown_delay,
        }
        txn.alloc(alloc)
        ev = self.scheduler.new_eval(txn, alloc["Job"], "alloc-stop")
        self.store.commit(txn)
        self.scheduler.schedule(ev["ID"])
        return {"EvalID": ev["ID"], "Index": txn.index}

    # ------------------------------------------------------------------ faults
    def reschedule_allocation(self, alloc_id: str) -> str:
        """Instant migration (the Poseidon seed); returns the new alloc's ID.

        One PlanResult frame: the new alloc N (pending, PreviousAllocation=O) before
        O's stop (NextAllocation=N); then client updates O complete / N running as
        two AllocationUpdated frames in an order chosen by the seeded RNG.
        """
        store, scheduler = self.store, self.scheduler
        old = store.alloc(alloc_id)
        if old["DesiredStatus"] != "run" or old["ClientStatus"] in TERMINAL:
            raise bad_request("alloc is not running")
        job = old["Job"]
        group = next(g for g in job["TaskGroups"] if g["Name"] == old["TaskGroup"])
        cpu, mem = group_resources(group)
        node = scheduler.placement.pick_node(cpu, mem) or store.nodes[old["NodeID"]]
        txn = store.txn("PlanResult")
        ev = scheduler.new_eval(txn, job, "alloc-stop")
        new = scheduler.new_alloc(txn, job, group, name_index(old), node, ev, old, None)
        scheduler.placement.hold(new, cpu, mem)
        scheduler.close_eval(txn, ev)
        txn.alloc(new)
        old["NextAllocation"] = new["ID"]
        scheduler.stop(txn, old, STOP_MIGRATING)
        store.commit(txn)
        order = [(self._stop, old["ID"]), (self._start, new["ID"])]
        if store.rng.random() < 0.5:
            order.reverse()  # the two clients report independently

        def report() -> None:
            for update, target in order:
                update(target)

        store.later(self.start_delay, report)
        return str(new["ID"])

    def oom_restart(self, alloc_id: str) -> None:
        """OOM kill and in-place restart: same alloc, Restarts+1, an oom_killed event."""
        alloc = self.store.alloc(alloc_id)
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
        self._update(alloc, "running", "Tasks are running", tasks)

    def reannounce_allocation(self, alloc_id: str) -> None:
        """The client re-sends an unchanged alloc (AllocationUpdated, same content)."""
        alloc = self.store.alloc(alloc_id)
        txn = self.store.txn("AllocationUpdated")
        txn.alloc(alloc)
        self.store.commit(txn)

    def finish_allocation(self, alloc_id: str, failed: bool = False) -> None:
        """The task exits by itself (complete, or failed and rescheduled per policy)."""
        alloc = self.store.alloc(alloc_id)
        if alloc["ClientStatus"] in TERMINAL:
            raise bad_request("alloc is already terminal")
        now = now_ns()
        ev = _task_event("Terminated", now, f"Exit Code: {1 if failed else 0}", fails=failed)
        ev["ExitCode"] = 1 if failed else 0
        tasks = _task_states(alloc, "dead", failed, [ev])
        if failed:
            self._update(alloc, "failed", "Failed tasks", tasks)
        else:
            self._update(alloc, "complete", "All tasks have completed", tasks)

    def fail_starts(self, image: str = "*", on: bool = True) -> None:
        """New allocs whose task image is `image` ("*": every image) fail to start."""
        if on:
            self.fail_images.add(image)
        else:
            self.fail_images.discard(image)


def _task_states(alloc: JSON, state: str, failed: bool, events: list[JSON]) -> JSON:
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
                "StartedAt": old.get("StartedAt") or (iso_now() if state == "running" else None),
                "FinishedAt": iso_now() if state == "dead" else None,
                "Events": [*(old.get("Events") or []), *events],
            }
    return out


def _failed_start(image: str, now: int) -> list[JSON]:
    """The task events after `Received` of a task whose image cannot be pulled, as Nomad's
    task runner emits them: the setup, the docker driver's pull, its error (which the
    driver marks unrecoverable for an image that does not exist), then the restart
    tracker's verdict, the event that fails the task."""
    setup = _task_event("Task Setup", now, "Building Task Directory")
    setup["Message"] = "Building Task Directory"
    pulling = _task_event("Driver", now, "Downloading image")
    pulling["DriverMessage"] = "Downloading image"
    error = f"Failed to pull `{image}`: simulated start failure"
    failure = _task_event("Driver Failure", now, error)
    failure["DriverError"] = error
    failure["Details"] = {"driver_error": error}
    verdict = "Error was unrecoverable"
    final = _task_event("Not Restarting", now, verdict, fails=True)
    final["RestartReason"] = verdict
    final["Details"] = {"restart_reason": verdict, "fails_task": "true"}
    return [setup, pulling, failure, final]


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
