"""The Poseidon API's files, executions and WebSocket (`run --poseidon-api`) against a
simulator with `--exec local`, whose runner tasks run real processes in real directories:
CodeOcean's calls replayed in its order, with Poseidon's status codes, bodies and frames."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import pwd
import secrets
import signal
import sys
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from hypothesis import given
from hypothesis import strategies as st

from controller.core.times import parse_time
from controller.executions.manager import MAX_WAITING_PER_RUNNER
from controller.lab.simulator import Simulator
from controller.nomad.jobs import TASK_NAME
from controller.standalone import Controller
from tests.simulator.exec_support import alive
from tests.support.fuzzing import against_live_service
from tests.support.ports import free_port
from tests.support.waiting import wait_until

from .conftest import TOKEN, FakeClock, Harness, write_pools
from .executions_support import (
    Stream,
    abandon_download,
    access_log,
    assert_one_quiet_line,
    gone,
    readers_of,
)
from .test_poseidon import (
    MANAGED,
    NO_RUNNER,
    OVERLOAD,
    Answer,
    CodeOcean,
    after_passes,
    environment_pool,
    idle_runners_run,
    managed_with_a_claim,
    start,
    start_with_a_java_token,
    synced,
)
from .test_process import API_TOKEN, Process

NO_FILE = b'{"message":"file not found or insufficient permissions"}'
EXERCISE = "name = input('What is your name? ')\nprint('Hello ' + name)\n"


@pytest.fixture
async def sim() -> AsyncIterator[Simulator]:
    yield Simulator(seed=1, start_delay=0.05, exec_mode="local")


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def task_dir(harness: Harness, runner_id: str) -> Path:
    """The runner task's working directory on this machine."""
    claim = harness.sim.variables("default")[f"poolkeeper/claims/{runner_id}"]
    sandboxes = harness.sim.sandboxes
    box = sandboxes.open(sandboxes.lookup(claim["Items"]["allocationId"]))
    return Path(box.task_dir(TASK_NAME))


class Session:
    """One learner's runner as CodeOcean drives it."""

    def __init__(self, codeocean: CodeOcean, runner_id: str) -> None:
        self.codeocean = codeocean
        self.runner_id = runner_id
        self.path = f"/runners/{runner_id}"

    @classmethod
    async def claim(cls, codeocean: CodeOcean, env_id: int, inactivity: int = 180) -> Session:
        answer = await codeocean.claim(env_id, inactivity)
        assert answer.status == 200, answer
        return cls(codeocean, answer.json()["runnerId"])

    async def copy(self, **body: Any) -> Answer:
        return await self.codeocean.call("PATCH", self.path + "/files", body)

    async def execute(self, command: str, time_limit: int = 60, **fields: Any) -> Answer:
        body = {"command": command, "timeLimit": time_limit, "privilegedExecution": False}
        return await self.codeocean.call("POST", self.path + "/execute", {**body, **fields})

    async def run(self, command: str, time_limit: int = 60, **fields: Any) -> Stream:
        """Execute and connect to the WebSocket URL, as CodeOcean's Faye client does."""
        answer = await self.execute(command, time_limit, **fields)
        assert answer.status == 200, answer
        return await Stream.open(answer.json()["websocketUrl"], headers={"Poseidon-Token": TOKEN})

    async def files(self, **params: str) -> Answer:
        return await self.codeocean.call("GET", self.path + "/files", params=params)


@pytest.fixture
async def session(harness: Harness, tmp_path: Path, http: aiohttp.ClientSession) -> Session:
    """A claimed runner of environment 10, whose pool keeps one idle runner."""
    controller = await start(harness, tmp_path, environment_pool("python", 10, 1))
    return await Session.claim(CodeOcean(http, controller), 10)


async def started(stream: Stream) -> None:
    assert await stream.next() == {"type": "start"}


async def test_codeocean_runs_a_submission(harness: Harness, tmp_path: Path, http) -> None:
    controller = await start(harness, tmp_path, environment_pool("python", 10, 1, maxRunners=1))
    codeocean = CodeOcean(http, controller)
    assert (await codeocean.call("PUT", "/execution-environments/10", synced(10, size=1))).status
    await codeocean_sequence(harness, controller, codeocean, 10)


async def test_codeocean_runs_a_submission_in_a_managed_environment(
    harness: Harness, tmp_path: Path, http
) -> None:
    controller = await start(harness, tmp_path, poseidon=MANAGED)
    codeocean = CodeOcean(http, controller)
    created = await codeocean.call("PUT", "/execution-environments/11", synced(11, size=1))
    assert created.status == 201
    await harness.settled(controller)
    await codeocean_sequence(harness, controller, codeocean, 11)


async def codeocean_sequence(
    harness: Harness, controller: Controller, codeocean: CodeOcean, env_id: int
) -> None:
    session = await Session.claim(codeocean, env_id)
    workspace = task_dir(harness, session.runner_id)
    (workspace / "stale.py").write_text("from an earlier submission")
    (workspace / ".profile").write_text("a dot file ./* leaves")

    # copy_files: delete ['./*'], one entry per directory (trailing /), then the files.
    copied = await session.copy(
        delete=["./*"],
        copy=[
            {"path": "tests/"},
            {"path": "exercise.py", "content": b64(EXERCISE)},
            {"path": "tests/test_ex.py", "content": ""},
        ],
    )
    assert (copied.status, copied.body) == (204, b"")
    assert sorted(p.name for p in workspace.iterdir()) == [".profile", "exercise.py", "tests"]
    assert (workspace / "exercise.py").read_text() == EXERCISE
    assert oct((workspace / "exercise.py").stat().st_mode & 0o7777) == "0o744"
    assert oct((workspace / "tests").stat().st_mode & 0o7777) == "0o1777"

    # Run it: the URL from the request's Host, then Poseidon's frames; stdin verbatim.
    executed = await session.execute("python3 exercise.py")
    assert executed.status == 200
    url = executed.json()["websocketUrl"]
    host = controller.url.removeprefix("http://")
    assert url.startswith(f"ws://{host}/api/v1/runners/{session.runner_id}/websocket?executionID=")
    async with await Stream.open(url, headers={"Poseidon-Token": TOKEN}) as stream:
        await started(stream)
        # Python writes input()'s prompt to stderr when stdin and stdout are a terminal
        # (as they are under Poseidon: stderr apart, through a FIFO).
        await stream.output_until("What is your name? ", stream="stderr")
        await stream.ws.send_str("Alice\n")
        assert await stream.to_end() == {"type": "exit", "data": 0}
        # A terminal, as Poseidon's: the input is echoed, lines end in CRLF.
        assert stream.output() == "Alice\r\nHello Alice\r\n"
        assert stream.output("stderr") == "What is your name? "

    # After an exit, CodeOcean lists the files and downloads what it needs.
    listed = await session.files(path="./", recursive="true", privilegedExecution="false")
    assert listed.status == 200
    headers = {entry["name"]: entry for entry in listed.json()["files"]}
    assert set(headers) == {"./exercise.py", "./tests", "./tests/test_ex.py"}  # no dot files
    user = pwd.getpwuid(os.getuid()).pw_name
    mtime = int((workspace / "exercise.py").stat().st_mtime)
    assert headers["./exercise.py"] == {
        "name": "./exercise.py", "entryType": "-", "size": len(EXERCISE),
        "modificationTime": mtime, "permissions": "rwxr--r--",
        "owner": user, "group": headers["./exercise.py"]["group"],
    }  # fmt: skip
    assert (headers["./tests"]["entryType"], headers["./tests"]["permissions"]) == (
        "d",
        "rwxrwxrwt",
    )
    flat = await session.files(path="tests", recursive="false")
    assert [entry["name"] for entry in flat.json()["files"]] == ["test_ex.py"]
    one = await session.files(path="exercise.py")  # a file: its name as given
    assert [entry["name"] for entry in one.json()["files"]] == ["exercise.py"]
    (workspace / "link").symlink_to("exercise.py")
    linked = {e["name"]: e for e in (await session.files(recursive="maybe")).json()["files"]}
    assert (linked["./link"]["entryType"], linked["./link"]["linkTarget"]) == ("l", "exercise.py")
    assert "linkTarget" not in linked["./exercise.py"]  # only links have one

    raw = await codeocean.call("GET", session.path + "/files/raw", params={"path": "exercise.py"})
    assert (raw.status, raw.body) == (200, EXERCISE.encode())
    assert raw.headers["Content-Length"] == str(len(EXERCISE))
    assert raw.headers["Content-Disposition"] == 'attachment; filename="exercise.py"'
    missing = await codeocean.call("GET", session.path + "/files/raw", params={"path": "nope"})
    assert (missing.status, missing.body) == (424, NO_FILE)
    unlisted = await session.files(path="nope")
    assert (unlisted.status, unlisted.body) == (424, NO_FILE)

    # The pool's only runner is claimed: another learner's claim is NOMAD_OVERLOAD.
    overload = await codeocean.claim(env_id)
    assert (overload.status, overload.body) == (500, OVERLOAD)
    destroyed = await codeocean.call("DELETE", session.path)
    assert (destroyed.status, destroyed.body) == (204, b"")
    await harness.settled(controller)


async def test_stdout_stderr_exit_codes_and_the_environment(session: Session) -> None:
    command = 'echo "$CODEOCEAN $GREETING"; echo oops >&2; exit 300'
    async with await session.run(command, environment={"GREETING": "hi there"}) as stream:
        await started(stream)
        assert await stream.to_end() == {"type": "exit", "data": 300 & 0xFF}
        # stderr comes apart from the terminal's output (not through it: no CR).
        assert (stream.output(), stream.output("stderr")) == ("true hi there\r\n", "oops\n")


async def test_a_time_limit_is_timeout_and_codeocean_deletes_the_runner(session: Session) -> None:
    codeocean = session.codeocean
    async with await session.run("echo $$; sleep 60 & echo $!; wait", time_limit=1) as stream:
        await started(stream)
        running = await stream.pids(2)
        assert await stream.to_end() == {"type": "timeout"}
    await gone(*running)
    deleted = await codeocean.call("DELETE", session.path)
    assert (deleted.status, deleted.body) == (204, b"")
    # A runner CodeOcean still holds the ID of: 410, and it claims a new one.
    again = await session.execute("true")
    assert (again.status, again.body) == (410, NO_RUNNER)
    retried = await Session.claim(codeocean, 10)
    assert (await retried.execute("true")).status == 200


async def test_a_binary_frame_stops_stdin_and_a_close_cancels(session: Session) -> None:
    async with await session.run("echo $$; cat") as stream:
        await started(stream)
        [shell] = await stream.pids(1)
        await stream.ws.send_str("first\n")
        await stream.output_until("first\r\nfirst\r\n")  # echoed, then cat's
        await stream.ws.send_bytes(b"\x00")
        await stream.ws.send_str("second\n")
        with pytest.raises(TimeoutError):
            await stream.next(within=0.5)  # not forwarded: cat has nothing to echo
        assert alive(shell)
    await gone(shell)  # the client's close cancelled the execution


async def test_deleting_the_runner_ends_its_execution_as_expected(session: Session) -> None:
    codeocean = session.codeocean
    async with await session.run("echo up; sleep 60") as stream:
        await stream.output_until("up")
        assert (await codeocean.call("DELETE", session.path)).status == 204
        end = await stream.to_end()
        assert end == {"type": "error", "data": "the allocation stopped as expected"}


async def test_an_oom_killed_allocation_is_poseidons_oom_text(
    harness: Harness, session: Session
) -> None:
    async with await session.run("echo up; sleep 60") as stream:
        await stream.output_until("up")
        claim = harness.sim.variables("default")[f"poolkeeper/claims/{session.runner_id}"]
        await harness.sim.oom_restart(claim["Items"]["allocationId"])
        assert await stream.to_end() == {"type": "error", "data": "the allocation was OOM Killed"}

    async def lost() -> bool:
        return (await session.execute("true")).status == 410

    await after_passes(session.codeocean.controller, lost, "the OOM-killed runner to be gone")


async def test_inactivity_is_reset_by_starts_and_file_requests_not_by_execute(
    harness: Harness, tmp_path: Path, http
) -> None:
    clock = FakeClock()
    controller = await start(harness, tmp_path, environment_pool("python", 10, 3), clock=clock)
    codeocean = CodeOcean(http, controller)
    claimed_at = clock.now
    stored_only, touched, started_one = [
        await Session.claim(codeocean, 10, inactivity=30) for _ in range(3)
    ]

    def deadline(session: Session) -> timedelta:
        """When the runner's claim expires, after the claims were made."""
        items = harness.sim.variables("default")[f"poolkeeper/claims/{session.runner_id}"]
        return parse_time(items["Items"]["expiresAt"]) - claimed_at

    clock.advance(20)
    assert (await stored_only.execute("true")).status == 200  # stored, not started
    assert deadline(stored_only) == timedelta(seconds=30)
    assert (await touched.files()).status == 200  # a file request is activity
    assert deadline(touched) == timedelta(seconds=50)
    async with await started_one.run("echo up; sleep 60") as stream:
        await stream.output_until("up")
        assert deadline(started_one) == timedelta(seconds=50)  # so is the start
        clock.advance(15)
        expired = await stored_only.files()
        assert (expired.status, expired.body) == (410, NO_RUNNER)
        # A running execution does not hold the runner: past its inactivity timeout,
        # the runner is gone and the execution ends with `timeout`.
        clock.advance(16)
        await controller.engine.reconcile_namespace("default")
        assert await stream.to_end() == {"type": "timeout"}
    gone_runner = await started_one.files()
    assert (gone_runner.status, gone_runner.body) == (410, NO_RUNNER)


async def test_lone_surrogates_are_u_fffd_as_go_decodes_them(
    harness: Harness, session: Session
) -> None:
    """Poseidon's Go decoder makes U+FFFD of an escaped surrogate that is not half of a
    pair: paths, deletes, commands and environments carry it as any other character."""
    codeocean = session.codeocean
    copied = await codeocean.call(
        "PATCH",
        session.path + "/files",
        raw=b'{"delete": ["gone\\udc00"], "copy": [{"path": "a\\ud800.txt", "content": "aGk="}]}',
    )
    assert copied.status == 204, copied
    assert (task_dir(harness, session.runner_id) / "a\ufffd.txt").read_bytes() == b"hi"
    executed = await codeocean.call(
        "POST",
        session.path + "/execute",
        raw=b'{"command": "echo x\\ud800y; printenv V", "environment": {"V": "\\udfff"}}',
    )
    assert executed.status == 200, executed
    url = executed.json()["websocketUrl"]
    async with await Stream.open(url, headers={"Poseidon-Token": TOKEN}) as stream:
        await started(stream)
        assert await stream.to_end() == {"type": "exit", "data": 0}
        assert stream.output() == "x\ufffdy\r\n\ufffd\r\n"


async def test_bad_input_on_runner_routes_is_answered_as_poseidon_answers_it(
    session: Session,
) -> None:
    codeocean = session.codeocean
    quote = await session.execute("echo 'hi'")
    assert (quote.status, quote.body) == (400, b'{"message":"use of forbidden character"}')
    typed = await codeocean.call("POST", session.path + "/execute", raw=b'{"timeLimit": "1"}')
    assert typed.body == (
        b'{"message":"json: cannot unmarshal string into Go struct field '
        b'ExecutionRequest.timeLimit of type int"}'
    )
    base64_error = await session.copy(copy=[{"path": "a.py", "content": "aGk=x"}])
    assert (base64_error.status, base64_error.body) == (
        400,
        b'{"message":"illegal base64 data at input byte 4"}',
    )
    not_ascii = await session.copy(copy=[{"path": "a.py", "content": "aGk\u00e9"}])
    assert (not_ascii.status, not_ascii.body) == (
        400,
        b'{"message":"illegal base64 data at input byte 3"}',
    )
    escaping = await session.copy(copy=[{"path": "../outside.py", "content": ""}])
    assert (
        escaping.status == 400
        and "must not leave the working directory" in escaping.json()["message"]
    )
    for params in ({"path": "../.."}, {"path": "/nonexistent"}):
        refused = await session.files(**params)
        assert (refused.status, refused.body) == (424, NO_FILE)

    base = codeocean.base.replace("http://", "ws://") + session.path
    headers = {"Poseidon-Token": TOKEN}
    with pytest.raises(aiohttp.WSServerHandshakeError) as unknown:
        await Stream.open(base + "/websocket?executionID=nope", headers=headers)
    assert unknown.value.status == 404
    with pytest.raises(aiohttp.WSServerHandshakeError) as no_token:
        await Stream.open(base + "/websocket?executionID=nope")
    assert no_token.value.status == 401
    unknown_body = await codeocean.call("GET", session.path + "/websocket?executionID=nope")
    assert unknown_body.body == b'{"message":"execution id unknown"}'

    # A URL is used once.
    executed = await session.execute("true")
    url = executed.json()["websocketUrl"]
    async with await Stream.open(url, headers=headers) as stream:
        await started(stream)
        assert await stream.to_end() == {"type": "exit", "data": 0}
    with pytest.raises(aiohttp.WSServerHandshakeError) as used:
        await Stream.open(url, headers=headers)
    assert used.value.status == 404


async def test_the_token_and_its_scope_guard_the_runner_routes(
    harness: Harness, tmp_path: Path, http
) -> None:
    controller = await start_with_a_java_token(harness, tmp_path, idle=1)
    codeocean = CodeOcean(http, controller)
    session = await Session.claim(codeocean, 10)
    workspace = task_dir(harness, session.runner_id)
    before = sorted(workspace.iterdir())
    routes: list[tuple[str, str, Any]] = [
        ("GET", "/files", None),
        ("PATCH", "/files", {"copy": [{"path": "x.py", "content": ""}]}),
        ("GET", "/files/raw?path=x.py", None),
        ("POST", "/execute", {"command": "touch y.py"}),
        ("GET", "/websocket?executionID=x", None),
    ]
    for method, suffix, body in routes:
        for token in (None, "wrong-token"):
            refused = await codeocean.call(method, session.path + suffix, body, token=token)
            assert (refused.status, refused.body) == (401, b""), (method, suffix, token)
        # A token whose scope does not cover the environment sees no such runner.
        hidden = await codeocean.call(method, session.path + suffix, body, token="java-token")
        assert (hidden.status, hidden.body) == (410, NO_RUNNER), (method, suffix)
    assert sorted(workspace.iterdir()) == before  # nothing was written


async def test_a_managed_image_change_keeps_a_claimed_runner_working(
    harness: Harness, tmp_path: Path, http
) -> None:
    controller, codeocean, runner_id = await managed_with_a_claim(harness, tmp_path, http)
    session = Session(codeocean, runner_id)
    async with await session.run("echo up; read line; echo got $line") as stream:
        await stream.output_until("up")
        new_image = "openhpi/co_execenv_python:3.12"
        changed = synced(11, image=new_image)
        assert (await codeocean.call("PUT", "/execution-environments/11", changed)).status == 204
        await after_passes(
            controller,
            lambda: idle_runners_run(harness, new_image, runner_id),
            "the idle runners to roll over",
        )
        # The learner's execution ran on through the rollout.
        await stream.ws.send_str("still here\n")
        assert await stream.to_end() == {"type": "exit", "data": 0}
        assert stream.output() == "up\r\nstill here\r\ngot still here\r\n"
    assert (await session.files()).status == 200


@pytest.fixture
async def sim_process(tmp_path: Path) -> AsyncIterator[str]:
    """`poolkeeper sim --exec local` as a process of its own; its URL."""
    url = f"http://127.0.0.1:{free_port()}"
    log = (tmp_path / "sim.log").open("wb")
    args = ["-m", "controller", "sim", "--exec", "local", "--listen", url.removeprefix("http://")]
    process = await asyncio.create_subprocess_exec(sys.executable, *args, stderr=log)

    async def listening() -> bool:
        try:
            async with aiohttp.ClientSession() as http, http.get(url + "/v1/status/leader"):
                return True
        except aiohttp.ClientError:
            return False

    try:
        await wait_until(listening, within=30, what="the simulator")
        yield url
    finally:
        process.send_signal(signal.SIGTERM)
        await asyncio.wait_for(process.wait(), 20)
        log.close()


@pytest.mark.slow
async def test_poolkeeper_run_on_sim_exec_local_as_processes(
    sim_process: str, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    """The commands of docs/poseidon.md, each a process: one submission end to end."""
    pools = write_pools(tmp_path / "pools.yaml", environment_pool("python", 10, 1))
    controller = Process(pools, sim_process, tmp_path, options=("--poseidon-api",))
    controller.start()
    headers = {"Poseidon-Token": API_TOKEN}
    base = controller.url + "/api/v1"
    try:
        await wait_until(controller.ready, within=30, what="the controller")

        async def warm() -> bool:
            statistics = base + "/statistics/execution-environments"
            async with http.get(statistics, headers=headers) as response:
                counts: dict[str, int] = (await response.json())["10"]
            return counts["idleRunners"] == 1

        await wait_until(warm, within=30, what="environment 10's idle runner")
        claim = {"executionEnvironmentId": 10, "inactivityTimeout": 180}
        async with http.post(base + "/runners", json=claim, headers=headers) as response:
            runner = base + "/runners/" + (await response.json())["runnerId"]
        copy = {"delete": ["./*"], "copy": [{"path": "hello.sh", "content": b64("echo hi")}]}
        async with http.patch(runner + "/files", json=copy, headers=headers) as response:
            assert response.status == 204
        command = {"command": "bash hello.sh", "timeLimit": 10}
        async with http.post(runner + "/execute", json=command, headers=headers) as response:
            url = (await response.json())["websocketUrl"]
        async with await Stream.open(url, headers=headers) as stream:
            assert await stream.to_end() == {"type": "exit", "data": 0}
            assert stream.frames[0] == {"type": "start"} and stream.output() == "hi\r\n"
        async with http.delete(runner, headers=headers) as response:
            assert response.status == 204
    finally:
        assert await controller.signal(signal.SIGTERM) == 0
    assert "Traceback" not in controller.output()


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=12,
)
FIELDS = ["delete", "copy", "path", "content", "command", "timeLimit", "environment"]
BODIES = st.dictionaries(st.sampled_from(FIELDS), JSON_VALUES, max_size=4) | JSON_VALUES


@given(body=BODIES, route=st.sampled_from(["PATCH /files", "POST /execute"]))
@against_live_service(max_examples=60)
async def test_any_body_is_answered_as_poseidon_would_never_with_a_traceback(
    session: Session, body: Any, route: str
) -> None:
    method, suffix = route.split(" ")
    answer = await session.codeocean.call(
        method, session.path + suffix, raw=json.dumps(body).encode()
    )
    assert answer.status in (200, 204, 400), answer
    if answer.status == 400:
        assert set(answer.json()) == {"message"}, answer


@given(path=st.text(max_size=40), recursive=st.text(max_size=6))
@against_live_service(max_examples=40)
async def test_any_path_to_list_or_download_is_a_listing_a_file_or_424(
    session: Session, path: str, recursive: str
) -> None:
    listed = await session.files(path=path, recursive=recursive)
    assert listed.status in (200, 424), listed
    raw = await session.codeocean.call("GET", session.path + "/files/raw", params={"path": path})
    assert raw.status in (200, 424), raw
    if raw.status == 424:
        assert raw.body == NO_FILE


async def test_an_abandoned_raw_download_ends_its_command_quietly(
    harness: Harness, tmp_path: Path, http, caplog: pytest.LogCaptureFixture
) -> None:
    pool = environment_pool("python", 10, 1)
    controller = await start(harness, tmp_path, pool, access_log=True)
    session = await Session.claim(CodeOcean(http, controller), 10)
    name = f"big-{secrets.token_hex(6)}.bin"
    with (task_dir(harness, session.runner_id) / name).open("wb") as big:
        big.truncate(4 * 1024**3)  # sparse: more than a test would ever read
    caplog.set_level(logging.INFO)
    url = f"{controller.url}/api/v1{session.path}/files/raw"
    await abandon_download(url, {"Poseidon-Token": TOKEN}, name)

    await wait_until(lambda: not readers_of(name), within=10, what="the download's cat to end")
    await wait_until(lambda: bool(access_log(caplog)), what="the download's access-log line")
    assert access_log(caplog) == [("/api/v1/runners/{runnerId}/files/raw", 499)]
    assert_one_quiet_line(caplog, session.runner_id)


@pytest.mark.parametrize("end", ["release", "expiry", "loss"])
async def test_stored_executions_are_bounded_and_forgotten_when_the_claim_ends(
    harness: Harness, tmp_path: Path, http, end: str
) -> None:
    clock = FakeClock()
    controller = await start(harness, tmp_path, environment_pool("python", 10, 1), clock=clock)
    codeocean = CodeOcean(http, controller)
    session = await Session.claim(codeocean, 10, inactivity=30)
    command = "echo " + "x" * 60_000
    for _ in range(MAX_WAITING_PER_RUNNER):
        assert (await session.execute(command)).status == 200
    refused = await session.execute(command)
    assert refused.status == 400, refused
    assert f"{MAX_WAITING_PER_RUNNER} executions waiting" in refused.json()["message"]
    manager = controller.executions
    assert manager.waiting(session.runner_id) == MAX_WAITING_PER_RUNNER

    if end == "release":
        assert (await codeocean.call("DELETE", session.path)).status == 204
    elif end == "expiry":
        clock.advance(31)
        await controller.engine.reconcile_namespace("default")  # the holder expires it
    else:
        claim = harness.sim.variables("default")[f"poolkeeper/claims/{session.runner_id}"]
        await harness.sim.oom_restart(claim["Items"]["allocationId"])
    await wait_until(
        lambda: manager.waiting(session.runner_id) == 0, what=f"the {end} to forget them"
    )
