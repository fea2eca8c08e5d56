"""The HTTP side of executions and files that both APIs (poolkeeper's and Poseidon's)
share: a large body read as it arrives, a download sent as it is read, and a streamed
execution run over its WebSocket (each API has its own frames for the client's input
and for the end)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable, Coroutine
from typing import Any

from aiohttp import web

from controller.errors import ErrorCode, ServiceError
from controller.executions.commands import TextStream
from controller.executions.files import Download
from controller.executions.manager import Ending, Execution, Outcome

# Seconds a request body may take to arrive after its headers.
BODY_READ_TIMEOUT_SECONDS = 30.0
# What a JSON upload may take on top of its files' base64 (4 characters per 3 bytes):
# paths, modes and the JSON around them.
JSON_UPLOAD_SLACK = 1024 * 1024
CLIENT_FRAME_LIMIT = 1024 * 1024  # bytes of one client frame
# Set on a request whose client went away while its answer was being sent (the access
# log's 499): the status line had gone out already.
CLIENT_GONE: web.RequestKey[bool] = web.RequestKey("client_gone", bool)


async def read_stream(request: web.Request, limit: int, write: Callable[[bytes], object]) -> None:
    """A body of up to `limit` bytes handed to `write` as it arrives, for routes whose
    bodies are larger than the API's usual limit (file uploads). 413 as soon as it is
    larger; 408 when no data came for BODY_READ_TIMEOUT_SECONDS."""
    too_large = ServiceError(
        ErrorCode.PAYLOAD_TOO_LARGE, f"the body is larger than this request may be ({limit} bytes)"
    )
    if request.content_length is not None and request.content_length > limit:
        raise too_large
    received = 0
    while True:
        try:
            async with asyncio.timeout(BODY_READ_TIMEOUT_SECONDS):
                chunk = await request.content.readany()
        except TimeoutError:
            raise ServiceError(
                ErrorCode.REQUEST_TIMEOUT,
                f"no part of the body arrived for {BODY_READ_TIMEOUT_SECONDS:g} s",
            ) from None
        if not chunk:
            return
        received += len(chunk)
        if received > limit:
            raise too_large
        write(chunk)


def json_upload_limit(max_upload_bytes: int) -> int:
    """The bytes a JSON upload of at most `max_upload_bytes` decoded bytes may take."""
    return max_upload_bytes // 3 * 4 + 4 + JSON_UPLOAD_SLACK


# The headers of a WebSocket upgrade (RFC 6455), as both APIs' documents name them for
# their stream routes: a request without them is 400.
UPGRADE_HEADERS: list[dict[str, Any]] = [
    {"name": name, "in": "header", "required": True, "schema": schema}
    for name, schema in (
        ("Connection", {"type": "string", "enum": ["Upgrade"]}),
        ("Upgrade", {"type": "string", "enum": ["websocket"]}),
        ("Sec-WebSocket-Version", {"type": "string", "enum": ["13"]}),
        ("Sec-WebSocket-Key", {"type": "string", "pattern": "^[A-Za-z0-9+/]{21}[AQgw]==$"}),
    )
]


def websocket_for(request: web.Request) -> web.WebSocketResponse:
    """The response of a stream route; 400 for a request that is no WebSocket upgrade."""
    ws = web.WebSocketResponse(max_msg_size=CLIENT_FRAME_LIMIT)
    if not ws.can_prepare(request).ok:
        raise ServiceError(ErrorCode.INVALID_REQUEST, "this route is a WebSocket: upgrade to it")
    return ws


ClientReader = Callable[[web.WebSocketResponse, Execution], Coroutine[Any, Any, None]]


async def serve_stream(
    request: web.Request,
    ws: web.WebSocketResponse,
    execution: Execution,
    frames: StreamFrames,
    read_client: ClientReader,
    terminal: Callable[[Outcome], dict[str, Any]],
) -> web.WebSocketResponse:
    """Run a connected execution over its socket: the start frame, its output, what
    `read_client` makes of the client's frames (it cancels the execution when the
    client goes), then (unless cancelled) the `terminal` frame and close 1000."""
    # The exec opens while the upgrade completes: its output waits for the start frame.
    running = asyncio.create_task(execution.run(frames))
    try:
        await ws.prepare(request)
    except BaseException:
        execution.cancel()
        await running
        raise
    await frames.start()
    reading = asyncio.create_task(read_client(ws, execution))
    try:
        outcome = await running
    finally:
        reading.cancel()
        await asyncio.gather(reading, return_exceptions=True)
    if outcome.ending is not Ending.CANCELLED:
        await frames.flush()
        await frames.send(terminal(outcome))
        with contextlib.suppress(ConnectionError, RuntimeError):
            await ws.close(code=1000)
    return ws


def _encoded(frame: dict[str, Any]) -> str:
    return json.dumps(frame, ensure_ascii=False)


class StreamFrames:
    """An execution's output to its client, as stdout/stderr frames of text, each
    frame encoded by `encode`."""

    def __init__(
        self, ws: web.WebSocketResponse, encode: Callable[[dict[str, Any]], str] = _encoded
    ) -> None:
        self.ws = ws
        self.encode = encode
        self._text = {"stdout": TextStream(), "stderr": TextStream()}
        self._started = asyncio.Event()

    async def start(self) -> None:
        await self.send({"type": "start"})
        self._started.set()

    async def output(self, stream: str, data: bytes) -> None:
        text = self._text[stream].text(data)
        if text:
            await self._started.wait()
            await self.send({"type": stream, "data": text})

    async def flush(self) -> None:
        """What a character cut off at the end left behind."""
        for stream, decoder in self._text.items():
            text = decoder.text(b"", final=True)
            if text:
                await self.send({"type": stream, "data": text})

    async def send(self, frame: dict[str, Any]) -> None:
        # A client gone: its reader cancels the execution, nothing is lost by not sending.
        with contextlib.suppress(ConnectionError, RuntimeError):
            await self.ws.send_str(self.encode(frame))


async def send_download(
    request: web.Request, download: Download, headers: dict[str, str] | None = None
) -> web.StreamResponse:
    """A started download as the response: `Content-Length` and the bytes. A client that
    goes away meanwhile leaves the download unfinished (CLIENT_GONE)."""
    response = web.StreamResponse(
        headers={"Content-Type": "application/octet-stream", **(headers or {})}
    )
    response.content_length = download.size
    try:
        await response.prepare(request)
        async for chunk in download.chunks():
            await response.write(chunk)
        await response.write_eof()
    except ServiceError:
        # The status is sent: the one way left to say the body is wrong is to cut it.
        if request.transport is not None:
            request.transport.abort()
    except ConnectionError:
        request[CLIENT_GONE] = True
    return response
