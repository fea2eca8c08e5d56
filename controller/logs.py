"""The log lines of `run` and `operator`: one set-up for poolkeeper's loggers and kopf's,
as text (the default) or as one JSON object per line (`--log-format json`).

A JSON line holds `time` (RFC 3339, UTC), `level`, `logger` and `message`, then every
field the call passed with `extra=` (a domain event's `pool` and `reason`, an access-log
line's `method`, `route`, `status` and `durationMs`), and for kopf's per-object logs the
object as `object` (`namespace/name`). A text line carries the same message, which
already says what those fields say.
"""

from __future__ import annotations

import copy
import json
import logging
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any, Final

from aiohttp.http_exceptions import HttpProcessingError

TEXT_FORMAT: Final = "%(asctime)s %(levelname)s %(name)s: %(message)s"

# What every LogRecord has; any other attribute of a record came from `extra=`.
_RECORD_ATTRIBUTES: Final = frozenset(
    vars(logging.LogRecord("", logging.INFO, "", 0, "", None, None))
) | {"message", "asctime", "taskName"}
# kopf's per-object loggers add the object's reference (shown as `object`), whether to
# post the line as a Kubernetes Event, and the operator's settings (neither is shown).
_KOPF_OBJECT: Final = "k8s_ref"
_KOPF_INTERNALS: Final = frozenset({_KOPF_OBJECT, "k8s_skip", "settings"})


def _kopf_object(record: logging.LogRecord) -> str | None:
    ref = getattr(record, _KOPF_OBJECT, None)
    if not isinstance(ref, Mapping):
        return None
    name, namespace = ref.get("name") or "", ref.get("namespace")
    return f"{namespace}/{name}" if namespace else str(name)


def _rfc3339(created: float) -> str:
    moment = datetime.fromtimestamp(created, UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


class TextFormatter(logging.Formatter):
    """`TIME LEVEL LOGGER: MESSAGE`; a kopf line about an object starts with it."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        obj = _kopf_object(record)
        if obj is not None:
            record = copy.copy(record)  # other handlers see the record unchanged
            record.msg, record.args = f"[{obj}] {record.getMessage()}", None
        return super().format(record)


class JsonFormatter(logging.Formatter):
    """One JSON object per line (module docstring)."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": _rfc3339(record.created),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        obj = _kopf_object(record)
        if obj is not None:
            entry["object"] = obj
        for key, value in vars(record).items():
            if key not in _RECORD_ATTRIBUTES and key not in _KOPF_INTERNALS:
                entry.setdefault(key, value)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry, ensure_ascii=False, default=str)


class MalformedRequests(logging.Filter):
    """The HTTP server's records of requests it could not parse (a request line or
    headers too long, too many headers, a Content-Length that is no number: a client's
    fault, answered 4xx before any route) as one INFO line without a traceback, at most
    one each `interval` seconds: anyone who can connect could otherwise fill the log.
    The next line counts those left out. Every other record passes as it is."""

    def __init__(self, interval: float = 1.0, clock: Callable[[], float] = time.monotonic):
        super().__init__()
        self.interval = interval
        self.clock = clock
        self._next = float("-inf")
        self._left_out = 0

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if not isinstance(error, HttpProcessingError):
            return True
        now = self.clock()
        if now < self._next:
            self._left_out += 1
            return False
        self._next = now + self.interval
        client = record.args[0] if isinstance(record.args, tuple) and record.args else "?"
        more = f" ({self._left_out} more since the last line)" if self._left_out else ""
        self._left_out = 0
        record.msg = "refused a malformed request from %s: %s %s%s"
        record.args = (client, error.code, error.message, more)
        record.levelno, record.levelname = logging.INFO, "INFO"
        record.exc_info = record.exc_text = None
        return True


def http_server_logger() -> logging.Logger:
    """The logger of poolkeeper's HTTP server (aiohttp's own records), malformed requests
    briefly (MalformedRequests)."""
    logger = logging.getLogger(HTTP_SERVER_LOGGER)
    if not any(isinstance(f, MalformedRequests) for f in logger.filters):
        logger.addFilter(MalformedRequests())
    return logger


HTTP_SERVER_LOGGER: Final = "controller.http"

LOG_FORMATS: Final[Mapping[str, Callable[[], logging.Formatter]]] = {
    "text": TextFormatter,
    "json": JsonFormatter,
}


def start_logging(log_format: str = "text") -> None:
    """INFO and above to stderr in `log_format`, for every logger (kopf's included: they
    all propagate to the root logger). Does nothing when logging is set up already."""
    handler = logging.StreamHandler()
    handler.setFormatter(LOG_FORMATS[log_format]())
    logging.basicConfig(level=logging.INFO, handlers=[handler])
