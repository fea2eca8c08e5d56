"""Who serves claims from the catalog: a record per live API replica, through Nomad alone.

`poolkeeper/replicas/<replica>` in the controllers' own namespace (core/replicas.py) says a
replica is alive for one REPLICA_TTL; it writes it again every third of that, reading
the others' records at the same time (only those that changed are read again). The live
replicas split every pool's offer into slices (core/handout.py). A graceful stop deletes
the record; records expired for a minute are deleted by whichever replica reads them, so
a replica that died leaves nothing that counts.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import Any, Final

from controller.core.handout import Claimers
from controller.core.paths import REPLICAS_PREFIX, replica_path, replica_segment
from controller.core.replicas import REPLICA_TTL, ReplicaRecord, live_replicas
from controller.nomad.errors import NomadError
from controller.nomad.port import Variables
from controller.records.reading import Listing
from controller.records.writing import OwnRecord, delete_unchanged

log = logging.getLogger(__name__)

BEAT_SECONDS: Final = REPLICA_TTL.total_seconds() / 3
FORGET_AFTER: Final = timedelta(seconds=60)


def _decode(path: str, variable: Mapping[str, Any]) -> ReplicaRecord | None:
    return ReplicaRecord.from_items(variable.get("Items") or {})


class ReplicaRecords:
    def __init__(
        self, port: Variables, home_namespace: str, identity: str, clock: Callable[[], datetime]
    ) -> None:
        self._port = port
        self._home = home_namespace
        self._identity = identity
        self._own = OwnRecord(
            port, replica_path(replica_segment(identity)), home_namespace, "this replica's record"
        )
        self._clock = clock
        self._records = Listing(port, REPLICAS_PREFIX, home_namespace, _decode)
        self._problem: str | None = None
        # Until the records are read, this replica counts itself alone.
        self.claimers = Claimers(identity, frozenset({identity}))

    async def beat(self) -> None:
        """Write this replica's record, then read the live replicas' (a failure is logged
        once: the slices stay as last read, and the next beat tries again)."""
        try:
            record = ReplicaRecord.written(self._identity, self._clock())
            await self._own.write(record.to_items())
            known = await self._records.read()
            now = self._clock()
            for path, hit in known.items():
                if hit.value is not None and now - hit.value.expires_at > FORGET_AFTER:
                    await delete_unchanged(self._port, path, self._home, hit.index)
        except NomadError as error:
            if self._problem is None:
                log.warning("cannot keep this replica's record in Nomad: %s", error)
            self._problem = str(error)
            return
        if self._problem is not None:
            log.info("this replica's record is kept again")
            self._problem = None
        live = live_replicas((hit.value for hit in known.values() if hit.value), now)
        self.claimers = Claimers(self._identity, live | {self._identity})

    async def leave(self) -> None:
        """No longer a replica (a graceful stop): the others take its slices."""
        await self._own.delete()
