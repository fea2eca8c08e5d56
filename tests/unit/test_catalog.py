"""The records reconcilers and API replicas share through Nomad (core/catalog.py): they
round-trip, a record that does not decode is refused whole, and the waiting tally counts
each abandoned request once."""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from controller.core.catalog import (
    VARIABLE_BYTES,
    VARIABLE_SLACK_BYTES,
    CatalogError,
    CatalogRecord,
    WaitingRecord,
    WaitingTally,
    without_job_template,
)
from controller.core.demand import StartSample
from controller.core.offers import Offer, Offered
from controller.core.paths import catalog_path, replica_segment

NOW = datetime(2026, 12, 5, 9, 0, tzinfo=UTC)


def record(**changes: Any) -> CatalogRecord:
    fields: dict[str, Any] = {
        "key": "default/py.3",
        "document": {"metadata": {"name": "py.3"}, "spec": {"idleRunners": 2}},
        "active": True,
        "status": {"idleRunners": 2, "lastReconcileTime": "2026-12-05T09:00:00Z"},
        "offer": Offer(
            (Offered("py-000000000001", "a1", 0, "n1", StartSample(10**18, 1.5)),),
            (Offered("py-000000000002", "a2", 3, "n2"),),
        ),
        "draining_nodes": {"n2": NOW + timedelta(hours=1), "n3": None},
        "holder": "host/1",
        "published_at": NOW,
        "conflict": None,
    }
    return CatalogRecord(**(fields | changes))


def test_a_record_round_trips_through_string_items() -> None:
    for original in (record(), record(conflict="prefix py- is pool default/other's")):
        items = original.to_items()
        assert all(isinstance(v, str) for v in items.values())
        assert CatalogRecord.from_items(items) == original


def test_the_path_has_no_dot_or_second_level() -> None:
    assert catalog_path("default/py.3") == "poolkeeper/catalog/default~py~3"


def test_republishing_or_another_pass_is_the_same_content() -> None:
    later = record(
        published_at=NOW + timedelta(seconds=5),
        status={"idleRunners": 2, "lastReconcileTime": "2026-12-05T09:00:05Z"},
    )
    assert later.same_content(record())
    assert not record(status={"idleRunners": 1}).same_content(record())
    assert not record(offer=Offer()).same_content(record())
    assert not record().same_content(None)


def corrupt(name: str, value: str | None) -> dict[str, str]:
    items = record().to_items()
    if value is None:
        del items[name]
    else:
        items[name] = value
    return items


@pytest.mark.parametrize(
    "items",
    [
        corrupt("document", None),
        corrupt("document", "{not json"),
        corrupt("document", "[]"),
        corrupt("status", "3"),
        corrupt("offer", "[]"),
        corrupt("offer", '{"prefix": "py-", "nodes": ["n"], "current": 1, "rest": []}'),
        corrupt("offer", '{"nodes": ["n"], "current": [], "rest": []}'),
        corrupt("offer", '{"prefix": "py-", "nodes": [1], "current": [], "rest": []}'),
        corrupt(
            "offer", '{"prefix": "py-", "nodes": ["n"], "current": [["1", "a", 0]], "rest": []}'
        ),
        corrupt(
            "offer",
            '{"prefix": "py-", "nodes": ["n"], "current": [["1", "a", "0", 0]], "rest": []}',
        ),
        corrupt(
            "offer", '{"prefix": "py-", "nodes": ["n"], "current": [[1, "a", 0, 0]], "rest": []}'
        ),
        corrupt(
            "offer", '{"prefix": "py-", "nodes": ["n"], "current": [["1", "a", 0, 1]], "rest": []}'
        ),
        corrupt("offer", '{"current": [["py-1", "a", 0, 0]], "rest": []}'),
        corrupt("offer", '{"prefix": "py-", "current": [], "rest": []}'),
        corrupt("drainingNodes", '{"n1": "yesterday"}'),
        corrupt("publishedAt", "soon"),
        corrupt("pool", ""),
        corrupt("holder", None),
    ],
)
def test_a_record_that_does_not_decode_is_refused(items: dict[str, str]) -> None:
    with pytest.raises(CatalogError):
        CatalogRecord.from_items(items)


def test_the_job_template_stays_with_the_reconciler() -> None:
    document = {"spec": {"nomad": {"namespace": "x", "jobTemplate": {"Meta": {"a": "b"}}}}}
    kept = json.dumps(document)
    assert without_job_template(document) == {"spec": {"nomad": {"namespace": "x"}}}
    assert json.dumps(document) == kept  # the pool's own document is left alone


def test_an_offer_capped_keeps_the_current_runners_first() -> None:
    current = tuple(Offered(f"py-00000000000{i}", "a", 0, "n") for i in range(3))
    rest = tuple(Offered(f"py-00000000001{i}", "a", 0, "n") for i in range(3))
    capped = Offer(current, rest).capped(4)
    assert (capped.current, capped.rest) == (current, rest[:1])
    assert capped.runner_ids == {o.runner_id for o in (*current, *rest[:1])}


def offered(count: int, prefix: str, *, start: bool, first: int = 0) -> tuple[Offered, ...]:
    """Runners as large as they come: the longest job prefix, a start each."""
    return tuple(
        Offered(
            f"{prefix}{first + i:012x}",
            f"{first + i:08x}-0000-4000-8000-000000000000",
            i % 3,
            f"nomad-client-{i % 40:03d}.zone-a.example.internal",
            StartSample(1_796_000_000_000_000_000 + i, 12.345678) if start else None,
        )
        for i in range(count)
    )


@pytest.mark.parametrize("start", [False, True])
def test_an_offer_fills_the_variable_and_no_more(start: bool) -> None:
    prefix = "p" * 62 + "-"  # the longest job prefix a pool may have
    big = record(
        offer=Offer(
            offered(1500, prefix, start=start), offered(500, prefix, start=start, first=9000)
        ),
        document={"spec": {"poseidon": {"env": {"X": "é" * 2000}}}},  # bytes, not characters
    )
    items = big.to_items()
    size = sum(len(k) + len(v.encode()) for k, v in items.items())
    assert size <= VARIABLE_BYTES - VARIABLE_SLACK_BYTES
    kept = CatalogRecord.from_items(items).offer
    # Nearly all of the room used, and the current runners kept first.
    assert size > 0.97 * (VARIABLE_BYTES - VARIABLE_SLACK_BYTES)
    assert kept.rest == ()
    assert [o.runner_id for o in kept.current] == [
        o.runner_id for o in big.offer.current[: len(kept.current)]
    ]
    assert len(kept) > (700 if not start else 500)


def test_an_offer_that_fits_is_carried_whole() -> None:
    whole = record(
        offer=Offer(offered(300, "py-", start=True), offered(2, "py-", start=False, first=500))
    )
    decoded = CatalogRecord.from_items(whole.to_items()).offer
    assert decoded == Offer(
        tuple(
            dataclasses.replace(o, start=StartSample(o.start.registered_ns, 12.346))
            for o in whole.offer.current
            if o.start
        ),
        whole.offer.rest,
    )


def test_an_offer_in_the_earlier_form_still_decodes() -> None:
    """During an upgrade a holder of the previous release writes whole runner IDs and node
    names, with no `prefix` or `nodes`: an upgraded API replica still offers its runners."""
    items = record().to_items()
    items["offer"] = json.dumps(
        {
            "current": [["py-000000000001", "a1", 0, "n1", 10**18, 1.5]],
            "rest": [["py-000000000002", "a2", 3, "n2"]],
        }
    )
    assert CatalogRecord.from_items(items).offer == record().offer


def test_runners_offered_alike_again_are_taken_over_from_the_last_read() -> None:
    """A record is read again each time one of its runners changes: the others are the
    objects the last read built, and what decodes is the same as a read from nothing."""
    last = CatalogRecord.from_items(
        record(offer=Offer(offered(5, "py-", start=True))).to_items()
    ).offer
    kept, restarted, moved, restamped, gone = last.current
    changed = (
        dataclasses.replace(restarted, allocation_restarts=restarted.allocation_restarts + 1),
        dataclasses.replace(moved, node_name="nomad-client-999"),
        dataclasses.replace(restamped, start=StartSample(1, 2.0)),
    )
    added = offered(1, "py-", start=False, first=9)
    items = record(offer=Offer((kept, *changed), added)).to_items()
    decoded = CatalogRecord.from_items(items, last).offer
    assert decoded == CatalogRecord.from_items(items).offer == Offer((kept, *changed), added)
    assert decoded.current[0] is kept
    assert not any(a is b for a in (*decoded.current[1:], *decoded.rest) for b in last.current)
    assert gone.runner_id not in decoded.runner_ids


def waiting(replica: str, arrivals: int, abandoned: int, expires: datetime) -> WaitingRecord:
    return WaitingRecord(
        replica, {"default/py": (NOW,) * arrivals}, {"default/py": abandoned}, expires
    )


def test_a_waiting_record_round_trips() -> None:
    original = waiting("api-1", 2, 5, NOW)
    assert WaitingRecord.from_items(original.to_items()) == original
    with pytest.raises(CatalogError):
        WaitingRecord.from_items({"replica": "api-1", "pools": "[]", "expiresAt": "x"})


def test_the_tally_counts_live_arrivals_and_each_abandoned_request_once() -> None:
    tally = WaitingTally()
    live = NOW + timedelta(seconds=30)
    # The first reading is the baseline: what was abandoned before it is not counted.
    tally.update([waiting("api-1", 2, 4, live)], NOW)
    assert tally.arrivals == {"default/py": (NOW, NOW)}
    assert tally.take_abandoned("default/py") == 0
    tally.update([waiting("api-1", 1, 6, live), waiting("api-2", 1, 1, live)], NOW)
    assert len(tally.arrivals["default/py"]) == 2
    assert tally.take_abandoned("default/py") == 3  # 2 more on api-1, 1 on the new api-2
    assert tally.take_abandoned("default/py") == 0  # taken once
    # An expired record (its replica died) counts for nothing.
    tally.update([waiting("api-1", 5, 9, NOW - timedelta(seconds=1))], NOW)
    assert tally.arrivals == {} and tally.take_abandoned("default/py") == 0


def test_a_replica_identity_becomes_a_path_segment() -> None:
    assert replica_segment("pod-7f9/12") == "pod-7f9-12"
    assert replica_segment("") == "replica"


def test_an_offer_without_some_runners_keeps_the_order_of_the_rest() -> None:
    offer = Offer(offered(3, "py-", start=False), offered(2, "py-", start=False, first=3))
    ids = [o.runner_id for o in (*offer.current, *offer.rest)]
    left = offer.without(frozenset({ids[1], ids[3]}))
    assert [o.runner_id for o in left.current] == [ids[0], ids[2]]
    assert [o.runner_id for o in left.rest] == [ids[4]]
    assert offer.without(frozenset({"other-000000000000"})) is offer
