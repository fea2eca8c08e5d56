"""`poolkeeper run`: the controller with pools read from YAML files."""

from __future__ import annotations

import argparse
import asyncio
import logging
from dataclasses import dataclass
from pathlib import Path

from controller import api_tier
from controller.core.problems import PoolProblem
from controller.core.times import utcnow
from controller.engine.engine import Clock
from controller.errors import UsageError
from controller.logs import start_logging
from controller.model import RunnerPool
from controller.nomad.config import NomadConfig
from controller.service import Service, ServiceSettings, shared_settings
from controller.serving import nomad_config_from_env
from controller.sources.files import ConfigError as PoolPathError
from controller.sources.files import load_pools
from controller.sources.registration import removal
from controller.sources.reload import reload, summary
from controller.tasks import serve_until_stopped

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Settings(ServiceSettings):
    pools_path: Path = Path("pools.yaml")
    allow_empty: bool = False  # a reload that defines no pool removes every pool


class Controller(Service):
    """The standalone controller: pools come from YAML files, reloaded on SIGHUP."""

    def __init__(self, settings: Settings, nomad: NomadConfig, *, clock: Clock = utcnow) -> None:
        super().__init__(settings, nomad, clock=clock, orphan_advice="--prune drains them")
        self.settings = settings
        self.pools: dict[str, RunnerPool] = {}
        self.refusals: dict[str, PoolProblem] = {}
        self._resuming: asyncio.Task[None] | None = None

    async def start(self) -> str:
        self.load_pools(initial=True)
        url = await self.serve_api(self.engine.readiness)
        await self.start_environments(first_read=self.settings.prune)
        self._resuming = asyncio.create_task(self.resume_drains())
        await self.engine.start()
        self.sync_watchers()
        return url

    async def stop(self) -> None:
        """Graceful stop: never destroys runners."""
        if self._resuming is not None:
            self._resuming.cancel()
            await asyncio.gather(self._resuming, return_exceptions=True)
        await self.close()

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
        outcome = reload(
            {} if initial else self.pools, result, allow_empty=self.settings.allow_empty
        )
        if outcome.refused_empty:
            log.error(
                "reload refused: %s defines no pool; pass --allow-empty to remove every pool",
                self.settings.pools_path,
            )
            return
        self.engine.set_protected({e.key for e in result.errors if e.key})
        for refused in outcome.refused:
            log.error("%s", refused)
        for pool in outcome.pools.values():
            refusal = outcome.refusals.get(pool.key)
            if self.pools.get(pool.key) != pool or self.refusals.get(pool.key) != refusal:
                self.engine.upsert_pool(pool, refusal=refusal)
        for key in outcome.removed:
            removed = self.pools[key]
            log.info(
                "pool %s removed from the files: deletionPolicy %s",
                key,
                removed.spec.deletion_policy,
            )
            self.engine.remove_pool(key, *removal(removed, self.engine.clock()))
        self.pools = dict(outcome.pools)
        self.refusals = dict(outcome.refusals)
        if not initial:
            log.info("reloaded %s: %s", self.settings.pools_path, summary(outcome))
            self.sync_watchers()

    def reload(self) -> None:
        """SIGHUP: pools and API tokens are read again."""
        self.load_pools()
        self.reload_files()


def settings_from_args(args: argparse.Namespace) -> Settings:
    shared = shared_settings(args)
    path = Path(args.pools)
    if not path.exists():
        raise UsageError(f"--pools {args.pools}: no such file or folder")
    return Settings(
        pools_path=path,
        prune=args.prune,
        allow_empty=args.allow_empty,
        **shared,
    )


def main(args: argparse.Namespace) -> int:
    if args.no_reconcile:
        start_logging(args.log_format)
        log.warning(
            "--no-reconcile serves as the API tier (poolkeeper api): --pools is not read, "
            "pools come from what their reconcilers publish in Nomad"
        )
        return api_tier.main(args)
    start_logging(args.log_format)
    settings = settings_from_args(args)
    controller = Controller(settings, nomad_config_from_env())
    stopping = "stopping; runners stay in Nomad"
    asyncio.run(serve_until_stopped(controller.start, controller.stop, controller.reload, stopping))
    return 0
