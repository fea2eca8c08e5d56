"""Allocation exec over a WebSocket, with `--exec local` (real processes) unless said."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
from collections.abc import AsyncIterator

import aiohttp
import pytest

from controller.lab.simulator import SimServer, Simulator, start_sim
from controller.lab.simulator.api_exec import NO_LOCAL_EXEC
from tests.simulator.conftest import START_DELAY, Client, service_job
from tests.simulator.exec_support import (
    alive,
    close_stdin,
    exec_params,
    exec_socket,
    exec_url,
    exists,
    exit_frame,
    next_frame,
    read_session,
    run,
    running_alloc,
    send_stdin,
)
from tests.support.waiting import wait_until

SH = "/bin/sh"


@pytest.fixture
def sim() -> Simulator:
    return Simulator(nodes=["sim-node-1"], seed=7, start_delay=START_DELAY, exec_mode="local")


@pytest.fixture
async def alloc_id(client: Client, sim: Simulator) -> str:
    return await running_alloc(client, sim)


# ---------------------------------------------------------------------- frames
async def test_exit_code_0_is_left_out(server: SimServer, alloc_id: str) -> None:
    session = await run(server, alloc_id, ["true"])
    assert session.frames == [
        {"stdout": {"close": True}},
        {"stderr": {"close": True}},
        {"exited": True, "result": {}},
    ]
    assert session.dropped  # no close frame after the exit: the connection just ends


async def test_stdout_and_stderr_apart_in_order_and_the_exit_code(
    server: SimServer, alloc_id: str
) -> None:
    script = "echo one; echo oops >&2; echo two; echo again >&2; exit 3"
    session = await run(server, alloc_id, [SH, "-c", script])
    assert session.data("stdout") == b"one\ntwo\n"
    assert session.data("stderr") == b"oops\nagain\n"
    assert exit_frame(session) == {"exited": True, "result": {"exit_code": 3}}
    assert session.dropped


async def test_stdin_reaches_the_process_and_its_close_is_eof(
    server: SimServer, alloc_id: str
) -> None:
    session = await run(server, alloc_id, ["cat"], stdin=b"hello\nworld\n")
    assert session.data("stdout") == b"hello\nworld\n"
    assert exit_frame(session)["result"] == {}


async def test_output_streams_as_it_comes(server: SimServer, alloc_id: str) -> None:
    command = [SH, "-c", "echo first; read answer; echo second $answer"]
    async with exec_socket(server, alloc_id, command) as ws:
        # The process waits for input, so this frame came before it could end.
        assert await next_frame(ws) == {"stdout": {"data": "Zmlyc3QK"}}  # "first\n"
        await send_stdin(ws, b"42\n")
        session = await read_session(ws)
    assert session.data("stdout") == b"second 42\n"
    assert exit_frame(session)["result"] == {}


async def test_an_output_frame_carries_at_most_1024_bytes(server: SimServer, alloc_id: str) -> None:
    session = await run(server, alloc_id, [SH, "-c", "head -c 5000 /dev/zero | tr '\\0' a"])
    sizes = [len(chunk) for chunk in session.chunks("stdout")]
    assert sum(sizes) == 5000 and max(sizes) <= 1024 and len(sizes) >= 5


async def test_tty_merges_stderr_ends_lines_with_crlf_and_echoes_stdin(
    server: SimServer, alloc_id: str
) -> None:
    script = "read line; echo got $line; echo oops >&2"
    session = await run(server, alloc_id, [SH, "-c", script], stdin=b"hi\n", tty="true")
    assert session.data("stdout") == b"hi\r\ngot hi\r\noops\r\n"
    assert session.data("stderr") == b""
    assert exit_frame(session)["result"] == {}


async def test_with_a_tty_closing_stdin_ends_the_input(server: SimServer, alloc_id: str) -> None:
    session = await run(server, alloc_id, ["cat"], stdin=b"abc\n", tty="true")
    assert session.data("stdout") == b"abc\r\nabc\r\n"
    assert exit_frame(session)["result"] == {}


async def test_heartbeats_resizes_and_unknown_keys_are_accepted(
    server: SimServer, alloc_id: str
) -> None:
    async with exec_socket(server, alloc_id, ["cat"]) as ws:
        for frame in ({}, {"foo": 1}, {"tty_size": {"height": 40, "width": 120}}):
            await ws.send_str(json.dumps(frame))
        await ws.ping()
        await send_stdin(ws, b"still here\n")
        await close_stdin(ws)
        session = await read_session(ws)
    assert session.data("stdout") == b"still here\n"


async def test_a_tty_resize_reaches_the_terminal(server: SimServer, alloc_id: str) -> None:
    async with exec_socket(server, alloc_id, [SH, "-c", "read go; stty size"], tty="true") as ws:
        await ws.send_str(json.dumps({"tty_size": {"height": 33, "width": 99}}))
        await send_stdin(ws, b"go\n")
        session = await read_session(ws)
    assert session.data("stdout").endswith(b"33 99\r\n")


async def test_an_undecodable_frame_closes_1011_at_the_next_output(
    server: SimServer, alloc_id: str
) -> None:
    async with exec_socket(server, alloc_id, [SH, "-c", "echo ready; sleep 0.3; echo late"]) as ws:
        assert "stdout" in await next_frame(ws)
        await ws.send_str("hello")
        session = await read_session(ws)
    assert session.frames == []  # "late" was not sent: the close frame took its place
    assert session.close == (1011, "invalid character 'h' looking for beginning of value")


async def test_stdin_after_its_close_ends_the_session_without_an_exit(
    server: SimServer, alloc_id: str
) -> None:
    async with exec_socket(server, alloc_id, [SH, "-c", "read line; sleep 0.2"]) as ws:
        await send_stdin(ws, b"x\n")
        await close_stdin(ws)
        await send_stdin(ws, b"too late\n")
        session = await read_session(ws)
    assert session.frames == [{"stdout": {"close": True}}, {"stderr": {"close": True}}]
    assert session.dropped


async def test_a_command_that_cannot_start_closes_1011(server: SimServer, alloc_id: str) -> None:
    session = await run(server, alloc_id, ["no-such-command-here"])
    reason = (
        'failed to start exec: exec: "no-such-command-here": executable file not found in $PATH'
    )
    assert session.close == (1011, reason)


# ---------------------------------------------------------------------- the process
async def test_environment_and_working_directory(
    server: SimServer, sim: Simulator, alloc_id: str
) -> None:
    session = await run(server, alloc_id, [SH, "-c", "pwd; env"])
    cwd, *lines = session.data("stdout").decode().splitlines()
    env = dict(line.split("=", 1) for line in lines if "=" in line)
    alloc = sim.alloc(alloc_id)
    root = os.path.dirname(cwd)
    assert os.path.basename(root) == alloc_id and os.path.basename(cwd) == "main"
    assert env["NOMAD_ALLOC_ID"] == alloc_id
    assert env["NOMAD_SHORT_ALLOC_ID"] == alloc_id[:8]
    assert env["NOMAD_ALLOC_NAME"] == alloc["Name"] == "j.g[0]"
    assert env["NOMAD_ALLOC_INDEX"] == "0"
    assert (env["NOMAD_JOB_ID"], env["NOMAD_GROUP_NAME"], env["NOMAD_TASK_NAME"]) == (
        "j",
        "g",
        "main",
    )
    assert (env["NOMAD_NAMESPACE"], env["NOMAD_REGION"], env["NOMAD_DC"]) == (
        "default",
        "global",
        "dc1",
    )
    assert (env["NOMAD_CPU_LIMIT"], env["NOMAD_MEMORY_LIMIT"]) == ("100", "128")
    assert env["NOMAD_ALLOC_DIR"] == f"{root}/alloc"
    assert env["NOMAD_TASK_DIR"] == f"{cwd}/local"
    assert env["NOMAD_SECRETS_DIR"] == f"{cwd}/secrets"
    assert env["PATH"] == os.environ["PATH"]  # the simulator's own environment underneath
    layout = ("alloc/logs", "alloc/tmp", "alloc/data", "main/local", "main/tmp", "main/secrets")
    assert all(exists(f"{root}/{sub}/.") for sub in layout)


async def test_meta_and_the_tasks_env_reach_the_process(
    client: Client, server: SimServer, sim: Simulator
) -> None:
    job = service_job("m", Meta={"pool": "py", "my-key": "x"})
    job["TaskGroups"][0]["Tasks"][0]["Env"] = {"NOMAD_TASK_NAME": "mine"}
    alloc_id = await running_alloc(client, sim, job)
    session = await run(server, alloc_id, ["env"])
    env = dict(line.split("=", 1) for line in session.data("stdout").decode().splitlines())
    assert env["NOMAD_META_pool"] == env["NOMAD_META_POOL"] == "py"
    assert env["NOMAD_META_my_key"] == env["NOMAD_META_MY_KEY"] == "x"
    assert env["NOMAD_TASK_NAME"] == "mine"  # the task's own Env wins, as in Nomad


async def _started(
    server: SimServer, alloc_id: str, script: str
) -> tuple[aiohttp.ClientSession, aiohttp.ClientWebSocketResponse, list[int]]:
    """An exec whose first output line lists the PIDs to watch."""
    http = aiohttp.ClientSession()
    ws = await http.ws_connect(exec_url(server, alloc_id), params=exec_params([SH, "-c", script]))
    first = await next_frame(ws)
    return http, ws, [int(pid) for pid in base64.b64decode(first["stdout"]["data"]).split()]


@pytest.fixture
async def watched(
    server: SimServer, alloc_id: str
) -> AsyncIterator[tuple[aiohttp.ClientWebSocketResponse, list[int]]]:
    """A running exec, with the PIDs of its shell and of a child in the background."""
    http, ws, pids = await _started(server, alloc_id, "sleep 60 & echo $$ $!; wait")
    assert all(alive(pid) for pid in pids)
    yield ws, pids
    await ws.close()
    await http.close()


async def test_stopping_the_allocation_kills_its_processes(
    client: Client,
    sim: Simulator,
    alloc_id: str,
    watched: tuple[aiohttp.ClientWebSocketResponse, list[int]],
) -> None:
    ws, pids = watched
    root = sim.sandboxes.open(sim.alloc(alloc_id)).path
    status, _, _ = await client.post(f"/v1/allocation/{alloc_id}/stop")
    assert status == 200
    session = await read_session(ws)
    # Its container is killed under it: SIGKILL, which a container runtime reports as 137.
    assert exit_frame(session) == {"exited": True, "result": {"exit_code": 137}}
    await wait_until(lambda: not any(alive(pid) for pid in pids))
    assert exists(root)  # kept, as a client keeps it until its garbage collection


async def test_an_oom_restart_kills_the_execs_and_keeps_the_directory(
    server: SimServer,
    sim: Simulator,
    alloc_id: str,
    watched: tuple[aiohttp.ClientWebSocketResponse, list[int]],
) -> None:
    ws, pids = watched
    await run(server, alloc_id, ["touch", "kept"])
    await sim.oom_restart(alloc_id)
    session = await read_session(ws)
    assert exit_frame(session)["result"] == {"exit_code": 137}
    await wait_until(lambda: not any(alive(pid) for pid in pids))
    assert sim.alloc(alloc_id)["ClientStatus"] == "running"
    again = await run(server, alloc_id, ["ls"])
    assert b"kept" in again.data("stdout")


async def test_a_node_going_down_drops_the_connection(
    sim: Simulator,
    alloc_id: str,
    watched: tuple[aiohttp.ClientWebSocketResponse, list[int]],
) -> None:
    ws, pids = watched
    await sim.node_down("sim-node-1")
    session = await read_session(ws)
    assert session.frames == [] and session.dropped  # no close frames, no exit: TCP ends
    await wait_until(lambda: not any(alive(pid) for pid in pids))


async def test_a_client_that_leaves_does_not_kill_the_process(
    sim: Simulator,
    alloc_id: str,
    watched: tuple[aiohttp.ClientWebSocketResponse, list[int]],
) -> None:
    ws, pids = watched
    await ws.close()
    await asyncio.sleep(0.3)
    assert all(alive(pid) for pid in pids)
    await sim.finish_allocation(alloc_id)
    await wait_until(lambda: not any(alive(pid) for pid in pids))


async def test_shutdown_kills_the_processes_and_removes_the_directories() -> None:
    sim = Simulator(nodes=["n"], seed=2, start_delay=START_DELAY, exec_mode="local")
    server = await start_sim(sim)
    async with aiohttp.ClientSession() as http:
        alloc_id = await running_alloc(Client(http, server.url), sim)
    session, ws, pids = await _started(server, alloc_id, "echo $$; exec sleep 60")
    root = os.path.dirname(sim.sandboxes.open(sim.alloc(alloc_id)).path)
    try:
        await server.stop()
        await wait_until(lambda: not any(alive(pid) for pid in pids))
        assert not exists(root)
    finally:
        await ws.close()
        await session.close()


@pytest.mark.slow
async def test_shutdown_amid_a_stdin_flood_ends_every_session_without_an_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Many sessions whose clients still flood stdin when the simulator stops: each ends
    at once, before the HTTP server's own shutdown (which logs an InvalidStateError for a
    request that ends just as its grace period runs out)."""
    sim = Simulator(nodes=["n"], seed=2, start_delay=START_DELAY, exec_mode="local")
    server = await start_sim(sim)
    chunk = b"x" * (1 << 20)

    async def flood(ws: aiohttp.ClientWebSocketResponse) -> None:
        while True:
            await send_stdin(ws, chunk)

    async with aiohttp.ClientSession() as http:
        alloc_id = await running_alloc(Client(http, server.url), sim)
        url, query = exec_url(server, alloc_id), exec_params(["sleep", "60"])
        sockets = [await http.ws_connect(url, params=query) for _ in range(48)]
        floods = [asyncio.create_task(flood(ws)) for ws in sockets]
        await asyncio.sleep(2)
        for task in floods:
            task.cancel()
        await asyncio.gather(*floods, return_exceptions=True)
        await server.stop()
        for ws in sockets:
            await ws.close()
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text


# ---------------------------------------------------------------------- refusals
async def close_of(server: SimServer, alloc_id: str, **params: str) -> tuple[int, str]:
    params.setdefault("command", json.dumps(["true"]))
    params.setdefault("task", "main")
    """How an exec with these raw query parameters is refused."""
    url = exec_url(server, alloc_id)
    async with aiohttp.ClientSession() as http, http.ws_connect(url, params=params) as ws:
        session = await read_session(ws)
    assert session.frames == []
    return session.close


async def test_unknown_allocation_closes_1008(server: SimServer) -> None:
    unknown = "6b1f0000-0000-0000-0000-000000000000"
    assert await close_of(server, unknown) == (1008, f'Unknown allocation "{unknown}"')


async def test_a_malformed_allocation_id_closes_1011(server: SimServer) -> None:
    reason = "alloc lookup failed: index error: UUID must be 36 characters"
    assert await close_of(server, "foo") == (1011, reason)


async def test_the_id_is_matched_as_a_uuid(server: SimServer, alloc_id: str) -> None:
    session = await run(server, alloc_id.upper(), ["true"])
    assert exit_frame(session)["result"] == {}


async def test_a_terminal_allocation_closes_1008(
    server: SimServer, sim: Simulator, alloc_id: str
) -> None:
    await sim.finish_allocation(alloc_id)
    reason = f"exec not possible, client status of allocation {alloc_id} is complete"
    assert await close_of(server, alloc_id) == (1008, reason)


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({"task": ""}, (1008, "must provide task name")),
        ({"command": "[]"}, (1008, "command is not present")),
        ({"command": "null"}, (1008, "command is not present")),
        # The client asks the task's driver first, and that fails for an unknown task.
        ({"task": "nope"}, (1011, "task not found")),
    ],
)
async def test_what_the_client_refuses(
    server: SimServer, alloc_id: str, params: dict[str, str], expected: tuple[int, str]
) -> None:
    assert await close_of(server, alloc_id, **params) == expected


async def test_a_task_not_started_or_not_running_closes_1008(
    client: Client, server: SimServer, sim: Simulator
) -> None:
    sim.set_start_delay(30)
    await client.register({"ID": "p", **_one_task_group()})
    await wait_until(lambda: bool(sim.allocations("p")))
    pending = sim.allocations("p")[0]["ID"]
    assert await close_of(server, pending) == (1008, 'task "main" not started yet.')
    sim.set_start_delay(START_DELAY)
    alloc_id = await running_alloc(client, sim)
    # A task that has ended in a running allocation (the simulator has no such fault).
    state = sim.alloc(alloc_id)["TaskStates"]["main"]
    sim.alloc(alloc_id)["TaskStates"]["main"] = {**state, "State": "dead"}
    assert await close_of(server, alloc_id) == (1008, 'task "main" is not running.')


async def test_a_reason_too_long_for_a_close_frame_just_ends_the_connection(
    client: Client, server: SimServer, sim: Simulator
) -> None:
    task = "t" * 120
    sim.set_start_delay(30)
    await client.register({"ID": "long", **_one_task_group(task)})
    await wait_until(lambda: bool(sim.allocations("long")))
    session = await run(server, sim.allocations("long")[0]["ID"], ["true"], task=task)
    assert session.frames == [] and session.dropped


async def test_a_down_node_has_no_path(
    server: SimServer, sim: Simulator, alloc_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Between the node's going down and the plan that marks its allocations lost.
    monkeypatch.setattr(sim.scheduler, "schedule", lambda *args: None)
    await sim.node_down("sim-node-1")
    assert await close_of(server, alloc_id) == (1008, "No path to node")


def _one_task_group(task_name: str = "main") -> dict[str, object]:
    task = {"Name": task_name, "Driver": "docker", "Config": {"image": "runner:1"}}
    return {"Type": "service", "TaskGroups": [{"Name": "g", "Count": 1, "Tasks": [task]}]}


# ---------------------------------------------------------------------- before the upgrade
@pytest.mark.parametrize(
    ("params", "body"),
    [
        (
            {"command": "ls"},
            "failed to marshal command into json: "
            "invalid character 'l' looking for beginning of value",
        ),
        (
            {"command": '"ls"'},
            "failed to marshal command into json: "
            "json: cannot unmarshal string into Go value of type []string",
        ),
        ({"command": ""}, "failed to marshal command into json: unexpected end of JSON input"),
        (
            {"command": '["ls"]', "tty": "maybe"},
            'tty value is not a boolean: strconv.ParseBool: parsing "maybe": invalid syntax',
        ),
    ],
)
async def test_a_bad_command_or_tty_is_a_plain_500(
    client: Client, alloc_id: str, params: dict[str, str], body: str
) -> None:
    status, text, _ = await client.get(f"/v1/client/allocation/{alloc_id}/exec", **params)
    assert (status, text) == (500, body)


async def test_a_request_that_is_no_upgrade_is_a_400(client: Client, alloc_id: str) -> None:
    status, text, headers = await client.get(
        f"/v1/client/allocation/{alloc_id}/exec", command='["ls"]', task="main"
    )
    assert status == 400
    assert text == (
        "Bad Request\nfailed to upgrade connection: websocket: the client is not using the "
        "websocket protocol: 'upgrade' token not found in 'Connection' header"
    )
    assert headers["Sec-Websocket-Version"] == "13"


async def test_another_origin_is_a_403(server: SimServer, alloc_id: str) -> None:
    async with aiohttp.ClientSession() as http:
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await http.ws_connect(
                exec_url(server, alloc_id),
                params=exec_params(["true"]),
                headers={"Origin": "http://elsewhere.example"},
            )
    assert refused.value.status == 403


@pytest.mark.parametrize("path", ["x", "x/exec/more", "x/stats", ""])
async def test_other_shapes_of_the_path_are_a_404(client: Client, path: str) -> None:
    status, text, _ = await client.get(f"/v1/client/allocation/{path}")
    assert (status, text) == (404, "resource not found")


# ---------------------------------------------------------------------- ACL and modes
@pytest.fixture
async def acl_server() -> AsyncIterator[tuple[SimServer, str, str]]:
    """An ACL-enabled local simulator with a running allocation: (server, its ID, the
    management token's secret)."""
    sim = Simulator(
        nodes=["n"], seed=3, start_delay=START_DELAY, acl_enabled=True, exec_mode="local"
    )
    server = await start_sim(sim)
    root = sim.bootstrap()["SecretID"]
    async with aiohttp.ClientSession(headers={"X-Nomad-Token": root}) as http:
        alloc_id = await running_alloc(Client(http, server.url), sim)
    yield server, alloc_id, root
    await server.stop()


def _client_token(server: SimServer) -> str:
    sim = server.sim
    sim.put_policy("readonly", {"Rules": 'namespace "default" { policy = "read" }'})
    return str(sim.create_token({"Type": "client", "Policies": ["readonly"]})["SecretID"])


async def test_a_token_without_alloc_exec_closes_1011(
    acl_server: tuple[SimServer, str, str],
) -> None:
    server, alloc_id, _ = acl_server
    reader = {"X-Nomad-Token": _client_token(server)}
    for headers in (reader, {"X-Nomad-Token": "not-a-token"}, {}):
        session = await run(server, alloc_id, ["true"], headers=headers)
        assert session.close == (1011, "Permission denied"), headers


async def test_a_management_token_may_exec_by_header_or_bearer(
    acl_server: tuple[SimServer, str, str],
) -> None:
    server, alloc_id, root = acl_server
    for headers in ({"X-Nomad-Token": root}, {"Authorization": f"Bearer {root}"}):
        session = await run(server, alloc_id, ["true"], headers=headers)
        assert exit_frame(session)["result"] == {}


def _token_of_policy(sim: Simulator, name: str, rules: str) -> dict[str, str]:
    sim.put_policy(name, {"Rules": rules})
    secret = sim.create_token({"Type": "client", "Policies": [name]})["SecretID"]
    return {"X-Nomad-Token": secret}


async def test_the_policies_decide_who_may_exec(acl_server: tuple[SimServer, str, str]) -> None:
    server, alloc_id, _ = acl_server
    sim = server.sim
    writer = _token_of_policy(sim, "writer", 'namespace "default" { policy = "write" }')
    assert exit_frame(await run(server, alloc_id, ["true"], headers=writer))["result"] == {}
    elsewhere = _token_of_policy(sim, "elsewhere", 'namespace "other" { policy = "write" }')
    session = await run(server, alloc_id, ["true"], headers=elsewhere)
    assert session.close == (1011, "Permission denied")
    # Without a token: the policy named "anonymous", here one that grants alloc-exec.
    sim.put_policy("anonymous", {"Rules": 'namespace "*" { capabilities = ["alloc-exec"] }'})
    assert exit_frame(await run(server, alloc_id, ["true"]))["result"] == {}


async def test_a_raw_exec_task_also_needs_alloc_node_exec(
    acl_server: tuple[SimServer, str, str],
) -> None:
    server, _, root = acl_server
    sim = server.sim
    job = service_job("raw")
    job["TaskGroups"][0]["Tasks"][0]["Driver"] = "raw_exec"
    async with aiohttp.ClientSession(headers={"X-Nomad-Token": root}) as http:
        alloc_id = await running_alloc(Client(http, server.url), sim, job)
    writer = _token_of_policy(sim, "writer", 'namespace "default" { policy = "write" }')
    session = await run(server, alloc_id, ["true"], headers=writer)
    assert session.close == (1011, "Permission denied")
    node_exec = _token_of_policy(
        sim, "node-exec", 'namespace "default" { capabilities = ["alloc-exec", "alloc-node-exec"] }'
    )
    assert exit_frame(await run(server, alloc_id, ["true"], headers=node_exec))["result"] == {}


async def test_the_handshake_frame_carries_the_token(
    acl_server: tuple[SimServer, str, str],
) -> None:
    server, alloc_id, root = acl_server
    async with exec_socket(server, alloc_id, ["true"], ws_handshake="true") as ws:
        await ws.send_str(json.dumps({"version": 1, "auth_token": root}))
        session = await read_session(ws)
    assert exit_frame(session)["result"] == {}


@pytest.mark.parametrize(
    ("first", "expected"),
    [
        ({"version": 2, "auth_token": "x"}, (1008, "unexpected handshake value: 2")),
        (
            {"version": "1"},
            (
                1008,
                "json: cannot unmarshal string into Go struct field "
                "wsHandshakeMessage.version of type int",
            ),
        ),
        # The frame's token replaces the header's, even when it is empty.
        ({"version": 1}, (1011, "Permission denied")),
    ],
)
async def test_a_bad_handshake(
    acl_server: tuple[SimServer, str, str], first: dict[str, object], expected: tuple[int, str]
) -> None:
    server, alloc_id, root = acl_server
    headers = {"X-Nomad-Token": root}
    async with exec_socket(server, alloc_id, ["true"], headers, ws_handshake="true") as ws:
        await ws.send_str(json.dumps(first))
        session = await read_session(ws)
    assert session.close == expected


async def test_without_exec_local_a_running_task_closes_1011() -> None:
    sim = Simulator(nodes=["n"], seed=1, start_delay=START_DELAY)
    server = await start_sim(sim)
    try:
        async with aiohttp.ClientSession() as http:
            alloc_id = await running_alloc(Client(http, server.url), sim)
        session = await run(server, alloc_id, ["true"])
        assert session.close == (1011, NO_LOCAL_EXEC)
        assert "--exec local" in NO_LOCAL_EXEC and len(NO_LOCAL_EXEC.encode()) <= 123
    finally:
        await server.stop()


def test_an_unknown_exec_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="docker"):
        Simulator(exec_mode="docker")
