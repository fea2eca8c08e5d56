"""What reconcilers and API replicas tell each other, as Nomad variables in the
controller's own Nomad namespace (the home namespace both sides share). Pure: the
records and their items (their paths are in core/paths.py, their I/O in records/).

- `poolkeeper/catalog/<namespace>~<name>`: a pool as its lease holder publishes it for
  the API tier: its spec (without `jobTemplate`, which only the reconciler renders), its
  status, the runners it offers to claims (current ones first, as many as fit in the
  variable: Nomad takes at most VARIABLE_BYTES of items) and the draining nodes they run
  on. Written when any of that changes, and at least every
  REPUBLISH_SECONDS; deleted when the pool goes; a record nobody has published for
  STALE_SECONDS is deleted by any reconciler (its pool is reconciled nowhere).
- `poolkeeper/waiting/<replica>`: the claim requests an API replica holds waiting, per
  pool (the demand estimate counts them); it carries its own expiry, refreshed while the
  replica lives, so a dead replica's requests stop counting.
- `poolkeeper/doorbell`: rung (written) by an API replica when claims changed (runners
  taken or ended, requests waiting, environments written); reconcilers watch it with a
  blocking read and look at once instead of at their next resync (Ring).

Every item is a string, as Nomad requires; structured ones are JSON. A record that does
not decode is refused as a whole (CatalogError), never half read.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Final

from controller.core.demand import StartSample
from controller.core.offers import EMPTY, Offer, Offered
from controller.core.times import format_time, parse_time

# Nomad refuses a variable whose items (keys and values) add up to more than 64 KiB.
VARIABLE_BYTES: Final = 64 * 1024
# Room a record leaves unused, for the JSON of its write and for safety.
VARIABLE_SLACK_BYTES: Final = 1024
# Runners a pass hands to a record at most: more than fit (a row is at least about 55
# bytes), so the record's size is what bounds its offer, at a bounded cost to encode.
OFFER_LIMIT: Final = 2000
REPUBLISH_SECONDS: Final = 60.0
STALE_SECONDS: Final = 600.0
# A waiting record counts until this long after its last refresh.
WAITING_TTL_SECONDS: Final = 30.0


class CatalogError(ValueError):
    """A record whose items do not decode."""


@dataclass(frozen=True)
class CatalogRecord:
    key: str
    document: Mapping[str, Any]  # the RunnerPool document, without spec.nomad.jobTemplate
    active: bool  # takes claims (false while it drains)
    status: Mapping[str, Any]  # as GET /v1/pools shows it
    offer: Offer
    # Nodes its runners run on that drain, and their drain deadline (None: none set).
    draining_nodes: Mapping[str, datetime | None]
    holder: str
    published_at: datetime
    conflict: str | None = None  # a prefix conflict's message: it hands out nothing

    def to_items(self) -> dict[str, str]:
        """The record's items, its offer cut to what fits in one variable after the
        others (current runners first)."""
        items = {
            "pool": self.key,
            "document": _dump(self.document),
            "active": "true" if self.active else "false",
            "status": _dump(self.status),
            "drainingNodes": _dump(
                {n: format_time(d) if d else "" for n, d in sorted(self.draining_nodes.items())}
            ),
            "holder": self.holder,
            "publishedAt": format_time(self.published_at),
        }
        if self.conflict is not None:
            items["conflict"] = self.conflict
        used = sum(len(k) + len(v.encode()) for k, v in items.items()) + len("offer")
        items["offer"] = encode_offer(self.offer, VARIABLE_BYTES - VARIABLE_SLACK_BYTES - used)
        return items

    def same_content(self, other: CatalogRecord | None) -> bool:
        """Equal but for when it was published and when its pool was last reconciled
        (then there is nothing to write: every pass reconciles)."""
        return other is not None and _content(self) == _content(other)

    @classmethod
    def from_items(cls, items: Mapping[str, Any], before: Offer = EMPTY) -> CatalogRecord:
        """The record its items say; `before`: the offer of its last read, whose runners
        that are offered alike again are taken over (decode_offer)."""
        try:
            document = json.loads(items["document"])
            status = json.loads(items["status"])
            nodes = json.loads(items["drainingNodes"])
            if not isinstance(document, dict) or not isinstance(status, dict):
                raise CatalogError("document and status must be objects")
            if not isinstance(nodes, dict):
                raise CatalogError("drainingNodes must be an object")
            return cls(
                key=_text(items, "pool"),
                document=document,
                active=items["active"] == "true",
                status=status,
                offer=decode_offer(json.loads(items["offer"]), before),
                draining_nodes={
                    str(name): parse_time(when) if when else None for name, when in nodes.items()
                },
                holder=_text(items, "holder"),
                published_at=parse_time(_text(items, "publishedAt")),
                conflict=items.get("conflict") or None,
            )
        except (KeyError, TypeError, ValueError) as error:
            raise CatalogError(f"catalog record does not decode: {error}") from None


def _content(record: CatalogRecord) -> CatalogRecord:
    status = {k: v for k, v in record.status.items() if k != "lastReconcileTime"}
    return dataclasses.replace(record, status=status, published_at=datetime.min)


def without_job_template(document: Mapping[str, Any]) -> dict[str, Any]:
    """The pool document as a catalog record carries it: the API tier never renders a job,
    and a job template may be large."""
    copied: dict[str, Any] = json.loads(json.dumps(document))
    nomad = copied.get("spec", {}).get("nomad")
    if isinstance(nomad, dict):
        nomad.pop("jobTemplate", None)
    return copied


def encode_offer(offer: Offer, room: int) -> str:
    """The offer as its record carries it, in at most `room` bytes: the runners' common ID
    prefix (their pool's job prefix) and node names once, each runner a row `[ID suffix,
    allocation ID, restarts, node index]` plus `[registeredNs, startSeconds]` where its
    start is known. Rows that do not fit are left out, the rest's before the current's."""
    while True:
        text = _dump(_offer_object(offer))
        if len(text) <= room or not len(offer):
            return text
        # Rows are alike in size: cut in proportion, a little more, until it fits.
        keep = min(len(offer) - 1, int(len(offer) * room / len(text) * 0.98))
        offer = offer.capped(max(0, keep))


def _offer_object(offer: Offer) -> dict[str, Any]:
    everyone = (*offer.current, *offer.rest)
    prefix = _common_prefix([o.runner_id for o in everyone])
    nodes = sorted({o.node_name for o in everyone})
    index = {name: i for i, name in enumerate(nodes)}

    def rows(group: tuple[Offered, ...]) -> list[list[Any]]:
        found: list[list[Any]] = []
        for o in group:
            row: list[Any] = [
                o.runner_id[len(prefix) :],
                o.allocation_id,
                o.allocation_restarts,
                index[o.node_name],
            ]
            if o.start is not None:
                row += [o.start.registered_ns, round(o.start.seconds, 3)]
            found.append(row)
        return found

    return {
        "prefix": prefix,
        "nodes": nodes,
        "current": rows(offer.current),
        "rest": rows(offer.rest),
    }


def _common_prefix(texts: list[str]) -> str:
    """The longest prefix of every text (the smallest and largest share it)."""
    if not texts:
        return ""
    low, high = min(texts), max(texts)
    length = 0
    while length < len(low) and low[length] == high[length]:
        length += 1
    return low[:length]


def decode_offer(value: Any, before: Offer = EMPTY) -> Offer:
    """An offer in the compact form above, or in the earlier one a holder of the previous
    release still writes during an upgrade: no `prefix` or `nodes`, every row `[runner ID,
    allocation ID, restarts, node name]`. A runner `before` offered alike is its object
    again: a record changes by a runner or two at a time, and building every runner anew
    was most of an API replica's work in following the catalog."""
    if not isinstance(value, dict):
        raise CatalogError("offer must be an object")
    earlier = "prefix" not in value and "nodes" not in value
    prefix, nodes = ("", None) if earlier else (value.get("prefix"), value.get("nodes"))
    if not isinstance(prefix, str):
        raise CatalogError("an offer's prefix must be a string")
    if not earlier and not (isinstance(nodes, list) and all(isinstance(n, str) for n in nodes)):
        raise CatalogError("an offer's nodes must be a list of names")
    known = before.by_id

    def node_name(row: list[Any]) -> str:
        node = row[3]
        if nodes is None and isinstance(node, str):
            return node
        if nodes is not None and isinstance(node, int) and 0 <= node < len(nodes):
            return str(nodes[node])
        raise CatalogError(f"an offered runner's node is not listed: {row!r}")

    def offered(rows: Any) -> tuple[Offered, ...]:
        if not isinstance(rows, list):
            raise CatalogError("an offer group must be a list")
        found: list[Offered] = []
        for row in rows:
            if not isinstance(row, list) or len(row) not in (4, 6):
                raise CatalogError(f"an offered runner must be a list of 4 or 6: {row!r}")
            suffix, allocation_id, restarts = row[:3]
            if not isinstance(suffix, str) or not isinstance(allocation_id, str):
                raise CatalogError(f"an offered runner's IDs must be strings: {row!r}")
            if not isinstance(restarts, int):
                raise CatalogError(f"an offered runner's restarts must be a number: {row!r}")
            runner_id, node = prefix + suffix, node_name(row)
            start = (int(row[4]), float(row[5])) if len(row) == 6 else None
            runner = known.get(runner_id)
            if runner is None or (
                runner.allocation_id,
                runner.allocation_restarts,
                runner.node_name,
                _start_fields(runner.start),
            ) != (allocation_id, restarts, node, start):
                sample = StartSample(*start) if start is not None else None
                runner = Offered(runner_id, allocation_id, restarts, node, sample)
            found.append(runner)
        return tuple(found)

    return Offer(offered(value.get("current")), offered(value.get("rest")))


def _start_fields(start: StartSample | None) -> tuple[int, float] | None:
    return (start.registered_ns, start.seconds) if start is not None else None


# Why the doorbell rang.
CLAIMS: Final = "claims"  # runners taken or ended: replace or purge them
WAITING: Final = "waiting"  # requests wait: read the waiting records
ENVIRONMENTS: Final = "environments"  # Poseidon environments written: read them


@dataclass(frozen=True)
class Ring:
    """The doorbell as last rung: who rang, when, why, and which pools it concerns (two
    rings may overwrite each other's, so a reader takes any ring as a reason to look)."""

    by: str
    at: datetime
    reasons: frozenset[str]
    pools: frozenset[str]

    def to_items(self) -> dict[str, str]:
        return {
            "by": self.by,
            "at": format_time(self.at),
            "reasons": ",".join(sorted(self.reasons)),
            "pools": ",".join(sorted(self.pools)),
        }

    @classmethod
    def reasons_in(cls, items: Mapping[str, Any]) -> frozenset[str]:
        """The reasons a ring's items give (none where they do not say)."""
        return frozenset(r for r in str(items.get("reasons") or "").split(",") if r)


@dataclass(frozen=True)
class WaitingRecord:
    """The requests one API replica holds waiting: per pool, when each (runner) arrived,
    and how many runners were wanted by requests that gave up, ever (readers take the
    growth since they last looked)."""

    replica: str
    arrivals: Mapping[str, tuple[datetime, ...]]
    abandoned_total: Mapping[str, int]
    expires_at: datetime

    def to_items(self) -> dict[str, str]:
        pools = {
            key: {
                "arrivals": [format_time(t) for t in self.arrivals.get(key, ())],
                "abandoned": self.abandoned_total.get(key, 0),
            }
            for key in sorted({*self.arrivals, *self.abandoned_total})
        }
        return {
            "replica": self.replica,
            "pools": _dump(pools),
            "expiresAt": format_time(self.expires_at),
        }

    @classmethod
    def from_items(cls, items: Mapping[str, Any]) -> WaitingRecord:
        try:
            pools = json.loads(items["pools"])
            if not isinstance(pools, dict):
                raise CatalogError("pools must be an object")
            arrivals: dict[str, tuple[datetime, ...]] = {}
            abandoned: dict[str, int] = {}
            for key, value in pools.items():
                arrivals[key] = tuple(parse_time(t) for t in value["arrivals"])
                abandoned[key] = int(value["abandoned"])
            return cls(_text(items, "replica"), arrivals, abandoned, parse_time(items["expiresAt"]))
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            raise CatalogError(f"waiting record does not decode: {error}") from None

    def expired(self, now: datetime) -> bool:
        return now >= self.expires_at


@dataclass
class WaitingTally:
    """What the waiting records of all replicas add up to, for the demand estimate: per
    pool, the arrivals of the requests waiting now, and the runners of requests that gave
    up since the last pass took them (the growth of each replica's total)."""

    arrivals: dict[str, tuple[datetime, ...]] = field(default_factory=dict)
    _seen_totals: dict[tuple[str, str], int] = field(default_factory=dict)
    _abandoned: dict[str, int] = field(default_factory=dict)
    _primed: bool = False  # the first reading is where the totals start from

    def update(self, records: list[WaitingRecord], now: datetime) -> None:
        """Take the live records as they are now (expired ones count for nothing). The
        totals a process finds on its first reading are its baseline (they were counted
        before it started, or never will be); after it, a new replica counts from 0."""
        arrivals: dict[str, list[datetime]] = {}
        for record in records:
            if record.expired(now):
                continue
            for key, moments in record.arrivals.items():
                arrivals.setdefault(key, []).extend(moments)
            for key, total in record.abandoned_total.items():
                seen = self._seen_totals.get(
                    (record.replica, key), total if not self._primed else 0
                )
                if total > seen:
                    self._abandoned[key] = self._abandoned.get(key, 0) + total - seen
                self._seen_totals[(record.replica, key)] = total
        self.arrivals = {key: tuple(sorted(m)) for key, m in arrivals.items()}
        self._primed = True

    def take_abandoned(self, key: str) -> int:
        return self._abandoned.pop(key, 0)


def waiting_expiry(now: datetime) -> datetime:
    return now + timedelta(seconds=WAITING_TTL_SECONDS)


def _text(items: Mapping[str, Any], name: str) -> str:
    value = items[name]
    if not isinstance(value, str) or not value:
        raise CatalogError(f"{name} must be a non-empty string")
    return value


def _dump(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True)
