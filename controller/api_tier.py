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

from controller.core.catalog import ENVIRONMENTS
from controller.core.readiness import CLAIMS, Readiness
from controller.logs import start_logging
from controller.nomad.config import NomadConfig
from controller.records.replicas import BEAT_SECONDS
from controller.serving import (
    Periodic,
    Serving,
    ServingSettings,
    nomad_config_from_env,
    serving_settings,
)
from controller.tasks import serve_until_stopped

log = logging.getLogger(__name__)


class ApiTier:
    def __init__(
        self, settings: ServingSettings, nomad: NomadConfig, identity: str | None = None
    ) -> None:
        """`identity`: who this replica is to the others (by default its `host/pid`)."""
        self.settings = settings
        identity = identity or f"{socket.gethostname()}/{os.getpid()}"
        self.serving = Serving(settings, nomad, identity, api_tier=True)
        self.metrics, self.sessions = self.serving.metrics, self.serving.sessions
        self.directory = self.serving.catalog
        doorbell = self.serving.records.doorbell
        # The live replicas split the pools' offers: each claims from its own slice first.
        self.replicas = self.serving.records.replicas()
        self._replica_beat = Periodic(
            "replica record", lambda: BEAT_SECONDS, self.replicas.beat, at_once=True
        )
        self.metrics.api_replicas.set_function(lambda: len(self.replicas.claimers.replicas))
        # The reconcilers register the environments' pools: told to read them at once.
        self.api = self.serving.serve_over(
            self.directory,
            None,
            on_written=lambda: doorbell.ring(ENVIRONMENTS),
            claimers=lambda: self.replicas.claimers,
        )
        self.environments = self.serving.environments
        self.executions = self.api.executions
        self._environment_refresh = Periodic(
            "poseidon environments",
            lambda: settings.resync_seconds,
            self.serving.refresh_environments,  # which pools are managed ones
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
        self._replica_beat.start()
        try:
            url = await self.api.serve(self.readiness)
        except BaseException:  # a port in use: nothing is left open behind the error
            await self.stop()
            raise
        if self.environments is not None:
            self._environment_refresh.start()
        return url

    async def stop(self) -> None:
        """Stop serving; claims and runners stay in Nomad."""
        await self._environment_refresh.stop()
        await self._replica_beat.stop()  # its record goes with the shared records
        await self.directory.stop()
        await self.api.close()
        await self.serving.close()

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
