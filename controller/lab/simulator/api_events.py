"""Route: /v1/event/stream, the event stream as newline-delimited JSON frames."""

from __future__ import annotations

import asyncio

from aiohttp import web

from controller.lab.simulator.authz import check_topics
from controller.lab.simulator.events import StreamDropped, TopicFilter
from controller.lab.simulator.routes import RouteGroup
from controller.lab.simulator.util import JSON, bad_request
from controller.lab.simulator.wire import AddRoute, namespace_of, parse_int


class EventRoutes(RouteGroup):
    def register(self, r: AddRoute) -> None:
        r(r"/v1/event/stream", GET=self.event_stream)

    async def event_stream(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.StreamResponse:
        topics: dict[str, set[str]] = {}
        for raw in request.query.getall("topic", []):
            if raw.count(":") > 1:
                raise bad_request(
                    "Invalid topic query: error parsing topics: "
                    f"Invalid key value pair for topic, topic: {raw}"
                )
            topic, colon, key = raw.partition(":")
            # A topic alone is all of its keys; `Topic:` is the empty key (matches none).
            topics.setdefault(topic, set()).add(key if colon else "*")
        if not topics:
            topics = {"*": {"*"}}
        permissions = self.sim.permissions(t)
        if permissions is not None:
            check_topics(set(topics), permissions, namespace_of(request))
        index = parse_int(request, "index") or 0
        filt = TopicFilter(topics, namespace_of(request))
        broker = self.sim.broker
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        await resp.prepare(request)
        loop = asyncio.get_running_loop()
        seq = broker.start_seq(index)
        generation = broker.generation
        try:
            await resp.write(b"{}\n")
            last_write = loop.time()
            while True:
                if broker.closing:
                    await resp.write_eof()  # the agent stops: the body ends, cleanly
                    return resp
                if broker.generation != generation:
                    if request.transport is not None:
                        request.transport.abort()  # a server restart, as the client sees it
                    return resp
                items = broker.read(seq)
                for item in items:
                    frame = filt.frame(item)
                    if frame is not None:
                        await resp.write(frame)
                        last_write = loop.time()
                    seq = item.seq + 1
                if items:
                    continue
                idle = loop.time() - last_write
                if idle >= self.sim.heartbeat_seconds:
                    await resp.write(b"{}\n")
                    last_write = loop.time()
                    continue
                await broker.wait(seq, self.sim.heartbeat_seconds - idle)
        except StreamDropped:
            return resp  # `event dropped from buffer`: the stream ends
        except (ConnectionResetError, ConnectionError):
            return resp
