"""The active/passive hook fails loudly instead of leaving a replica silently passive."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from kopf._core.engines import daemons as kopf_daemons

from controller.operator import leadership
from controller.operator.leadership import (
    Activity,
    LeadershipHookError,
    install_pause_hook,
    watch_attachment,
)


async def _never(_: bool) -> None:
    raise AssertionError("no change expected")


def test_a_kopf_without_the_pause_toggle_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    def daemon_killer(*, settings: Any, memories: Any) -> None: ...

    monkeypatch.setattr(kopf_daemons, "daemon_killer", daemon_killer)
    with pytest.raises(LeadershipHookError, match="operator_paused"):
        install_pause_hook()


def test_the_hook_wraps_this_kopf_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kopf_daemons, "daemon_killer", kopf_daemons.daemon_killer)
    install_pause_hook()
    wrapped = kopf_daemons.daemon_killer
    install_pause_hook()
    assert kopf_daemons.daemon_killer is wrapped
    assert getattr(wrapped, "poolkeeper_hook", False)


async def test_a_hook_that_never_attaches_stops_the_operator() -> None:
    activity = Activity(peering=True, on_change=_never)
    with pytest.raises(LeadershipHookError, match="never attached"):
        await watch_attachment(activity, within=0.05)


async def test_an_attached_hook_passes_the_watch() -> None:
    activity = Activity(peering=True, on_change=_never)

    class Toggles(list[Any]):
        def is_off(self) -> bool:
            return False

        async def wait_for(self, _: bool) -> None:
            await asyncio.sleep(3600)

    token = leadership.following(activity)
    try:
        watching = asyncio.create_task(watch_attachment(activity, within=5))
        activity.attach(Toggles())
        await watching
    finally:
        leadership.stop_following(token)
        await activity.stop()
