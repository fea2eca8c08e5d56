"""An execution's stdin on its way from its client to its command, held within bounds.

A client may send stdin faster than its command reads it (a command that reads none at
all: `sleep`). What the command has not taken yet is held here, at most
STDIN_BUFFER_BYTES per execution and STDIN_PROCESS_BYTES for all the executions of the
process; a client's frame that does not fit waits, and while it waits its socket is not
read, so the client is held back by TCP rather than the process's memory growing. A
frame larger than the room left is taken when nothing else is held (a frame is at most
1 MiB). Bytes stop counting once they are sent on Nomad's exec, which itself waits for
Nomad to read them.
"""

from __future__ import annotations

import asyncio
from collections import deque

STDIN_BUFFER_BYTES = 1024 * 1024
STDIN_PROCESS_BYTES = 32 * 1024 * 1024


class StdinBudget:
    """The stdin bytes every execution of the process holds, and who waits for room."""

    def __init__(self, limit: int = STDIN_PROCESS_BYTES) -> None:
        self.limit = limit
        self.held = 0
        self._waiting: set[asyncio.Future[None]] = set()

    async def changed(self) -> None:
        """Until bytes are taken, held or let go anywhere in the process."""
        waiter = asyncio.get_running_loop().create_future()
        self._waiting.add(waiter)
        try:
            await waiter
        finally:
            self._waiting.discard(waiter)

    def wake(self) -> None:
        for waiter in self._waiting:
            if not waiter.done():
                waiter.set_result(None)


class Stdin:
    """One execution's input: chunks of bytes, then None for its end."""

    def __init__(self, budget: StdinBudget, limit: int = STDIN_BUFFER_BYTES) -> None:
        self._budget = budget
        self._limit = limit
        self._chunks: deque[bytes | None] = deque()
        self.held = 0  # bytes put and not sent yet
        self._open = True

    async def put(self, data: bytes) -> None:
        """Hold `data` for the command, once it fits (dropped if the execution ends first)."""
        while self._open and not self._fits(len(data)):
            await self._budget.changed()
        self.put_now(data)

    def put_now(self, data: bytes | None) -> None:
        """Hold `data` whether it fits or not (the request's own stdin, within its body's
        limit), or the end of the input (None)."""
        if not self._open:
            return
        if data is not None:
            self._count(len(data))
        self._chunks.append(data)
        self._budget.wake()

    async def get(self) -> bytes | None:
        """The next chunk for the command (its bytes still count until `sent`)."""
        while not self._chunks:
            await self._budget.changed()
        return self._chunks.popleft()

    def sent(self, size: int) -> None:
        """A chunk of `size` bytes is on Nomad's exec: room for more."""
        self._count(-size)
        self._budget.wake()

    def close(self) -> None:
        """The execution ended: what it held is let go, later input is dropped."""
        self._open = False
        self._chunks.clear()
        self._count(-self.held)
        self._budget.wake()

    def _fits(self, size: int) -> bool:
        budget = self._budget
        mine = self.held == 0 or self.held + size <= self._limit
        process = budget.held == 0 or budget.held + size <= budget.limit
        return mine and process

    def _count(self, size: int) -> None:
        self.held += size
        self._budget.held += size
