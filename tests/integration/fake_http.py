"""Small loopback HTTP servers for tests that need Nomad's answers scripted exactly."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def multi_query(request: web.Request) -> dict[str, list[str]]:
    """The query string with repeated keys kept (Nomad's `topic=` repeats)."""
    query: dict[str, list[str]] = {}
    for key, value in request.query.items():
        query.setdefault(key, []).append(value)
    return query


class Loopback:
    """Handlers served on free loopback ports, all stopped by `close`."""

    def __init__(self) -> None:
        self.runners: list[web.AppRunner] = []

    async def serve(self, method: str, path: str, handler: Handler, ssl_context: Any = None) -> str:
        """Serve `handler` at `method path`; the base URL it is reached at."""
        app = web.Application()
        app.router.add_route(method, path, handler)
        runner = web.AppRunner(app, shutdown_timeout=0.1)
        await runner.setup()
        self.runners.append(runner)
        await web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ssl_context).start()
        port = runner.addresses[0][1]
        return f"{'https' if ssl_context else 'http'}://127.0.0.1:{port}"

    async def close(self) -> None:
        for runner in self.runners:
            await runner.cleanup()
