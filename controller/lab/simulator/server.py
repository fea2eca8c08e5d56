"""Running the simulator's HTTP API on a socket (in-process or from the CLI)."""

from __future__ import annotations

import asyncio
import socket
import ssl
from dataclasses import dataclass

from aiohttp import web

from controller.lab.simulator.api import build_app
from controller.lab.simulator.cluster import Simulator


@dataclass
class SimServer:
    sim: Simulator
    runner: web.AppRunner
    host: str
    port: int
    url: str

    async def stop(self) -> None:
        # Event streams end as an agent that shuts down ends them: their bodies end (the
        # client reads EOF), rather than being cut. Blocking queries and exec sessions
        # would otherwise hold the shutdown open.
        self.sim.broker.close()
        await asyncio.sleep(0)  # the streams write their end
        self.sim.shutdown()
        # The exec sessions end with their killed processes. aiohttp's shutdown gives a
        # request still in progress a grace period and logs an InvalidStateError for one
        # that ends just as that period runs out: let them end first.
        await self.sim.sandboxes.sessions_ended(_SHUTDOWN_TIMEOUT)
        await self.runner.cleanup()


_SHUTDOWN_TIMEOUT = 0.5  # seconds a request in progress may take to end
GO_MAX_HEADER_BYTES = 1 << 20  # net/http's DefaultMaxHeaderBytes, which Nomad's agent keeps


async def start_sim(
    sim: Simulator,
    host: str = "127.0.0.1",
    port: int = 0,
    ssl_context: ssl.SSLContext | None = None,
    listening: socket.socket | None = None,
) -> SimServer:
    """Serve `sim` on host:port (0 picks a free port), or on the `listening` socket its
    starter bound for it; returns once it accepts connections."""
    runner = web.AppRunner(
        build_app(sim),
        access_log=None,
        shutdown_timeout=_SHUTDOWN_TIMEOUT,
        # As Go's HTTP server reads a request: up to 1 MiB of request line and headers
        # (an exec's command travels in its URL).
        max_line_size=GO_MAX_HEADER_BYTES,
        max_field_size=GO_MAX_HEADER_BYTES,
    )
    await runner.setup()
    site: web.BaseSite
    if listening is not None:
        site = web.SockSite(runner, listening, ssl_context=ssl_context)
        host, port = listening.getsockname()[:2]
    else:
        site = web.TCPSite(runner, host, port, ssl_context=ssl_context)
    await site.start()
    server = site._server
    sockets = getattr(server, "sockets", None) or []
    bound = sockets[0].getsockname()[1] if sockets else port
    if host not in ("0.0.0.0", "::", ""):
        sim.advertise = host
    scheme = "https" if ssl_context is not None else "http"
    shown = "127.0.0.1" if host in ("0.0.0.0", "") else host
    sim.node_registry.serve_clients_at(f"{shown}:{bound}")
    return SimServer(sim, runner, host, bound, f"{scheme}://{shown}:{bound}")
