"""serve_until_stopped: the plumbing `poolkeeper run` and `poolkeeper api` share."""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import weakref

from controller.tasks import serve_until_stopped


class Cycle:
    """An object in a reference cycle: only the cyclic collector frees it."""

    def __init__(self) -> None:
        self.me = self


async def test_what_a_served_process_built_to_start_is_kept_out_of_full_collections() -> None:
    started = asyncio.Event()
    kept: list[Cycle] = []
    dropped: list[weakref.ref[Cycle]] = []

    async def start() -> None:
        kept.append(Cycle())  # what the process goes on using
        dropped.append(weakref.ref(Cycle()))  # garbage of its start
        started.set()

    async def stop() -> None:
        pass

    gc.disable()  # only the collections the code under test makes
    served = asyncio.create_task(serve_until_stopped(start, stop, lambda: None, "stop"))
    try:
        await asyncio.wait_for(started.wait(), 5)
        # What start built is in no generation the collector walks.
        assert not any(o is kept[0] for o in gc.get_objects())
        assert dropped[0]() is None  # collected, not frozen with the rest
        os.kill(os.getpid(), signal.SIGTERM)  # its handler is on the loop by now
        await asyncio.wait_for(served, 5)
    finally:
        served.cancel()
        gc.unfreeze()
        gc.enable()
