"""Active/passive operator replicas: the only module that touches kopf internals.

kopf peering pauses every replica but the one with the highest priority. kopf 1.45 has no
public hook for "this replica was paused or resumed": its watchers and daemons follow a
private `operator_paused` toggle set. We hand that very toggle set to an `Activity` (by
wrapping kopf's `daemon_killer`, the one root task that receives it), and the operator
runs its engine only while kopf has this replica active. The hook is checked against
kopf's signature when installed and must attach within HOOK_ATTACH_SECONDS of the start,
or the operator stops with an error: a silently missing hook would leave every replica
passive (or, worse, several active). The kopf version range it is tested with is pinned
in pyproject.toml. See docs/operator-internals.md.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
import threading
from collections.abc import Awaitable, Callable
from typing import Any, Final

from kopf._core.engines import daemons as kopf_daemons

log = logging.getLogger(__name__)

# kopf starts its daemon killer right after the operator's tasks: a few seconds at most.
HOOK_ATTACH_SECONDS: Final = 30.0


class LeadershipHookError(RuntimeError):
    """kopf's internals are not what the pause hook expects."""


_ACTIVITY: contextvars.ContextVar[Activity] = contextvars.ContextVar("poolkeeper_activity")


class Activity:
    """Follows kopf's own pause toggles: active exactly while kopf processes events.

    In peering mode kopf starts paused (its peering toggles are created switched on) and
    resumes once it wins; until those toggles exist the set is empty, which must not
    count as active, hence `len(...) >= 2` (kopf's "peering CRD is missing" toggle plus
    at least one peering toggle).
    """

    POLL_SECONDS: Final = 0.1

    def __init__(self, peering: bool, on_change: Callable[[bool], Awaitable[None]]) -> None:
        self.peering = peering
        self.on_change = on_change
        self.active = False
        self._toggles: Any = None
        self.attached = asyncio.Event()
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None

    def attach(self, toggles: Any) -> None:
        self._toggles = toggles
        self.attached.set()
        self._task = asyncio.create_task(self._follow(), name="poolkeeper activity")

    def _is_active(self) -> bool:
        toggles = self._toggles
        if toggles is None:
            return False
        settled = not self.peering or len(toggles) >= 2
        return bool(settled and toggles.is_off())

    async def sync(self) -> bool:
        """Catch up with kopf now (its resumed watchers may deliver events before our
        follower notices the resume); returns whether this replica is active."""
        async with self._lock:
            now_active = self._is_active()
            if now_active != self.active:
                self.active = now_active
                try:
                    await self.on_change(now_active)
                except Exception:
                    log.exception("switching to %s failed", "active" if now_active else "passive")
        return self.active

    async def _follow(self) -> None:
        while True:
            if await self.sync():
                await self._toggles.wait_for(True)
            else:
                await asyncio.sleep(self.POLL_SECONDS)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        async with self._lock:
            if self.active:
                self.active = False
                await self.on_change(False)


_HOOK_LOCK = threading.Lock()


def install_pause_hook() -> None:
    """Route kopf's private pause toggle set to the Activity of the operator starting it.
    Raises LeadershipHookError when this kopf's internals differ from the tested ones."""
    with _HOOK_LOCK:
        original = getattr(kopf_daemons, "daemon_killer", None)
        if getattr(original, "poolkeeper_hook", False):
            return
        if original is None or "operator_paused" not in inspect.signature(original).parameters:
            raise LeadershipHookError(
                "this kopf has no daemon_killer(operator_paused=...): the active/passive "
                "hook cannot attach; "
                "use the kopf version pinned in pyproject.toml"
            )

        def daemon_killer(*, operator_paused: Any, **kwargs: Any) -> Any:
            activity = _ACTIVITY.get(None)
            if activity is not None:
                activity.attach(operator_paused)
            return original(operator_paused=operator_paused, **kwargs)

        daemon_killer.poolkeeper_hook = True  # type: ignore[attr-defined]
        kopf_daemons.daemon_killer = daemon_killer


def following(activity: Activity) -> contextvars.Token[Activity]:
    """Make the operator started next in this context report to `activity`."""
    return _ACTIVITY.set(activity)


def stop_following(token: contextvars.Token[Activity]) -> None:
    _ACTIVITY.reset(token)


async def watch_attachment(activity: Activity, within: float = HOOK_ATTACH_SECONDS) -> None:
    """Raise LeadershipHookError if kopf never hands its pause toggles to `activity`."""
    try:
        async with asyncio.timeout(within):
            await activity.attached.wait()
    except TimeoutError:
        raise LeadershipHookError(
            f"kopf did not start its daemon killer within {within:g} s: the active/passive "
            "hook never attached, so this replica would never reconcile"
        ) from None
