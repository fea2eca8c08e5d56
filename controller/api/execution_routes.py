"""The routes of executions and files in a claimed runner, and the stream protocol.

Stream frames (text frames of JSON). To the client: `{"type": "start"}`, then
`{"type": "stdout"|"stderr", "data": str}` (invalid UTF-8 replaced), then exactly one of
`{"type": "exit", "exitCode": int}`, `{"type": "timeout"}`, `{"type": "error",
"message": str}`, then close 1000. From the client: `{"type": "stdin", "data": str}` and
`{"type": "stdinClose"}`; anything else is ignored. A client that closes the socket
cancels the execution (its command is killed), and is sent nothing more.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import WSMessage, WSMsgType, web

from controller.api.bodies import parse_json, read_body, validated
from controller.api.models import (
    ExecutionBody,
    ExecutionCreated,
    ExecutionResult,
    FileList,
    FilesBody,
)
from controller.api.route import NOT_CLAIMED, RUNNER_GONE, Query, Route, runner_in_scope
from controller.core.gojson import go_text
from controller.errors import ErrorCode, ServiceError
from controller.executions.archives import Spool
from controller.executions.commands import BELOW_PATTERN, PATH_PATTERN
from controller.executions.files import FileOperations
from controller.executions.manager import (
    MAX_WAITING_PER_RUNNER,
    Ending,
    Execution,
    ExecutionManager,
    Outcome,
)
from controller.executions.streaming import (
    StreamFrames,
    json_upload_limit,
    read_stream,
    send_download,
    serve_stream,
    websocket_for,
)

EXECUTIONS_KEY: web.AppKey[ExecutionManager] = web.AppKey("executions", ExecutionManager)
FILES_KEY: web.AppKey[FileOperations] = web.AppKey("files", FileOperations)

TAR = "application/x-tar"
BOOLEANS = ("true", "false")


# ---- executions --------------------------------------------------------------------------


async def create_execution(request: web.Request) -> web.Response:
    runner_id = runner_in_scope(request)
    body = await read_body(request, ExecutionBody)
    manager = request.app[EXECUTIONS_KEY]
    if body.wait:
        return web.json_response(await manager.run_waited(runner_id, body.to_request()))
    execution_id = await manager.create(runner_id, body.to_request())
    scheme = "wss" if request.secure else "ws"
    url = f"{scheme}://{request.host}/v1/runners/{runner_id}/executions/{execution_id}/stream"
    return web.json_response({"executionId": execution_id, "streamUrl": url}, status=201)


async def stream_execution(request: web.Request) -> web.StreamResponse:
    ws = websocket_for(request)
    execution = request.app[EXECUTIONS_KEY].connect(
        request.match_info["runnerId"], request.match_info["executionId"]
    )
    return await serve_stream(request, ws, execution, StreamFrames(ws), _client_frames, _terminal)


def _terminal(outcome: Outcome) -> dict[str, Any]:
    if outcome.ending is Ending.EXIT:
        return {"type": "exit", "exitCode": outcome.exit_code}
    if outcome.ending is Ending.TIMEOUT:
        return {"type": "timeout"}
    return {"type": "error", "message": outcome.message}


async def _client_frames(ws: web.WebSocketResponse, execution: Execution) -> None:
    """stdin from the client; its close (or its going away) cancels the execution."""
    async for message in ws:
        data = _stdin_of(message)
        del message  # while `put` waits, the frame is held once, as bytes
        if isinstance(data, bytes):
            # Waits while the command has not taken what it was sent (executions/stdin.py).
            await execution.input.put(data)
        elif data is STDIN_CLOSE:
            execution.input.put_now(None)
    execution.cancel()


class _StdinClose:
    """A client's `stdinClose` frame."""


STDIN_CLOSE = _StdinClose()


def _stdin_of(message: WSMessage) -> bytes | _StdinClose | None:
    """The bytes of a client's stdin frame, STDIN_CLOSE for its stdinClose frame, None for
    anything else (ignored: not text, not JSON, another type)."""
    if message.type is not WSMsgType.TEXT:
        return None
    try:
        frame = json.loads(message.data)
    except (ValueError, RecursionError):  # not JSON, a number int() refuses, deep nesting
        return None
    kind = frame.get("type") if isinstance(frame, dict) else None
    if kind == "stdin" and isinstance(frame.get("data"), str):
        return go_text(frame["data"]).encode()  # a lone surrogate is U+FFFD, as in Go
    return STDIN_CLOSE if kind == "stdinClose" else None


# ---- files -------------------------------------------------------------------------------


async def put_files(request: web.Request) -> web.Response:
    runner_id = runner_in_scope(request)
    files = request.app[FILES_KEY]
    await files.activity.live(runner_id)  # 404/410 before a large body is taken in
    limit = files.activity.spec(runner_id).max_upload_bytes
    # A tar body's: checked whatever the body (a JSON body names its own paths).
    into = files.extraction_target(request.query.get("path"))
    if request.content_type == TAR:
        spool = Spool()
        try:
            await read_stream(request, limit, spool.write)
            await files.upload_tar(runner_id, into, spool)
        finally:
            spool.close()
        return web.Response(status=204)
    raw = bytearray()
    await read_stream(request, json_upload_limit(limit), raw.extend)
    parsed = await asyncio.to_thread(parse_json, bytes(raw))  # megabytes of base64
    body = validated(FilesBody, parsed)
    delete, archive = files.check_uploads(runner_id, body.to_uploads())
    try:
        await files.upload(runner_id, delete, archive, own=True)
    finally:
        archive.close()
    return web.Response(status=204)


async def list_files(request: web.Request) -> web.Response:
    runner_id = runner_in_scope(request)
    recursive = request.query.get("recursive", "true")
    if recursive not in BOOLEANS:
        raise ServiceError(ErrorCode.INVALID_REQUEST, "recursive: must be true or false")
    files = await request.app[FILES_KEY].listing(
        runner_id, request.query.get("path"), recursive == "true"
    )
    return web.json_response({"files": files})


async def download_file(request: web.Request) -> web.StreamResponse:
    runner_id = runner_in_scope(request)
    path = request.query.get("path")
    if path is None:
        raise ServiceError(ErrorCode.INVALID_REQUEST, "path: required")
    async with request.app[FILES_KEY].download(runner_id, path) as download:
        return await send_download(request, download)


# ---- the table ---------------------------------------------------------------------------

RUNNER = "/v1/runners/{runnerId}"
CLAIM_ERRORS = {404: NOT_CLAIMED, 410: RUNNER_GONE}
EXEC_ERRORS = {
    **CLAIM_ERRORS,
    400: "invalid request, or a value the pool does not allow",
    502: "Nomad refused or broke the exec (ExecFailed; the message says why)",
}
FILE_QUERY = {
    "path": Query("relative: under the pool's workingDir (default: it)", pattern=PATH_PATTERN)
}

EXECUTION_ROUTES: tuple[Route, ...] = (
    Route(
        "POST", RUNNER + "/executions", "createExecution",
        "run a command in the runner: streamed over a WebSocket, or waited for",
        create_execution,
        body=ExecutionBody,
        responses={
            201: ("created: open its stream to run it", ExecutionCreated),
            200: ("wait: the command ran", ExecutionResult),
        },
        errors={**EXEC_ERRORS, 409: "wait: maxConcurrent executions run already; "
                f"streamed: {MAX_WAITING_PER_RUNNER} created ones wait to be opened "
                "(TooManyExecutions)",
                413: "body too large"},
    ),
    Route(
        "GET", RUNNER + "/executions/{executionId}/stream", "streamExecution",
        "the execution's WebSocket: it runs while this is open (the ID is the credential)",
        stream_execution,
        needs_token=False,
        responses={101: ("the execution runs; frames as docs/reference.md says", None)},
        errors={
            400: "not a WebSocket upgrade",
            404: "unknown, used or stale execution (ExecutionNotFound)",
            409: "maxConcurrent executions run already (TooManyExecutions)",
        },
    ),
    Route(
        "PUT", RUNNER + "/files", "putFiles",
        "delete, make directories and write files (JSON), or extract a tar archive",
        put_files,
        body=FilesBody,
        raw_body=TAR,
        query={"path": Query("a tar body: where to extract it (default: the working dir; "
                             "checked, but not used, with a JSON body)", pattern=PATH_PATTERN)},
        responses={204: ("done", None)},
        errors={**EXEC_ERRORS, 413: "more than the pool's maxUploadBytes"},
    ),
    Route(
        "GET", RUNNER + "/files", "listFiles", "list files (recursively by default)", list_files,
        query={**FILE_QUERY, "recursive": Query("true (default) or false", values=BOOLEANS)},
        responses={200: ("the entries", FileList)},
        errors={**EXEC_ERRORS, 404: "no such path (FileNotFound), or " + NOT_CLAIMED},
    ),
    Route(
        "GET", RUNNER + "/files/content", "downloadFile", "a file's bytes, streamed",
        download_file,
        query={"path": Query("the file; relative: under the pool's workingDir", required=True,
                             pattern=BELOW_PATTERN)},
        responses={200: ("the bytes (application/octet-stream, Content-Length)", None)},
        errors={
            **EXEC_ERRORS, 404: "no such file (FileNotFound), or " + NOT_CLAIMED,
            400: "invalid path, or not a regular file",
        },
    ),
)  # fmt: skip
