"""The clients' allocation directories, and the processes `--exec local` runs in them.

An allocation that exec or the fs API reaches, or whose task writes output (the mock
driver), gets a private directory with the layout a Nomad client builds, under a temporary
root the simulator owns (built when first needed, so that allocations nobody looks at cost
nothing). With `--exec local` its execs run in it as real processes. The processes end
with the allocation (terminal, gone, its node down) and when one of its tasks restarts.
The directory outlives a terminal allocation, as a client keeps it until its garbage
collection: the newest `GC_MAX_ALLOCS` terminal ones of a node are kept; it goes with the
allocation itself and with its node. Nothing here isolates anything: a process may read
and write whatever the simulator can.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import tempfile
from collections.abc import Sequence

from controller.lab.simulator.localexec import LocalProcess
from controller.lab.simulator.scheduler import name_index
from controller.lab.simulator.store import TERMINAL, Store, Txn
from controller.lab.simulator.util import JSON, ApiError

EXEC_MODES = ("none", "local")
# How many terminal allocations' directories a client keeps (Nomad's gc_max_allocs).
GC_MAX_ALLOCS = 50
_SHARED_DIRS = ("logs", "tmp", "data")  # under alloc/, shared by the group's tasks
# A task directory's subdirectories and their modes, as the client builds them.
_TASK_DIRS = {"local": 0o777, "tmp": 0o1777, "secrets": 0o777, "private": 0o777}
_NOT_ENV_NAME = re.compile(r"[^A-Za-z0-9_.]")  # Nomad turns these into "_" in meta names


class Sandbox:
    """One allocation's directory, and the process groups its execs started."""

    def __init__(self, path: str, alloc: JSON) -> None:
        self.path = path
        self.tasks = [t["Name"] for t in alloc_group(alloc)["Tasks"]]
        self.restarts = _restarts(alloc)  # per task, as last seen: a rise is a restart
        self.processes: list[LocalProcess] = []
        self.ended = False  # no process may run in it any more
        self.kept = False  # ended, but the directory stays (a terminal allocation's)

    def task_dir(self, task: str) -> str:
        return os.path.join(self.path, task)

    def unreadable_dirs(self) -> list[tuple[str, str]]:
        """(kind, directory) of what the fs API must not read: each task's secrets, private."""
        return [
            (kind, os.path.join(self.path, task, kind))
            for task in self.tasks
            for kind in ("secret", "private")
        ]

    def build(self) -> None:
        _mkdir(self.path, 0o755)
        shared = os.path.join(self.path, "alloc")
        _mkdir(shared, 0o755)
        for name in _SHARED_DIRS:
            _mkdir(os.path.join(shared, name), 0o777)
        for task in self.tasks:
            _mkdir(self.task_dir(task), 0o777)
            for name, mode in _TASK_DIRS.items():
                _mkdir(os.path.join(self.task_dir(task), name), mode)
            for stream in ("stdout", "stderr"):
                # The log files a client's logmon opens when the task starts (empty here).
                open(os.path.join(shared, "logs", f"{task}.{stream}.0"), "ab").close()

    def kill(self, task: str | None = None, lost: bool = False) -> None:
        for process in self.processes:
            if task is None or process.task == task:
                process.kill(lost)

    def reaped(self, process: LocalProcess) -> None:
        """One of its processes has exited: forget its group once nothing of it runs."""
        if not process.group_alive():
            self.processes.remove(process)
        if self.ended and not self.kept:
            self.remove()  # again: what the killed process was still writing is done now

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


class Sandboxes:
    def __init__(self, store: Store, exec_mode: str) -> None:
        if exec_mode not in EXEC_MODES:
            raise ValueError(f"invalid exec mode {exec_mode!r} (expected none or local)")
        self.store = store
        self.exec_mode = exec_mode
        self._root = ""
        self._boxes: dict[str, Sandbox] = {}
        # The connections of running execs, which the simulator's shutdown waits for.
        self._sessions: set[asyncio.Task[None]] = set()
        store.after_commit.append(self._after_commit)

    # ------------------------------------------------------------------ the server's view
    def lookup(self, alloc_id: str) -> JSON:
        """The allocation a /v1/client route names, found as the server's state store does."""
        problem = _uuid_problem(alloc_id)
        if problem is not None:
            raise ApiError(500, f"alloc lookup failed: index error: {problem}")
        # The UUID index compares bytes: any case, any placement of the hyphens.
        digits = alloc_id.replace("-", "").lower()
        canonical = f"{digits[:8]}-{digits[8:12]}-{digits[12:16]}-{digits[16:20]}-{digits[20:]}"
        alloc = self.store.allocs.get(canonical) if len(digits) == 32 else None
        if alloc is None:
            raise ApiError(404, f'Unknown allocation "{alloc_id}"')
        return alloc

    def reach(self, alloc: JSON) -> None:
        """The server's connection to the allocation's client: none while its node is down."""
        if self.store.nodes[alloc["NodeID"]]["Status"] == "down":
            raise ApiError(404, "No path to node")

    # ------------------------------------------------------------------ the client's view
    def open(self, alloc: JSON) -> Sandbox:
        """The allocation's directory, built on first use; a terminal allocation that had
        none (or whose directory was collected) has none, which the client reports as an
        unknown allocation."""
        box = self._boxes.get(alloc["ID"])
        if box is not None:
            return box
        if alloc["ClientStatus"] in TERMINAL:
            raise ApiError(404, f'Unknown allocation "{alloc["ID"]}"')
        box = Sandbox(os.path.join(self._root_dir(), alloc["ID"]), alloc)
        box.build()
        self._boxes[alloc["ID"]] = box
        return box

    async def start(
        self, alloc: JSON, task: JSON, argv: Sequence[str], tty: bool
    ) -> tuple[Sandbox, LocalProcess]:
        """Run `argv` as a local process in the allocation's task directory."""
        box = self.open(alloc)
        env = task_env(alloc, task, box)
        process = await LocalProcess.start(argv, box.task_dir(task["Name"]), env, tty, task["Name"])
        box.processes.append(process)
        if box.ended:  # the allocation stopped while the process was starting
            process.kill()
        return box, process

    def write_log(self, alloc: JSON, task: str, stream: str, data: bytes) -> None:
        """What a task writes to its stdout or stderr, into the log file a client's logmon
        fills (`alloc/logs/<task>.<stream>.0`)."""
        if alloc["ClientStatus"] in TERMINAL and alloc["ID"] not in self._boxes:
            return
        box = self.open(alloc)
        with open(os.path.join(box.path, "alloc", "logs", f"{task}.{stream}.0"), "ab") as log:
            log.write(data)

    def serving(self, connection: asyncio.Task[None]) -> None:
        """An exec's connection (the task serving it) runs until its session ends."""
        self._sessions.add(connection)
        connection.add_done_callback(self._sessions.discard)

    def shutdown(self) -> None:
        """The simulator stops: every process dies as with its node, the root goes."""
        for box in self._boxes.values():
            box.kill(lost=True)
        self._boxes.clear()
        if self._root:
            shutil.rmtree(self._root, ignore_errors=True)
            self._root = ""

    async def sessions_ended(self, limit: float) -> None:
        """Wait (up to `limit` seconds) until the exec connections have closed, which
        they do once shutdown() has killed their processes."""
        if self._sessions:
            await asyncio.wait(set(self._sessions), timeout=limit)

    # ------------------------------------------------------------------ lifecycle
    def _after_commit(self, txn: Txn) -> None:
        if not self._boxes or not txn.tables & {"allocs", "nodes"}:
            return
        finished = False
        for alloc_id, box in list(self._boxes.items()):
            alloc = self.store.allocs.get(alloc_id)
            if alloc is None:
                self._end(alloc_id, lost=False)
            elif self.store.nodes[alloc["NodeID"]]["Status"] == "down":
                self._end(alloc_id, lost=True)
            elif alloc["ClientStatus"] in TERMINAL:
                if not box.ended:
                    self._end(alloc_id, lost=False, keep=True)
                    finished = True
            else:
                restarts = _restarts(alloc)
                for task, count in restarts.items():
                    if count > box.restarts.get(task, 0):
                        box.kill(task)  # a restarted task's container takes its execs along
                box.restarts = restarts

        if finished:
            self._collect()

    def _end(self, alloc_id: str, lost: bool, keep: bool = False) -> None:
        """No process runs in the allocation's directory any more; unless it is `keep`
        (a terminal allocation's, until collected), the directory goes too."""
        box = self._boxes.pop(alloc_id)
        if keep:
            self._boxes[alloc_id] = box  # last: the kept ones are in the order they ended
        box.ended, box.kept = True, keep
        box.kill(lost=lost)
        if not keep:
            box.remove()

    def _collect(self) -> None:
        """A client's garbage collection: beyond GC_MAX_ALLOCS terminal allocations'
        directories on a node, the oldest go (kept in the order they ended)."""
        kept: dict[str, list[str]] = {}
        for alloc_id, box in self._boxes.items():
            alloc = self.store.allocs.get(alloc_id)
            if box.kept and alloc is not None:
                kept.setdefault(alloc["NodeID"], []).append(alloc_id)
        for alloc_ids in kept.values():
            for alloc_id in alloc_ids[: max(len(alloc_ids) - GC_MAX_ALLOCS, 0)]:
                self._end(alloc_id, lost=False)

    def root_dir(self) -> str:
        """The folder of every allocation directory (made on first use)."""
        return self._root_dir()

    def _root_dir(self) -> str:
        if not self._root:
            # realpath: the escape check compares resolved paths with this prefix.
            self._root = os.path.realpath(tempfile.mkdtemp(prefix="poolkeeper-sim-"))
        return self._root


def alloc_group(alloc: JSON) -> JSON:
    return next(g for g in alloc["Job"]["TaskGroups"] if g["Name"] == alloc["TaskGroup"])


def task_env(alloc: JSON, task: JSON, box: Sandbox) -> dict[str, str]:
    """A local exec's environment: the simulator's own, what Nomad sets for the task (with
    this host's paths for its directories), then the task's `Env`, which wins as in Nomad."""
    job, group = alloc["Job"], alloc_group(alloc)
    resources = task.get("Resources") or {}
    name = task["Name"]
    env = dict(os.environ)
    env.update(
        NOMAD_ALLOC_DIR=os.path.join(box.path, "alloc"),
        NOMAD_TASK_DIR=os.path.join(box.task_dir(name), "local"),
        NOMAD_SECRETS_DIR=os.path.join(box.task_dir(name), "secrets"),
        NOMAD_ALLOC_ID=alloc["ID"],
        NOMAD_SHORT_ALLOC_ID=alloc["ID"][:8],
        NOMAD_ALLOC_NAME=alloc["Name"],
        NOMAD_ALLOC_INDEX=str(name_index(alloc)),
        NOMAD_GROUP_NAME=group["Name"],
        NOMAD_TASK_NAME=name,
        NOMAD_JOB_ID=job["ID"],
        NOMAD_JOB_NAME=job.get("Name") or job["ID"],
        NOMAD_NAMESPACE=alloc["Namespace"],
        NOMAD_REGION=job.get("Region") or "global",
        NOMAD_DC="dc1",
        NOMAD_CPU_LIMIT=str(resources.get("CPU") or 0),
        NOMAD_MEMORY_LIMIT=str(resources.get("MemoryMB") or 0),
    )
    if job.get("ParentID"):
        env["NOMAD_JOB_PARENT_ID"] = job["ParentID"]
    meta = {**(job.get("Meta") or {}), **(group.get("Meta") or {}), **(task.get("Meta") or {})}
    for key, value in meta.items():
        clean = _NOT_ENV_NAME.sub("_", key)
        env[f"NOMAD_META_{clean}"] = env[f"NOMAD_META_{clean.upper()}"] = str(value)
    env.update({k: str(v) for k, v in (task.get("Env") or {}).items()})
    return env


def _restarts(alloc: JSON) -> dict[str, int]:
    return {name: s.get("Restarts", 0) for name, s in (alloc.get("TaskStates") or {}).items()}


def _mkdir(path: str, mode: int) -> None:
    os.mkdir(path)
    os.chmod(path, mode)  # not left to the umask, as the client sets them


def _uuid_problem(text: str) -> str | None:
    """What go-memdb's UUID index says of an ID it cannot parse (None: it parses)."""
    if len(text) != 36:
        return "UUID must be 36 characters"
    hyphens = text.count("-")
    if hyphens > 4:
        return f'UUID should have maximum of 4 "-"; got {hyphens}'
    digits = text.replace("-", "")
    if len(digits) % 2:
        return "Input (without hyphens) must be even length"
    for ch in digits:
        if ch not in "0123456789abcdefABCDEF":
            return f"Invalid UUID: encoding/hex: invalid byte: U+{ord(ch):04X} {ch!r}"
    return None
