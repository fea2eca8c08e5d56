"""`poolkeeper run`: the controller with pools read from YAML files (CONTRACT.md §3)."""

from __future__ import annotations

import argparse
import asyncio
import functools
import logging
import os
import signal
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from controller.api.app import TokenSet, create_app, read_token_file
from controller.claims import ClaimService
from controller.cli import UsageError
from controller.engine.reconciler import Clock, Engine, utcnow
from controller.engine.types import PoolMode
from controller.metrics import Metrics
from controller.model import DeletionPolicy, RunnerPool
from controller.nomad.client import NomadClient
from controller.nomad.config import ConfigError, NomadConfig
from controller.nomad.events import EventWatcher
from controller.pools_file import ConfigError as PoolPathError
from controller.pools_file import load_pools, reload

log = logging.getLogger(__name__)

DELETION_MODES = {
    DeletionPolicy.DRAIN: PoolMode.DRAIN,
    DeletionPolicy.DELETE: PoolMode.DELETE,
    DeletionPolicy.ORPHAN: None,
}


def parse_listen(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise UsageError(f"--listen {value!r} is not HOST:PORT")
    return host.strip("[]"), int(port)


@dataclass(frozen=True)
class Settings:
    pools_path: Path
    listen: tuple[str, int] = ("127.0.0.1", 8080)
    resync_seconds: float = 10.0
    token_file: Path | None = None
    insecure_no_auth: bool = False
    reconcile: bool = True
    prune: bool = False


class Controller:
    """Engine, event watchers and HTTP API of one standalone process."""

    def __init__(self, settings: Settings, nomad: NomadConfig, *, clock: Clock = utcnow) -> None:
        self.settings = settings
        self.nomad = nomad
        self.metrics = Metrics()
        self.client = NomadClient(nomad, on_request=self.metrics.observe_nomad_request)
        self.engine = Engine(
            self.client,
            self.metrics,
            resync_seconds=settings.resync_seconds,
            clock=clock,
            reconcile=settings.reconcile,
            home_namespace=nomad.namespace or "default",
            prune=settings.prune,
        )
        self.claims = ClaimService(self.engine)
        self.tokens = TokenSet(None if settings.insecure_no_auth else self._read_tokens())
        self.pools: dict[str, RunnerPool] = {}
        self.watchers: dict[str, EventWatcher] = {}
        self._runner: web.AppRunner | None = None
        self.url = ""

    def _read_tokens(self) -> list[str]:
        tokens: list[str] = []
        if self.settings.token_file is not None:
            try:
                tokens += read_token_file(self.settings.token_file)
            except OSError as error:
                raise UsageError(
                    f"--api-token-file {self.settings.token_file}: {error.strerror}"
                ) from None
        env = os.environ.get("POOLKEEPER_API_TOKENS", "")
        tokens += [t.strip() for t in env.replace(",", "\n").splitlines() if t.strip()]
        if not tokens:
            raise UsageError(
                "no API token: give --api-token-file or POOLKEEPER_API_TOKENS, "
                "or --insecure-no-auth"
            )
        return tokens

    async def start(self) -> str:
        self.load_pools(initial=True)
        app = create_app(self.engine, self.metrics, self.tokens, self.engine.ready, self.claims)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        host, port = self.settings.listen
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        bound = self._runner.addresses[0]
        self.url = f"http://{host}:{bound[1]}"
        if self.settings.reconcile:
            await self.engine.resume_drains()
        await self.engine.start()
        self._sync_watchers()
        log.info("poolkeeper listening on %s", self.url)
        return self.url

    async def stop(self) -> None:
        """Graceful stop: never destroys runners."""
        for watcher in self.watchers.values():
            await watcher.stop()
        self.watchers.clear()
        await self.engine.stop()
        await self.claims.drain()
        if self._runner is not None:
            await self._runner.cleanup()
        await self.client.close()

    def load_pools(self, *, initial: bool = False) -> None:
        """Read the pool files; on reload keep what an invalid document would lose."""
        try:
            result = load_pools(self.settings.pools_path)
        except PoolPathError as error:
            if initial:
                raise UsageError(f"--pools {self.settings.pools_path}: {error}") from None
            log.error("reload failed, keeping the current pools: %s", error)
            return
        for problem in result.errors:
            log.error("%s", problem)
        self.engine.protected = {e.key for e in result.errors if e.key}
        outcome = reload({} if initial else self.pools, result)
        for refusal in outcome.refused:
            log.error("%s", refusal)
        for pool in outcome.pools.values():
            if self.pools.get(pool.key) != pool:
                self.engine.upsert_pool(pool)
        for key in outcome.removed:
            removed = self.pools[key]
            mode = DELETION_MODES[removed.spec.deletion_policy]
            log.info(
                "pool %s removed from the files: deletionPolicy %s",
                key,
                removed.spec.deletion_policy,
            )
            self.engine.remove_pool(key, mode, removed.spec.drain_timeout_seconds)
        self.pools = dict(outcome.pools)
        if not initial:
            self._sync_watchers()

    def reload(self) -> None:
        """SIGHUP: pools and API tokens are read again."""
        self.load_pools()
        self.reload_tokens()

    def reload_tokens(self) -> None:
        if self.tokens.enabled:
            try:
                self.tokens.replace(self._read_tokens())
            except UsageError as error:
                log.error("keeping the previous API tokens: %s", error)

    def _stream_state(self, namespace: str, up: bool) -> None:
        self.metrics.event_stream_up.labels(namespace=namespace).set(1 if up else 0)

    def _sync_watchers(self) -> None:
        for namespace in self.engine.namespaces() - set(self.watchers):
            watcher = EventWatcher(
                self.nomad,
                namespace,
                on_job=functools.partial(self.engine.hint_job, namespace),
                on_state=functools.partial(self._stream_state, namespace),
            )
            watcher.start()
            self.watchers[namespace] = watcher


def settings_from_args(args: argparse.Namespace) -> Settings:
    if args.resync_seconds <= 0:
        raise UsageError(f"--resync-seconds {args.resync_seconds} must be positive")
    path = Path(args.pools)
    if not path.exists():
        raise UsageError(f"--pools {args.pools}: no such file or folder")
    return Settings(
        pools_path=path,
        listen=parse_listen(args.listen),
        resync_seconds=args.resync_seconds,
        token_file=Path(args.api_token_file) if args.api_token_file else None,
        insecure_no_auth=args.insecure_no_auth,
        reconcile=not args.no_reconcile,
        prune=args.prune,
    )


async def serve(controller: Controller) -> None:
    loop = asyncio.get_running_loop()
    stopping = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stopping.set)
    loop.add_signal_handler(signal.SIGINT, stopping.set)
    loop.add_signal_handler(signal.SIGHUP, controller.reload)
    await controller.start()
    await stopping.wait()
    log.info("stopping; runners stay in Nomad")
    await controller.stop()


def main(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    settings = settings_from_args(args)
    try:
        nomad = NomadConfig.from_env(os.environ)
    except ConfigError as error:
        raise UsageError(str(error)) from None
    asyncio.run(serve(Controller(settings, nomad)))
    return 0
