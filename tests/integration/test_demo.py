import pytest
from rich.console import Console

from controller.lab.demo import run_demo

pytestmark = pytest.mark.slow


async def test_the_demo_story_holds_every_invariant():
    console = Console(record=True, width=120)
    assert await run_demo(console) == 0
    text = console.export_text()
    assert "every invariant held" in text
    for step in ("instant reschedule", "goes down", "claim", "scale", "image changes"):
        assert step in text
