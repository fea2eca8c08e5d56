"""Serving a table of routes: this API's app and Poseidon's add theirs alike."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from aiohttp import web
from aiohttp.typedefs import Handler


class Served(Protocol):
    """What an app needs of a route to serve it."""

    @property
    def method(self) -> str: ...
    @property
    def path(self) -> str: ...
    @property
    def handler(self) -> Handler: ...


def add_routes(app: web.Application, routes: Iterable[Served]) -> None:
    for route in routes:
        if route.method == "GET":
            app.router.add_get(route.path, route.handler)  # and HEAD
        else:
            app.router.add_route(route.method, route.path, route.handler)
