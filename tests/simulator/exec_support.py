"""Helpers for the exec and fs tests: running allocations, exec sessions, live processes."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from controller.lab.simulator import SimServer, Simulator
from tests.simulator.conftest import Client, service_job
from tests.support.waiting import wait_until


async def running_alloc(client: Client, sim: Simulator, job: dict[str, Any] | None = None) -> str:
    """Register a one-allocation job (default: service_job("j")), wait until its allocation
    runs; its ID."""
    job = job or service_job("j")
    await client.register(job)
    await wait_until(
        lambda: any(a["ClientStatus"] == "running" for a in sim.allocations(job["ID"]))
    )
    return str(sim.allocations(job["ID"])[0]["ID"])


def exec_url(server: SimServer, alloc_id: str) -> str:
    return f"{server.url}/v1/client/allocation/{alloc_id}/exec"


def exec_params(command: Sequence[str], task: str = "main", **extra: str) -> dict[str, str]:
    return {"task": task, "command": json.dumps(list(command)), **extra}


@dataclass
class Session:
    """What a client saw of one exec: every frame, and how the connection ended."""

    frames: list[dict[str, Any]] = field(default_factory=list)
    end: aiohttp.WSMessage | None = None

    def chunks(self, stream: str) -> list[bytes]:
        """The data of each of a stream's frames."""
        return [
            base64.b64decode(f[stream]["data"]) for f in self.frames if "data" in f.get(stream, {})
        ]

    def data(self, stream: str) -> bytes:
        return b"".join(self.chunks(stream))

    @property
    def close(self) -> tuple[int, str]:
        """The close frame's code and reason (there must be one)."""
        assert self.end is not None and self.end.type is aiohttp.WSMsgType.CLOSE, self.end
        return int(self.end.data), str(self.end.extra)

    @property
    def dropped(self) -> bool:
        """The connection ended with no close frame (the client reads it as 1006)."""
        return self.end is not None and self.end.type is aiohttp.WSMsgType.CLOSED


async def read_session(ws: aiohttp.ClientWebSocketResponse, limit: float = 5.0) -> Session:
    session = Session()
    while True:
        msg = await asyncio.wait_for(ws.receive(), limit)
        if msg.type is aiohttp.WSMsgType.TEXT:
            session.frames.append(json.loads(msg.data))
            continue
        session.end = msg
        return session


async def next_frame(ws: aiohttp.ClientWebSocketResponse, limit: float = 5.0) -> dict[str, Any]:
    msg = await asyncio.wait_for(ws.receive(), limit)
    assert msg.type is aiohttp.WSMsgType.TEXT, msg
    frame: dict[str, Any] = json.loads(msg.data)
    return frame


async def send_stdin(ws: aiohttp.ClientWebSocketResponse, data: bytes) -> None:
    await ws.send_str(json.dumps({"stdin": {"data": base64.b64encode(data).decode()}}))


async def close_stdin(ws: aiohttp.ClientWebSocketResponse) -> None:
    await ws.send_str(json.dumps({"stdin": {"close": True}}))


@contextlib.asynccontextmanager
async def exec_socket(
    server: SimServer,
    alloc_id: str,
    command: Sequence[str],
    headers: dict[str, str] | None = None,
    **params: str,
) -> AsyncIterator[aiohttp.ClientWebSocketResponse]:
    """An exec's WebSocket (task "main" unless `task` is given)."""
    url, query = exec_url(server, alloc_id), exec_params(command, **params)
    async with (
        aiohttp.ClientSession() as http,
        http.ws_connect(url, params=query, headers=headers) as ws,
    ):
        yield ws


async def run(
    server: SimServer,
    alloc_id: str,
    command: Sequence[str],
    stdin: bytes | None = None,
    headers: dict[str, str] | None = None,
    **params: str,
) -> Session:
    """One exec from start to end; `stdin` (when given) is sent, then closed."""
    async with exec_socket(server, alloc_id, command, headers, **params) as ws:
        if stdin is not None:
            if stdin:
                await send_stdin(ws, stdin)
            await close_stdin(ws)
        return await read_session(ws)


def exists(path: str) -> bool:
    return os.path.exists(path)


def alive(pid: int) -> bool:
    """Whether a process runs (a zombie no longer does)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return False
    return fields[0] != "Z"


def exit_frame(session: Session) -> dict[str, Any]:
    """The last frame, which must be the exit, after both close frames."""
    *_, out_close, err_close, exited = session.frames
    assert out_close == {"stdout": {"close": True}}
    assert err_close == {"stderr": {"close": True}}
    assert exited["exited"] is True
    return exited
