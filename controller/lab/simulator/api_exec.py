"""Routes: /v1/client/allocation/:alloc_id/exec, allocation exec over a WebSocket.

As through a Nomad server (the address a controller is given): a bad `command` or `tty`
and a request that is no WebSocket upgrade are answered in plain HTTP; everything after
the upgrade (the token, the allocation, the task) as one close frame, 1011 for errors
Nomad codes 500 or not at all and 1008 for the others. A command that runs streams its
output, then both close frames, then the exit, and then the TCP connection just ends.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import struct
from http import HTTPStatus
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from aiohttp import WSMsgType, web

from controller.core.gojson import (
    GoJSONError,
    GoStruct,
    decode_struct,
    go_bool,
    unmarshal_strings,
)
from controller.lab.simulator.authz import ALLOC_EXEC, ALLOC_NODE_EXEC
from controller.lab.simulator.localexec import LocalProcess
from controller.lab.simulator.routes import ClientRoutes
from controller.lab.simulator.sandbox import Sandbox, alloc_group
from controller.lab.simulator.store import TERMINAL
from controller.lab.simulator.util import JSON, ApiError
from controller.lab.simulator.wire import ENCODE, AddRoute, text

if TYPE_CHECKING:
    pass

# Without --exec local, a running task is like one whose driver cannot exec.
NO_LOCAL_EXEC = "simulated tasks run no processes: start the simulator with --exec local to exec"
_MAX_CLOSE_REASON = 123  # bytes: a close frame holds 125, two of them the code
_NOT_WEBSOCKET = "websocket: the client is not using the websocket protocol: "
# Drivers whose tasks see the host's filesystem need alloc-node-exec as well.
_NO_FS_ISOLATION = frozenset({"raw_exec"})

_IO = GoStruct("proto.ExecTaskStreamingIOOperation", {"data": "[]uint8", "close": "bool"})
_TTY_SIZE = GoStruct(
    "proto.ExecTaskStreamingRequest_TerminalSize", {"height": "int32", "width": "int32"}
)
_REQUEST = GoStruct("proto.ExecTaskStreamingRequest", {"stdin": _IO, "tty_size": _TTY_SIZE})
_HANDSHAKE = GoStruct("agent.wsHandshakeMessage", {"version": "int", "auth_token": "string"})


class ExecRoutes(ClientRoutes):
    def register(self, r: AddRoute) -> None:
        r(r"/v1/client/allocation/(?P<rest>.*)", GET=self.client_allocation)

    async def client_allocation(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.StreamResponse:
        alloc_id, _, action = p["rest"].partition("/")
        if action != "exec":
            # Nomad's answer to any other shape; its other actions are not simulated.
            return text(404, "resource not found")
        return await self.exec(request, alloc_id)

    async def exec(self, request: web.Request, alloc_id: str) -> web.StreamResponse:
        task = request.query.get("task", "")
        try:
            argv = unmarshal_strings(request.query.get("command", "")) or []
        except GoJSONError as exc:
            return text(500, f"failed to marshal command into json: {exc.message}")
        tty = False
        if request.query.get("tty"):
            try:
                tty = go_bool(request.query["tty"])
            except ValueError as exc:
                return text(500, f"tty value is not a boolean: {exc}")
        refused = _refused_upgrade(request)
        if refused is not None:
            return refused
        ws = web.WebSocketResponse(compress=False, max_msg_size=0)
        await ws.prepare(request)
        socket = ExecSocket(ws, request)
        try:
            secret = await self._handshake(socket, request)
            if secret is None:
                socket.drop()  # the client left before its handshake
                return ws
            alloc, spec = self._target(alloc_id, task, argv, secret)
            if self.sim.sandboxes.exec_mode != "local":
                raise ApiError(500, NO_LOCAL_EXEC)
            try:
                box, process = await self.sim.sandboxes.start(alloc, spec, argv, tty)
            except OSError as exc:
                raise _start_failure(argv[0], exc) from None
        except ApiError as exc:
            await socket.refuse(exc)
            return ws
        self.sim.sandboxes.serving(request.task)
        await ExecSession(socket, box, process).run()
        return ws

    async def _handshake(self, socket: ExecSocket, request: web.Request) -> str | None:
        """The token's secret: the request's, or with ws_handshake the first frame's (None:
        the client left first)."""
        secret = self.api.secret_of(request)
        raw = request.query.get("ws_handshake", "")
        if not raw:
            return secret
        try:
            if not go_bool(raw):
                return secret
        except ValueError as exc:
            raise ApiError(400, f"ws_handshake value is not a boolean: {exc}") from None
        frame = await socket.receive()
        if frame is None:
            return None
        try:
            first = decode_struct(frame, _HANDSHAKE)
        except EOFError:
            raise ApiError(400, "EOF") from None
        except GoJSONError as exc:
            raise ApiError(400, exc.message) from None
        if first["version"] != 1:
            raise ApiError(400, f"unexpected handshake value: {first['version']}")
        return str(first["auth_token"])

    def _target(
        self, alloc_id: str, task: str, command: list[str], secret: str
    ) -> tuple[JSON, JSON]:
        """The allocation and task spec to exec in, through the server's checks and then
        the client's, in their order; an ApiError with Nomad's code and text otherwise."""
        try:
            token = self.api.resolve_token(secret)
        except ApiError:
            raise _denied() from None
        if not alloc_id:
            raise ApiError(400, "missing AllocID")
        sandboxes = self.sim.sandboxes
        alloc = sandboxes.lookup(alloc_id)
        namespace = alloc["Namespace"]
        if not self.api.allows(token, namespace, ALLOC_EXEC):
            raise _denied()
        if alloc["ClientStatus"] in TERMINAL:
            raise ApiError(
                400,
                f"exec not possible, client status of allocation {alloc['ID']} "
                f"is {alloc['ClientStatus']}",
            )
        sandboxes.reach(alloc)
        # On the client: the request's fields, then the task as its runner knows it.
        if not task:
            raise ApiError(400, "must provide task name")
        if not command:
            raise ApiError(400, "command is not present")
        spec = next((t for t in alloc_group(alloc)["Tasks"] if t["Name"] == task), None)
        if spec is None:
            # The driver's capabilities are asked for first, and fail for a task with no
            # runner, so "unknown task name" (400) cannot be reached.
            raise ApiError(500, "task not found")
        if spec.get("Driver") in _NO_FS_ISOLATION and not self.api.allows(
            token, namespace, ALLOC_NODE_EXEC
        ):
            raise _denied()
        state = (alloc.get("TaskStates") or {}).get(task) or {}
        if not state.get("StartedAt"):
            raise ApiError(404, f'task "{task}" not started yet.')
        if state.get("State") != "running":
            raise ApiError(404, f'task "{task}" is not running.')
        return alloc, spec


class ExecSocket:
    """The WebSocket as Nomad's agent drives it: JSON text frames out, a close frame only
    for an error, and otherwise the TCP connection closed without one."""

    def __init__(self, ws: web.WebSocketResponse, request: web.Request) -> None:
        self.ws = ws
        self.transport = request.transport
        self.gone = False
        self._sending = asyncio.Lock()

    async def receive(self) -> str | None:
        """The next text (or binary) frame; None once the client closed or went away."""
        msg = await self.ws.receive()
        if msg.type is WSMsgType.TEXT:
            return str(msg.data)
        if msg.type is WSMsgType.BINARY:
            return bytes(msg.data).decode("utf-8", "replace")
        return None

    async def send(self, frame: JSON) -> None:
        if self.gone:
            return
        try:
            async with self._sending:
                await self.ws.send_str(ENCODE(frame))
        except (ConnectionError, RuntimeError):
            self.gone = True  # the client went away: its process keeps running

    async def refuse(self, exc: ApiError) -> None:
        """One close frame for an error (none if its reason is too long to send), then the end."""
        reason = exc.message.encode()
        if not self.gone and len(reason) <= _MAX_CLOSE_REASON:
            code = 1011 if exc.status == 500 else 1008
            with contextlib.suppress(ConnectionError, RuntimeError):
                async with self._sending:
                    await self.ws.send_frame(struct.pack("!H", code) + reason, WSMsgType.CLOSE)
        self.drop()

    def drop(self) -> None:
        """End the TCP connection without a close frame."""
        self.gone = True
        if self.transport is not None:
            self.transport.close()


class ExecSession:
    """One running exec: the client's frames to the process, its output back, its exit."""

    def __init__(self, socket: ExecSocket, box: Sandbox, process: LocalProcess) -> None:
        self.socket = socket
        self.box = box
        self.process = process
        self.input_error = ""  # a frame Go could not decode: reported at the next frame out
        self.stdin_closed = False
        self.stdin_failed = False  # input after stdin's close: the session ends with no exit

    async def run(self) -> None:
        forwarding = asyncio.create_task(self._forward_input())
        try:
            # The output ends when no process holds it open any more, then the exit comes.
            await asyncio.gather(self._pump("stdout"), self._pump("stderr"))
            exit_code = await self.process.wait()
            await self._out({"stdout": {"close": True}})
            await self._out({"stderr": {"close": True}})
            if not self.stdin_failed:
                # Protobuf's omitempty: an exit code of 0 is not written.
                result = {"exit_code": exit_code} if exit_code else {}
                await self._out({"exited": True, "result": result})
        finally:
            forwarding.cancel()
            self.box.reaped(self.process)
            self.process.close()
            self.socket.drop()

    async def _pump(self, stream: str) -> None:
        # Read on after the client has gone, so that the process never blocks on its output.
        while data := await self.process.read(stream):
            await self._out({stream: {"data": base64.b64encode(data).decode()}})

    async def _out(self, frame: JSON) -> None:
        if self.socket.gone:
            return
        if self.process.lost:  # its node went away, and the connection with it
            self.socket.drop()
        elif self.input_error:
            # Nomad's agent notices a failed input frame only as its next frame goes out.
            await self.socket.refuse(ApiError(500, self.input_error))
        else:
            await self.socket.send(frame)

    async def _forward_input(self) -> None:
        while (raw := await self.socket.receive()) is not None:
            if self.process.lost:
                # Its node went away (or the simulator stops): the frames still in flight
                # are not decoded, so that the session ends at once.
                return
            try:
                frame = decode_struct(raw, _REQUEST)
            except EOFError:
                return  # an empty frame reads as the input's end: forwarding stops quietly
            except GoJSONError as exc:
                self.input_error = exc.message
                return
            stdin, size = frame["stdin"], frame["tty_size"]
            if stdin is not None and not stdin["close"]:
                if self.stdin_closed:
                    self.stdin_failed = True  # Nomad: a write on the closed pipe fails it all
                    return
                await self.process.write(stdin["data"] or b"")
            elif stdin is not None:
                if not self.stdin_closed:
                    self.process.close_stdin()
                self.stdin_closed = True
            elif size is not None:
                self.process.resize(size["height"], size["width"])
            # Anything else ({} or only unknown keys) is a heartbeat.


def _denied() -> ApiError:
    # The streaming RPC carries no code with it, which the agent turns into 500: 1011.
    return ApiError(500, "Permission denied")


def _start_failure(name: str, exc: OSError) -> ApiError:
    """A command that cannot start: a driver error (500), in the container runtime's words."""
    if isinstance(exc, FileNotFoundError):
        reason = "executable file not found in $PATH"
    else:
        reason = (exc.strerror or str(exc)).lower()
    return ApiError(500, f'failed to start exec: exec: "{name}": {reason}')


def _refused_upgrade(request: web.Request) -> web.Response | None:
    """gorilla/websocket's refusal of a request it will not upgrade, and Nomad's line after
    it (gorilla has written its status and text already, so Nomad's 500 stays unsent)."""
    headers = request.headers
    status = 400
    if not _has_token(headers.getall("Connection", []), "upgrade"):
        reason = _NOT_WEBSOCKET + "'upgrade' token not found in 'Connection' header"
    elif not _has_token(headers.getall("Upgrade", []), "websocket"):
        reason = _NOT_WEBSOCKET + "'websocket' token not found in 'Upgrade' header"
    elif not _has_token(headers.getall("Sec-WebSocket-Version", []), "13"):
        reason = "websocket: unsupported version: 13 not found in 'Sec-Websocket-Version' header"
    elif not _same_origin(request):
        status, reason = 403, "websocket: request origin not allowed by Upgrader.CheckOrigin"
    elif not _valid_key(headers.get("Sec-WebSocket-Key", "")):
        reason = (
            "websocket: not a websocket handshake: "
            "'Sec-WebSocket-Key' header must be Base64 encoded value of 16-byte in length"
        )
    else:
        return None
    resp = text(status, f"{HTTPStatus(status).phrase}\nfailed to upgrade connection: {reason}")
    resp.headers["Sec-Websocket-Version"] = "13"
    resp.headers["X-Content-Type-Options"] = "nosniff"
    return resp


def _has_token(values: list[str], token: str) -> bool:
    return any(part.strip().lower() == token for value in values for part in value.split(","))


def _same_origin(request: web.Request) -> bool:
    origin = request.headers.get("Origin")
    if origin is None:
        return True
    try:
        host = urlsplit(origin).netloc
    except ValueError:
        return False
    return host.lower() == request.host.lower()


def _valid_key(key: str) -> bool:
    try:
        return len(base64.b64decode(key, validate=True)) == 16
    except binascii.Error:
        return False
