"""A task of its own that runs until stopped, and a process served until SIGTERM: the
plumbing every long-running part and command shares."""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

log = logging.getLogger(__name__)


class Background:
    """`work` in a task of its own, from `start` until `stop` (idempotent both)."""

    def __init__(self, name: str, work: Callable[[], Coroutine[Any, Any, None]]) -> None:
        self._name = name
        self._work = work
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._work(), name=self._name)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None


async def serve_until_stopped(
    start: Callable[[], Awaitable[object]],
    stop: Callable[[], Awaitable[None]],
    reload: Callable[[], object],
    stopping: str,
) -> None:
    """Start, reload on SIGHUP, and stop gracefully on SIGTERM or SIGINT, logging
    `stopping` then."""
    loop = asyncio.get_running_loop()
    stopped = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stopped.set)
    loop.add_signal_handler(signal.SIGINT, stopped.set)
    loop.add_signal_handler(signal.SIGHUP, reload)
    await start()
    freeze_startup_heap()
    await stopped.wait()
    log.info("%s", stopping)
    await stop()


def freeze_startup_heap() -> None:
    """Keep what the process built to start (modules, settings, clients, its first view
    of the pools) out of the cyclic collector's full collections, which then walk only
    what came later. A full collection pauses every request in flight: in an API replica
    the longest went from 33 ms to 2 ms (docs/performance.md). Garbage is collected first,
    so none is kept."""
    gc.collect()
    gc.freeze()
