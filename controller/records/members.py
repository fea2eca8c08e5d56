"""Who reconciles: a record per live reconciler, through Nomad alone.

`poolkeeper/members/<replica>` in the controllers' own namespace (core/members.py) says who
a reconciler is, which pools it defines and which of their leases it holds; it is
written again every TTL/3 and counts for one TTL after that, so a reconciler that dies
stops counting within a TTL, well before Nomad frees its leases (2 x TTL + lock delay).
A graceful stop deletes the record first, then gives the leases back. Records expired for
a minute are deleted by whoever reads them. A process that defines pools is a member, and
so is one that keeps the managed Poseidon environments (API replicas read the records to
know whether any does).

The holdings come from the records, not from each reader's own sight of the leases, so
that every member computes the same assignment from the same reading (core/balance.py):
were each to use what it last saw of the leases, one that had just seen a pool taken and
one that had not would deal the free pools out differently, and each leave some to the
other.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping
from datetime import datetime, timedelta
from typing import Any, Final

from controller.core.members import MemberRecord, Membership
from controller.core.paths import MEMBERS_PREFIX, member_path, replica_segment
from controller.nomad.errors import NomadError
from controller.nomad.port import Variables
from controller.records.reading import Listing
from controller.records.writing import delete_unchanged

log = logging.getLogger(__name__)

FORGET_AFTER: Final = timedelta(seconds=60)


def _decode(path: str, variable: Mapping[str, Any]) -> MemberRecord | None:
    return MemberRecord.from_items(variable.get("Items") or {})


class Members:
    def __init__(
        self,
        port: Variables,
        home_namespace: str,
        identity: str,
        ttl_seconds: float,
        clock: Callable[[], datetime],
        *,
        environments: bool = False,
    ) -> None:
        """`environments`: this process registers the managed environments' pools (its
        record says so even while it defines no pool)."""
        self._port = port
        self._home = home_namespace
        self.identity = identity
        self.environments = environments
        self._path = member_path(replica_segment(identity))
        self._ttl = timedelta(seconds=ttl_seconds)
        self._clock = clock
        self._records = Listing(port, MEMBERS_PREFIX, home_namespace, _decode)
        self._written = False

    async def beat(
        self, pools: Collection[str], holds: Collection[str], lapsed: Collection[str] = ()
    ) -> None:
        """Say this process reconciles these pools, holds these of their leases and could
        not keep these, for one more TTL (no pools and no environments: not a member)."""
        if not pools and not self.environments:
            await self.leave()
            return
        record = MemberRecord(
            self.identity,
            frozenset(pools),
            frozenset(holds),
            self._clock() + self._ttl,
            frozenset(lapsed),
            self.environments,
        )
        await self._port.put_variable(self._path, record.to_items(), self._home, cas=None)
        self._written = True

    async def live(self, *, collect: bool = True) -> Membership:
        """The live members (this one included), as Nomad holds their records now (only
        changed records are read again); with `collect`, records expired for a minute
        are deleted (a reader that only reads, the API tier, leaves that to members)."""
        known = await self._records.read()
        now = self._clock()
        membership = Membership({}, {})
        for path, hit in known.items():
            record = hit.value
            if record is None:
                continue
            if now < record.expires_at:
                membership.add(record)
            elif collect and now - record.expires_at > FORGET_AFTER:
                await delete_unchanged(self._port, path, self._home, hit.index)
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
