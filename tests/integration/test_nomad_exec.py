"""The Nomad exec client against a loopback WebSocket server speaking Nomad's frames:
output and exit (exit_code left out when 0), stdin, heartbeats, the close codes Nomad
refuses with (1008, 1011), an abrupt TCP drop, refusals before the upgrade, TLS."""

from __future__ import annotations

import asyncio
import base64
import json
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import WSMsgType, web

import controller.nomad.exec as nomad_exec
from controller.nomad.config import NomadConfig
from controller.nomad.errors import NomadUnavailable
from controller.nomad.exec import ENDPOINT, ExecBroken, ExecError, ExecRefused, NomadExec, Output
from tests.integration.fake_http import Loopback
from tests.integration.test_nomad_client import make_tls, server_context
from tests.support.ports import free_port

TOKEN = "exec-token-never-to-be-seen"
ALLOC = "5457f16d-0f87-8e6b-5e91-0c7da3a41eb7"


@dataclass
class Agent:
    """What the fake agent saw: the upgrade request and every frame the client sent."""

    url: str = ""
    query: dict[str, str] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    frames: list[dict[str, Any]] = field(default_factory=list)


Script = Callable[[web.WebSocketResponse, web.Request, Agent], Awaitable[None]]


def out(stream: str, data: bytes) -> dict[str, Any]:
    return {stream: {"data": base64.b64encode(data).decode()}}


async def finish(ws: web.WebSocketResponse, request: web.Request, result: dict[str, Any]) -> None:
    """As Nomad's agent ends a command: both close frames, the exit, then the TCP
    connection dropped without a close frame."""
    await ws.send_json({"stdout": {"close": True}})
    await ws.send_json({"stderr": {"close": True}})
    await ws.send_json({"exited": True, "result": result})
    assert request.transport is not None
    request.transport.close()


async def refuse(ws: web.WebSocketResponse, request: web.Request, code: int, reason: str) -> None:
    """As Nomad refuses after the upgrade: one close frame with its reason, then the end."""
    await ws.send_frame(struct.pack("!H", code) + reason.encode(), WSMsgType.CLOSE)
    assert request.transport is not None
    request.transport.close()


async def read_stdin(ws: web.WebSocketResponse, agent: Agent) -> bytes:
    """The client's stdin until it closes it (heartbeats and resizes recorded too)."""
    data = b""
    async for message in ws:
        frame = json.loads(message.data)
        agent.frames.append(frame)
        stdin = frame.get("stdin") or {}
        if stdin.get("close"):
            return data
        data += base64.b64decode(stdin.get("data", ""))
    return data


@pytest.fixture
def agent(loopback: Loopback) -> Callable[..., Awaitable[Agent]]:
    async def start(script: Script, ssl_context: Any = None, status: int = 101) -> Agent:
        seen = Agent()

        async def handle(request: web.Request) -> web.StreamResponse:
            seen.query = dict(request.query)
            seen.headers = dict(request.headers)
            if status != 101:
                return web.Response(status=status, text="failed to marshal command into json")
            ws = web.WebSocketResponse()
            await ws.prepare(request)
            await script(ws, request, seen)
            return ws

        path = "/v1/client/allocation/{alloc}/exec"
        seen.url = await loopback.serve("GET", path, handle, ssl_context)
        return seen

    return start


class Execs:
    """Exec clients of a test, and the requests their metrics hook was told of."""

    def __init__(self) -> None:
        self.made: list[NomadExec] = []
        self.calls: list[tuple[str, str]] = []

    def __call__(self, url: str, **config: Any) -> NomadExec:
        client = NomadExec(
            NomadConfig(address=url, token=TOKEN, **config),
            on_request=lambda endpoint, code: self.calls.append((endpoint, code)),
            connect_timeout=5.0,
        )
        self.made.append(client)
        return client


@pytest.fixture
async def execs() -> AsyncIterator[Execs]:
    made = Execs()
    yield made
    for client in made.made:
        await client.close()


async def run(client: NomadExec, stdin: bytes | None = None) -> tuple[list[Output], int | None]:
    async with client.session(ALLOC, "runner", ["/bin/sh", "-c", "cat"], namespace="ns") as s:
        if stdin is not None:
            await s.send(stdin)
            await s.close_stdin()
        outputs = [o async for o in s.output()]
        return outputs, s.exit_code


async def test_output_stdin_and_an_exit_code_of_0_left_out(agent, execs) -> None:
    async def script(ws: web.WebSocketResponse, request: web.Request, seen: Agent) -> None:
        data = await read_stdin(ws, seen)
        await ws.send_json(out("stdout", data))
        await ws.send_json(out("stderr", b"err\n"))
        await finish(ws, request, {})  # protobuf's omitempty: no exit_code for 0

    fake = await agent(script)
    client = execs(fake.url)
    payload = bytes(range(256)) * 600  # binary, and more than one stdin frame
    outputs, code = await run(client, payload)
    assert code == 0
    assert b"".join(o.data for o in outputs if o.stream == "stdout") == payload
    assert [o for o in outputs if o.stream == "stderr"] == [Output("stderr", b"err\n")]
    # The upgrade: the token in its header, the command as a JSON array, the task.
    assert fake.headers["X-Nomad-Token"] == TOKEN
    assert fake.headers["User-Agent"].startswith("poolkeeper/")
    assert json.loads(fake.query["command"]) == ["/bin/sh", "-c", "cat"]
    assert (fake.query["task"], fake.query["tty"], fake.query["namespace"]) == (
        "runner",
        "false",
        "ns",
    )
    assert fake.frames[-1] == {"stdin": {"close": True}}
    assert len(fake.frames) > 2  # the stdin came in chunks
    assert execs.calls == [(ENDPOINT, "101")]


async def test_a_non_zero_exit_code(agent, execs) -> None:
    async def script(ws: web.WebSocketResponse, request: web.Request, seen: Agent) -> None:
        await ws.send_json(out("stdout", b"partial"))
        await finish(ws, request, {"exit_code": 3})

    fake = await agent(script)
    outputs, code = await run(execs(fake.url))
    assert (outputs, code) == ([Output("stdout", b"partial")], 3)


async def test_1008_unknown_allocation(agent, execs) -> None:
    async def script(ws: web.WebSocketResponse, request: web.Request, seen: Agent) -> None:
        await refuse(ws, request, 1008, f'Unknown allocation "{ALLOC}"')

    fake = await agent(script)
    with pytest.raises(ExecRefused) as refused:
        await run(execs(fake.url))
    assert (refused.value.code, refused.value.reason) == (1008, f'Unknown allocation "{ALLOC}"')
    assert "Unknown allocation" in str(refused.value)


async def test_1011_permission_denied(agent, execs) -> None:
    async def script(ws: web.WebSocketResponse, request: web.Request, seen: Agent) -> None:
        await refuse(ws, request, 1011, "Permission denied")

    fake = await agent(script)
    with pytest.raises(ExecRefused) as refused:
        await run(execs(fake.url))
    assert (refused.value.code, refused.value.reason) == (1011, "Permission denied")


async def test_an_abrupt_tcp_drop_before_the_exit_is_an_error(agent, execs) -> None:
    async def script(ws: web.WebSocketResponse, request: web.Request, seen: Agent) -> None:
        await ws.send_json(out("stdout", b"half"))
        assert request.transport is not None
        request.transport.abort()  # an agent restart: no close frame, no exit

    fake = await agent(script)
    client = execs(fake.url)
    seen: list[Output] = []
    with pytest.raises(ExecBroken):
        async with client.session(ALLOC, "runner", ["sleep", "9"], namespace="ns") as session:
            async for output in session.output():
                seen.append(output)
    assert seen == [Output("stdout", b"half")]


async def test_refused_before_the_upgrade(agent, execs) -> None:
    async def script(ws: web.WebSocketResponse, request: web.Request, seen: Agent) -> None:
        raise AssertionError("never upgraded")

    fake = await agent(script, status=500)
    with pytest.raises(ExecError, match="HTTP 500"):
        await run(execs(fake.url))
    assert execs.calls == [(ENDPOINT, "500")]


async def test_nomad_unreachable(execs) -> None:
    with pytest.raises(NomadUnavailable, match="cannot reach Nomad"):
        await run(execs(f"http://127.0.0.1:{free_port()}"))
    assert execs.calls == [(ENDPOINT, "error")]


async def test_heartbeats_and_terminal_size(agent, execs, monkeypatch) -> None:
    monkeypatch.setattr(nomad_exec, "HEARTBEAT_SECONDS", 0.05)

    async def script(ws: web.WebSocketResponse, request: web.Request, seen: Agent) -> None:
        async for message in ws:
            seen.frames.append(json.loads(message.data))
            if seen.frames.count({}) >= 2:
                break
        await finish(ws, request, {})

    fake = await agent(script)
    client = execs(fake.url)
    async with client.session(ALLOC, "runner", ["sh"], namespace="ns", tty=True) as session:
        await session.resize(40, 120)
        assert [o async for o in session.output()] == []
    assert fake.query["tty"] == "true"
    assert fake.frames[0] == {"tty_size": {"height": 40, "width": 120}}
    assert fake.frames.count({}) >= 2


async def test_tls_with_the_configured_ca(agent, execs, tmp_path: Path) -> None:
    ca, cert, key = make_tls(tmp_path)

    async def script(ws: web.WebSocketResponse, request: web.Request, seen: Agent) -> None:
        await finish(ws, request, {"exit_code": 7})

    fake = await agent(script, ssl_context=server_context(cert, key))
    assert fake.url.startswith("https://")
    _, code = await run(execs(fake.url, ca_cert=str(ca)))
    assert code == 7
    with pytest.raises(NomadUnavailable):  # not trusted without the CA
        await run(execs(fake.url))


async def test_closing_early_leaves_quietly(agent, execs) -> None:
    closed = asyncio.Event()

    async def script(ws: web.WebSocketResponse, request: web.Request, seen: Agent) -> None:
        await ws.send_json(out("stdout", b"first"))
        async for _ in ws:
            pass  # until the client's close frame
        closed.set()

    fake = await agent(script)
    client = execs(fake.url)
    async with client.session(ALLOC, "runner", ["sleep", "9"], namespace="ns") as session:
        async for output in session.output():
            assert output == Output("stdout", b"first")
            break
    await asyncio.wait_for(closed.wait(), 5)
