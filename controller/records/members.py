"""Who reconciles: a record per live reconciler, through Nomad alone.

`poolkeeper/members/<replica>` in the controllers' own namespace says who a reconciler is
(its lease identity), which pools it defines, which of their leases it held when it wrote
the record, and until when the record counts: it is
written again every TTL/3 and counts for one TTL after that, so a reconciler that dies
stops counting within a TTL, well before Nomad frees its leases (2 x TTL + lock delay).
A graceful stop deletes the record first, then gives the leases back. Records expired for
a minute are deleted by whoever reads them. Only a process that defines pools is a member.

The holdings come from the records, not from each reader's own sight of the leases, so
that every member computes the same assignment from the same reading (core/balance.py):
were each to use what it last saw of the leases, one that had just seen a pool taken and
one that had not would deal the free pools out differently, and each leave some to the
other.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final

from controller.core.paths import MEMBERS_PREFIX, replica_segment
from controller.core.times import format_time, parse_time
from controller.nomad.errors import NomadConflict, NomadError
from controller.nomad.port import Variables

log = logging.getLogger(__name__)

FORGET_AFTER: Final = timedelta(seconds=60)


@dataclass(frozen=True)
class MemberRecord:
    identity: str
    pools: frozenset[str]
    holds: frozenset[str]
    expires_at: datetime

    def to_items(self) -> dict[str, str]:
        return {
            "identity": self.identity,
            "pools": ",".join(sorted(self.pools)),
            "holds": ",".join(sorted(self.holds)),
            "expiresAt": format_time(self.expires_at),
        }

    @classmethod
    def from_items(cls, items: Mapping[str, Any]) -> MemberRecord | None:
        try:
            return cls(
                str(items["identity"]),
                _keys(items.get("pools")),
                _keys(items.get("holds")),
                parse_time(str(items["expiresAt"])),
            )
        except (KeyError, ValueError):
            return None


def _keys(joined: object) -> frozenset[str]:
    return frozenset(key for key in str(joined or "").split(",") if key)


@dataclass(frozen=True)
class Membership:
    """The live members as read from their records."""

    defines: dict[str, frozenset[str]]  # member identity -> the pools it defines
    holders: dict[str, str]  # pool -> the member whose record says it holds its lease


class Members:
    def __init__(
        self,
        port: Variables,
        home_namespace: str,
        identity: str,
        ttl_seconds: float,
        clock: Callable[[], datetime],
    ) -> None:
        self._port = port
        self._home = home_namespace
        self.identity = identity
        self._path = MEMBERS_PREFIX + replica_segment(identity)
        self._ttl = timedelta(seconds=ttl_seconds)
        self._clock = clock
        self._known: dict[str, tuple[int, MemberRecord | None]] = {}
        self._written = False

    async def beat(self, pools: Collection[str], holds: Collection[str]) -> None:
        """Say this process reconciles these pools and holds these of their leases, for one
        more TTL (no pools: not a member)."""
        if not pools:
            await self.leave()
            return
        expires_at = self._clock() + self._ttl
        record = MemberRecord(self.identity, frozenset(pools), frozenset(holds), expires_at)
        await self._port.put_variable(self._path, record.to_items(), self._home, cas=None)
        self._written = True

    async def live(self) -> Membership:
        """The live members (this one included), as Nomad holds their records now (only
        changed records are read again)."""
        metas = await self._port.list_variables(MEMBERS_PREFIX, self._home)
        known: dict[str, tuple[int, MemberRecord | None]] = {}
        for meta in metas:
            path, index = str(meta["Path"]), int(meta.get("ModifyIndex", 0))
            hit = self._known.get(path)
            if hit is None or hit[0] != index:
                variable = await self._port.read_variable(path, self._home)
                items = (variable or {}).get("Items") or {}
                hit = (index, MemberRecord.from_items(items) if variable else None)
            known[path] = hit
        self._known = known
        now = self._clock()
        membership = Membership({}, {})
        for path, (index, record) in known.items():
            if record is None:
                continue
            if now < record.expires_at:
                membership.defines[record.identity] = record.pools
                membership.holders.update(dict.fromkeys(record.holds, record.identity))
            elif now - record.expires_at > FORGET_AFTER:
                with contextlib.suppress(NomadConflict):
                    await self._port.delete_variable(path, self._home, cas=index)
        return membership

    async def leave(self) -> None:
        """No longer a member (a graceful stop, or no pool left): others take its share."""
        if not self._written:
            return
        try:
            await self._port.delete_variable(self._path, self._home)
            self._written = False
        except NomadError as error:
            log.warning("could not delete this reconciler's member record: %s", error)
