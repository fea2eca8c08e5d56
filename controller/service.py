"""What `poolkeeper run` and `poolkeeper operator` share: metrics, the Nomad sessions, the
engine, the API listener and claim path over the engine (serving.py), the event-stream
watchers, and what API replicas tell the reconcilers through Nomad (the doorbell and their
waiting records). The two front doors differ only in where pools come from."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import functools
import logging
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from controller.core.catalog import CLAIMS, ENVIRONMENTS, WAITING
from controller.core.events import EventSink, PoolEvent
from controller.core.leases import DEFAULT_TTL_SECONDS, MIN_TTL_SECONDS
from controller.core.paths import catalog_path
from controller.core.readiness import Readiness
from controller.core.times import utcnow
from controller.engine.directory import EngineDirectory
from controller.engine.engine import Clock, Engine
from controller.engine.publish import StatusSink
from controller.errors import UsageError
from controller.nomad.config import NomadConfig
from controller.nomad.errors import NomadError
from controller.nomad.events import EventWatcher
from controller.serving import (
    Periodic,
    Serving,
    ServingSettings,
    serving_settings,
)

log = logging.getLogger(__name__)


def lease_ttl(value: float) -> float:
    if value < MIN_TTL_SECONDS:
        raise UsageError(
            f"--lease-ttl-seconds {value:g} is below Nomad's minimum lock TTL of "
            f"{MIN_TTL_SECONDS:g}"
        )
    return value


@dataclass(frozen=True)
class ServiceSettings(ServingSettings):
    prune: bool = False
    lease_ttl_seconds: float = DEFAULT_TTL_SECONDS


def shared_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The ServiceSettings fields that `run` and `operator` take from the options they
    share, checked (a bad value is a UsageError)."""
    return serving_settings(args) | {"lease_ttl_seconds": lease_ttl(args.lease_ttl_seconds)}


def log_event(event: PoolEvent) -> None:
    """What happened to a pool, as a log line (the operator also posts a Kubernetes Event)."""
    level = logging.WARNING if event.warning else logging.INFO
    fields = {"pool": event.pool, "reason": event.reason}
    log.log(level, "pool %s: %s: %s", event.pool, event.reason, event.message, extra=fields)


class Service:
    def __init__(
        self,
        settings: ServiceSettings,
        nomad: NomadConfig,
        *,
        clock: Clock = utcnow,
        on_status: StatusSink | None = None,
        on_event: EventSink = log_event,
        orphan_advice: str,
    ) -> None:
        """`orphan_advice`: how this front door removes runner jobs of undefined pools."""
        self.service_settings = settings
        self.nomad = nomad
        # Pools other reconcilers hold are offered from the catalog they publish.
        self.serving = Serving(
            settings,
            nomad,
            self.identity(),
            clock=clock,
            own=self._published_here,
            wanted=self._held_elsewhere,
        )
        self.metrics, self.sessions = self.serving.metrics, self.serving.sessions
        self.client, records = self.sessions.client, self.serving.records
        self.engine = Engine(
            self.client,
            self.metrics,
            resync_seconds=settings.resync_seconds,
            clock=clock,
            on_status=on_status,
            on_event=on_event,
            home_namespace=self.serving.home,
            prune=settings.prune,
            orphan_advice=orphan_advice,
            identity=self.identity(),
            lease_ttl_seconds=settings.lease_ttl_seconds,
            records=records,
            keeps_environments=self.serving.manages_environments,
        )
        self.directory = EngineDirectory(
            self.engine,
            ring=self._ring_claims,
            catalog=self.serving.catalog,
            unread=self.pools_unread,
        )
        self.api = self.serving.serve_over(self.directory, self.engine)
        self.environments = self.serving.environments
        self.claims, self.runners = self.api.claims, self.api.runners
        self.executions, self.files, self.tokens = (
            self.api.executions,
            self.api.files,
            self.api.tokens,
        )
        self._environment_refresh = Periodic(
            "poseidon environments",
            lambda: settings.resync_seconds,
            self._refresh_environments,
            at_once=True,
        )
        # What API replicas tell the reconcilers: claims changed, requests wait.
        self._doorbell_watch = records.doorbell_watch(self._answer_doorbell)
        self._waiting_refresh = Periodic(
            "waiting records", lambda: settings.resync_seconds, self._read_waiting
        )
        self.watchers: dict[str, EventWatcher] = {}

    @property
    def url(self) -> str:
        return self.api.url

    def identity(self) -> str:
        """Who holds a pool's lease, as other processes read it: host and process."""
        return f"{socket.gethostname()}/{os.getpid()}"

    def pools_unread(self) -> str | None:
        """Why the engine may lack some of the pools defined now (None: it has them all,
        as a pools file read before serving gives them); claims and runner requests
        answer 503 rather than 404 meanwhile."""
        return None

    def _held_elsewhere(self) -> bool:
        """Whether a pool this process defines is reconciled by another (offered from the
        catalog)."""
        return not all(self.engine.writes(key) for key in self.engine.pools)

    def _published_here(self) -> set[str]:
        return {catalog_path(key) for key in self.engine.pools if self.engine.writes(key)}

    def readiness(self) -> Readiness:
        """The engine's, and pools held elsewhere count as not read until the catalog
        offers them (claims for them are served from there)."""
        ready = self.engine.readiness()
        unoffered = tuple(k for k in self.directory.unoffered() if k not in ready.unobserved)
        return dataclasses.replace(ready, unobserved=ready.unobserved + unoffered)

    async def serve_api(self, ready: Callable[[], Readiness]) -> str:
        """Start the one listener for API, health and metrics, and follow what API
        replicas tell the reconcilers and the catalog; returns the listener's URL."""
        url = await self.api.serve(ready)
        self.serving.catalog.start()
        self._doorbell_watch.start()
        self._waiting_refresh.start()
        return url

    def _ring_claims(self, key: str) -> None:
        self.serving.records.doorbell.ring(CLAIMS, key)

    async def _answer_doorbell(self, reasons: frozenset[str]) -> None:
        """An API replica rang: look at every namespace now (claims were taken or ended),
        and read what it says changed."""
        for namespace in self.engine.namespaces():
            self.engine.hint_namespace(namespace)
        if WAITING in reasons:
            await self._read_waiting()
        if ENVIRONMENTS in reasons and self.environments is not None:
            await self._refresh_environments()

    async def _read_waiting(self) -> None:
        try:
            self.engine.waiting_elsewhere(await self.serving.records.waiting_elsewhere.read())
        except NomadError as error:
            log.warning("cannot read the API replicas' waiting claim requests: %s", error)

    async def start_environments(self, *, first_read: bool = False) -> None:
        """Follow the managed Poseidon environments in Nomad. With `first_read`, return
        only once they have been read (retrying while Nomad does not answer): before
        --prune may take their runners for orphans."""
        if self.environments is None:
            return
        delay = 1.0
        while first_read:
            try:
                await self.environments.refresh()
            except NomadError as error:
                log.warning(
                    "cannot read the Poseidon environments yet, retrying in %.0f s: %s",
                    delay,
                    error,
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, 30.0)
            else:
                break
        self._environment_refresh.start()

    async def stop_environments(self) -> None:
        await self._environment_refresh.stop()

    async def _refresh_environments(self) -> None:
        if await self.serving.refresh_environments():
            self.sync_watchers()  # an environment's pool may be in a namespace new here

    async def resume_drains(self, keep_going: Callable[[], bool] = lambda: True) -> None:
        """Take up the drains recorded in Nomad. Nomad may well be down when a controller
        starts, so this retries with backoff (in the background) instead of failing."""
        delay = 1.0
        while keep_going():
            try:
                await self.engine.resume_drains()
            except NomadError as error:
                log.warning("cannot read recorded drains yet, retrying in %.0f s: %s", delay, error)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 30.0)
            else:
                self.sync_watchers()
                return

    def reload_files(self) -> None:
        """The token file and the TLS certificate read again (SIGHUP, or on change)."""
        self.api.reload_files()

    def sync_watchers(self) -> None:
        """One event-stream watcher per Nomad namespace the engine reconciles."""
        for namespace in self.engine.namespaces() - set(self.watchers):
            watcher = EventWatcher(
                self.nomad,
                namespace,
                on_job=functools.partial(self.engine.hint_job, namespace),
                on_state=functools.partial(self._stream_state, namespace),
            )
            watcher.start()
            self.watchers[namespace] = watcher

    async def stop_watchers(self) -> None:
        for namespace, watcher in self.watchers.items():
            await watcher.stop()
            self.metrics.forget_event_stream(namespace)
        self.watchers.clear()

    def _stream_state(self, namespace: str, up: bool) -> None:
        self.metrics.event_stream_up.labels(namespace=namespace).set(1 if up else 0)

    async def close(self) -> None:
        """Stop everything; never destroys runners (Nomad keeps them)."""
        await self.api.stop_watching_files()
        await self._doorbell_watch.stop()
        await self._waiting_refresh.stop()
        await self.stop_environments()
        await self.stop_watchers()
        await self.engine.stop()
        await self.serving.catalog.stop()
        await self.api.close()
        await self.serving.close()
