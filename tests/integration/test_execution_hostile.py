"""Hostile input on the routes of executions and files, for a runner that is claimed:
bad JSON, wrong types, huge commands, invalid base64, stream URLs reused or guessed.

Never a 5xx other than 502 (the exec failed) and 503, never a traceback, errors in the
API's shape, and a refused request writes nothing (not even the claim's deadline).

The simulator here runs no processes (no `--exec local`): a request that gets as far as
Nomad's exec is answered 502, so generated commands are never run on this machine. The
tests marked LOCAL, whose commands are written out here, run theirs as processes: a
stream's garbage frames and a stdin flood, on both APIs.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import secrets
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from hypothesis import given
from hypothesis import strategies as st

from controller.executions.manager import MAX_WAITING_PER_RUNNER
from controller.executions.stdin import STDIN_BUFFER_BYTES
from controller.lab.simulator import Simulator
from tests.support.fuzzing import against_live_service

from .conftest import TOKEN, Harness, write_pools
from .executions_support import Runner, Stream, claimed_runner
from .test_hostile_input import HOSTILE_JSON, PYTHON_ERRORS
from .test_poseidon import READONLY, environment_pool

ENVIRONMENT = 10
MIB = 1024 * 1024

TRACEBACK = re.compile(r"Traceback|File \"|\.py\", line")


@pytest.fixture
async def sim(request: pytest.FixtureRequest) -> AsyncIterator[Simulator]:
    """Without `--exec local`, unless a test asks for it (LOCAL)."""
    yield Simulator(seed=1, start_delay=0.05, exec_mode=getattr(request, "param", "none"))


LOCAL = pytest.mark.parametrize("sim", ["local"], indirect=True)


@pytest.fixture(params=["one process", "API tier"])
async def runner(harness: Harness, tmp_path: Path, request: pytest.FixtureRequest) -> Runner:
    """A runner claimed through one process that also reconciles, or through an API
    replica beside it: both reject the same way. Its pool serves Poseidon's environment
    ENVIRONMENT too, so that the runner is reached through either API."""
    pool = environment_pool("py", ENVIRONMENT, idle=1, maxRunners=10)
    controller = await harness.start(write_pools(tmp_path / "pools.yaml", pool), poseidon=READONLY)
    if request.param == "one process":
        return await claimed_runner(harness, controller)
    await harness.settled(controller)
    tier = await harness.start_api_tier(poseidon=READONLY)
    return await claimed_runner(harness, tier, settled=False)


async def send(
    runner: Runner, method: str, suffix: str, body: bytes | None, content_type: str
) -> tuple[int, str]:
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": content_type}
    async with aiohttp.ClientSession() as http:
        url = runner.controller.url + runner.path + suffix
        async with http.request(method, url, data=body, headers=headers) as response:
            return response.status, await response.text()


async def check(
    runner: Runner,
    method: str,
    suffix: str,
    body: bytes | None,
    content_type: str = "application/json",
) -> tuple[int, Any]:
    """Send, then hold the API to its promises for hostile input."""
    index = runner.claim_index()
    status, text = await send(runner, method, suffix, body, content_type)
    assert not TRACEBACK.search(text), (suffix, status, text[:300])
    assert status < 500 or status in (502, 503), (suffix, status, text[:300])
    payload: Any = json.loads(text) if text else None
    if status >= 400:
        error = payload["error"]
        assert isinstance(error["code"], str) and isinstance(error["message"], str)
    if status in (400, 404, 409, 413):
        assert runner.claim_index() == index, f"{suffix} was refused ({status}) but wrote"
    return status, payload


BAD_EXECUTIONS = [
    b"{",
    b"[]",
    b'"echo hi"',
    b'{"command": 5}',
    b'{"command": []}',
    b'{"command": [""]}',
    b'{"command": ""}',
    b'{"command": ["echo", 1]}',
    b'{"command": "echo", "env": {"1BAD": "x"}}',
    b'{"command": "echo", "env": {"A=B": "x"}}',
    b'{"command": "echo", "env": {"A": 1}}',
    b'{"command": "echo", "env": []}',
    b'{"command": "echo\\u0000x"}',
    b'{"command": ["echo", "\\ud800"]}',
    b'{"command": "echo", "env": {"A": "x\\u0000"}}',
    b'{"command": "echo", "timeLimitSeconds": 0}',
    b'{"command": "echo", "timeLimitSeconds": 3601}',
    b'{"command": "echo", "timeLimitSeconds": "5"}',
    b'{"command": "echo", "timeLimitSeconds": 1.5}',
    b'{"command": "echo", "wait": "yes"}',
    b'{"command": "echo", "tty": 1}',
    b'{"command": "echo", "workingDir": "../up"}',
    b'{"command": "echo", "workingDir": ""}',
    b'{"command": "echo", "stdin": 5}',
    b'{"command": "echo", "unknown": true}',
    b'{"command": ["A=B", "x"], "env": {"A": "1"}}',
]


async def test_huge_commands(runner: Runner) -> None:
    # Past the API's 64 KiB: 413, nothing written.
    body = json.dumps({"command": "echo " + "a" * 70_000, "wait": True}).encode()
    status, answer = await check(runner, "POST", "/executions", body)
    assert status == 413, answer
    # Within it, many arguments: as far as Nomad (which runs nothing here: 502).
    command = ["echo", *["ä" * 5] * 4000]
    body = json.dumps({"command": command, "wait": True}, ensure_ascii=False).encode()
    status, answer = await check(runner, "POST", "/executions", body)
    assert (status, answer["error"]["code"]) == (502, "ExecFailed"), answer
    assert "--exec local" in answer["error"]["message"]


BAD_UPLOADS = [
    b"{",
    b"[1]",
    b'{"files": {}}',
    b'{"files": [{"path": "a"}]}',
    b'{"files": [{"path": "a", "content": "!!!"}]}',
    b'{"files": [{"path": "a", "content": "YQ"}]}',
    b'{"files": [{"path": "a", "content": "YWJj\\u00e9"}]}',  # base64 has no non-ASCII
    '{"files": [{"path": "a", "content": "éééé"}]}'.encode(),
    b'{"files": [{"path": "a", "content": "YQ==", "mode": "999"}]}',
    b'{"files": [{"path": "a", "content": "YQ==", "mode": "4755"}]}',
    b'{"files": [{"path": "a", "content": "YQ==", "mode": 644}]}',
    b'{"files": [{"path": "", "content": ""}]}',
    b'{"files": [{"path": ".", "content": ""}]}',
    b'{"files": [{"path": "a\\u0000b", "content": ""}]}',
    b'{"delete": ["."]}',
    b'{"delete": ["/"]}',
    b'{"delete": "x"}',
    b'{"directories": [1]}',
    b'{"other": []}',
]


BAD_QUERIES = [
    "/files?recursive=maybe",
    "/files?path=../x",
    "/files?path=%00",
    "/files/content",
    "/files/content?path=",
    "/files/content?path=.",
    "/files/content?path=../../etc/passwd",
]
BAD_REQUESTS: list[tuple[str, str, bytes | None]] = [
    *(("POST", "/executions", body) for body in BAD_EXECUTIONS),
    *(("PUT", "/files", body) for body in BAD_UPLOADS),
    *(("GET", query, None) for query in BAD_QUERIES),
]


@pytest.mark.parametrize(
    ("method", "suffix", "body"),
    BAD_REQUESTS,
    ids=[f"{method} {suffix} {(body or b'')[:40]!r}" for method, suffix, body in BAD_REQUESTS],
)
async def test_bad_requests_are_400_and_write_nothing(
    runner: Runner, method: str, suffix: str, body: bytes | None
) -> None:
    status, answer = await check(runner, method, suffix, body)
    assert (status, answer["error"]["code"]) == (400, "InvalidRequest"), answer


async def test_stream_urls_reused_or_guessed_are_404(runner: Runner) -> None:
    status, created = await check(runner, "POST", "/executions", b'{"command": "true"}')
    assert status == 201, created
    url = created["streamUrl"]
    async with await Stream.open(url) as stream:
        # No --exec local: the exec fails, after the start frame, as an error frame.
        assert (await stream.next()) == {"type": "start"}
        end = await stream.to_end()
        assert end["type"] == "error" and "--exec local" in end["message"]
    base = url.rsplit("/executions/", 1)[0]
    other = base.replace(runner.id, runner.id[:-1] + ("0" if runner.id[-1] != "0" else "1"))
    _, fresh = await check(runner, "POST", "/executions", b'{"command": "true"}')
    fresh_id = fresh["executionId"]
    for target in (
        url,  # used
        f"{base}/executions/{secrets.token_urlsafe(24)}/stream",  # guessed
        f"{base}/executions/{fresh_id[:-1]}/stream",  # nearly right
        f"{other}/executions/{fresh_id}/stream",  # another runner's path
    ):
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await Stream.open(target)
        assert refused.value.status == 404, target
    # The untouched one still opens, with a wrong bearer token even: the ID is the credential.
    async with await Stream.open(fresh["streamUrl"], headers={"Authorization": "Bearer wrong"}):
        pass


async def test_executions_waiting_for_their_sockets_are_bounded(runner: Runner) -> None:
    body = json.dumps({"command": "echo " + "x" * 60_000}).encode()
    for _ in range(MAX_WAITING_PER_RUNNER):
        assert (await check(runner, "POST", "/executions", body))[0] == 201
    status, answer = await check(runner, "POST", "/executions", body)
    assert (status, answer["error"]["code"]) == (409, "TooManyExecutions"), answer
    assert runner.controller.executions.waiting(runner.id) == MAX_WAITING_PER_RUNNER


async def test_the_stream_route_wants_a_websocket(runner: Runner) -> None:
    _, created = await check(runner, "POST", "/executions", b'{"command": "true"}')
    suffix = f"/executions/{created['executionId']}/stream"
    status, answer = await check(runner, "GET", suffix, None)
    assert (status, answer["error"]["code"]) == (400, "InvalidRequest"), answer
    async with await Stream.open(created["streamUrl"]):  # not used up by the refusal
        pass


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.text(max_size=40),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4)
    ),
    max_leaves=12,
)
execution_bodies = st.fixed_dictionaries(
    {},
    optional={
        "command": json_values,
        "env": json_values,
        "workingDir": json_values,
        "timeLimitSeconds": json_values,
        "tty": json_values,
        "privileged": json_values,
        "wait": st.just(True),  # a streamed one would wait for its socket, unopened
        "stdin": json_values,
    },
)
upload_bodies = st.fixed_dictionaries(
    {},
    optional={
        "delete": json_values,
        "directories": json_values,
        "files": st.lists(
            st.fixed_dictionaries(
                {"path": json_values, "content": json_values}, optional={"mode": json_values}
            ),
            max_size=3,
        )
        | json_values,
    },
)


@pytest.mark.slow
@against_live_service(max_examples=80)
@given(
    route=st.sampled_from([("POST", "/executions"), ("PUT", "/files")]),
    body=st.one_of(execution_bodies, upload_bodies, json_values).map(json.dumps),
)
async def test_fuzz_bodies(runner: Runner, route: tuple[str, str], body: str) -> None:
    await check(runner, route[0], route[1], body.encode())


# ---- streams: garbage frames, and more stdin than the command reads --------------------

# Frames a client may send that are no stdin: each is ignored, the stream goes on.
GARBAGE_FRAMES: list[str | bytes] = [
    b"\x00\xffa binary frame",
    "not JSON",
    "[1, 2]",
    "[" * 5_000 + "]" * 5_000,
    '{"type": "stdin", "data": 5}',
    '{"type": "stdin", "data": "x", "n": 1' + "0" * 5_000 + "}",
    '{"type": "stdin"}',
    '{"type": "resize", "data": "x"}',
    '{"type": "stdin", "data": "\\ud800"}',  # a lone surrogate: U+FFFD, as Go would
]


@LOCAL
async def test_garbage_frames_leave_a_stream_working(runner: Runner) -> None:
    async with await runner.stream(command=["cat"]) as stream:
        assert await stream.next() == {"type": "start"}
        for frame in GARBAGE_FRAMES:
            if isinstance(frame, bytes):
                await stream.ws.send_bytes(frame)
            else:
                await stream.ws.send_str(frame)
        await stream.send({"type": "stdin", "data": "hello\n"})
        await stream.send({"type": "stdinClose"})
        assert await stream.to_end() == {"type": "exit", "exitCode": 0}
        assert stream.output() == "\ufffdhello\n"


# The runner routes' JSON bodies, hostile as test_hostile_input.HOSTILE_JSON makes them:
# (method, path under the runner, fields; the Poseidon routes under /api/v1).
RUNNER_JSON_ROUTES = [
    ("POST", "/executions", ["command", "env", "timeLimitSeconds", "stdin", "x"]),
    ("PUT", "/files", ["files", "delete", "directories", "x"]),
    ("POST", "/execute", ["command", "environment", "timeLimit", "x"]),
    ("PATCH", "/files", ["copy", "delete", "x"]),
]


@LOCAL
async def test_hostile_json_on_runner_routes_is_never_a_server_error(runner: Runner) -> None:
    """Deep nesting, huge numbers, lone surrogates, as the whole body and in every field
    of both APIs' runner routes: refused (400), or taken as Go takes them under
    Poseidon's API (a lone surrogate is U+FFFD there): never a 5xx, never a Python
    exception's name."""
    headers = {"Content-Type": "application/json", "Poseidon-Token": TOKEN}
    async with aiohttp.ClientSession(headers=headers) as http:
        for method, suffix, fields in RUNNER_JSON_ROUTES:
            poseidon = suffix in ("/execute",) or method == "PATCH"
            base = f"/api/v1/runners/{runner.id}" if poseidon else runner.path
            url = runner.controller.url + base + suffix
            for what, value in HOSTILE_JSON.items():
                for body in [value, *(f'{{"{field}": {value}}}' for field in fields)]:
                    auth = {} if poseidon else {"Authorization": f"Bearer {TOKEN}"}
                    async with http.request(method, url, data=body, headers=auth) as response:
                        text = await response.text()
                    where = (method, base + suffix, what, body[:60], response.status, text[:300])
                    assert response.status < 500, where
                    assert not TRACEBACK.search(text) and not PYTHON_ERRORS.search(text), where
                    if not poseidon:
                        assert response.status == 400, where


async def poseidon_stream(runner: Runner, command: str) -> Stream:
    """An execution through Poseidon's API, its WebSocket open."""
    headers = {"Poseidon-Token": TOKEN}
    url = f"{runner.controller.url}/api/v1/runners/{runner.id}/execute"
    async with (
        aiohttp.ClientSession(headers=headers) as http,
        http.post(url, json={"command": command, "timeLimit": 60}) as response,
    ):
        assert response.status == 200, await response.text()
        websocket_url = (await response.json())["websocketUrl"]
    return await Stream.open(websocket_url, headers=headers, timeout=CLOSE_SOON)


# Frames no client may send: text that is not UTF-8, and more than a frame may hold.
BROKEN_FRAMES = [
    ("text that is not UTF-8", b"\xff\xfe\xfd", aiohttp.WSMsgType.TEXT, 1007),
    ("a frame over 1 MiB", b"x" * (MIB + 1), aiohttp.WSMsgType.TEXT, 1009),
]


@pytest.mark.slow
@LOCAL
@pytest.mark.parametrize("api", ["v1", "poseidon"])
async def test_a_broken_frame_closes_its_stream_and_the_runner_goes_on(
    runner: Runner, api: str
) -> None:
    """The socket is closed with the code the WebSocket protocol gives, its command is
    cancelled, and the runner serves the next execution."""
    for what, data, kind, code in BROKEN_FRAMES:
        if api == "v1":
            stream = await runner.stream(command=["cat"])
        else:
            stream = await poseidon_stream(runner, "cat")
        async with stream:
            assert await stream.next() == {"type": "start"}, what
            await stream.ws.send_frame(data, kind)
            while await stream.next() is not None:
                pass
            assert stream.ws.close_code == code, what
    if api == "v1":
        status, result = await runner.run(command=["echo", "still here"])
        assert (status, result["stdout"]) == (200, "still here\n"), result
    else:
        async with await poseidon_stream(runner, "echo still here") as stream:
            assert await stream.next() == {"type": "start"}
            assert await stream.to_end() == {"type": "exit", "data": 0}
            assert "still here" in stream.output()


async def held_back(sent: Callable[[], int], sending: asyncio.Task[None]) -> None:
    """Until the sender makes no progress for a second (or it is done)."""
    last, since = sent(), time.monotonic()
    deadline = since + 60
    while not sending.done() and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
        if sent() != last:
            last, since = sent(), time.monotonic()
        elif time.monotonic() - since >= 1.0:
            return


FLOOD_FRAMES = 64  # MiB: far more than the sockets and buffers on the way hold
# The server stops reading a flooded socket: a close is not answered until there is room.
CLOSE_SOON = aiohttp.ClientWSTimeout(ws_close=1.0)


@pytest.mark.slow
@LOCAL
async def test_a_stdin_flood_is_held_back_and_nothing_is_lost(runner: Runner) -> None:
    """A command that reads nothing until told: its client's stdin waits in the client
    (the server stops reading its socket), the server holds at most its bound; once the
    command reads, every byte arrives."""
    command = "while [ ! -e go ]; do sleep 0.1; done; exec wc -c"
    status, created = await runner.api("POST", "/executions", {"command": command})
    assert status == 201, created
    data = "x" * (MIB - 64)
    sent = 0
    async with await Stream.open(created["streamUrl"], timeout=CLOSE_SOON) as stream:
        assert await stream.next() == {"type": "start"}

        async def flood() -> None:
            nonlocal sent
            for _ in range(FLOOD_FRAMES):
                await stream.send({"type": "stdin", "data": data})
                sent += 1

        sending = asyncio.create_task(flood())
        await held_back(lambda: sent, sending)
        assert not sending.done() and sent < FLOOD_FRAMES, sent
        assert runner.controller.executions.stdin_budget.held <= STDIN_BUFFER_BYTES
        (runner.task_dir() / "go").touch()
        await sending
        await stream.send({"type": "stdinClose"})
        assert await stream.to_end() == {"type": "exit", "exitCode": 0}
        assert int(stream.output()) == FLOOD_FRAMES * len(data)


@pytest.mark.slow
@LOCAL
async def test_a_stdin_flood_on_poseidons_websocket_is_held_back(runner: Runner) -> None:
    data = "x" * (MIB - 64)
    sent = 0
    async with await poseidon_stream(runner, "sleep 60") as stream:
        assert await stream.next() == {"type": "start"}

        async def flood() -> None:
            nonlocal sent
            for _ in range(FLOOD_FRAMES):
                await stream.ws.send_str(data)
                sent += 1

        sending = asyncio.create_task(flood())
        await held_back(lambda: sent, sending)
        assert not sending.done() and sent < FLOOD_FRAMES, sent
        assert runner.controller.executions.stdin_budget.held <= STDIN_BUFFER_BYTES
        sending.cancel()
        await asyncio.gather(sending, return_exceptions=True)


@pytest.mark.slow
@LOCAL
async def test_a_client_that_does_not_read_keeps_its_runner(runner: Runner) -> None:
    """`yes` past its time limit while the client reads nothing for a while: the command
    is killed at the limit, the stream ends with `timeout` once the client reads, and the
    runner stays claimed (the output nobody read does not hold the exec open)."""
    status, created = await runner.api(
        "POST", "/executions", {"command": "yes", "timeLimitSeconds": 2}
    )
    assert status == 201, created
    async with await Stream.open(created["streamUrl"]) as stream:
        await asyncio.sleep(6)  # past the limit and the 3 s a kill may take
        assert await stream.next() == {"type": "start"}
        while (frame := await stream.next()) is not None:
            last = frame
        assert last == {"type": "timeout"}
    status, claim = await runner.api("GET", "")
    assert status == 200, claim
    assert "yes" not in _commands_in(runner.task_dir())


def _commands_in(folder: Path) -> list[str]:
    """The command lines of the processes working in `folder` (a runner's, with --exec
    local)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if Path(os.readlink(proc / "cwd")) == folder:
                found.append((proc / "cmdline").read_bytes().replace(b"\0", b" ").decode().strip())
        except (OSError, UnicodeDecodeError):
            continue
    return found
