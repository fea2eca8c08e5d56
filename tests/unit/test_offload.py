"""compute(): small steps inline, large ones in a worker thread."""

from __future__ import annotations

import asyncio
import threading

from controller.engine.offload import INLINE_BELOW, compute


def test_small_steps_run_inline_and_large_ones_in_a_worker_thread() -> None:
    async def where(size: int) -> int:
        return await compute(size, threading.get_ident)

    async def run() -> tuple[int, int, int]:
        return threading.get_ident(), await where(INLINE_BELOW - 1), await where(INLINE_BELOW)

    loop_thread, small, large = asyncio.run(run())
    assert small == loop_thread
    assert large != loop_thread


def test_arguments_and_results_pass_through() -> None:
    def combine(a: int, b: int, *, c: int) -> tuple[int, int, int]:
        return a, b, c

    assert asyncio.run(compute(10_000, combine, 1, 2, c=3)) == (1, 2, 3)
    assert asyncio.run(compute(0, combine, 1, 2, c=3)) == (1, 2, 3)
