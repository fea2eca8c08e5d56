"""The demo's story: what it says of each step."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

from rich.console import Console

from controller.lab.demo import Story


class _Settled(Story):
    """A story whose invariants always hold (no controller behind it)."""

    async def snapshot(self) -> Any:
        return [], []


async def test_a_steps_time_is_its_action_and_its_settling() -> None:
    """A step that killed a command after its 1 s limit took that second, though the
    invariants held at once when it was over."""
    now = [10.0]
    nothing = cast(Any, None)
    story = _Settled(nothing, nothing, nothing, Path("pools.yaml"), Console(), clock=lambda: now[0])
    now[0] += 1.2  # the step's action: a stream until its time limit killed the command
    await story.settle("sleep 60 with a time limit of 1 s: killed")
    assert story.log[-1] == ("sleep 60 with a time limit of 1 s: killed", "ok in 1.2 s")
    now[0] += 0.3
    await story.settle("release")
    assert story.log[-1] == ("release", "ok in 0.3 s")
