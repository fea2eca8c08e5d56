"""The HTTP wire: replies, query parameters, request bodies and blocking queries."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from aiohttp import web

from controller.core.gojson import GO_BOOLS, go_bool
from controller.lab.simulator.bexpr import FilterError, compile_filter
from controller.lab.simulator.util import JSON, bad_request, parse_go_duration

if TYPE_CHECKING:
    from controller.lab.simulator.cluster import Simulator

Handler = Callable[[web.Request, dict[str, str], JSON | None], Awaitable[web.StreamResponse]]
MAX_WAIT = 300.0
# One shared encoder: json.dumps(..., separators=...) would build a new one per call.
ENCODE = json.JSONEncoder(separators=(",", ":")).encode


class AddRoute(Protocol):
    """How a route group adds a route: a path pattern and a handler per HTTP method."""

    def __call__(self, pattern: str, **methods: Handler) -> None: ...


def text(status: int, message: str) -> web.Response:
    return web.Response(status=status, text=message, content_type="text/plain", charset="utf-8")


def reply(body: Any, index: int | None = None, status: int = 200) -> web.Response:
    headers = {"X-Nomad-KnownLeader": "true", "X-Nomad-LastContact": "0"}
    if index is not None:
        headers["X-Nomad-Index"] = str(index)
    return web.Response(
        status=status,
        body=ENCODE(body).encode(),
        content_type="application/json",
        headers=headers,
    )


def reply_raw(body: bytes, index: int) -> web.Response:
    headers = {
        "X-Nomad-KnownLeader": "true",
        "X-Nomad-LastContact": "0",
        "X-Nomad-Index": str(index),
    }
    return web.Response(body=body, content_type="application/json", headers=headers)


_Value = TypeVar("_Value")


def parse_bool(request: web.Request, name: str, default: bool = False) -> bool:
    value = _query_value(
        request, name, go_bool, 'Failed to parse value of "{name}" ({raw}): invalid syntax'
    )
    return default if value is None else value


def parse_int(request: web.Request, name: str) -> int | None:
    return _query_value(
        request, name, int, "Failed to parse value of '{name}' ({raw}): invalid syntax"
    )


def _query_value(
    request: web.Request, name: str, parse: Callable[[str], _Value], error: str
) -> _Value | None:
    """The query parameter `name` parsed, None when absent or empty; a bad one is Nomad's
    400 with `error` (its two parsers quote the name differently)."""
    raw = request.query.get(name)
    if raw is None or raw == "":
        return None
    try:
        return parse(raw)
    except ValueError:
        raise bad_request(error.format(name=name, raw=raw)) from None


def namespace_of(request: web.Request) -> str:
    return request.query.get("namespace") or "default"


async def read_json(request: web.Request, required: bool = True) -> Any:
    try:
        raw = await request.read()
    except ConnectionResetError:
        # The client died mid-body (a SIGKILLed controller): nothing was applied, and the
        # answer reaches no one; say so instead of logging a traceback.
        raise bad_request("client closed the connection before sending the body") from None
    if not raw.strip():
        if required:
            raise bad_request("Request body is empty")
        return None
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise bad_request(f"Failed to decode request body: {type(exc).__name__}") from None


async def block(sim: Simulator, request: web.Request, index_of: Callable[[], int]) -> int:
    """Blocking query: wait until index_of() > ?index or ?wait elapses; returns the index
    to answer with. As in Nomad, that is the index of what was read, 0 for a table never
    written: the few reads Nomad floors at 1 say so themselves (`floored`)."""
    raw_index = request.query.get("index")
    raw_wait = request.query.get("wait")
    stale = request.query.get("stale")
    if stale not in (None, "") and stale not in GO_BOOLS:
        raise bad_request(
            f"Expect `true` or `false` for `stale` query string parameter, got {stale}"
        )
    min_index = 0
    if raw_index not in (None, ""):
        try:
            min_index = int(raw_index)
            if min_index < 0:
                raise ValueError
        except ValueError:
            raise bad_request("Invalid index") from None
    wait = MAX_WAIT
    if raw_wait not in (None, ""):
        try:
            wait = parse_go_duration(raw_wait)
        except ValueError:
            raise bad_request("Invalid wait time") from None
        wait = MAX_WAIT if wait <= 0 else min(wait, MAX_WAIT)
    if min_index > 0:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        while index_of() <= min_index:
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            await sim.wait_for_change(remaining)
    return index_of()


def floored(index: int) -> int:
    """The index of the reads Nomad answers with at least 1 (`setReplyQueryMeta`, ACL
    policies, namespaces, a node's allocations), so that a blocking query can follow."""
    return max(index, 1)


def table_index(sim: Simulator, *names: str) -> Callable[[], int]:
    """The newest index of the named tables, as a blocking query waits on it."""
    return lambda: max(sim.table_index[n] for n in names)


def query_filter(request: web.Request) -> Callable[[Any], bool] | None:
    expr = request.query.get("filter")
    if not expr:
        return None
    try:
        return compile_filter(expr)
    except FilterError as exc:
        raise bad_request(
            f"failed to create result paginator: failed to read filter expression: {exc}"
        ) from None
