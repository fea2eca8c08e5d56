"""`poolkeeper api`: the API tier. It serves the whole client API (claims, keepalives,
releases, executions and files with their WebSockets, the Poseidon API, metrics, health)
and never registers, reconciles or takes a lease: pools come from the catalog their lease
holders publish in Nomad (directory/catalog.py), and claims, waiting requests and
environments written here reach the reconcilers through Nomad too (the doorbell, waiting
records, environment variables). Any number of replicas serve behind one load balancer;
they share nothing but Nomad.

Ready once the catalog has been read, and while it can be: a replica that cannot reach
Nomad is unready and answers NomadUnavailable.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import socket

from controller import __version__
from controller.claims.store import ClaimStore
from controller.core.catalog import replica_segment
from controller.core.readiness import CLAIMS, Readiness
from controller.core.times import utcnow
from controller.directory.catalog import CatalogDirectory
from controller.directory.doorbell import ENVIRONMENTS, Doorbell
from controller.directory.waiting import WaitingPublisher
from controller.logs import start_logging
from controller.metrics import Metrics
from controller.nomad.config import NomadConfig
from controller.nomad.errors import NomadError
from controller.poseidon.context import EnvironmentMode
from controller.serving import (
    ApiServer,
    NomadSessions,
    Periodic,
    ServingSettings,
    environment_template,
    nomad_config_from_env,
    serving_settings,
)
from controller.sources.environments import EnvironmentStore
from controller.tasks import serve_until_stopped

log = logging.getLogger(__name__)


class ApiTier:
    def __init__(self, settings: ServingSettings, nomad: NomadConfig) -> None:
        self.settings = settings
        self.metrics = Metrics()
        identity = f"{socket.gethostname()}/{os.getpid()}"
        self.sessions = NomadSessions.open(
            nomad, self.metrics, f"poolkeeper/{__version__} (api {identity})"
        )
        home = nomad.namespace or "default"
        replica = replica_segment(identity)
        client = self.sessions.client
        self.doorbell = Doorbell(client, home, replica, utcnow)
        self.waiting = WaitingPublisher(client, home, replica, utcnow, self.doorbell)
        self.directory = CatalogDirectory(self.sessions.watch, home, self.doorbell, self.waiting)
        poseidon = settings.poseidon
        self.environments = (
            EnvironmentStore(
                client,
                home,
                environment_template(poseidon.environment_template),
                None,  # the reconcilers register environments' pools
                on_written=lambda: self.doorbell.ring(ENVIRONMENTS),
            )
            if poseidon.enabled and poseidon.environments is EnvironmentMode.MANAGED
            else None
        )
        store = ClaimStore(client, self.sessions.watch)
        self.api = ApiServer(
            settings, self.directory, self.sessions, store, self.metrics, self.environments
        )
        self.executions = self.api.executions
        self._environment_refresh = Periodic(
            "poseidon environments", lambda: settings.resync_seconds, self._refresh_environments
        )

    def readiness(self) -> Readiness:
        """Ready to serve claims while the catalog is read; nothing served otherwise."""
        why = self.directory.available()
        return Readiness.idle(why) if why is not None else Readiness((CLAIMS,))

    @property
    def url(self) -> str:
        return self.api.url

    async def start(self) -> str:
        self.directory.start()
        try:
            url = await self.api.serve(self.readiness)
        except BaseException:  # a port in use: nothing is left open behind the error
            await self.stop()
            raise
        if self.environments is not None:
            self._environment_refresh.start()
        return url

    async def _refresh_environments(self) -> None:
        assert self.environments is not None
        try:
            await self.environments.refresh()  # which pools are managed ones
        except NomadError as error:
            log.warning("cannot read the Poseidon environments from Nomad: %s", error)

    async def stop(self) -> None:
        """Stop serving; claims and runners stay in Nomad."""
        await self._environment_refresh.stop()
        await self.directory.stop()
        await self.api.close()
        await self.waiting.close()
        await self.doorbell.close()
        await self.sessions.close()

    def reload(self) -> None:
        """SIGHUP: the API tokens and the TLS certificate are read again."""
        self.api.reload_files()


def settings_from_args(args: argparse.Namespace) -> ServingSettings:
    return ServingSettings(**serving_settings(args))


def main(args: argparse.Namespace) -> int:
    start_logging(args.log_format)
    tier = ApiTier(settings_from_args(args), nomad_config_from_env())
    stopping = "stopping the API tier; claims and runners stay in Nomad"
    asyncio.run(serve_until_stopped(tier.start, tier.stop, tier.reload, stopping))
    return 0
