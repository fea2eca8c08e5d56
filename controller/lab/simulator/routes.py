"""What the route groups share: the simulator they serve and the steps many of their
handlers take (blocking reads, the query of a list, a JSON object body, a 404, the
replies of writes, a page's next token)."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from aiohttp import web

from controller.lab.simulator.util import JSON, bad_request, not_found
from controller.lab.simulator.wire import (
    ENCODE,
    Handler,
    block,
    namespace_of,
    query_filter,
    read_json,
    reply,
    table_index,
)

if TYPE_CHECKING:
    from controller.lab.simulator.api import Api
    from controller.lab.simulator.cluster import Simulator

T = TypeVar("T")
NOT_AN_OBJECT = "Failed to decode request body: expected a JSON object"


@dataclass(frozen=True)
class ListQuery:
    """What every list route reads first, in this order (the first bad one is the 400):
    the blocking query, then ?filter, ?namespace and ?prefix."""

    index: int  # to answer with, once the listed tables changed
    keep: Callable[[Any], bool] | None  # ?filter
    namespace: str
    prefix: str


class RouteGroup:
    """The routes of one part of the API, served from one simulator."""

    def __init__(self, sim: Simulator) -> None:
        self.sim = sim

    async def block_on_tables(self, request: web.Request, *tables: str) -> int:
        """A blocking query on the newest index of `tables`."""
        return await block(self.sim, request, table_index(self.sim, *tables))

    async def block_on_object(
        self, request: web.Request, table: str, find: Callable[[], JSON | None]
    ) -> int:
        """A blocking read of one object: it waits on the object's ModifyIndex, or on its
        table's index while the object does not exist."""

        def index_of() -> int:
            obj = find()
            return int(obj["ModifyIndex"]) if obj is not None else self.sim.table_index[table]

        return await block(self.sim, request, index_of)

    async def list_query(self, request: web.Request, *tables: str) -> ListQuery:
        """The query of a list of what `tables` hold."""
        index = await self.block_on_tables(request, *tables)
        keep = query_filter(request)
        return ListQuery(index, keep, namespace_of(request), request.query.get("prefix", ""))


class EncodedStubs(Generic[T]):
    """The list stubs of objects as JSON, each encoded once per version of its object and
    then reused: a long list re-encodes only the objects written since the last one."""

    def __init__(self, key_of: Callable[[T], Hashable], version_of: Callable[[T], object]) -> None:
        self._key_of = key_of
        self._version_of = version_of
        self._encoded: dict[tuple[Hashable, Hashable], tuple[object, bytes]] = {}

    def array(self, items: Iterable[T], variant: Hashable, stub: Callable[[T], JSON]) -> bytes:
        """The JSON array of the items' stubs; `variant` names the query parameters that
        shape a stub, so that each shape is kept apart."""
        parts: list[bytes] = []
        for item in items:
            key, version = (variant, self._key_of(item)), self._version_of(item)
            hit = self._encoded.get(key)
            if hit is None or hit[0] != version:
                hit = self._encoded[key] = (version, ENCODE(stub(item)).encode())
            parts.append(hit[1])
        return b"[" + b",".join(parts) + b"]"


async def read_object(request: web.Request) -> JSON:
    """The request's body, which must be a JSON object."""
    body = await read_json(request)
    if not isinstance(body, dict):
        raise bad_request(NOT_AN_OBJECT)
    return body


def found(value: T | None, what: str) -> T:
    """`value`, or Nomad's 404 for a `what` that does not exist."""
    if value is None:
        raise not_found(what)
    return value


def put_or_post(handler: Handler) -> dict[str, Handler]:
    """The methods of a write: Nomad takes PUT and POST alike."""
    return {"PUT": handler, "POST": handler}


def object_methods(read: Handler, write: Handler, delete: Handler) -> dict[str, Handler]:
    """The methods of one object's route: GET reads it, PUT or POST writes it, DELETE
    deletes it."""
    return {"GET": read, "DELETE": delete, **put_or_post(write)}


def write_reply(out: JSON) -> web.Response:
    """The answer to a write whose response body carries the write's index."""
    return reply(out, out["Index"])


def index_reply(index: int) -> web.Response:
    """The answer to a write that Nomad answers with its index alone, and no body."""
    return web.Response(status=200, headers={"X-Nomad-Index": str(index)})


def with_next_token(response: web.Response, next_token: str | None) -> web.Response:
    """A list page's response, with the token of the next page when there is one."""
    if next_token is not None:
        response.headers["X-Nomad-NextToken"] = next_token
    return response


class ClientRoutes(RouteGroup):
    """Routes of a Nomad client (exec, file system) that check a token themselves: Nomad
    authorizes them on the client, after the allocation is known, not in the server's
    route table."""

    def __init__(self, sim: Simulator, api: Api) -> None:
        super().__init__(sim)
        self.api = api
