"""What `poolkeeper run` and `poolkeeper operator` share: metrics, the Nomad client, the
engine, the claim service, API tokens, the HTTP listener and the event-stream watchers.
The two front doors differ only in where pools come from."""

from __future__ import annotations

import argparse
import asyncio
import functools
import logging
import os
import socket
import ssl
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from controller import __version__
from controller.api.app import create_app
from controller.api.auth import (
    Token,
    TokenFileError,
    TokenSet,
    parse_token_lines,
    read_token_file,
)
from controller.api.openapi import extended
from controller.api.routes import OPENAPI_KEY
from controller.claims.service import ClaimService
from controller.core.events import EventSink, PoolEvent
from controller.core.leases import DEFAULT_TTL_SECONDS, MIN_TTL_SECONDS
from controller.core.times import utcnow
from controller.engine.engine import Clock, Engine
from controller.engine.publish import StatusSink
from controller.errors import UsageError
from controller.executions.files import FileOperations
from controller.executions.manager import ExecutionManager
from controller.metrics import Metrics
from controller.nomad.client import NomadClient
from controller.nomad.config import ConfigError, NomadConfig
from controller.nomad.errors import NomadError
from controller.nomad.events import EventWatcher
from controller.nomad.exec import NomadExec
from controller.poseidon.app import create_poseidon_app
from controller.poseidon.context import PREFIX as POSEIDON_PREFIX
from controller.poseidon.context import EnvironmentMode, Poseidon, PoseidonSettings
from controller.poseidon.openapi import openapi_part
from controller.sources.environments import (
    EnvironmentInvalid,
    EnvironmentStore,
    EnvironmentTemplate,
)

log = logging.getLogger(__name__)

# Seconds a connection may stay idle, or take to send its request headers (nginx's
# keepalive_timeout default); tests lower it. aiohttp's own default is an hour, which
# lets slow-loris clients hold connections.
HTTP_IDLE_TIMEOUT_SECONDS = 75.0

# How long a thread may hold the GIL while another waits for it (Python's default is
# 5 ms). The engine computes its passes in worker threads while the claim API answers on
# the loop thread, which then gets the GIL back within this time.
GIL_SWITCH_SECONDS = 0.0005


def lease_ttl(value: float) -> float:
    if value < MIN_TTL_SECONDS:
        raise UsageError(
            f"--lease-ttl-seconds {value:g} is below Nomad's minimum lock TTL of "
            f"{MIN_TTL_SECONDS:g}"
        )
    return value


def parse_listen(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise UsageError(f"--listen {value!r} is not HOST:PORT")
    return host.strip("[]"), int(port)


def nomad_config_from_env() -> NomadConfig:
    """The Nomad CLI's environment variables; a bad value is a usage error (exit 2)."""
    try:
        return NomadConfig.from_env(os.environ)
    except ConfigError as error:
        raise UsageError(str(error)) from None


@dataclass(frozen=True)
class ServiceSettings:
    listen: tuple[str, int] = ("127.0.0.1", 8080)
    resync_seconds: float = 10.0
    token_file: Path | None = None
    insecure_no_auth: bool = False
    reconcile: bool = True
    prune: bool = False
    lease_ttl_seconds: float = DEFAULT_TTL_SECONDS
    tls_cert: Path | None = None  # serve the API over HTTPS with this certificate
    tls_key: Path | None = None
    poseidon: PoseidonSettings = field(default_factory=PoseidonSettings)  # --poseidon-api
    access_log: bool = False


def shared_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The ServiceSettings fields that `run` and `operator` take from the options they
    share, checked (a bad value is a UsageError)."""
    if args.resync_seconds <= 0:
        raise UsageError(f"--resync-seconds {args.resync_seconds} must be positive")
    tls_cert, tls_key = tls_files(args.tls_cert, args.tls_key)
    return {
        "listen": parse_listen(args.listen),
        "resync_seconds": args.resync_seconds,
        "token_file": Path(args.api_token_file) if args.api_token_file else None,
        "insecure_no_auth": args.insecure_no_auth,
        "lease_ttl_seconds": lease_ttl(args.lease_ttl_seconds),
        "tls_cert": tls_cert,
        "tls_key": tls_key,
        "poseidon": poseidon_settings(args),
        "access_log": args.access_log,
    }


def poseidon_settings(args: argparse.Namespace) -> PoseidonSettings:
    """--poseidon-api and the options that go with it."""
    enabled, environments = args.poseidon_api, args.poseidon_environments
    threshold, template = args.poseidon_depleting_threshold, args.poseidon_environment_template
    if not 0 <= threshold <= 1:
        raise UsageError(f"--poseidon-depleting-threshold {threshold:g} is not between 0 and 1")
    mode = EnvironmentMode(environments)
    if template is not None and mode is not EnvironmentMode.MANAGED:
        raise UsageError("--poseidon-environment-template needs --poseidon-environments managed")
    if not enabled and (mode is EnvironmentMode.MANAGED or threshold or template):
        raise UsageError("the --poseidon-* options need --poseidon-api")
    return PoseidonSettings(enabled, mode, threshold, Path(template) if template else None)


def environment_template(path: Path | None) -> EnvironmentTemplate:
    """The managed environments' template (the RunnerPool defaults without a file)."""
    try:
        return EnvironmentTemplate.read(path) if path is not None else EnvironmentTemplate({})
    except EnvironmentInvalid as error:
        raise UsageError(f"--poseidon-environment-template {error}") from None


def tls_files(cert: str | None, key: str | None) -> tuple[Path | None, Path | None]:
    """--tls-cert and --tls-key, which go together."""
    if bool(cert) != bool(key):
        raise UsageError("--tls-cert and --tls-key must be given together")
    return (Path(cert), Path(key)) if cert and key else (None, None)


def server_tls(cert: Path, key: Path, context: ssl.SSLContext | None = None) -> ssl.SSLContext:
    """A server TLS context with this certificate; loaded into `context` when given, so a
    listener serving it hands the new certificate to new connections."""
    context = context or ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as error:
        raise UsageError(f"--tls-cert {cert} / --tls-key {key}: {error}") from None
    return context


class Periodic:
    """Runs `step` in a task of its own every `seconds` (read when it is due, so tests
    may change it), the first time at once with `at_once`, until stopped."""

    def __init__(
        self,
        name: str,
        seconds: Callable[[], float],
        step: Callable[[], Awaitable[None]],
        *,
        at_once: bool = False,
    ) -> None:
        self._name, self._seconds, self._step, self._at_once = name, seconds, step, at_once
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=self._name)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _run(self) -> None:
        if not self._at_once:
            await asyncio.sleep(self._seconds())
        while True:
            await self._step()
            await asyncio.sleep(self._seconds())


class FileWatch:
    """Notices when files change (size, modification time, or the file behind a link, as
    when Kubernetes rotates a mounted Secret), checked every POLL_SECONDS."""

    POLL_SECONDS = 5.0

    def __init__(self, paths: list[Path], on_change: Callable[[], None]) -> None:
        self._paths = paths
        self._on_change = on_change
        self._seen = self._stamp()
        self._periodic = Periodic("file watch", lambda: self.POLL_SECONDS, self._check)

    def _stamp(self) -> list[tuple[int, int, int] | None]:
        stamps: list[tuple[int, int, int] | None] = []
        for path in self._paths:
            try:
                status = path.stat()
            except OSError:
                stamps.append(None)
            else:
                stamps.append((status.st_ino, status.st_size, status.st_mtime_ns))
        return stamps

    def start(self) -> None:
        if self._paths:
            self._periodic.start()

    async def stop(self) -> None:
        await self._periodic.stop()

    async def _check(self) -> None:
        stamp = self._stamp()
        if stamp != self._seen:
            self._seen = stamp
            self._on_change()


def read_api_tokens(token_file: Path | None) -> list[Token]:
    """Tokens (with their scopes) from the file and POOLKEEPER_API_TOKENS, a line each;
    none is an error."""
    tokens: list[Token] = []
    try:
        if token_file is not None:
            tokens += read_token_file(token_file)
        env = os.environ.get("POOLKEEPER_API_TOKENS", "")
        tokens += parse_token_lines(env, "POOLKEEPER_API_TOKENS")
    except OSError as error:
        raise UsageError(f"--api-token-file {token_file}: {error.strerror}") from None
    except TokenFileError as error:
        raise UsageError(str(error)) from None
    if not tokens:
        raise UsageError(
            "no API token: give --api-token-file or POOLKEEPER_API_TOKENS, or --insecure-no-auth"
        )
    return tokens


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
        self.metrics = Metrics()
        user_agent = f"poolkeeper/{__version__} ({self.identity()})"
        self.client = NomadClient(
            nomad, on_request=self.metrics.observe_nomad_request, user_agent=user_agent
        )
        self.engine = Engine(
            self.client,
            self.metrics,
            resync_seconds=settings.resync_seconds,
            clock=clock,
            on_status=on_status,
            on_event=on_event,
            reconcile=settings.reconcile,
            home_namespace=nomad.namespace or "default",
            prune=settings.prune,
            orphan_advice=orphan_advice,
            identity=self.identity(),
            lease_ttl_seconds=settings.lease_ttl_seconds,
        )
        self.claims = ClaimService(self.engine)
        self.exec = NomadExec(
            nomad, on_request=self.metrics.observe_nomad_request, user_agent=user_agent
        )
        self.executions = ExecutionManager(
            self.engine, self.claims, self.client, self.exec, self.metrics
        )
        self.files = FileOperations(self.executions.activity, self.exec, self.metrics)
        poseidon = settings.poseidon
        self.environments = (
            EnvironmentStore(
                self.client,
                nomad.namespace or "default",
                environment_template(poseidon.environment_template),
                self.engine,
                active=self.registers_pools,
            )
            if poseidon.enabled and poseidon.environments is EnvironmentMode.MANAGED
            else None
        )
        self._environment_refresh = Periodic(
            "poseidon environments",
            lambda: settings.resync_seconds,
            self._refresh_environments,
            at_once=True,
        )
        self.tokens = TokenSet(
            None if settings.insecure_no_auth else read_api_tokens(settings.token_file)
        )
        self.watchers: dict[str, EventWatcher] = {}
        self._runner: web.AppRunner | None = None
        self._tls: ssl.SSLContext | None = None
        watched = [p for p in (settings.token_file, settings.tls_cert, settings.tls_key) if p]
        self._file_watch = FileWatch(watched, self.reload_files)
        self.url = ""

    def identity(self) -> str:
        """Who holds a pool's lease, as other processes read it: host and process."""
        return f"{socket.gethostname()}/{os.getpid()}"

    def registers_pools(self) -> bool:
        """Whether this process gives the engine pools now (a passive operator replica
        does not)."""
        return True

    async def serve_api(self, ready: Callable[[], list[str]]) -> str:
        """Start the one listener for API, health and metrics; returns its URL."""
        sys.setswitchinterval(GIL_SWITCH_SECONDS)
        app = create_app(
            self.engine,
            self.metrics,
            self.tokens,
            ready,
            self.claims,
            self.executions,
            self.files,
            log_requests=self.service_settings.access_log,
        )
        poseidon = self.service_settings.poseidon
        if poseidon.enabled:
            context = Poseidon(
                self.engine,
                self.claims,
                self.tokens,
                poseidon,
                self.environments,
                self.executions,
                self.files,
            )
            app.add_subapp(POSEIDON_PREFIX + "/", create_poseidon_app(context))
            app[OPENAPI_KEY] = extended(app[OPENAPI_KEY], openapi_part())
        self._runner = web.AppRunner(
            app, access_log=None, keepalive_timeout=HTTP_IDLE_TIMEOUT_SECONDS
        )
        await self._runner.setup()
        host, port = self.service_settings.listen
        cert, key = self.service_settings.tls_cert, self.service_settings.tls_key
        try:
            self._tls = server_tls(cert, key) if cert and key else None
            await web.TCPSite(self._runner, host, port, ssl_context=self._tls).start()
        except OSError as error:
            await self._runner.cleanup()
            self._runner = None
            reason = os.strerror(error.errno) if error.errno else str(error)
            raise UsageError(f"--listen {host}:{port}: {reason}") from None
        except UsageError:
            await self._runner.cleanup()
            self._runner = None
            raise
        scheme = "https" if self._tls is not None else "http"
        self.url = f"{scheme}://{host}:{self._runner.addresses[0][1]}"
        self._file_watch.start()
        log.info("poolkeeper listening on %s", self.url)
        if not self.tokens.enabled:
            log.warning(
                "--insecure-no-auth: the /v1 API takes claims from anyone who can reach %s",
                self.url,
            )
        return self.url

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
        assert self.environments is not None  # only started with managed environments
        try:
            await self.environments.refresh()
        except NomadError as error:
            log.warning("cannot read the Poseidon environments from Nomad: %s", error)

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
        """The token file and the TLS certificate read again (SIGHUP, or when they change
        on disk: a rotated Kubernetes Secret); what cannot be read keeps the previous."""
        if self.tokens.enabled:
            try:
                self.tokens.replace(read_api_tokens(self.service_settings.token_file))
            except UsageError as error:
                log.error("keeping the previous API tokens: %s", error)
            else:
                log.info("API tokens read again")
        cert, key = self.service_settings.tls_cert, self.service_settings.tls_key
        if self._tls is not None and cert and key:
            try:
                server_tls(cert, key)  # a fresh context first: a bad pair leaves ours alone
                server_tls(cert, key, self._tls)
            except UsageError as error:
                log.error("keeping the previous TLS certificate: %s", error)
            else:
                log.info("TLS certificate read again")

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
        await self._file_watch.stop()
        await self.stop_environments()
        await self.stop_watchers()
        await self.engine.stop()
        await self.executions.close()
        await self.claims.drain()
        if self._runner is not None:
            await self._runner.cleanup()
        await self.exec.close()
        await self.client.close()
