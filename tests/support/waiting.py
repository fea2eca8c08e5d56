"""Waiting for a condition: a liveness bound instead of a sleep that hopes."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable

# Checks are polled often at first (in-process state answers at once) and then less often
# (checks that make requests should not flood what they watch).
_FIRST_PAUSE = 0.005
_LONGEST_PAUSE = 0.05


async def wait_until(
    check: Callable[[], bool | Awaitable[bool]],
    *,
    within: float = 15.0,
    what: str = "the condition",
) -> None:
    """Return once ``check`` (sync or async) holds; fail after ``within`` seconds.

    The default bound is generous since CI machines are shared and slow: a condition that
    holds returns at once, so only a failure waits that long.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    pause = _FIRST_PAUSE
    while True:
        outcome = check()
        if inspect.isawaitable(outcome):
            outcome = await outcome
        if outcome:
            return
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {within} s waiting for {what}")
        await asyncio.sleep(pause)
        pause = min(pause * 2, _LONGEST_PAUSE)
