"""Helpers for the tests of executions and files against a simulator with `--exec local`:
a claimed runner, its task directory on this machine, executions and their streams."""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from controller.api_tier import ApiTier
from controller.lab.simulator import Simulator
from controller.nomad.jobs import TASK_NAME
from controller.standalone import Controller
from tests.simulator.exec_support import alive
from tests.support.waiting import wait_until

from .conftest import Harness


@dataclass
class Runner:
    """A runner claimed through the API, with what a test needs to reach it."""

    harness: Harness
    controller: Controller | ApiTier
    claim: dict[str, Any]

    @property
    def id(self) -> str:
        return str(self.claim["runnerId"])

    @property
    def path(self) -> str:
        return f"/v1/runners/{self.id}"

    @property
    def sim(self) -> Simulator:
        return self.harness.sim

    def task_dir(self) -> Path:
        """The runner task's directory on this machine: its working directory."""
        sandboxes = self.sim.sandboxes
        box = sandboxes.open(sandboxes.lookup(self.claim["allocationId"]))
        return Path(box.task_dir(TASK_NAME))

    def alloc_dir(self) -> Path:
        return self.task_dir().parent

    async def api(self, method: str, suffix: str, body: Any = None) -> tuple[int, Any]:
        return await self.harness.api(self.controller, method, self.path + suffix, body)

    async def run(self, **body: Any) -> tuple[int, Any]:
        """A waited execution."""
        return await self.api("POST", "/executions", {**body, "wait": True})

    async def stream(self, **body: Any) -> Stream:
        """A streamed execution, its socket open."""
        status, created = await self.api("POST", "/executions", body)
        assert status == 201, created
        return await Stream.open(created["streamUrl"])

    def claim_index(self) -> int:
        variable = self.sim.variables()[f"poolkeeper/claims/{self.id}"]
        return int(variable["ModifyIndex"])


async def claimed_runner(
    harness: Harness,
    controller: Controller | ApiTier,
    pool: str = "py",
    *,
    settled: bool = True,
    **body: Any,
) -> Runner:
    """A runner claimed through `controller` (settled first, unless it is an API replica:
    then the caller settles its reconciler)."""
    if settled:
        assert isinstance(controller, Controller)
        await harness.settled(controller)
    status, claim = await harness.api(controller, "POST", f"/v1/pools/default/{pool}/claims", body)
    assert status == 201, claim
    return Runner(harness, controller, claim)


class Stream:
    """The client side of an execution's WebSocket."""

    def __init__(self, http: aiohttp.ClientSession, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.http = http
        self.ws = ws
        self.frames: list[dict[str, Any]] = []

    @classmethod
    async def open(cls, url: str, **kwargs: Any) -> Stream:
        http = aiohttp.ClientSession()
        try:
            ws = await http.ws_connect(url, **kwargs)
        except BaseException:
            await http.close()
            raise
        return cls(http, ws)

    async def next(self, within: float = 20.0) -> dict[str, Any] | None:
        """The next frame; None once the server closed the socket."""
        message = await asyncio.wait_for(self.ws.receive(), within)
        if message.type is not aiohttp.WSMsgType.TEXT:
            return None
        frame: dict[str, Any] = json.loads(message.data)
        self.frames.append(frame)
        return frame

    async def output_until(self, text: str, stream: str = "stdout") -> str:
        """Output frames until `text` has come (the process may still run)."""
        seen = ""
        while text not in seen:
            frame = await self.next()
            assert frame is not None, f"closed before {text!r}: {self.frames}"
            if frame["type"] == stream:
                seen += frame["data"]
        return seen

    async def pids(self, count: int) -> list[int]:
        """The first `count` process IDs the command printed, one per line."""
        while len(found := pids(self.output())) < count or not self.output().endswith("\n"):
            frame = await self.next()
            assert frame is not None, f"closed before {count} PIDs: {self.frames}"
        return found[:count]

    async def to_end(self) -> dict[str, Any]:
        """Frames until the close; the terminal frame (the last one)."""
        while await self.next() is not None:
            pass
        assert self.ws.close_code == 1000, self.ws.close_code
        return self.frames[-1]

    def output(self, stream: str = "stdout") -> str:
        return "".join(f["data"] for f in self.frames if f["type"] == stream)

    async def send(self, frame: dict[str, Any]) -> None:
        await self.ws.send_json(frame)

    async def close(self) -> None:
        await self.ws.close()
        await self.http.close()

    async def __aenter__(self) -> Stream:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()


def pids(text: str) -> list[int]:
    """The process IDs a command printed, one per line."""
    return [int(line) for line in text.split() if line.isdigit()]


async def gone(*pids: int) -> None:
    await wait_until(lambda: not any(alive(pid) for pid in pids), what=f"processes {pids} to end")


def readers_of(name: str) -> list[int]:
    """The processes on this machine that `cat` a file of this (unique) name: a
    download's command in a runner of the simulator with `--exec local`."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:  # not a process, or one that has just ended
            continue
        if argv[:1] == [b"cat"] and any(arg.endswith(name.encode()) for arg in argv[1:]):
            found.append(int(proc.name))
    return found


async def abandon_download(url: str, headers: dict[str, str], path: str) -> None:
    """Start downloading `path` from `url`, read a MiB of it, and hang up, as a client
    that goes away mid-download does (its `cat` still runs in the runner then)."""
    async with (
        aiohttp.ClientSession() as http,
        http.get(url, params={"path": path}, headers=headers) as response,
    ):
        assert response.status == 200, await response.text()
        await response.content.readexactly(1024 * 1024)
        assert readers_of(path), "the download's cat is not running"
        response.close()  # the connection, not back to the pool: closed


def access_log(caplog: pytest.LogCaptureFixture) -> list[tuple[str, int]]:
    lines = [vars(r) for r in caplog.records if r.name == "controller.api.access_log"]
    return [(line["route"], line["status"]) for line in lines]


def assert_one_quiet_line(caplog: pytest.LogCaptureFixture, runner_id: str) -> None:
    """The abandoned download is one line (no traceback), naming the runner."""
    ours = [r for r in caplog.records if r.name.startswith("controller.")]
    assert not [r for r in ours if r.exc_info or r.levelno >= logging.WARNING], [
        r.getMessage() for r in ours
    ]
    abandoned = [r.getMessage() for r in ours if "download" in r.getMessage()]
    assert len(abandoned) == 1 and runner_id in abandoned[0], abandoned
