"""Executions as Poseidon runs them, on poolkeeper's execution manager: `POST .../execute`
stores a command and answers the WebSocket URL that runs it, and the WebSocket speaks
Poseidon's frames.

- To the client (text frames, JSON as Go writes it): `{"type":"start"}`, then
  `stdout`/`stderr` with `data` as raw text, then exactly one of `{"type":"exit",
  "data":<0-255>}`, `{"type":"timeout"}` or `{"type":"error","data":<text>}` with
  Poseidon's texts, then close 1000. A client that closed first is sent nothing.
- From the client: a text frame's bytes are the command's stdin, verbatim; a binary frame
  ends the forwarding of stdin (the socket stays open); closing cancels the execution.
- As Poseidon's, a command runs with `bash -c` in a terminal (output in CRLF lines, the
  input echoed), its stderr apart from it.
- Poseidon's inactivity rules: storing the command is no activity, starting it is; a
  running execution does not keep the runner's claim alive, and when the claim expires
  meanwhile, the execution ends with `timeout`.
"""

from __future__ import annotations

import re
from typing import Any, Final

from aiohttp import WSMsgType, web

from controller.core.claims import ClaimState
from controller.core.gojson import go_marshal
from controller.errors import ErrorCode as ServiceCode
from controller.errors import ServiceError
from controller.executions.activity import ENDED_MESSAGES, OOM_KILLED
from controller.executions.commands import ENV_NAME_PATTERN
from controller.executions.manager import Ending, Execution, ExecutionRequest, Outcome
from controller.executions.streaming import StreamFrames, serve_stream, websocket_for
from controller.poseidon.context import PREFIX, claimed_runner, poseidon
from controller.poseidon.wire import EXECUTION_REQUEST, answer, bad_request, read_struct

# Poseidon runs every command with bash, with this variable set.
SHELL: Final = ("/bin/bash", "-c")
CODEOCEAN_ENV: Final = {"CODEOCEAN": "true"}
FORBIDDEN_CHARACTER: Final = "'"  # Poseidon refuses it: its command line quotes with it
# Poseidon's `error` texts (CodeOcean matches the first exactly).
OOM_TEXT: Final = "the allocation was OOM Killed"
STOPPED_TEXT: Final = "the allocation stopped as expected"
FAILED_TEXT: Final = "Error executing the request"
_ENV_NAME = re.compile(ENV_NAME_PATTERN)


async def execute(request: web.Request) -> web.Response:
    runner_id = await claimed_runner(request)
    body = await read_struct(request, EXECUTION_REQUEST)
    command: str = body["command"]
    if FORBIDDEN_CHARACTER in command:
        raise bad_request("use of forbidden character")
    environment: dict[str, str] = body["environment"] or {}
    for name in environment:
        if not _ENV_NAME.match(name):
            raise bad_request(f"environment variable name {name!r} is not [A-Za-z_][A-Za-z0-9_]*")
    manager = poseidon(request).executions
    spec = manager.activity.spec(runner_id)
    time_limit: int = body["timeLimit"]
    if time_limit < 0:
        raise bad_request(f"timeLimit {time_limit} must not be negative")
    stored = ExecutionRequest(
        command=[*SHELL, command],
        env={**CODEOCEAN_ENV, **environment},
        time_limit_seconds=time_limit or spec.max_time_limit_seconds,  # 0: Poseidon's none
        tty=True,  # as Poseidon's: a terminal, with stderr still apart
        stderr_apart=True,
        privileged=body["privilegedExecution"],
    )
    # Kept until its runner's claim ends or the longest time limit passes, not 30 s as
    # under /v1; past the bound of those waiting on the runner, the request is at fault.
    try:
        execution_id = await manager.create(
            runner_id, stored, connect_within=spec.max_time_limit_seconds, keeps_claim=False
        )
    except ServiceError as error:
        if error.code is ServiceCode.TOO_MANY_EXECUTIONS:
            raise bad_request(error.message) from None
        raise
    scheme = "wss" if request.secure else "ws"
    url = f"{scheme}://{request.host}{PREFIX}/runners/{runner_id}/websocket"
    return answer({"websocketUrl": f"{url}?executionID={execution_id}"})


async def websocket(request: web.Request) -> web.StreamResponse:
    runner_id = await claimed_runner(request)
    manager, execution_id = poseidon(request).executions, request.query.get("executionID", "")
    manager.expect(runner_id, execution_id)  # as Poseidon: an unknown ID is 404 before all
    ws = websocket_for(request)
    execution = manager.connect(runner_id, execution_id)
    frames = StreamFrames(ws, go_marshal)
    return await serve_stream(request, ws, execution, frames, _client_frames, terminal_frame)


async def _client_frames(ws: web.WebSocketResponse, execution: Execution) -> None:
    forwarding = True
    async for message in ws:
        if message.type is WSMsgType.BINARY:
            forwarding = False
        elif message.type is WSMsgType.TEXT and forwarding:
            data = message.data.encode()
            del message  # while `put` waits, the frame is held once, as bytes
            # Waits while the command has not taken what it was sent (executions/stdin.py).
            await execution.input.put(data)
    execution.cancel()


def terminal_frame(outcome: Outcome) -> dict[str, Any]:
    """How an execution ended, in Poseidon's words."""
    if outcome.ending is Ending.EXIT and outcome.exit_code is not None:
        return {"type": "exit", "data": outcome.exit_code & 0xFF}
    if outcome.ending is Ending.TIMEOUT or outcome.message == ENDED_MESSAGES[ClaimState.EXPIRED]:
        return {"type": "timeout"}  # the time limit, or the runner's inactivity timeout
    if outcome.message == OOM_KILLED:
        return {"type": "error", "data": OOM_TEXT}
    if outcome.message == ENDED_MESSAGES[ClaimState.RELEASED]:
        return {"type": "error", "data": STOPPED_TEXT}
    return {"type": "error", "data": FAILED_TEXT}
