"""Running a pass's pure, CPU-heavy steps beside the event loop (see engine/reconciler.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")

# Below this many runners a step takes a fraction of a millisecond: a hop to a worker
# thread (and back for the GIL) would cost more than the loop is spared.
INLINE_BELOW = 250


async def compute(size: int, func: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """`func(*args, **kwargs)` in a worker thread when it works on `size` >= INLINE_BELOW
    runners, inline otherwise. `func` must only compute: the caller stores results."""
    if size < INLINE_BELOW:
        return func(*args, **kwargs)
    return await asyncio.to_thread(func, *args, **kwargs)
