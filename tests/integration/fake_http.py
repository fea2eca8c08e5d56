"""Small loopback HTTP servers for tests that need Nomad's answers scripted exactly."""

from __future__ import annotations

from typing import Any

from aiohttp import web


def multi_query(request: web.Request) -> dict[str, list[str]]:
    """The query string with repeated keys kept (Nomad's `topic=` repeats)."""
    query: dict[str, list[str]] = {}
    for key, value in request.query.items():
        query.setdefault(key, []).append(value)
    return query


async def serve_app(app: web.Application, runners: list[web.AppRunner], ssl_context: Any) -> str:
    """Start `app` on a free loopback port; the caller cleans up `runners`."""
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    runners.append(runner)
    await web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ssl_context).start()
    port = runner.addresses[0][1]
    return f"{'https' if ssl_context else 'http'}://127.0.0.1:{port}"
