"""`--access-log`: one log line per request, after its answer.

The line names the route *template* (`/v1/runners/{runnerId}`), never the path a client
sent: paths carry runner IDs and, mistyped, anything at all. Headers, query strings and
bodies are never logged, so neither is a token.
"""

from __future__ import annotations

import logging
import time
from typing import Final

from aiohttp import web
from aiohttp.typedefs import Handler

from controller.executions.streaming import CLIENT_GONE

log = logging.getLogger(__name__)

# A request that matched no route (404, 405): its path is not logged.
UNMATCHED: Final = "(unmatched)"
# The client closed the connection before the answer, or while a streamed answer was
# being sent (nginx's convention).
CLIENT_CLOSED: Final = 499
# Polled by probes and scrapers every few seconds: logged at DEBUG, so that the
# access log shows what clients do.
POLLED_ROUTES: Final = frozenset({"/healthz", "/readyz", "/metrics"})


def route_template(request: web.Request) -> str:
    resource = request.match_info.route.resource
    return resource.canonical if resource is not None else UNMATCHED


@web.middleware
async def access_log(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Outermost middleware: it sees the status the error middleware answered with."""
    started = time.perf_counter()
    status = CLIENT_CLOSED  # unless an answer comes: only a cancel gets past the errors
    try:
        response = await handler(request)
        status = CLIENT_CLOSED if request.get(CLIENT_GONE) else response.status
        return response
    except web.HTTPException as error:
        status = error.status
        raise
    finally:
        route = route_template(request)
        duration_ms = round((time.perf_counter() - started) * 1000, 1)
        log.log(
            logging.DEBUG if route in POLLED_ROUTES else logging.INFO,
            "%s %s %d %.1f ms",
            request.method,
            route,
            status,
            duration_ms,
            extra={
                "method": request.method,
                "route": route,
                "status": status,
                "durationMs": duration_ms,
            },
        )
