"""Routes: /v1/client/fs/ls|stat|cat|readat|stream/:alloc_id, an allocation's directory.

As through a Nomad server: the server checks `read-fs` (in the request's namespace) and
finds the allocation and its node, then the client checks `read-fs` again (in the
allocation's) and reads. ls and stat come back as plain RPC errors (403, 404 for what is
missing, else 500); cat, readat and stream as a streaming RPC's (500 for the server's
checks, the file's stat 400, its reading 500).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, BinaryIO

from aiohttp import web

from controller.core.gojson import go_bool, go_int
from controller.lab.simulator.allocfs import (
    NO_SUCH_FILE,
    FsError,
    list_dir,
    open_file,
    stat_path,
)
from controller.lab.simulator.authz import READ_FS, READ_LOGS
from controller.lab.simulator.routes import ClientRoutes
from controller.lab.simulator.sandbox import Sandbox
from controller.lab.simulator.store import TERMINAL
from controller.lab.simulator.util import JSON, ApiError, bad_request
from controller.lab.simulator.wire import ENCODE, AddRoute, reply, text

if TYPE_CHECKING:
    pass

FS_OPS = ("ls", "stat", "cat", "readat", "stream", "logs")
_CHUNK = 64 * 1024  # a stream frame's data, at most
_FOLLOW_POLL = 0.2  # seconds: how often a followed file is looked at (Nomad's batch window)
_HEARTBEAT = 1.0  # seconds between the empty frames of a stream that has nothing to say
# cat and readat may be any file's bytes: Nomad keeps browsers from reading them as a page.
_UNTRUSTED_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "X-XSS-Protection": "1; mode=block",
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; sandbox",
}


class FsRoutes(ClientRoutes):
    def register(self, r: AddRoute) -> None:
        r(r"/v1/client/fs/(?P<rest>.*)", GET=self.fs)

    async def fs(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.StreamResponse:
        op, sep, alloc_id = p["rest"].partition("/")
        handlers: dict[str, Callable[[web.Request, str], Awaitable[web.StreamResponse]]] = {
            "ls": self.ls,
            "stat": self.stat,
            "cat": self.cat,
            "readat": self.readat,
            "stream": self.stream,
            "logs": self.logs,
        }
        if not sep or op not in handlers:
            return text(404, "Invalid method")  # as Nomad says it
        return await handlers[op](request, alloc_id)

    # ------------------------------------------------------------------ plain RPCs
    async def ls(self, request: web.Request, alloc_id: str) -> web.Response:
        _require_alloc_id(alloc_id)
        box = self._directory(request, alloc_id, denied=403)
        return reply(_plain(list_dir, box.path, request.query.get("path") or "/"))

    async def stat(self, request: web.Request, alloc_id: str) -> web.Response:
        _require_alloc_id(alloc_id)
        path = request.query.get("path", "")
        if not path:
            raise bad_request("must provide a file name")
        box = self._directory(request, alloc_id, denied=403)
        return reply(_plain(stat_path, box.path, path))

    # ------------------------------------------------------------------ streaming RPCs
    async def cat(self, request: web.Request, alloc_id: str) -> web.StreamResponse:
        return await self._untrusted(request, alloc_id, "0", "")

    async def readat(self, request: web.Request, alloc_id: str) -> web.StreamResponse:
        return await self._untrusted(
            request, alloc_id, request.query.get("offset", ""), request.query.get("limit", "")
        )

    async def _untrusted(
        self, request: web.Request, alloc_id: str, offset_text: str, limit_text: str
    ) -> web.StreamResponse:
        """The file's raw bytes (from an offset, to a limit), with Nomad's headers for
        untrusted content on the answer, errors included."""
        try:
            _require_alloc_id(alloc_id)
            path = request.query.get("path", "")
            if not path:
                raise bad_request("must provide a file name")
            offset = _number("offset", offset_text)
            limit = _number("limit", limit_text) if limit_text else 0
            file = self._open(request, alloc_id, path, offset, origin="start")
        except ApiError as exc:
            return _with_untrusted_headers(text(exc.status, exc.message))
        with file:
            resp = _with_untrusted_headers(web.StreamResponse())
            await resp.prepare(request)
            remaining = limit if limit > 0 else None  # None: to the end of the file
            while remaining != 0:
                chunk = file.read(_CHUNK if remaining is None else min(remaining, _CHUNK))
                if not chunk:
                    break
                await resp.write(chunk)
                if remaining is not None:
                    remaining -= len(chunk)
            await resp.write_eof()
        return resp

    async def stream(self, request: web.Request, alloc_id: str) -> web.StreamResponse:
        """The file as concatenated StreamFrame JSON objects; `follow` (the default) goes
        on at its end until the client leaves or the file is deleted."""
        _require_alloc_id(alloc_id)
        path = request.query.get("path", "")
        if not path:
            raise bad_request("must provide a file name")
        follow = True
        if request.query.get("follow"):
            try:
                follow = go_bool(request.query["follow"])
            except ValueError as exc:
                raise ApiError(500, f"failed to parse follow field to boolean: {exc}") from None
        offset = _number("offset", request.query.get("offset") or "0")
        origin = request.query.get("origin") or "start"
        if origin not in ("start", "end"):
            raise bad_request("origin must be start or end")
        file = self._open(request, alloc_id, path, offset, origin)
        resp = web.StreamResponse(headers={"Content-Type": "text/plain; charset=utf-8"})
        await resp.prepare(request)
        with file, contextlib.suppress(ConnectionError):  # a client leaves a followed file
            await _stream_frames(resp, file, path, follow)
            await resp.write_eof()
        return resp

    async def logs(self, request: web.Request, alloc_id: str) -> web.StreamResponse:
        """A task's stdout or stderr, as `stream` sends a file (`follow` defaults to
        false here, and ends once the allocation is terminal), or with `plain=true` as
        its bytes. A task's log is the file its client's logmon writes,
        `alloc/logs/<task>.<type>.0`. Nomad checks `read-logs` for it, not `read-fs`."""
        query = request.query
        task = query.get("task", "")
        if not alloc_id:
            raise ApiError(500, "must provide a valid alloc id")
        if not task:
            raise ApiError(500, "must provide task name")
        follow, plain = (_flag(query, name) for name in ("follow", "plain"))
        log_type = query.get("type", "")
        if log_type not in ("stdout", "stderr"):
            raise ApiError(500, "must provide log type (stdout/stderr)")
        offset = _number("offset", query.get("offset") or "0", 400)
        origin = query.get("origin") or "start"
        if origin not in ("start", "end"):
            raise ApiError(500, "origin must be start or end")
        box = self._directory(request, alloc_id, denied=500, capability=READ_LOGS)
        alloc = self.sim.sandboxes.lookup(alloc_id)
        if task not in box.tasks:
            raise bad_request(f'unknown task name "{task}"')
        path = f"alloc/logs/{task}.{log_type}.0"
        file = self._open(request, alloc_id, path, offset, origin, box)
        content_type = "text/plain" if plain else "application/json"
        resp = web.StreamResponse(headers={"Content-Type": content_type})
        await resp.prepare(request)
        follow = follow and alloc["ClientStatus"] not in TERMINAL
        with file, contextlib.suppress(ConnectionError):
            if plain:
                while chunk := file.read(_CHUNK):
                    await resp.write(chunk)
            else:
                await _stream_frames(resp, file, path, follow)
            await resp.write_eof()
        return resp

    def _open(
        self,
        request: web.Request,
        alloc_id: str,
        path: str,
        offset: int,
        origin: str,
        box: Sandbox | None = None,
    ) -> BinaryIO:
        box = box or self._directory(request, alloc_id, denied=500)
        try:
            info = stat_path(box.path, path)
        except FsError as exc:
            raise bad_request(exc.message) from None
        if info["IsDir"]:
            raise bad_request(f'file "{path}" is a directory')
        if origin == "end":
            offset = max(info["Size"] - offset, 0)
        try:
            return open_file(box.path, path, box.unreadable_dirs(), offset)
        except FsError as exc:
            raise ApiError(500, exc.message) from None

    # ------------------------------------------------------------------ both
    def _directory(
        self, request: web.Request, alloc_id: str, denied: int, capability: str = READ_FS
    ) -> Sandbox:
        """The allocation's directory, past the server's checks and the client's. A token
        the server refuses is `denied` (403 on plain RPCs, 500 on streaming ones)."""
        try:
            token = self.api.resolve_token(self.api.secret_of(request))
        except ApiError:
            raise ApiError(denied, "Permission denied") from None
        namespace = request.query.get("namespace") or "default"
        if not self.api.allows(token, namespace, capability):
            raise ApiError(denied, "Permission denied")
        sandboxes = self.sim.sandboxes
        alloc = sandboxes.lookup(alloc_id)
        sandboxes.reach(alloc)
        if not self.api.allows(token, alloc["Namespace"], capability):
            raise ApiError(403, "Permission denied")
        return sandboxes.open(alloc)


def _require_alloc_id(alloc_id: str) -> None:
    if not alloc_id:
        raise bad_request("must provide a valid alloc id")


def _plain(
    read: Callable[[str, str], JSON | list[JSON]], base: str, path: str
) -> JSON | list[JSON]:
    """An fs read as a plain RPC answers it: 404 when something is missing, else 500."""
    try:
        return read(base, path)
    except FsError as exc:
        raise ApiError(404 if NO_SUCH_FILE in exc.message else 500, exc.message) from None


def _number(name: str, raw: str, status: int = 500) -> int:
    try:
        return go_int(raw)
    except ValueError as exc:
        raise ApiError(status, f"error parsing {name}: {exc}") from None


def _flag(query: Mapping[str, str], name: str) -> bool:
    """A boolean query parameter of the logs route (absent: false; bad: 400)."""
    raw = query.get(name, "")
    try:
        return go_bool(raw) if raw else False
    except ValueError as exc:
        raise bad_request(f"failed to parse {name} field to boolean: {exc}") from None


def _with_untrusted_headers(resp: web.StreamResponse) -> web.StreamResponse:
    resp.headers.update(_UNTRUSTED_HEADERS)
    resp.headers["Content-Type"] = "text/plain"
    return resp


async def _stream_frames(resp: web.StreamResponse, file: BinaryIO, path: str, follow: bool) -> None:
    """Write the file from its offset as frames (Offset: where the frame's data ends)."""
    loop = asyncio.get_running_loop()
    quiet_since = loop.time()
    while True:
        data = file.read(_CHUNK)
        if data:
            frame: JSON = {"Offset": file.tell(), "Data": base64.b64encode(data).decode()}
            await _frame(resp, {**frame, "File": path})
            quiet_since = loop.time()
            continue
        if not follow:
            return
        event = _file_event(file)
        if event == "file deleted":
            await _frame(resp, {"Offset": file.tell(), "File": path, "FileEvent": event})
            return
        if event == "file truncated":
            file.seek(0)
            await _frame(resp, {"File": path, "FileEvent": event})
        if loop.time() - quiet_since >= _HEARTBEAT:
            await _frame(resp, {})
            quiet_since = loop.time()
        await asyncio.sleep(_FOLLOW_POLL)


async def _frame(resp: web.StreamResponse, frame: JSON) -> None:
    # No separator between frames: the client's JSON decoder reads one after another.
    await resp.write(ENCODE(frame).encode())


def _file_event(file: BinaryIO) -> str:
    try:
        size = os.stat(file.name).st_size
    except FileNotFoundError:
        return "file deleted"
    return "file truncated" if size < file.tell() else ""
