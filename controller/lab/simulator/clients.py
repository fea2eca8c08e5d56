"""The simulated clients: they run allocations and report back; the allocation faults."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from controller.lab.simulator.jobspec import group_images, group_resources
from controller.lab.simulator.scheduler import STOP_MIGRATING, Scheduler, name_index
from controller.lab.simulator.store import TERMINAL, Store
from controller.lab.simulator.util import JSON, bad_request, iso_now, now_ns, parse_go_duration

MOCK_DRIVER = "mock_driver"
# What a client reports with every update of an allocation in host networking mode.
HOST_NETWORK_STATUS: JSON = {"InterfaceName": "", "Address": "", "AddressIPv6": "", "DNS": None}
# A task's output, written where the client's log collector puts it (set by the Simulator).
WriteLog = Callable[[JSON, str, str, bytes], None]

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
        self.write_log: WriteLog | None = None
        # Allocations running mock_driver tasks: the tasks still running, and the exit
        # code or error message of each one that has ended.
        self._mock_running: dict[str, set[str]] = {}
        self._mock_exits: dict[str, list[tuple[int, str]]] = {}

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
        mock = {
            t["Name"]: t.get("Config") or {} for t in group["Tasks"] if t["Driver"] == MOCK_DRIVER
        }
        start_error = next(
            (str(c["start_error"]) for c in mock.values() if c.get("start_error")), ""
        )
        if start_error:
            events = _driver_failure(start_error, now)
            tasks = _task_states(alloc, "dead", True, [received, *events])
            self._update(alloc, "failed", "Failed tasks", tasks)
            return
        started = _task_event("Started", now, "Task started by client")
        tasks = _task_states(alloc, "running", False, [received, started])
        self._update(alloc, "running", "Tasks are running", tasks)
        if mock:
            self._run_mock(alloc, mock, all_mock=len(mock) == len(group["Tasks"]))

    # ------------------------------------------------------------------ mock_driver
    def _run_mock(self, alloc: JSON, tasks: dict[str, JSON], all_mock: bool) -> None:
        """Nomad's test driver (`mock_driver`): each task writes `stdout_string` and
        `stderr_string` (then `*_repeat` more times, `*_repeat_duration` apart) and exits
        after `run_for` (0: at once) with `exit_code` (or the error `exit_err_msg`). The
        allocation ends when the last of its tasks does, if all of them are mock tasks:
        complete, or failed when one exited non-zero or with an error."""
        alloc_id = alloc["ID"]
        if all_mock:
            self._mock_running[alloc_id] = set(tasks)
            self._mock_exits[alloc_id] = []
        for name, config in tasks.items():
            for stream in ("stdout", "stderr"):
                output = str(config.get(f"{stream}_string") or "").encode()
                if not output:
                    continue
                every = _duration(config.get(f"{stream}_repeat_duration"))
                for i in range(1 + int(config.get(f"{stream}_repeat") or 0)):
                    self.store.later(i * every, self._mock_output, alloc_id, name, stream, output)
            exit_code = int(config.get("exit_code") or 0)
            message = str(config.get("exit_err_msg") or "")
            run_for = _duration(config.get("run_for"))
            self.store.later(run_for, self._mock_exit, alloc_id, name, exit_code, message)

    def _mock_output(self, alloc_id: str, task: str, stream: str, data: bytes) -> None:
        alloc = self.store.allocs.get(alloc_id)
        if alloc is not None and alloc["ClientStatus"] == "running" and self.write_log:
            self.write_log(alloc, task, stream, data)

    def _mock_exit(self, alloc_id: str, task: str, exit_code: int, message: str) -> None:
        running = self._mock_running.get(alloc_id)
        alloc = self.store.allocs.get(alloc_id)
        if running is None or task not in running:
            return
        running.discard(task)
        self._mock_exits[alloc_id].append((exit_code, message))
        if running:
            return
        exits = self._mock_exits.pop(alloc_id)
        del self._mock_running[alloc_id]
        if alloc is None or alloc["ClientStatus"] != "running" or alloc["DesiredStatus"] != "run":
            return
        code, error = max(exits, key=lambda e: (e[0] != 0 or bool(e[1]), e[0]))
        self._exit(alloc, code, error)

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
        alloc["NetworkStatus"] = HOST_NETWORK_STATUS
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
        self._exit(alloc, 1 if failed else 0, "")

    def _exit(self, alloc: JSON, exit_code: int, error: str) -> None:
        """The allocation's tasks have exited: complete, or failed (non-zero, or an error)."""
        failed = exit_code != 0 or bool(error)
        message = f"Exit Code: {exit_code}" + (f", Exit Message: {error!r}" if error else "")
        ev = _task_event("Terminated", now_ns(), message, fails=failed)
        ev["ExitCode"] = exit_code
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
    pulling = _task_event("Driver", now, "Downloading image")
    pulling["DriverMessage"] = "Downloading image"
    events = _driver_failure(f"Failed to pull `{image}`: simulated start failure", now)
    return [events[0], pulling, *events[1:]]


def _driver_failure(error: str, now: int) -> list[JSON]:
    """The task events after `Received` of a task its driver fails to start."""
    setup = _task_event("Task Setup", now, "Building Task Directory")
    setup["Message"] = "Building Task Directory"
    failure = _task_event("Driver Failure", now, error)
    failure["DriverError"] = error
    failure["Details"] = {"driver_error": error}
    verdict = "Error was unrecoverable"
    final = _task_event("Not Restarting", now, verdict, fails=True)
    final["RestartReason"] = verdict
    final["Details"] = {"restart_reason": verdict, "fails_task": "true"}
    return [setup, failure, final]


def _duration(value: Any) -> float:
    """A mock_driver duration ("1s", "500ms"); none or a bad one is 0."""
    try:
        return max(parse_go_duration(str(value)), 0.0) if value else 0.0
    except ValueError:
        return 0.0


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
