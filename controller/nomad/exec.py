"""A client of Nomad's allocation exec: `GET /v1/client/allocation/:id/exec`, a WebSocket.

Frames, as Nomad 1.7-1.9 speak them (JSON text frames, bytes in standard base64):
- to Nomad: `{"stdin":{"data":…}}`, `{"stdin":{"close":true}}` (end of input),
  `{"tty_size":{"height":…,"width":…}}`, and `{}` every 10 s as a heartbeat, as Nomad's
  own Go client sends it (proxies close idle sockets);
- from Nomad: `{"stdout":{"data":…}}`, `{"stderr":{"data":…}}`, `{"stdout":{"close":true}}`
  (ignored), then `{"exited":true,"result":{"exit_code":N}}`, where `exit_code` is left
  out when it is 0 (protobuf's omitempty). After the exit Nomad drops the TCP connection
  without a close frame: that is the normal end. A drop before it is an error.
- Nomad refuses after the upgrade, as one close frame: 1008 for what it codes 4xx
  (`Unknown allocation "…"`, `task "runner" is not running.`), 1011 for 500 or no code
  (`Permission denied`: the token lacks `alloc-exec`).

The exec sockets have their own connection pool, not the API client's: an execution holds
its connection for as long as it runs, and must not starve the reconcile loop and the
claims of theirs. Nomad allows 100 connections per client address
(`limits.http_max_conns_per_client`); EXEC_CONNECTIONS stays below that beside the API
client's connections and the event streams. TLS and the proxy are the API client's.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from controller.nomad.client import (
    DEFAULT_USER_AGENT,
    NomadSession,
    OnRequest,
    Proxy,
    report,
)
from controller.nomad.config import NomadConfig, scrub
from controller.nomad.errors import NomadError, NomadUnavailable

log = logging.getLogger(__name__)

ENDPOINT = "/v1/client/allocation/:id/exec"
EXEC_CONNECTIONS = 64
HEARTBEAT_SECONDS = 10.0
# Bytes of stdin per frame. Nomad's Go client sends 2048; the agent reads whole frames
# with no size limit, and fewer, larger frames cost less to encode on both sides.
STDIN_CHUNK = 64 * 1024
# Nomad's frames carry at most 1024 bytes of output; this only guards the decoder.
MAX_FRAME_BYTES = 4 * 1024 * 1024
_REFUSED = {1008: "refused the exec", 1011: "failed the exec"}


class ExecError(NomadError):
    """The exec did not run to its exit: Nomad refused it, or its connection broke."""


class ExecRefused(ExecError):
    """Nomad closed the socket with a code (1008, 1011, ...) before the exit; the reason
    is Nomad's text (`Unknown allocation "…"`, `Permission denied`)."""

    def __init__(self, code: int, reason: str) -> None:
        what = _REFUSED.get(code, f"closed the exec ({code})")
        reason = scrub(reason)  # Nomad's text reaches clients: no URL's credentials in it
        super().__init__(f"Nomad {what}: {reason or 'no reason given'}")
        self.code = code
        self.reason = reason


class ExecBroken(ExecError):
    """The connection ended before the command's exit (an agent or node restart, or a
    close without a code)."""


@dataclass(frozen=True, slots=True)
class Output:
    stream: str  # "stdout" or "stderr"
    data: bytes


class ExecSession:
    """One open exec: stdin to the command, its output and exit code back."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self._ws = ws
        self.exit_code: int | None = None  # set once the exit frame came
        self._heartbeat = asyncio.get_running_loop().create_task(self._beat())

    async def send(self, data: bytes) -> None:
        """Bytes to the command's stdin."""
        view = memoryview(data)
        for start in range(0, len(view), STDIN_CHUNK):
            chunk = base64.b64encode(view[start : start + STDIN_CHUNK]).decode("ascii")
            await self._frame({"stdin": {"data": chunk}})

    async def close_stdin(self) -> None:
        """The command reads the end of its input."""
        await self._frame({"stdin": {"close": True}})

    async def resize(self, height: int, width: int) -> None:
        await self._frame({"tty_size": {"height": height, "width": width}})

    async def output(self) -> AsyncIterator[Output]:
        """The command's output as it comes, until its exit (then `exit_code` is set).
        Raises ExecRefused or ExecBroken when the exec ends without an exit."""
        while self.exit_code is None:
            message = await self._ws.receive()
            if message.type in (aiohttp.WSMsgType.TEXT, aiohttp.WSMsgType.BINARY):
                try:
                    frame = json.loads(message.data)
                except ValueError:
                    raise ExecBroken("Nomad sent a frame that is not JSON") from None
                for output in self._read(frame):
                    yield output
            elif message.type is aiohttp.WSMsgType.CLOSE:
                raise ExecRefused(int(message.data), str(message.extra or ""))
            else:  # CLOSED, CLOSING, ERROR: the connection is gone
                raise ExecBroken("the connection to Nomad ended before the command's exit")

    def _read(self, frame: Any) -> list[Output]:
        if not isinstance(frame, dict):
            return []
        if frame.get("exited") is True:
            result = frame.get("result") or {}
            code = result.get("exit_code", 0) if isinstance(result, dict) else 0
            self.exit_code = code if isinstance(code, int) else 0
            return []
        found = []
        for stream in ("stdout", "stderr"):
            part = frame.get(stream)
            data = part.get("data") if isinstance(part, dict) else None
            if isinstance(data, str) and data:
                try:
                    found.append(Output(stream, base64.b64decode(data, validate=True)))
                except binascii.Error:
                    raise ExecBroken(f"Nomad sent {stream} that is not base64") from None
        return found  # anything else ({}, the close frames) is no output

    async def close(self) -> None:
        """Leave the exec. Nomad does not stop the command when its socket closes: the
        command wrapping (controller.executions) does."""
        self._heartbeat.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._heartbeat
        with contextlib.suppress(aiohttp.ClientError, OSError, RuntimeError):
            await self._ws.close()

    async def _frame(self, frame: dict[str, Any]) -> None:
        try:
            await self._ws.send_str(json.dumps(frame, separators=(",", ":")))
        except (aiohttp.ClientError, ConnectionError, RuntimeError) as error:
            raise ExecBroken(f"the connection to Nomad ended: {type(error).__name__}") from None

    async def _beat(self) -> None:
        with contextlib.suppress(ExecBroken):
            while not self._ws.closed:
                await asyncio.sleep(HEARTBEAT_SECONDS)
                await self._frame({})


class NomadExec:
    """Opens exec sessions with the controller's Nomad token and TLS settings."""

    def __init__(
        self,
        config: NomadConfig,
        *,
        on_request: OnRequest | None = None,
        connect_timeout: float = 10.0,
        max_connections: int = EXEC_CONNECTIONS,
        user_agent: str = DEFAULT_USER_AGENT,
    ) -> None:
        self._config = config
        self._on_request = on_request
        self._proxy = Proxy.for_address(config.address)
        self._sessions = NomadSession(
            config,
            max_connections,
            aiohttp.ClientTimeout(
                total=None, connect=connect_timeout, sock_connect=connect_timeout
            ),
            user_agent,
        )

    @contextlib.asynccontextmanager
    async def session(
        self,
        allocation_id: str,
        task: str,
        command: Sequence[str],
        *,
        namespace: str,
        tty: bool = False,
    ) -> AsyncIterator[ExecSession]:
        """An exec of `command` in `task` of the allocation. Raises NomadUnavailable when
        Nomad cannot be reached, ExecRefused when it answers without upgrading."""
        params = {
            "task": task,
            "command": json.dumps(list(command), separators=(",", ":")),
            "tty": "true" if tty else "false",
            "namespace": namespace,
        }
        if self._config.region:
            params["region"] = self._config.region
        ws = await self._connect(f"/v1/client/allocation/{allocation_id}/exec", params)
        session = ExecSession(ws)
        try:
            yield session
        finally:
            await session.close()

    async def _connect(self, path: str, params: dict[str, str]) -> aiohttp.ClientWebSocketResponse:
        try:
            ws = await self._sessions.get().ws_connect(
                path,
                params=params,
                proxy=self._proxy.url,
                proxy_auth=self._proxy.auth,
                timeout=aiohttp.ClientWSTimeout(ws_receive=None, ws_close=2.0),
                autoping=True,
                max_msg_size=MAX_FRAME_BYTES,
            )
        except aiohttp.WSServerHandshakeError as error:
            self._report(str(error.status))
            # Nomad's answers before an upgrade: a command or tty it cannot parse (500),
            # a path it does not know (404). Nothing ran.
            raise ExecError(
                f"Nomad answered HTTP {error.status} instead of opening the exec"
            ) from None
        except (aiohttp.ClientError, TimeoutError, OSError) as error:
            self._report("error")
            raise NomadUnavailable(
                f"exec: cannot reach Nomad at {self._config.address} ({type(error).__name__})",
                maybe_applied=False,
            ) from None
        self._report("101")
        return ws

    def _report(self, code: str) -> None:
        report(self._on_request, ENDPOINT, code)

    async def close(self) -> None:
        await self._sessions.close()
