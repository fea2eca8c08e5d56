"""An API replica's replica record (records/replicas.py keeps them in Nomad): who it is and
until when the record counts. The live replicas split every pool's offer into slices
(core/handout.py), so each replica claims its own runners first. Pure.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final

from controller.core.times import format_time, parse_time

# A record counts this long after it was written; a replica writes its own again every
# third of it. A replica that died keeps its slice at most this long: the others take
# from it meanwhile once their own slices are empty.
REPLICA_TTL: Final = timedelta(seconds=15)


@dataclass(frozen=True)
class ReplicaRecord:
    identity: str  # the replica's `host/pid`: the name its slices are hashed with
    expires_at: datetime

    def to_items(self) -> dict[str, str]:
        return {"identity": self.identity, "expiresAt": format_time(self.expires_at)}

    @classmethod
    def from_items(cls, items: Mapping[str, Any]) -> ReplicaRecord | None:
        """The record, or None for items that do not decode."""
        identity, expires = items.get("identity"), items.get("expiresAt")
        if not isinstance(identity, str) or not identity or not isinstance(expires, str):
            return None
        try:
            return cls(identity, parse_time(expires))
        except ValueError:
            return None

    @classmethod
    def written(cls, identity: str, now: datetime) -> ReplicaRecord:
        """The record a replica writes now."""
        return cls(identity, now + REPLICA_TTL)


def live_replicas(records: Iterable[ReplicaRecord], now: datetime) -> frozenset[str]:
    """The replicas whose records count at `now`."""
    return frozenset(record.identity for record in records if now < record.expires_at)
