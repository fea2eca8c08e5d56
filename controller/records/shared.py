"""SharedRecords: every record this process keeps in Nomad for others, and reads of
theirs, assembled once per process (`run`, `operator` and `api` alike) on its two Nomad
sessions: one for calls, one for blocking reads that hold their connection while they
wait."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Protocol

from controller.core.leases import LOCK_DELAY_SECONDS
from controller.core.paths import replica_segment
from controller.nomad.port import LockTerms, VariableLists, VariableWatch
from controller.records.catalog import CatalogRecords
from controller.records.claims import ClaimStore
from controller.records.doorbell import Doorbell, DoorbellWatch
from controller.records.drains import DrainRecords
from controller.records.environments import EnvironmentRecords
from controller.records.leases import LeasePort, LeaseRecords
from controller.records.members import Members
from controller.records.waiting import WaitingPublisher, WaitingReader


class RecordsPort(VariableLists, LeasePort, Protocol):
    """What the shared records need of Nomad: variables, their lists, and locks."""


class Watcher(VariableLists, VariableWatch, Protocol):
    """Blocking lists and reads."""


class SharedRecords:
    def __init__(
        self,
        port: RecordsPort,
        watcher: Watcher,
        home_namespace: str,
        identity: str,
        clock: Callable[[], datetime],
    ) -> None:
        """`identity`: who this process is to the others (a lease holder's identity, an
        API replica's `host/pid`); `home_namespace`: the controllers' own namespace."""
        self._port = port
        self._watcher = watcher
        self._clock = clock
        self.home = home_namespace
        self.identity = identity
        replica = replica_segment(identity)
        self.claims = ClaimStore(port, watcher)
        self.doorbell = Doorbell(port, home_namespace, replica, clock)
        self.waiting = WaitingPublisher(port, home_namespace, replica, clock, self.doorbell)
        self.waiting_elsewhere = WaitingReader(port, home_namespace, clock)
        self.catalog = CatalogRecords(port, watcher, home_namespace)
        self.environments = EnvironmentRecords(port, home_namespace)
        self.drains = DrainRecords(port, home_namespace)

    def leases(self, ttl_seconds: float) -> LeaseRecords:
        return LeaseRecords(self._port, self._watcher, LockTerms(ttl_seconds, LOCK_DELAY_SECONDS))

    def members(self, ttl_seconds: float, *, environments: bool = False) -> Members:
        return Members(
            self._port,
            self.home,
            self.identity,
            ttl_seconds,
            self._clock,
            environments=environments,
        )

    def doorbell_watch(self, on_ring: Callable[[frozenset[str]], Awaitable[None]]) -> DoorbellWatch:
        return DoorbellWatch(self._watcher, self.home, on_ring)

    async def close(self) -> None:
        """What this process still owes the others: its waiting record deleted (nothing
        of it waits any more) and the last ring written."""
        await self.waiting.close()
        await self.doorbell.close()
