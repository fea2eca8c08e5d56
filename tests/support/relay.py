"""A TCP relay to a server, which a test can cut: connections through it are reset and new
ones refused at once, as the server sees a client whose process was killed.

It runs in a thread of its own, so that it relays while the test's event loop is busy.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class Relay:
    """Relays 127.0.0.1:``port`` to ``host``:``target_port`` until ``cut()`` or ``stop()``."""

    def __init__(self, host: str, target_port: int) -> None:
        self.host = host
        self.target_port = target_port
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.Server | None = None
        self._transports: set[asyncio.WriteTransport] = set()
        self._thread = threading.Thread(target=self._loop.run_forever, name="relay", daemon=True)

    def start(self) -> Relay:
        self._thread.start()
        self._server = self._run(asyncio.start_server(self._relay, "127.0.0.1", 0))
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self

    def _run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(10)

    async def _relay(
        self, client_in: asyncio.StreamReader, client_out: asyncio.StreamWriter
    ) -> None:
        try:
            server_in, server_out = await asyncio.open_connection(self.host, self.target_port)
        except OSError:
            client_out.transport.abort()
            return
        for writer in (client_out, server_out):
            self._transports.add(writer.transport)
        await asyncio.gather(
            _pump(client_in, server_out), _pump(server_in, client_out), return_exceptions=True
        )
        for writer in (client_out, server_out):
            self._transports.discard(writer.transport)
            writer.transport.abort()

    def cut(self) -> None:
        """Refuse new connections and reset every open one."""
        self._run(self._cut())

    async def _cut(self) -> None:
        if self._server is not None:
            self._server.close()
        for transport in list(self._transports):
            transport.abort()

    def stop(self) -> None:
        if not self._thread.is_alive():
            return
        self.cut()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()


async def _pump(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    with contextlib.suppress(OSError):
        while data := await source.read(65536):
            sink.write(data)
            await sink.drain()
    with contextlib.suppress(OSError, RuntimeError):
        sink.write_eof()
