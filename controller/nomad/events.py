"""Nomad's event stream turned into "look at this job again" hints.

Events are hints only (docs/architecture.md): a duplicate costs one extra reconcile and a lost
event is covered by the periodic resync. So the watcher is built to never stop: any
failure (refused connection, 403, a stream that ends, a chunked-encoding error, a bad
line) is logged once per kind, reported through `on_state(False)`, and followed by a
reconnect with exponential backoff and jitter from the last seen Index + 1.

python-nomad's stream thread is not used: it reconnects at once from its original index
and dies silently on other errors. This watcher runs on the event loop with aiohttp,
with the same TLS settings, proxy and token as NomadClient, and reads the NDJSON body in
chunks, since a single frame (a plan with many allocations) can exceed aiohttp's
line-length limit.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import time
from collections.abc import Callable
from typing import Any

import aiohttp

from controller.nomad.client import Proxy, tls_connector
from controller.nomad.config import NomadConfig

log = logging.getLogger(__name__)

TOPICS = ("Job:*", "Allocation:*")
_MAX_LINE = 64 * 1024 * 1024  # a frame larger than this means a broken stream


class _StreamError(Exception):
    """A failure of one connection; `kind` groups repeats for logging."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind = kind


class EventWatcher:
    """Follows Job and Allocation events of one Nomad namespace, calling on_job(job_id).

    on_job and on_state run on the event loop thread. `healthy_after` is how long a
    connection must last before the backoff starts again from `backoff_base`;
    `read_timeout` must exceed Nomad's 30 s heartbeat.
    """

    def __init__(
        self,
        config: NomadConfig,
        namespace: str,
        on_job: Callable[[str], None],
        *,
        on_state: Callable[[bool], None] | None = None,
        backoff_base: float = 0.5,
        backoff_max: float = 30.0,
        healthy_after: float = 30.0,
        read_timeout: float = 75.0,
        start_index: int = 0,
        rng: random.Random | None = None,
    ) -> None:
        self._config = config
        self._namespace = namespace
        self._on_job = on_job
        self._on_state = on_state
        self._backoff_base = backoff_base
        self._backoff_max = backoff_max
        self._healthy_after = healthy_after
        self._read_timeout = read_timeout
        self._rng = rng or random.Random()
        self._index = start_index  # last Index seen; resume from the next one
        self._up: bool | None = None
        self._failures = 0
        self._logged: set[str] = set()
        self._task: asyncio.Task[None] | None = None

    @property
    def last_index(self) -> int:
        return self._index

    @property
    def up(self) -> bool:
        return bool(self._up)

    def start(self) -> None:
        """Start following the stream on the running event loop."""
        if self._task is None or self._task.done():
            self._set_state(False)
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name=f"nomad-events-{self._namespace}"
            )

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._set_state(False)

    # -- the loop ------------------------------------------------------------------------

    async def _run(self) -> None:
        headers = {"X-Nomad-Token": self._config.token} if self._config.token else {}
        connector = tls_connector(self._config)
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=self._read_timeout)
        async with aiohttp.ClientSession(
            connector=connector, headers=headers, timeout=timeout
        ) as session:
            while True:
                started = time.monotonic()
                try:
                    await self._follow(session)
                    raise _StreamError("ended", "Nomad closed the stream")
                except asyncio.CancelledError:
                    raise
                except _StreamError as exc:
                    self._failed(exc.kind, str(exc), started)
                except aiohttp.ClientResponseError as exc:
                    self._failed(f"http-{exc.status}", f"{exc.status} {exc.message}", started)
                except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                    self._failed(type(exc).__name__, str(exc) or type(exc).__name__, started)
                except Exception as exc:  # never die: events are only hints
                    self._failed(type(exc).__name__, repr(exc), started)
                await asyncio.sleep(self._next_delay())

    async def _follow(self, session: aiohttp.ClientSession) -> None:
        params: list[tuple[str, str]] = [("topic", t) for t in TOPICS]
        params += [("namespace", self._namespace), ("index", str(self._resume_index()))]
        if self._config.region:
            params.append(("region", self._config.region))
        url = f"{self._config.address}/v1/event/stream"
        proxy = Proxy.for_address(self._config.address)
        async with session.get(url, params=params, proxy=proxy.url, proxy_auth=proxy.auth) as resp:
            if resp.status != 200:
                body = (await resp.text(errors="replace"))[:300].strip()
                raise _StreamError(
                    f"http-{resp.status}", f"{resp.status} {self._config.redact(body)}"
                )
            buffer = b""
            async for chunk in resp.content.iter_any():
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    self._handle_line(line)
                if len(buffer) > _MAX_LINE:
                    raise _StreamError("oversized", f"a frame exceeded {_MAX_LINE} bytes")
            if buffer.strip():
                self._handle_line(buffer)

    def _handle_line(self, line: bytes) -> None:
        line = line.strip()
        if not line:
            return
        try:
            frame = json.loads(line)
        except ValueError:
            self._log_once("bad-json", f"skipping a line that is not JSON: {line[:100]!r}")
            return
        # Any frame, the `{}` heartbeat included (sent on connect), proves the stream works.
        self._set_state(True)
        if not isinstance(frame, dict) or not frame:
            return
        index = frame.get("Index")
        if isinstance(index, int) and index > self._index:
            self._index = index
        job_ids: dict[str, None] = {}  # ordered and de-duplicated within a frame
        for event in frame.get("Events") or ():
            job_id = _job_of(event)
            if job_id:
                job_ids[job_id] = None
        for job_id in job_ids:
            try:
                self._on_job(job_id)
            except Exception:
                log.exception("on_job(%r) failed", job_id)

    def _resume_index(self) -> int:
        # Nomad starts inclusive of the given index; the last one was already seen.
        return self._index + 1 if self._index > 0 else 0

    # -- failures and backoff ------------------------------------------------------------

    def _failed(self, kind: str, detail: str, started: float) -> None:
        self._set_state(False)
        if time.monotonic() - started >= self._healthy_after:
            # The connection worked for a while: this is a fresh outage, not a flapping one.
            self._failures = 0
            self._logged.clear()
        self._failures += 1
        self._log_once(kind, f"event stream for namespace {self._namespace!r}: {detail}")

    def _next_delay(self) -> float:
        ceiling = min(self._backoff_max, self._backoff_base * 2 ** (self._failures - 1))
        return self._rng.uniform(ceiling / 2, ceiling)

    def _log_once(self, kind: str, message: str) -> None:
        message = self._config.redact(message)
        if kind in self._logged:
            log.debug("%s", message)
        else:
            self._logged.add(kind)
            log.warning("%s (repeats are logged at debug level)", message)

    def _set_state(self, up: bool) -> None:
        if self._up is up:
            return
        self._up = up
        if up:
            log.info("event stream for namespace %r is up", self._namespace)
        if self._on_state is not None:
            try:
                self._on_state(up)
            except Exception:
                log.exception("on_state hook failed")


def _job_of(event: Any) -> str | None:
    if not isinstance(event, dict):
        return None
    topic = event.get("Topic")
    if topic == "Job":
        key = event.get("Key")
        return key if isinstance(key, str) and key else None
    if topic == "Allocation":
        payload = event.get("Payload") or {}
        alloc = payload.get("Allocation") if isinstance(payload, dict) else None
        job_id = alloc.get("JobID") if isinstance(alloc, dict) else None
        if not job_id:
            keys = event.get("FilterKeys") or []
            job_id = keys[0] if keys else None
        return job_id if isinstance(job_id, str) and job_id else None
    return None
