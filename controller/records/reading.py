"""Reading shared records, written once for all of them: the records under a prefix read
again only where they changed, and the one follower of a prefix by blocking lists.

Nomad's variable list carries each variable's path and ModifyIndex but no Items, so a
reader keeps what it read by path with its index and reads again only the variables
whose index moved. A variable deleted between the list and its read is left out.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Generic, TypeVar

from controller.nomad.errors import NomadError
from controller.nomad.port import VariableLists, Variables
from controller.tasks import Background

log = logging.getLogger(__name__)

T = TypeVar("T")

# A follower lists at most this often (a blocking list returns on any variable's change).
FOLLOW_GAP_SECONDS: Final = 0.025
# The longest blocking list (the watch session's read timeout is longer).
WAIT_SECONDS: Final = 8.0
RETRY_SECONDS: Final = (0.5, 5.0)  # the first and the longest pause after a failed list
# How often a follower that is not wanted now looks whether it is wanted again.
UNWANTED_CHECK_SECONDS: Final = 0.25


@dataclass(frozen=True, slots=True)
class Known(Generic[T]):
    """A record as read: the variable's ModifyIndex then, and what it decoded to."""

    index: int
    value: T


def listed(metas: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """Path -> ModifyIndex of the variables a list names."""
    return {str(meta["Path"]): int(meta.get("ModifyIndex", 0)) for meta in metas}


async def read_changed(
    port: Variables,
    namespace: str,
    present: Mapping[str, int],
    known: Mapping[str, Known[T]],
    decode: Callable[[str, Mapping[str, Any]], T],
) -> dict[str, Known[T]]:
    """The records `present` names (path -> ModifyIndex, from a list): from `known` where
    the index did not move, read concurrently (and decoded) where it did."""
    stale = [
        path
        for path, index in present.items()
        if (hit := known.get(path)) is None or hit.index != index
    ]
    variables = await asyncio.gather(*(port.read_variable(path, namespace) for path in stale))
    fresh = {path: variable for path, variable in zip(stale, variables, strict=True) if variable}
    found: dict[str, Known[T]] = {}
    for path in present:
        variable = fresh.get(path)
        if variable is not None:
            found[path] = Known(int(variable.get("ModifyIndex", 0)), decode(path, variable))
        elif path in known and path not in stale:
            found[path] = known[path]
    return found


class Listing(Generic[T]):
    """The records under a prefix as last read; `read` lists them and reads again only
    those that changed."""

    def __init__(
        self,
        port: Variables,
        prefix: str,
        namespace: str,
        decode: Callable[[str, Mapping[str, Any]], T],
    ) -> None:
        self._port = port
        self.prefix = prefix
        self.namespace = namespace
        self._decode = decode
        self.known: dict[str, Known[T]] = {}

    async def read(self) -> dict[str, Known[T]]:
        metas = await self._port.list_variables(self.prefix, self.namespace)
        self.known = await read_changed(
            self._port, self.namespace, listed(metas), self.known, self._decode
        )
        return self.known


class Follower:
    """Follows the records under a prefix with blocking lists, and awaits `on_list` with
    each list's path -> ModifyIndex. Nomad blocks a list on its table's index, so a list
    returns on any variable's change: lists come at most every FOLLOW_GAP_SECONDS. While
    lists fail, `problem` says why (logged once, and once when they succeed again) and
    the follower retries with backoff; `read` is set once a list was taken. While not
    `wanted`, it pauses and then reads everything again."""

    def __init__(
        self,
        watcher: VariableLists,
        prefix: str,
        namespace: str,
        on_list: Callable[[dict[str, int]], Awaitable[None]],
        *,
        what: str,
        wanted: Callable[[], bool] = lambda: True,
    ) -> None:
        self._watcher = watcher
        self._prefix = prefix
        self._namespace = namespace
        self._on_list = on_list
        self._what = what
        self._wanted = wanted
        self.problem: str | None = f"{what} has not been read from Nomad yet"
        self.read = asyncio.Event()
        self._following = Background(what, self._follow)
        self.start, self.stop = self._following.start, self._following.stop

    async def _follow(self) -> None:
        index, pause = 0, RETRY_SECONDS[0]
        while True:
            if not self._wanted():
                index = 0  # read it all again once wanted
                await asyncio.sleep(UNWANTED_CHECK_SECONDS)
                continue
            try:
                metas, index = await self._watcher.wait_variables(
                    self._prefix, self._namespace, index, WAIT_SECONDS
                )
                await self._on_list(listed(metas))
            except NomadError as error:
                if self.problem is None:
                    log.warning("cannot read %s from Nomad: %s", self._what, error)
                self.problem = f"cannot read {self._what}: {error}"
                await asyncio.sleep(pause)
                pause = min(pause * 2, RETRY_SECONDS[1])
                continue
            if self.problem is not None and self.read.is_set():
                log.info("%s is read again", self._what)
            self.problem, pause = None, RETRY_SECONDS[0]
            self.read.set()
            await asyncio.sleep(FOLLOW_GAP_SECONDS)
