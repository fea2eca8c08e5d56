"""`poolkeeper run`: the controller with pools read from YAML files."""

from __future__ import annotations

import argparse
import asyncio
import logging
from dataclasses import dataclass, field
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
from controller.sources.files import LimitExceeded, LoadLimits, LoadResult, load_pools
from controller.sources.registration import removal
from controller.sources.reload import RemovalGuard, reload, summary
from controller.tasks import serve_until_stopped

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Settings(ServiceSettings):
    pools_path: Path = Path("pools.yaml")
    allow_empty: bool = False  # a reload that defines no pool removes every pool
    allow_shrink: bool = False  # a reload may remove more than max_removed_share of the pools
    max_removed_share: float = 0.5
    limits: LoadLimits = field(default_factory=LoadLimits)


class Controller(Service):
    """The standalone controller: pools come from YAML files, reloaded on SIGHUP."""

    def __init__(self, settings: Settings, nomad: NomadConfig, *, clock: Clock = utcnow) -> None:
        super().__init__(settings, nomad, clock=clock, orphan_advice="--prune drains them")
        self.settings = settings
        self.pools: dict[str, RunnerPool] = {}
        self.refusals: dict[str, PoolProblem] = {}
        self._resuming: asyncio.Task[None] | None = None
        self._reloading = asyncio.Lock()
        self._next_reload: asyncio.Task[None] | None = None
        self._reloads: set[asyncio.Task[None]] = set()

    async def start(self) -> str:
        await self.load_pools(initial=True)
        url = await self.serve_api(self.readiness)
        await self.start_environments(first_read=self.settings.prune)
        self._resuming = asyncio.create_task(self.resume_drains())
        await self.engine.start()
        self.sync_watchers()
        return url

    async def stop(self) -> None:
        """Graceful stop: never destroys runners."""
        tasks = [*self._reloads, *([self._resuming] if self._resuming else [])]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.close()

    async def load_pools(self, *, initial: bool = False) -> None:
        """Read the pool files in a worker thread (parsing YAML is CPU-bound: on the event
        loop it would stall the API and the lease renewals), then take them on the loop;
        on reload keep what an invalid document would lose."""
        settings = self.settings
        try:
            result = await asyncio.to_thread(load_pools, settings.pools_path, settings.limits)
        except (PoolPathError, LimitExceeded) as error:
            if initial:
                raise UsageError(str(error)) from None
            if isinstance(error, LimitExceeded):
                log.error("reload refused: %s; the current pools keep running", error)
            else:
                log.error("reload failed, keeping the current pools: %s", error)
            return
        self._take(result, initial=initial)

    def _take(self, result: LoadResult, *, initial: bool) -> None:
        for problem in result.errors:
            log.error("%s", problem)
        guard = RemovalGuard(
            self.settings.allow_empty, self.settings.allow_shrink, self.settings.max_removed_share
        )
        outcome = reload({} if initial else self.pools, result, guard)
        if outcome.guard_refusal is not None:
            log.error("reload refused: %s %s", self.settings.pools_path, outcome.guard_refusal)
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

    def reload(self) -> asyncio.Task[None]:
        """SIGHUP: pools and API tokens are read again, in the background; the task that
        does it is returned. One reload runs at a time; signals arriving while the next
        one waits to start are answered by that one."""
        if self._next_reload is None:
            self._next_reload = asyncio.create_task(self._reload())
            self._reloads.add(self._next_reload)
            self._next_reload.add_done_callback(self._reloads.discard)
        return self._next_reload

    async def _reload(self) -> None:
        async with self._reloading:
            self._next_reload = None
            await self.load_pools()
            self.reload_files()


def settings_from_args(args: argparse.Namespace) -> Settings:
    shared = shared_settings(args)
    if args.pools is None:
        raise UsageError("--pools PATH is required (pools files, or --no-reconcile)")
    path = Path(args.pools)
    if not path.exists():
        raise UsageError(f"--pools {args.pools}: no such file or folder")
    if not 0 <= args.max_removed_share <= 1:
        raise UsageError(f"--max-removed-share {args.max_removed_share:g} is not between 0 and 1")
    return Settings(
        pools_path=path,
        prune=args.prune,
        allow_empty=args.allow_empty,
        allow_shrink=args.allow_shrink,
        max_removed_share=args.max_removed_share,
        limits=LoadLimits.from_args(args),
        **shared,
    )


def main(args: argparse.Namespace) -> int:
    if args.no_reconcile:
        start_logging(args.log_format)
        ignored = " (--pools is not read)" if args.pools is not None else ""
        log.warning(
            "--no-reconcile serves as the API tier (poolkeeper api)%s: pools come from "
            "what their reconcilers publish in Nomad",
            ignored,
        )
        return api_tier.main(args)
    start_logging(args.log_format)
    settings = settings_from_args(args)
    controller = Controller(settings, nomad_config_from_env())
    stopping = "stopping; runners stay in Nomad"
    asyncio.run(serve_until_stopped(controller.start, controller.stop, controller.reload, stopping))
    return 0
