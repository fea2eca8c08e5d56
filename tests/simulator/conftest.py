"""Fixtures: a simulator on a free loopback port and an HTTP session to it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import pytest

from controller.lab.simulator import SimServer, Simulator, start_sim

START_DELAY = 0.01
# python-nomad's own suite runs from a temporary folder (test_python_nomad_suite.py).
collect_ignore = ["pynomad_support"]


def service_job(
    job_id: str, count: int = 1, image: str = "runner:1", **extra: Any
) -> dict[str, Any]:
    task = {
        "Name": "main",
        "Driver": "docker",
        "Config": {"image": image},
        "Resources": {"CPU": 100, "MemoryMB": 128},
    }
    job = {
        "ID": job_id,
        "Type": "service",
        "TaskGroups": [{"Name": "g", "Count": count, "Tasks": [task]}],
    }
    job.update(extra)
    return job


class Client:
    """A thin aiohttp wrapper returning (status, parsed body or text, headers)."""

    def __init__(self, session: aiohttp.ClientSession, url: str) -> None:
        self.session = session
        self.url = url

    async def call(
        self, method: str, path: str, body: Any = None, raw: bytes | None = None, **params: Any
    ) -> tuple[int, Any, Any]:
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        async with self.session.request(
            method, self.url + path, data=data, params={k: str(v) for k, v in params.items()}
        ) as resp:
            text = await resp.text()
            ctype = resp.headers.get("Content-Type", "")
            parsed: Any = (
                json.loads(text) if ctype.startswith("application/json") and text else text
            )
            return resp.status, parsed, resp.headers

    async def get(self, path: str, **params: Any) -> tuple[int, Any, Any]:
        return await self.call("GET", path, **params)

    async def put(self, path: str, body: Any = None, **params: Any) -> tuple[int, Any, Any]:
        return await self.call("PUT", path, body, **params)

    async def post(self, path: str, body: Any = None, **params: Any) -> tuple[int, Any, Any]:
        return await self.call("POST", path, body, **params)

    async def delete(self, path: str, **params: Any) -> tuple[int, Any, Any]:
        return await self.call("DELETE", path, **params)

    async def register(self, job: dict[str, Any], **body: Any) -> dict[str, Any]:
        status, out, _ = await self.put("/v1/jobs", {"Job": job, **body})
        assert status == 200, out
        assert isinstance(out, dict)
        return out


class Stream:
    """An open /v1/event/stream response, read frame by frame."""

    def __init__(self, resp: aiohttp.ClientResponse, after: int = -1) -> None:
        self.resp = resp
        self.after = after

    async def next(self, limit: float = 3.0, heartbeats: bool = False) -> dict[str, Any]:
        while True:
            line = await asyncio.wait_for(self.resp.content.readline(), limit)
            if not line:
                raise EOFError("stream ended")
            frame: dict[str, Any] = json.loads(line)
            if frame and frame["Index"] <= self.after:
                continue  # the replayed newest item of a subscription "from now"
            if frame or heartbeats:
                return frame

    async def events(self, count: int, limit: float = 3.0) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        while len(out) < count:
            out.extend((await self.next(limit))["Events"])
        return out


@pytest.fixture
def sim() -> Simulator:
    return Simulator(
        nodes=["sim-node-1", "sim-node-2", "sim-node-3"], seed=7, start_delay=START_DELAY
    )


@pytest.fixture
async def server(sim: Simulator) -> AsyncIterator[SimServer]:
    srv = await start_sim(sim, "127.0.0.1", 0)
    yield srv
    await srv.stop()


@pytest.fixture
async def client(server: SimServer) -> AsyncIterator[Client]:
    async with aiohttp.ClientSession() as session:
        yield Client(session, server.url)


@pytest.fixture
async def open_stream(server: SimServer) -> AsyncIterator[Callable[..., Any]]:
    session = aiohttp.ClientSession()
    opened: list[aiohttp.ClientResponse] = []

    async def opener(after: int = -1, **params: Any) -> Stream:
        """Open a stream; with `after`, only frames with a higher index are returned."""
        if after >= 0:
            params["index"] = after + 1
        query = [
            (k, str(v)) for k, vs in params.items() for v in (vs if isinstance(vs, list) else [vs])
        ]
        resp = await session.get(server.url + "/v1/event/stream", params=query)
        opened.append(resp)
        return Stream(resp, after)

    yield opener
    for resp in opened:
        resp.close()
    await session.close()
