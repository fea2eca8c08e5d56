"""One exec of `--exec local`: a real subprocess on pipes, or on a pseudo-terminal for tty.

Each process leads a process group of its own, so killing the group also ends what it
started, unless that left the group: nothing here is a container, and nothing is isolated.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import os
import pty
import signal
import struct
import termios
from collections.abc import Mapping, Sequence

# The Nomad client reads output with a buffer of this size: no output frame carries more.
READ_SIZE = 1024
_END_OF_FILE = b"\x04"  # what a terminal reads as end of input at the start of a line


class LocalProcess:
    def __init__(self, proc: asyncio.subprocess.Process, terminal: int | None, task: str) -> None:
        self.proc = proc
        self.pid = proc.pid
        self.task = task
        self.tty = terminal is not None
        self._terminal = -1 if terminal is None else terminal  # the pty's controlling side
        self._terminal_out: asyncio.StreamReader | None = None
        # Killed with its node: the session drops its connection and sends nothing more.
        self.lost = False

    @classmethod
    async def start(
        cls, argv: Sequence[str], cwd: str, env: Mapping[str, str], tty: bool, task: str
    ) -> LocalProcess:
        """Start `argv`; OSError when it cannot be run (not found, not executable)."""
        if not tty:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                cwd=cwd,
                env=dict(env),
                start_new_session=True,
            )
            return cls(proc, None, task)
        terminal, child_side = pty.openpty()
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=child_side,
                stdout=child_side,
                stderr=child_side,
                cwd=cwd,
                env=dict(env),
                start_new_session=True,
                preexec_fn=_take_terminal,
            )
        except BaseException:
            os.close(terminal)
            raise
        finally:
            # Only the child keeps its side open, so reading ours ends when the child's does.
            os.close(child_side)
        process = cls(proc, terminal, task)
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        # A duplicate for the reading transport, which closes it; writes and resizes keep
        # using `terminal`.
        await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(os.dup(terminal), "rb", 0)
        )
        process._terminal_out = reader
        return process

    async def read(self, stream: str) -> bytes:
        """Up to READ_SIZE bytes of "stdout" or "stderr"; b"" at its end."""
        if self._terminal_out is None:
            pipe = self.proc.stdout if stream == "stdout" else self.proc.stderr
            assert pipe is not None
            return await pipe.read(READ_SIZE)
        if stream == "stderr":
            return b""  # a terminal has one output: stderr is merged into stdout
        try:
            return await self._terminal_out.read(READ_SIZE)
        except OSError as exc:
            if exc.errno == errno.EIO:  # every holder of the child's side has closed it
                return b""
            raise

    async def write(self, data: bytes) -> None:
        """Give the process input; input for a process that is gone is dropped."""
        if not self.tty:
            stdin = self.proc.stdin
            assert stdin is not None
            with contextlib.suppress(ConnectionError):
                stdin.write(data)
                await stdin.drain()
            return
        view = memoryview(data)
        while view:
            try:
                view = view[os.write(self._terminal, view) :]
            except BlockingIOError:
                await asyncio.sleep(0.01)  # the terminal's input queue is full
            except OSError:
                return

    def close_stdin(self) -> None:
        if not self.tty:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            return
        # A terminal cannot be half-closed: its end-of-file character is the nearest thing.
        with contextlib.suppress(OSError):
            os.write(self._terminal, _END_OF_FILE)

    def resize(self, height: int, width: int) -> None:
        if not self.tty:
            return
        rows, cols = (min(max(n, 0), 0xFFFF) for n in (height, width))
        with contextlib.suppress(OSError):
            fcntl.ioctl(self._terminal, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))

    async def wait(self) -> int:
        """The exit code, a death by signal N shown as 128 + N (as a container runtime does)."""
        code = await self.proc.wait()
        return 128 - code if code < 0 else code

    def kill(self, lost: bool = False) -> None:
        """SIGKILL the whole process group (with `lost`: as if its node went away)."""
        self.lost = self.lost or lost
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)

    def group_alive(self) -> bool:
        """Whether anything of its process group still runs (it outlives its leader)."""
        try:
            os.killpg(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def close(self) -> None:
        """Release what the exited process leaves open on this side."""
        if self.proc.stdin is not None:
            self.proc.stdin.close()  # a client that never closed it
        if self._terminal >= 0:
            os.close(self._terminal)
            self._terminal = -1


def _take_terminal() -> None:
    # In the child, after setsid: make the pty its controlling terminal, so that the
    # terminal's signals (^C, ^\) and job control reach it as they would in a container.
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)
