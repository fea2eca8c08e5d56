"""Executions in a claimed runner, on Nomad's allocation exec of its runner task.

A waited execution runs within its request and answers with its exit code and output.
A streamed one is created by its request and runs when its WebSocket opens (within
CONNECT_WITHIN_SECONDS, once); the API's stream route drives it (execution_routes.py).
At most MAX_WAITING_PER_RUNNER created ones wait for their sockets on one runner, and
they are forgotten when the runner's claim ends.
Either way an execution ends in exactly one way:

- `exit`: the command exited (code 137, SIGKILL, is first checked against the claim and
  the allocation: a container killed for memory or stopped is a lost runner, `error`);
- `timeout`: its time limit passed; `cancelled`: its client went away. Both kill the
  command's process group from a second exec (commands.py) and wait KILL_GRACE_SECONDS
  for the exec to end; if it does not, the runner is retired (a `retired` tombstone);
- `error`: the runner's claim ended (released, expired, lost: Activity stops it), or
  Nomad refused or broke the exec.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

from controller.claims.runners import RunnerClaims
from controller.directory.view import PoolDirectory
from controller.errors import ErrorCode, ServiceError
from controller.executions.activity import Activity, Target, ended_message
from controller.executions.commands import (
    STDERR_FIFO_DIR,
    InvalidValue,
    PidMarker,
    execution_command,
    kill_command,
    stderr_end_command,
    stderr_into,
    stderr_reader_command,
    working_dir,
)
from controller.executions.stdin import Stdin, StdinBudget
from controller.metrics import Metrics
from controller.nomad.client import NomadClient
from controller.nomad.errors import NomadError, NomadUnavailable
from controller.nomad.exec import ExecError, ExecSession, NomadExec
from controller.nomad.jobs import TASK_NAME

log = logging.getLogger(__name__)

EXECUTION_ID_BYTES = 24  # 192 random bits: the stream route's credential
CONNECT_WITHIN_SECONDS = 30.0
# Created executions not connected yet, per runner: each holds its command (up to the
# API's 64 KiB body) until its socket opens, it expires or the runner's claim ends.
MAX_WAITING_PER_RUNNER = 32
KILL_GRACE_SECONDS = 3.0
WAITED_OUTPUT_LIMIT = 1024 * 1024  # bytes per stream
SIGKILL_EXIT = 128 + 9
TERMINAL_SIZE = (24, 80)  # rows, columns: what a terminal opens with
STOP_WAIT_SECONDS = 5.0
STDERR_DRAIN_SECONDS = 1.0  # for a stderr reader to end after its command


class Ending(StrEnum):
    """How an execution ended: exit, timeout and error are the type of its last frame;
    cancelled, its client went away first."""

    EXIT = "exit"
    TIMEOUT = "timeout"
    ERROR = "error"
    CANCELLED = "cancelled"


@dataclass(frozen=True, slots=True)
class Outcome:
    ending: Ending
    exit_code: int | None = None
    message: str = ""
    nomad_unavailable: bool = False  # the exec could not even reach Nomad


@dataclass(frozen=True)
class ExecutionRequest:
    command: str | Sequence[str]
    env: Mapping[str, str] = field(default_factory=dict)
    working_dir: str | None = None
    time_limit_seconds: int | None = None
    tty: bool = False
    privileged: bool | None = None  # None: true unless the pool has an unprivileged wrapper
    stdin: str | None = None
    # With tty: stderr still apart from the terminal, through a FIFO a second exec reads
    # (as Poseidon runs interactive commands).
    stderr_apart: bool = False


class OutputSink(Protocol):
    async def output(self, stream: str, data: bytes) -> None: ...


class WaitedOutput:
    """A waited execution's output, at most WAITED_OUTPUT_LIMIT bytes per stream."""

    def __init__(self, limit: int = WAITED_OUTPUT_LIMIT) -> None:
        self.limit = limit
        self.streams = {"stdout": bytearray(), "stderr": bytearray()}
        self.truncated = False

    async def output(self, stream: str, data: bytes) -> None:
        kept = self.streams[stream]
        room = self.limit - len(kept)
        if len(data) > room:
            self.truncated = True
        kept += data[: max(room, 0)]

    def text(self, stream: str) -> str:
        return self.streams[stream].decode("utf-8", "replace")


@dataclass(frozen=True, slots=True)
class Checked:
    """A request's argv and time limit, checked; the FIFO of a stderr kept apart."""

    argv: list[str]
    time_limit_seconds: int
    stderr_fifo: str | None


@dataclass
class Prepared:
    """An execution checked and ready to run (a streamed one waits for its socket)."""

    id: str
    target: Target
    argv: list[str]
    tty: bool
    time_limit_seconds: int
    stdin: bytes | None
    keeps_claim: bool = True  # the claim is kept alive while it runs (Activity.hold)
    stderr_fifo: str | None = None  # stderr apart from a terminal: the FIFO it goes through


@dataclass(eq=False)
class _Waiting:
    """A created execution waiting for its socket. It is held on its runner's activity
    (without keeping the claim alive), so the claim's end stops it: it is forgotten."""

    manager: ExecutionManager
    prepared: Prepared
    expiry: asyncio.TimerHandle | None = None

    def stop(self, message: str) -> None:
        self.manager.forget(self)


class Execution:
    """One running execution; `stop` and `cancel` end it from outside."""

    def __init__(self, manager: ExecutionManager, prepared: Prepared) -> None:
        self._manager = manager
        self.prepared = prepared
        # stdin for the command: bytes, then None for its end (sent once the launcher runs)
        self.input = Stdin(manager.stdin_budget)
        if prepared.stdin:
            self.input.put_now(prepared.stdin)
        self._halted: asyncio.Future[tuple[Ending, str]] = (
            asyncio.get_running_loop().create_future()
        )
        self.done = asyncio.Event()
        self.started_at = time.monotonic()

    @property
    def runner_id(self) -> str:
        return self.prepared.target.record.runner_id

    def stop(self, message: str) -> None:
        """End with `error` (the runner's claim ended)."""
        self._halt(Ending.ERROR, message)

    def cancel(self) -> None:
        """The client went away: kill the command."""
        self._halt(Ending.CANCELLED, "")

    def _halt(self, ending: Ending, message: str) -> None:
        if not self._halted.done():
            self._halted.set_result((ending, message))

    @property
    def seconds(self) -> float:
        """How long it has run."""
        return time.monotonic() - self.started_at

    async def run(self, sink: OutputSink) -> Outcome:
        try:
            outcome = await self._run(sink)
        finally:
            self._manager.finished(self)
        self._manager.count(self, outcome)
        return outcome

    async def _run(self, sink: OutputSink) -> Outcome:
        manager, target = self._manager, self.prepared.target
        if self._halted.done():  # stopped before it started
            return self._outcome_of_halt()
        try:
            await manager.activity.touch(target)  # starting is activity
            # Before the exec opens: the command may start (and its limit run) before the
            # upgrade is answered, and its own `timeout` must count as a timeout.
            opening = time.monotonic()
            async with manager.exec.session(
                target.record.allocation_id,
                TASK_NAME,
                self.prepared.argv,
                namespace=target.record.namespace,
                tty=self.prepared.tty,
            ) as session:
                return await self._drive(session, sink, opening)
        except ServiceError as error:  # the claim is gone, or Nomad did not answer
            if error.code is ErrorCode.RUNNER_GONE:
                return Outcome(Ending.ERROR, message=ended_message(error))
            return Outcome(Ending.ERROR, message=error.message, nomad_unavailable=True)
        except NomadUnavailable as error:
            return Outcome(Ending.ERROR, message=str(error), nomad_unavailable=True)
        except ExecError as error:  # refused before the upgrade
            message = await manager.activity.explain_failure(target, error)
            return Outcome(Ending.ERROR, message=message)

    async def _drive(self, session: ExecSession, sink: OutputSink, opening: float) -> Outcome:
        if self.prepared.tty:  # a terminal of no size would have programs wrap at column 0
            await session.resize(*TERMINAL_SIZE)
        marker = PidMarker()
        launched = asyncio.Event()
        pump = asyncio.create_task(self._pump(session, sink, marker, launched))
        feeder = asyncio.create_task(self._feed(session, launched))
        fifo = self.prepared.stderr_fifo
        stderr = asyncio.create_task(self._read_stderr(fifo, sink) if fifo else asyncio.sleep(0))
        limit = self.prepared.time_limit_seconds
        deadline = asyncio.get_running_loop().call_later(limit, self._halt, Ending.TIMEOUT, "")
        try:
            first: set[asyncio.Future[Any]] = {pump, self._halted}
            await asyncio.wait(first, return_when=asyncio.FIRST_COMPLETED)
            if not self._halted.done():
                late = time.monotonic() - opening >= limit
                await self._drain_stderr(stderr)  # all of stderr comes before the end
                return await self._ended(session, pump, late)
            ending, message = self._halted.result()
            if ending is Ending.ERROR or pump.done():
                return Outcome(ending, message=message)
            await self._manager.kill(self.prepared.target, marker.pid)
            if marker.done:
                # What the command wrote goes to no one now: a client that does not read
                # must not hold the exec open (the pump would wait on its socket).
                pump.cancel()
                await asyncio.gather(pump, return_exceptions=True)
                pump = asyncio.create_task(_discard_output(session))
            await asyncio.wait({pump}, timeout=KILL_GRACE_SECONDS)
            if not pump.done():
                await self._manager.retire(self, f"the command did not stop after its {ending}")
            return Outcome(ending)
        finally:
            deadline.cancel()
            for task in (pump, feeder, stderr):
                task.cancel()
            await asyncio.gather(pump, feeder, stderr, return_exceptions=True)

    def _outcome_of_halt(self) -> Outcome:
        ending, message = self._halted.result()
        return Outcome(ending, message=message)

    async def _ended(self, session: ExecSession, pump: asyncio.Task[None], late: bool) -> Outcome:
        """The exec ended by itself: the command's exit, or Nomad's failure."""
        target = self.prepared.target
        error = pump.exception()
        if isinstance(error, ExecError):
            message = await self._manager.activity.explain_failure(target, error)
            return Outcome(Ending.ERROR, message=message)
        if error is not None:
            raise error
        code = session.exit_code
        if code == SIGKILL_EXIT:
            lost = await self._manager.activity.why_lost(target)
            if lost is not None:
                return Outcome(Ending.ERROR, message=lost)
            if late:  # the task's own `timeout` killed it before our timer fired
                return Outcome(Ending.TIMEOUT)
        return Outcome(Ending.EXIT, exit_code=code)

    async def _pump(
        self, session: ExecSession, sink: OutputSink, marker: PidMarker, launched: asyncio.Event
    ) -> None:
        async for output in session.output():
            data = output.data
            if output.stream == "stdout" and not marker.done:
                data = marker.feed(data)
                if marker.done:
                    launched.set()
            if data:
                await sink.output(output.stream, data)

    async def _read_stderr(self, fifo: str, sink: OutputSink) -> None:
        """The command's stderr, from the second exec that reads its FIFO."""
        target = self.prepared.target

        async def stderr(data: bytes) -> None:
            await sink.output("stderr", data)

        try:
            await self._manager.beside(target, stderr_reader_command(fifo), stderr, within=None)
        except NomadError as error:
            log.warning("no stderr from an execution on %s: %s", target.record.runner_id, error)

    async def _drain_stderr(self, stderr: asyncio.Task[None]) -> None:
        """Wait for the stderr reader to end after its command (a reader whose command
        never opened the FIFO is ended)."""
        fifo = self.prepared.stderr_fifo
        await asyncio.wait({stderr}, timeout=STDERR_DRAIN_SECONDS)
        if stderr.done() or fifo is None:
            return
        with contextlib.suppress(NomadError, TimeoutError):
            await self._manager.beside(self.prepared.target, stderr_end_command(fifo))
        await asyncio.wait({stderr}, timeout=STDERR_DRAIN_SECONDS)

    async def _feed(self, session: ExecSession, launched: asyncio.Event) -> None:
        # After the launcher's PID: a terminal would otherwise echo input before it.
        await launched.wait()
        try:
            while (data := await self.input.get()) is not None:
                await session.send(data)
                self.input.sent(len(data))
            await session.close_stdin()
        except ExecError:
            pass  # the exec ended; the pump reports how


async def _discard_output(session: ExecSession) -> None:
    """Read the exec to its end, keeping nothing."""
    async for _ in session.output():
        pass


class ExecutionManager:
    def __init__(
        self,
        directory: PoolDirectory,
        claims: RunnerClaims,
        nomad: NomadClient,
        exec_client: NomadExec,
        metrics: Metrics,
    ) -> None:
        self.claims = claims
        self.exec = exec_client
        self.metrics = metrics
        self.activity = Activity(claims, directory, nomad)
        self._pending: dict[str, _Waiting] = {}
        self._waiting_on: Counter[str] = Counter()  # of _pending, by runner ID
        self._running: set[Execution] = set()
        self.stdin_budget = StdinBudget()

    # ---- the API's calls ------------------------------------------------------------------

    async def run_waited(self, runner_id: str, request: ExecutionRequest) -> dict[str, Any]:
        """Run to the end; the answer of `wait: true`."""
        check = self._checked(runner_id, request)
        target = await self.activity.live(runner_id)
        execution = self.start(self._prepare(target, request, check))
        execution.input.put_now(None)  # the request's stdin is all there is
        output = WaitedOutput()
        outcome = await execution.run(output)
        if outcome.ending is Ending.ERROR:
            unavailable = outcome.nomad_unavailable
            code = ErrorCode.NOMAD_UNAVAILABLE if unavailable else ErrorCode.EXEC_FAILED
            raise ServiceError(code, outcome.message)
        return {
            "executionId": execution.prepared.id,
            "exitCode": outcome.exit_code,
            "stdout": output.text("stdout"),
            "stderr": output.text("stderr"),
            "timedOut": outcome.ending is Ending.TIMEOUT,
            "outputTruncated": output.truncated,
            "durationSeconds": round(execution.seconds, 3),
        }

    async def create(
        self,
        runner_id: str,
        request: ExecutionRequest,
        *,
        connect_within: float = CONNECT_WITHIN_SECONDS,
        keeps_claim: bool = True,
    ) -> str:
        """A streamed execution, run when its socket opens within `connect_within`
        seconds; its ID. `keeps_claim`: the claim is kept alive while it runs. 409 when
        MAX_WAITING_PER_RUNNER created executions of the runner wait already."""
        check = self._checked(runner_id, request)
        target = await self.activity.live(runner_id)  # it starts, and is activity, later
        if self._waiting_on[runner_id] >= MAX_WAITING_PER_RUNNER:
            raise ServiceError(
                ErrorCode.TOO_MANY_EXECUTIONS,
                f"runner {runner_id} has {MAX_WAITING_PER_RUNNER} executions waiting to be "
                "connected, the most it keeps: connect them first",
            )
        prepared = self._prepare(target, request, check)
        prepared.keeps_claim = keeps_claim
        waiting = _Waiting(self, prepared)
        waiting.expiry = asyncio.get_running_loop().call_later(connect_within, self.forget, waiting)
        self._pending[prepared.id] = waiting
        self._waiting_on[runner_id] += 1
        self.activity.hold(target, waiting, keep_alive=False)
        return prepared.id

    def waiting(self, runner_id: str) -> int:
        """How many created executions of the runner wait for their sockets."""
        return self._waiting_on[runner_id]

    def forget(self, waiting: _Waiting) -> None:
        """A created execution is not connected any more: it expired, its claim ended,
        or it is connected now."""
        if self._pending.pop(waiting.prepared.id, None) is None:
            return
        if waiting.expiry is not None:
            waiting.expiry.cancel()
        runner_id = waiting.prepared.target.record.runner_id
        self._waiting_on[runner_id] -= 1
        if not self._waiting_on[runner_id]:
            del self._waiting_on[runner_id]
        self.activity.let_go(runner_id, waiting)

    def connect(self, runner_id: str, execution_id: str) -> Execution:
        """The streamed execution `execution_id` of the runner, now running (counted);
        404 for an unknown, used or stale ID, 409 past the pool's maxConcurrent."""
        waiting = self._found(runner_id, execution_id)
        execution = self.start(waiting.prepared)  # 409 leaves it pending, to be tried again
        self.forget(waiting)
        return execution

    def expect(self, runner_id: str, execution_id: str) -> None:
        """404 unless `connect` would find the execution (it may still be refused 409)."""
        self._found(runner_id, execution_id)

    def _found(self, runner_id: str, execution_id: str) -> _Waiting:
        waiting = self._pending.get(execution_id)
        if waiting is None or waiting.prepared.target.record.runner_id != runner_id:
            raise ServiceError(
                ErrorCode.EXECUTION_NOT_FOUND,
                "no such execution: unknown, already connected, or not connected in time",
            )
        return waiting

    def start(self, prepared: Prepared) -> Execution:
        target = prepared.target
        runner_id = target.record.runner_id
        limit = target.spec.max_concurrent
        # The activity holds the waiting executions too: they do not run.
        if self.activity.running(runner_id) - self._waiting_on[runner_id] >= limit:
            raise ServiceError(
                ErrorCode.TOO_MANY_EXECUTIONS,
                f"runner {runner_id} already runs {limit} executions (maxConcurrent)",
            )
        execution = Execution(self, prepared)
        self.activity.hold(target, execution, keep_alive=prepared.keeps_claim)
        self._running.add(execution)
        return execution

    async def close(self) -> None:
        """The controller stops: every execution ends with an error."""
        for waiting in list(self._pending.values()):
            self.forget(waiting)
        running = list(self._running)
        for execution in running:
            execution.stop("the controller is stopping")
        if running:
            await asyncio.wait(
                [asyncio.create_task(e.done.wait()) for e in running], timeout=STOP_WAIT_SECONDS
            )
        await self.activity.close()

    # ---- what executions call back --------------------------------------------------------

    def finished(self, execution: Execution) -> None:
        execution.input.close()
        self._running.discard(execution)
        self.activity.let_go(execution.runner_id, execution)
        execution.done.set()

    def count(self, execution: Execution, outcome: Outcome) -> None:
        pool = execution.prepared.target.record.pool
        self.metrics.executions_total.labels(pool=pool, result=outcome.ending.value).inc()
        self.metrics.execution_duration.observe(execution.seconds)

    async def kill(self, target: Target, pid: int | None) -> None:
        """SIGKILL the command's process group, from a second exec."""
        if pid is None:
            return  # the launcher never ran: nothing started that could be killed
        try:
            await self.beside(target, kill_command(pid))
        except (NomadError, TimeoutError) as error:
            log.warning("could not kill an execution on %s: %s", target.record.runner_id, error)

    async def beside(
        self,
        target: Target,
        argv: list[str],
        stdout: Callable[[bytes], Awaitable[None]] | None = None,
        *,
        within: float | None = KILL_GRACE_SECONDS,
    ) -> None:
        """An exec of `argv` beside an execution (no stdin), its stdout to `stdout`, to
        its end or for `within` seconds (TimeoutError); NomadError when Nomad refuses."""
        async with asyncio.timeout(within):
            async with self.exec.session(
                target.record.allocation_id,
                TASK_NAME,
                argv,
                namespace=target.record.namespace,
            ) as session:
                await session.close_stdin()
                async for output in session.output():
                    if stdout is not None and output.stream == "stdout":
                        await stdout(output.data)

    async def retire(self, execution: Execution, why: str) -> None:
        runner_id = execution.runner_id
        log.warning("retiring runner %s: %s", runner_id, why)
        try:
            await self.claims.retire(runner_id)
        except ServiceError as error:
            log.warning("could not retire runner %s: %s", runner_id, error.message)

    # ---- checks ---------------------------------------------------------------------------

    def _checked(self, runner_id: str, request: ExecutionRequest) -> Checked:
        """The argv and time limit of the request, checked against the pool's settings
        before anything is read or written (400 InvalidRequest)."""
        spec = self.activity.spec(runner_id)
        limit = request.time_limit_seconds or spec.default_time_limit_seconds
        if limit > spec.max_time_limit_seconds:
            raise _invalid(
                f"timeLimitSeconds {limit} exceeds the pool's maximum "
                f"({spec.max_time_limit_seconds})"
            )
        wrapper = spec.unprivileged_wrapper
        privileged = request.privileged if request.privileged is not None else not wrapper
        command, fifo = request.command, None
        if request.tty and request.stderr_apart:
            fifo = f"{STDERR_FIFO_DIR}/poolkeeper-stderr-{secrets.token_hex(16)}"
            command = stderr_into(fifo, command)
        try:
            argv = execution_command(
                command,
                time_limit_seconds=limit,
                directory=working_dir(spec.working_dir, request.working_dir),
                env=request.env,
                wrapper=[] if privileged else wrapper,
            )
        except InvalidValue as error:
            raise _invalid(str(error)) from None
        return Checked(argv, limit, fifo)

    def _prepare(self, target: Target, request: ExecutionRequest, check: Checked) -> Prepared:
        stdin = request.stdin.encode() if request.stdin else None
        execution_id = secrets.token_urlsafe(EXECUTION_ID_BYTES)
        return Prepared(
            execution_id,
            target,
            check.argv,
            request.tty,
            check.time_limit_seconds,
            stdin,
            stderr_fifo=check.stderr_fifo,
        )


def _invalid(message: str) -> ServiceError:
    return ServiceError(ErrorCode.INVALID_REQUEST, message)
