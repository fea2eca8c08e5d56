"""Hostile input on the routes of executions and files, for a runner that is claimed:
bad JSON, wrong types, huge commands, invalid base64, stream URLs reused or guessed.

Never a 5xx other than 502 (the exec failed) and 503, never a traceback, errors in the
API's shape, and a refused request writes nothing (not even the claim's deadline).

The simulator here runs no processes (no `--exec local`): a request that gets as far as
Nomad's exec is answered 502, so generated commands are never run on this machine.
"""

from __future__ import annotations

import json
import re
import secrets
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from hypothesis import given
from hypothesis import strategies as st

from controller.executions.manager import MAX_WAITING_PER_RUNNER
from tests.support.documents import pool_doc
from tests.support.fuzzing import against_live_service

from .conftest import TOKEN, Harness, write_pools
from .executions_support import Runner, Stream, claimed_runner

TRACEBACK = re.compile(r"Traceback|File \"|\.py\", line")


@pytest.fixture(params=["one process", "API tier"])
async def runner(harness: Harness, tmp_path: Path, request: pytest.FixtureRequest) -> Runner:
    """A runner claimed through one process that also reconciles, or through an API
    replica beside it: both reject the same way."""
    pools = write_pools(tmp_path / "pools.yaml", pool_doc("py", idle=1, maxRunners=10))
    controller = await harness.start(pools)
    if request.param == "one process":
        return await claimed_runner(harness, controller)
    await harness.settled(controller)
    return await claimed_runner(harness, await harness.start_api_tier(), settled=False)


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
