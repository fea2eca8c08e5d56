"""Executions end to end: a standalone controller against a simulator with `--exec local`,
whose runner tasks run real processes (a test that says a process is gone checks its PID)."""

from __future__ import annotations

import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from controller.lab.simulator import Simulator
from controller.standalone import Controller
from tests.simulator.exec_support import alive
from tests.support.documents import pool_doc
from tests.support.waiting import wait_until

from .conftest import FakeClock, Harness, write_pools
from .executions_support import Runner, Stream, claimed_runner, gone, pids


@pytest.fixture
async def sim() -> AsyncIterator[Simulator]:
    yield Simulator(seed=1, start_delay=0.05, exec_mode="local")


async def start(harness: Harness, tmp_path: Path, **spec: Any) -> Controller:
    pools = write_pools(tmp_path / "pools.yaml", pool_doc("py", idle=1, **spec))
    return await harness.start(pools)


@pytest.fixture
async def runner(harness: Harness, tmp_path: Path) -> Runner:
    return await claimed_runner(harness, await start(harness, tmp_path))


# ---- waited ------------------------------------------------------------------------------


async def test_a_waited_execution_answers_exit_code_stdout_and_stderr(runner: Runner) -> None:
    status, result = await runner.run(command="echo out; echo err >&2; exit 3")
    assert status == 200, result
    assert (result["exitCode"], result["stdout"], result["stderr"]) == (3, "out\n", "err\n")
    assert (result["timedOut"], result["outputTruncated"]) == (False, False)
    assert result["durationSeconds"] >= 0 and result["executionId"]


async def test_an_array_runs_as_is_and_stdin_is_sent(runner: Runner) -> None:
    status, result = await runner.run(command=["cat"], stdin="line one\nline two\n")
    assert (status, result["exitCode"], result["stdout"]) == (200, 0, "line one\nline two\n")
    status, result = await runner.run(command=["/bin/sh", "-c", "exit 42"])
    assert (status, result["exitCode"]) == (200, 42)


async def test_env_values_arrive_byte_for_byte(runner: Runner) -> None:
    env = {
        "SPACES": "  two  spaces  ",
        "QUOTES": 'it\'s "quoted" \\ back',
        "DOLLARS": "$HOME ${PATH} $(id) `id` $1 *",
        "NEWLINE": "a\nb",
        "EMPTY": "",
        "UNICODE": "grüße ✓",
    }
    # The command's own environment, as the kernel holds it.
    status, result = await runner.run(command=["cat", "/proc/self/environ"], env=env)
    assert status == 200, result
    environment = result["stdout"].split("\0")
    for name, value in env.items():
        assert f"{name}={value}" in environment


async def test_output_past_a_mebibyte_is_truncated(runner: Runner) -> None:
    status, result = await runner.run(command="head -c 1100000 /dev/zero | tr '\\0' x; echo e >&2")
    assert status == 200, result
    assert len(result["stdout"]) == 1024 * 1024 and result["outputTruncated"] is True
    assert result["stderr"] == "e\n"


async def test_a_waited_time_limit_kills_the_process(runner: Runner) -> None:
    command = "echo $$; sleep 60 & echo $!; wait"
    status, result = await runner.run(command=command, timeLimitSeconds=1)
    assert status == 200, result
    assert (result["timedOut"], result["exitCode"]) == (True, None)
    await gone(*pids(result["stdout"]))


# ---- streamed ----------------------------------------------------------------------------


async def test_a_stream_echoes_stdin_and_ends_with_exit(runner: Runner) -> None:
    async with await runner.stream(command=["cat"]) as stream:
        assert await stream.next() == {"type": "start"}
        await stream.send({"type": "stdin", "data": "héllo\n"})
        await stream.output_until("héllo\n")
        await stream.send({"type": "stdin", "data": "again\n"})
        await stream.send({"type": "stdinClose"})
        assert await stream.to_end() == {"type": "exit", "exitCode": 0}
        assert stream.output() == "héllo\nagain\n"


async def test_output_streams_as_it_comes(runner: Runner) -> None:
    async with await runner.stream(
        command='echo first; read answer; echo "second $answer"; exit 5'
    ) as stream:
        # The command waits for input: this line came while it was still running.
        await stream.output_until("first\n")
        await stream.send({"type": "stdin", "data": "now\n"})
        assert await stream.to_end() == {"type": "exit", "exitCode": 5}
        assert stream.output() == "first\nsecond now\n"


async def test_stderr_and_a_terminal(runner: Runner) -> None:
    async with await runner.stream(command="echo oops >&2") as stream:
        assert await stream.to_end() == {"type": "exit", "exitCode": 0}
        assert stream.output("stderr") == "oops\n"
    command = "read x; echo got $x; stty size"
    async with await runner.stream(command=command, tty=True, stdin="hi\n") as stream:
        assert await stream.to_end() == {"type": "exit", "exitCode": 0}
        # A terminal echoes the input and ends lines in CRLF; it has a size.
        assert stream.output() == "hi\r\ngot hi\r\n24 80\r\n"


async def test_a_time_limit_ends_with_timeout_and_the_process_is_gone(runner: Runner) -> None:
    async with await runner.stream(
        command="echo $$; sleep 60 & echo $!; wait", timeLimitSeconds=1
    ) as stream:
        started = await stream.pids(2)
        assert await stream.to_end() == {"type": "timeout"}
    await gone(*started)
    status, _ = await runner.api("GET", "")
    assert status == 200  # the runner stays usable


async def test_a_client_that_goes_away_kills_the_process(runner: Runner) -> None:
    stream = await runner.stream(command="echo $$; sleep 60 & echo $!; wait")
    started = await stream.pids(2)
    await stream.close()
    await gone(*started)

    async def counted() -> bool:
        _, text = await runner.harness.api(runner.controller, "GET", "/metrics", token=None)
        return 'poolkeeper_executions_total{pool="default/py",result="cancelled"} 1.0' in text

    await wait_until(counted, what="the cancelled execution to be counted")


@pytest.mark.slow
async def test_a_process_that_outlives_its_limit_retires_the_runner(runner: Runner) -> None:
    # A new session escapes the process group the limit kills, and holds stdout open,
    # so the exec does not end: 3 s later the runner is retired.
    async with await runner.stream(
        command="setsid sleep 30 & echo $!; wait", timeLimitSeconds=1
    ) as stream:
        [escaped] = await stream.pids(1)
        assert await stream.to_end() == {"type": "timeout"}
    status, body = await runner.api("GET", "")
    assert (status, body["error"]["reason"]) == (410, "Retired")
    assert alive(escaped)  # what nothing could kill; the test's own cleanup does
    os.kill(escaped, signal.SIGKILL)
    await gone(escaped)


async def test_a_stream_url_works_once(runner: Runner) -> None:
    status, created = await runner.api("POST", "/executions", {"command": "true"})
    assert status == 201
    async with await Stream.open(created["streamUrl"]) as stream:
        assert await stream.to_end() == {"type": "exit", "exitCode": 0}
    with pytest.raises(aiohttp.WSServerHandshakeError) as again:
        await Stream.open(created["streamUrl"])
    assert again.value.status == 404


async def test_concurrent_executions_are_limited(harness: Harness, tmp_path: Path) -> None:
    controller = await start(harness, tmp_path, executions={"maxConcurrent": 1})
    runner = await claimed_runner(harness, controller)
    _, waiting = await runner.api("POST", "/executions", {"command": "true"})  # not counted
    async with await runner.stream(command="echo up; sleep 60") as first:
        await first.output_until("up")
        status, body = await runner.run(command="true")
        assert (status, body["error"]["code"]) == (409, "TooManyExecutions")
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await Stream.open(waiting["streamUrl"])
        assert refused.value.status == 409
    # Once the first has ended, the refused stream may still connect (within 30 s).
    second: Stream | None = None

    async def connects() -> bool:
        nonlocal second
        try:
            second = await Stream.open(waiting["streamUrl"])
        except aiohttp.WSServerHandshakeError as error:
            assert error.status == 409
            return False
        return True

    await wait_until(connects, what="the first execution to end")
    assert second is not None
    async with second:
        assert await second.to_end() == {"type": "exit", "exitCode": 0}


async def test_working_dir_and_the_unprivileged_wrapper(harness: Harness, tmp_path: Path) -> None:
    executions = {"workingDir": "local", "unprivilegedWrapper": ["env", "AS_USER=yes"]}
    controller = await start(harness, tmp_path, executions=executions)
    runner = await claimed_runner(harness, controller)
    assert (await runner.api("PUT", "/files", {"directories": ["sub"]}))[0] == 204
    status, result = await runner.run(command='pwd; echo "${AS_USER:-no}"')
    assert status == 200 and result["stdout"] == f"{runner.task_dir() / 'local'}\nyes\n", result
    status, result = await runner.run(
        command='pwd; echo "${AS_USER:-no}"', workingDir="sub", privileged=True
    )
    expected = f"{runner.task_dir() / 'local' / 'sub'}\nno\n"
    assert status == 200 and result["stdout"] == expected, result


# ---- the claim -----------------------------------------------------------------------------


async def test_a_release_during_an_execution_ends_it_with_error(runner: Runner) -> None:
    async with await runner.stream(command="echo up; sleep 60") as stream:
        await stream.output_until("up")
        status, _ = await runner.api("DELETE", "")
        assert status == 204
        assert await stream.to_end() == {"type": "error", "message": "runner released"}


async def test_an_expiry_written_elsewhere_ends_the_execution(runner: Runner) -> None:
    async with await runner.stream(command="echo up; sleep 60") as stream:
        await stream.output_until("up")
        # Another process found the claim expired (its renewals did not reach Nomad).
        assert isinstance(runner.controller, Controller)
        client = runner.controller.client
        path = f"poolkeeper/claims/{runner.id}"
        variable = await client.read_variable(path, "default")
        assert variable is not None
        items = {**variable["Items"], "state": "expired"}
        await client.put_variable(path, items, "default", cas=variable["ModifyIndex"])
        assert await stream.to_end() == {"type": "error", "message": "runner expired"}


async def test_an_oom_restart_ends_the_execution_and_loses_the_runner(runner: Runner) -> None:
    async with await runner.stream(command="echo up; sleep 60") as stream:
        await stream.output_until("up")
        await runner.sim.oom_restart(runner.claim["allocationId"])
        end = await stream.to_end()
        assert end == {"type": "error", "message": "runner lost: the allocation was OOM killed"}

    async def lost() -> bool:
        status, body = await runner.api("GET", "")
        return status == 410 and body["error"]["reason"] == "AllocationLost"

    await wait_until(lost, what="the claim to become AllocationLost")


@pytest.mark.slow
async def test_a_running_execution_keeps_its_claim_alive(harness: Harness, tmp_path: Path) -> None:
    controller = await start(harness, tmp_path)
    short = await claimed_runner(harness, controller, inactivityTimeoutSeconds=2)
    status, result = await short.run(command="sleep 5; echo done", timeLimitSeconds=20)
    assert (status, result["exitCode"], result["stdout"]) == (200, 0, "done\n"), result
    status, claim = await short.api("GET", "")
    assert status == 200, claim  # alive: five seconds of execution, a two-second timeout
    # With nothing running, the timeout applies again.

    async def expired() -> bool:
        status, body = await short.api("GET", "")
        return status == 410 and body["error"]["reason"] == "Expired"

    await wait_until(expired, what="the idle claim to expire")


async def test_the_engine_renews_instead_of_expiring_a_busy_claim(
    harness: Harness, tmp_path: Path
) -> None:
    clock = FakeClock()
    pools = write_pools(tmp_path / "pools.yaml", pool_doc("py", idle=1))
    controller = await harness.start(pools, clock=clock)
    runner = await claimed_runner(harness, controller)
    async with await runner.stream(command="echo up; sleep 60") as stream:
        await stream.output_until("up")
        _, before = await runner.api("GET", "")
        clock.advance(3600)  # far past the deadline, while the execution runs
        await controller.engine.reconcile_namespace("default")
        status, after = await runner.api("GET", "")
        assert status == 200, after
        assert after["expiresAt"] > before["expiresAt"]
