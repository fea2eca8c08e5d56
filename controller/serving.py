"""What `run`, `operator` and `api` serve alike, assembled once (`Serving`): the Nomad
sessions, the shared records in Nomad (records/), the catalog of the pools other
processes hold, the managed Poseidon environments, and the one HTTP listener (the API,
the Poseidon API, health and metrics) with the claim path over a pool directory. A
reconciling process gives it the engine as its directory (service.py); the API tier the
catalog (api_tier.py)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import ssl
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
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
from controller.claims.runners import RunnerClaims
from controller.claims.service import ClaimService
from controller.core.handout import RANDOM, Claimers
from controller.core.leases import DEFAULT_TTL_SECONDS
from controller.core.readiness import Readiness
from controller.core.times import utcnow
from controller.directory.catalog import CatalogDirectory
from controller.directory.view import PoolDirectory
from controller.errors import UsageError
from controller.executions.activity import WATCH_SECONDS
from controller.executions.files import FileOperations
from controller.executions.manager import ExecutionManager
from controller.logs import http_server_logger
from controller.metrics import Metrics
from controller.nomad.client import NomadClient
from controller.nomad.config import ConfigError, NomadConfig
from controller.nomad.errors import NomadError
from controller.nomad.exec import NomadExec
from controller.poseidon.app import create_poseidon_app
from controller.poseidon.context import PREFIX as POSEIDON_PREFIX
from controller.poseidon.context import EnvironmentMode, Poseidon, PoseidonSettings
from controller.poseidon.openapi import openapi_part
from controller.records.claims import ClaimStore
from controller.records.shared import SharedRecords
from controller.sources.environments import (
    EnvironmentInvalid,
    EnvironmentStore,
    EnvironmentTemplate,
    Registrar,
)
from controller.tasks import Background

log = logging.getLogger(__name__)

# Seconds a connection may stay idle, or take to send its request headers (nginx's
# keepalive_timeout default); tests lower it. aiohttp's own default is an hour, which
# lets slow-loris clients hold connections.
HTTP_IDLE_TIMEOUT_SECONDS = 75.0

# How long a thread may hold the GIL while another waits for it (Python's default is
# 5 ms). The engine computes its passes in worker threads while the claim API answers on
# the loop thread, which then gets the GIL back within this time.
GIL_SWITCH_SECONDS = 0.0005
# Blocking reads (busy runners' claims) at once, and the read timeout beyond their wait.
WATCH_CONNECTIONS = 1024
WATCH_MARGIN_SECONDS = 5.0


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
class ServingSettings:
    """What the listener and the claim path are told (`run`, `operator` and `api`)."""

    listen: tuple[str, int] = ("127.0.0.1", 8080)
    resync_seconds: float = 10.0  # also how often managed environments are read again
    token_file: Path | None = None
    insecure_no_auth: bool = False
    tls_cert: Path | None = None  # serve the API over HTTPS with this certificate
    tls_key: Path | None = None
    poseidon: PoseidonSettings = field(default_factory=PoseidonSettings)  # --poseidon-api
    access_log: bool = False


def serving_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The ServingSettings fields from the options every serving command has, checked (a
    bad value is a UsageError)."""
    if args.resync_seconds <= 0:
        raise UsageError(f"--resync-seconds {args.resync_seconds} must be positive")
    tls_cert, tls_key = tls_files(args.tls_cert, args.tls_key)
    return {
        "listen": parse_listen(args.listen),
        "resync_seconds": args.resync_seconds,
        "token_file": Path(args.api_token_file) if args.api_token_file else None,
        "insecure_no_auth": args.insecure_no_auth,
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
        step: Callable[[], Awaitable[object]],
        *,
        at_once: bool = False,
    ) -> None:
        self._seconds, self._step, self._at_once = seconds, step, at_once
        self._running = Background(name, self._run)
        self.start, self.stop = self._running.start, self._running.stop

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


@dataclass
class NomadSessions:
    """The process's sessions to Nomad: API calls (passes, claims), blocking reads (held
    open while they wait, so they never take the connections calls need), and execs
    (each held as long as it runs)."""

    client: NomadClient
    watch: NomadClient
    exec: NomadExec

    @classmethod
    def open(cls, nomad: NomadConfig, metrics: Metrics, user_agent: str) -> NomadSessions:
        hook = metrics.observe_nomad_request
        return cls(
            NomadClient(nomad, on_request=hook, user_agent=user_agent),
            NomadClient(
                nomad,
                max_connections=WATCH_CONNECTIONS,
                timeout=WATCH_SECONDS + WATCH_MARGIN_SECONDS,
                on_request=hook,
                user_agent=user_agent,
            ),
            NomadExec(nomad, on_request=hook, user_agent=user_agent),
        )

    async def close(self) -> None:
        await self.exec.close()
        await self.watch.close()
        await self.client.close()


class Serving:
    """What every serving process assembles alike, in two steps: the sessions, the shared
    records and the catalog first (a reconciler's engine is built on the records), then,
    over the process's pool directory, the managed environments and the listener."""

    def __init__(
        self,
        settings: ServingSettings,
        nomad: NomadConfig,
        identity: str,
        *,
        api_tier: bool = False,
        clock: Callable[[], datetime] = utcnow,
        own: Callable[[], set[str]] = set,
        wanted: Callable[[], bool] = lambda: True,
    ) -> None:
        """`identity`: who this process is to the others; `own` and `wanted`: which
        catalog records it publishes itself, and whether it follows the catalog now
        (directory/catalog.py)."""
        self.settings = settings
        self.metrics = Metrics()
        kind = "api " if api_tier else ""
        user_agent = f"poolkeeper/{__version__} ({kind}{identity})"
        self.sessions = NomadSessions.open(nomad, self.metrics, user_agent)
        self.home = nomad.namespace or "default"
        self.records = SharedRecords(
            self.sessions.client, self.sessions.watch, self.home, identity, clock
        )
        self.catalog = CatalogDirectory(self.records, clock=clock, own=own, wanted=wanted)
        self.environments: EnvironmentStore | None = None
        # The API tier reads who runs the managed environments from the member records.
        self._members = self.records.members(DEFAULT_TTL_SECONDS) if api_tier else None

    @property
    def manages_environments(self) -> bool:
        poseidon = self.settings.poseidon
        return poseidon.enabled and poseidon.environments is EnvironmentMode.MANAGED

    def serve_over(
        self,
        directory: PoolDirectory,
        registrar: Registrar | None,
        *,
        on_written: Callable[[], None] = lambda: None,
        claimers: Callable[[], Claimers] = lambda: RANDOM,
    ) -> ApiServer:
        """The managed environments (registered with `registrar`, when this process
        reconciles) and the listener over `directory`; `claimers`: the live API replicas
        whose slices of the offers claims take from (an API replica's)."""
        if self.manages_environments:
            template = environment_template(self.settings.poseidon.environment_template)
            self.environments = EnvironmentStore(
                self.records.environments, template, registrar, on_written=on_written
            )
        return ApiServer(
            self.settings,
            directory,
            self.sessions,
            self.records.claims,
            self.metrics,
            self.environments,
            claimers,
        )

    async def refresh_environments(self) -> bool:
        """Read the managed environments again; whether they could be read (a failure is
        logged: the next refresh tries again)."""
        assert self.environments is not None  # only refreshed with managed environments
        try:
            await self.environments.refresh()
            if self._members is not None:
                membership = await self._members.live(collect=False)
                self.environments.note_keepers(membership.environments)
        except NomadError as error:
            log.warning("cannot read the Poseidon environments from Nomad: %s", error)
            return False
        return True

    async def close(self) -> None:
        """What this process owes the others written, then the sessions closed."""
        await self.records.close()
        await self.sessions.close()


class ApiServer:
    """The listener and the claim path over `directory`."""

    def __init__(
        self,
        settings: ServingSettings,
        directory: PoolDirectory,
        sessions: NomadSessions,
        store: ClaimStore,
        metrics: Metrics,
        environments: EnvironmentStore | None,
        claimers: Callable[[], Claimers] = lambda: RANDOM,
    ) -> None:
        self.settings = settings
        self.directory = directory
        self.metrics = metrics
        self.environments = environments
        self.claims = ClaimService(directory, store, metrics, claimers=claimers)
        self.runners = RunnerClaims(directory, store, metrics)
        self.executions = ExecutionManager(
            directory, self.runners, sessions.client, sessions.exec, metrics
        )
        self.files = FileOperations(self.executions.activity, sessions.exec, metrics)
        self.tokens = TokenSet(
            None if settings.insecure_no_auth else read_api_tokens(settings.token_file)
        )
        self._runner: web.AppRunner | None = None
        self._tls: ssl.SSLContext | None = None
        watched = [p for p in (settings.token_file, settings.tls_cert, settings.tls_key) if p]
        self._file_watch = FileWatch(watched, self.reload_files)
        self.url = ""

    async def serve(self, ready: Callable[[], Readiness]) -> str:
        """Start the one listener for API, health and metrics; returns its URL."""
        sys.setswitchinterval(GIL_SWITCH_SECONDS)
        app = create_app(
            self.directory,
            self.metrics,
            self.tokens,
            ready,
            self.claims,
            self.runners,
            self.executions,
            self.files,
            log_requests=self.settings.access_log,
        )
        poseidon = self.settings.poseidon
        if poseidon.enabled:
            context = Poseidon(
                self.directory,
                self.claims,
                self.runners,
                self.tokens,
                poseidon,
                self.environments,
                self.executions,
                self.files,
            )
            app.add_subapp(POSEIDON_PREFIX + "/", create_poseidon_app(context))
            app[OPENAPI_KEY] = extended(app[OPENAPI_KEY], openapi_part())
        self._runner = web.AppRunner(
            app,
            access_log=None,
            keepalive_timeout=HTTP_IDLE_TIMEOUT_SECONDS,
            logger=http_server_logger(),
        )
        await self._runner.setup()
        host, port = self.settings.listen
        cert, key = self.settings.tls_cert, self.settings.tls_key
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

    def reload_files(self) -> None:
        """The token file and the TLS certificate read again (SIGHUP, or when they change
        on disk: a rotated Kubernetes Secret); what cannot be read keeps the previous."""
        if self.tokens.enabled:
            try:
                self.tokens.replace(read_api_tokens(self.settings.token_file))
            except UsageError as error:
                log.error("keeping the previous API tokens: %s", error)
            else:
                log.info("API tokens read again")
        cert, key = self.settings.tls_cert, self.settings.tls_key
        if self._tls is not None and cert and key:
            try:
                server_tls(cert, key)  # a fresh context first: a bad pair leaves ours alone
                server_tls(cert, key, self._tls)
            except UsageError as error:
                log.error("keeping the previous TLS certificate: %s", error)
            else:
                log.info("TLS certificate read again")

    async def stop_watching_files(self) -> None:
        await self._file_watch.stop()

    async def close(self) -> None:
        """Stop serving: running executions end with an error; nothing in Nomad changes."""
        await self._file_watch.stop()
        await self.executions.close()
        await self.claims.drain()
        if self._runner is not None:
            await self._runner.cleanup()
