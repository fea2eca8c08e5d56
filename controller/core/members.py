"""A reconciler's member record (records/members.py keeps them in Nomad): who it is (its
lease identity), which pools it defines, which of their leases it held when it wrote the
record, which it could not keep (its renewals failed: another member is to take them),
whether it keeps managed Poseidon environments, and until when the record counts. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from controller.core.times import format_time, parse_time


@dataclass(frozen=True)
class MemberRecord:
    identity: str
    pools: frozenset[str]
    holds: frozenset[str]
    expires_at: datetime
    lapsed: frozenset[str] = frozenset()
    environments: bool = False  # it registers the managed environments' pools

    def to_items(self) -> dict[str, str]:
        items = {
            "identity": self.identity,
            "pools": ",".join(sorted(self.pools)),
            "holds": ",".join(sorted(self.holds)),
            "expiresAt": format_time(self.expires_at),
        }
        if self.lapsed:
            items["lapsed"] = ",".join(sorted(self.lapsed))
        if self.environments:
            items["environments"] = "managed"
        return items

    @classmethod
    def from_items(cls, items: Mapping[str, Any]) -> MemberRecord | None:
        try:
            return cls(
                str(items["identity"]),
                _keys(items.get("pools")),
                _keys(items.get("holds")),
                parse_time(str(items["expiresAt"])),
                _keys(items.get("lapsed")),
                items.get("environments") == "managed",
            )
        except (KeyError, ValueError):
            return None


def _keys(joined: object) -> frozenset[str]:
    return frozenset(key for key in str(joined or "").split(",") if key)


@dataclass
class Membership:
    """The live members as read from their records."""

    defines: dict[str, frozenset[str]]  # member identity -> the pools it defines (if any)
    holders: dict[str, str]  # pool -> the member whose record says it holds its lease
    # member identity -> the pools whose leases it could not keep
    lapsed: dict[str, frozenset[str]] = field(default_factory=dict)
    # the members that register the managed Poseidon environments' pools
    environments: set[str] = field(default_factory=set)

    def add(self, record: MemberRecord) -> None:
        if record.pools:
            self.defines[record.identity] = record.pools
            self.holders.update(dict.fromkeys(record.holds, record.identity))
        if record.lapsed:
            self.lapsed[record.identity] = record.lapsed
        if record.environments:
            self.environments.add(record.identity)
