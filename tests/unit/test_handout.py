"""Handing out a pool's offer (core/handout.py): every runner once to one process's
claims, a lost runner never again, and the live API replicas each on a slice of their own
until it is empty; the replica records that say who is live (core/replicas.py)."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest

from controller.core.handout import RANDOM, Claimers, Handout, owner, score
from controller.core.offers import Offer, Offered
from controller.core.paths import replica_path, replica_segment
from controller.core.replicas import REPLICA_TTL, ReplicaRecord, live_replicas

NOW = datetime(2026, 12, 7, 9, 0, tzinfo=UTC)


def runners(*numbers: int) -> tuple[Offered, ...]:
    return tuple(Offered(f"py-{n:012x}", f"alloc-{n}", 0, "node-1") for n in numbers)


def offer(current: range | tuple[int, ...], rest: range | tuple[int, ...] = ()) -> Offer:
    return Offer(runners(*current), runners(*rest))


def taken_all(handout: Handout, unsettled: frozenset[str] = frozenset()) -> list[str]:
    ids = []
    while (offered := handout.take(unsettled)) is not None:
        ids.append(offered.runner_id)
    return ids


def ids(*numbers: int) -> list[str]:
    return [o.runner_id for o in runners(*numbers)]


A, B, C = "api-1/100", "api-2/200", "api-3/300"
TWO = (Claimers(A, frozenset({A, B})), Claimers(B, frozenset({A, B})))


# ---- one process: every runner once ---------------------------------------------------


@pytest.mark.parametrize(
    "claimers",
    [RANDOM, Claimers(A, frozenset({A})), TWO[0]],
    ids=["at random", "the only replica", "one of two"],
)
def test_every_runner_is_handed_out_once_current_ones_first(claimers: Claimers) -> None:
    handout = Handout(random.Random(1))
    handout.refresh(offer(range(10), range(10, 15)), claimers)
    assert len(handout) == 15
    order = taken_all(handout)
    assert sorted(order[:10]) == ids(*range(10))  # the current template first
    assert sorted(order[10:]) == ids(*range(10, 15))
    assert len(handout) == 0
    assert handout.take() is None


def test_runners_handed_out_stay_out_while_a_newer_offer_lists_them() -> None:
    handout = Handout(random.Random(2))
    handout.refresh(offer(range(4)), RANDOM)
    first = handout.take()
    assert first is not None
    # The holder's next pass began before the claim: its offer still lists the runner,
    # and adds a fresh one.
    handout.refresh(offer(range(5)), RANDOM)
    rest = taken_all(handout)
    assert first.runner_id not in rest
    assert sorted([first.runner_id, *rest]) == ids(*range(5))


def test_a_runner_lost_is_dropped_and_one_given_back_comes_back() -> None:
    handout = Handout(random.Random(3))
    same = offer(range(3))
    handout.refresh(same, RANDOM)
    lost, given_back = handout.take(), handout.take()
    assert lost is not None and given_back is not None
    handout.give_back(given_back.runner_id)  # its claim was withdrawn: idle again
    handout.refresh(same, RANDOM)
    left = taken_all(handout)
    assert given_back.runner_id in left
    assert lost.runner_id not in left  # a lost check-and-set is never retried
    assert len(left) == 2


def test_an_offer_that_no_longer_lists_a_runner_forgets_it() -> None:
    handout = Handout(random.Random(4))
    handout.refresh(offer(range(2)), RANDOM)
    gone = handout.take()
    assert gone is not None
    handout.refresh(offer((1,)), RANDOM)  # a pass saw its claim
    handout.refresh(offer((0, 1)), RANDOM)  # (its ID listed again: claimable again)
    assert gone.runner_id in taken_all(handout)


def test_unsettled_runners_are_passed_over() -> None:
    handout = Handout(random.Random(5))
    handout.refresh(offer(range(4)), RANDOM)
    unsettled = frozenset(ids(1, 2))
    assert sorted(taken_all(handout, unsettled)) == ids(0, 3)


def test_at_random_the_order_differs_between_processes() -> None:
    orders = set()
    for seed in range(5):
        handout = Handout(random.Random(seed))
        handout.refresh(offer(range(20)), RANDOM)
        orders.add(tuple(taken_all(handout)))
    assert len(orders) > 1


# ---- slices -------------------------------------------------------------------------------


def test_the_score_is_the_same_in_every_process_and_version() -> None:
    # Replicas of two releases during a rolling upgrade must split alike: pinned values.
    assert score(A, "py-000000000001") == 0xD1D70FF09AA1C704
    assert score(B, "py-000000000001") == 0x93FFCADB9DFA8A6D
    assert owner([A, B], "py-000000000001") == (A, 0xD1D70FF09AA1C704)


def test_the_slices_split_the_offer_between_the_replicas() -> None:
    whole = offer(range(200))
    slices = []
    for claimers in TWO:
        handout = Handout()
        handout.refresh(whole, claimers)
        own = [r for r in ids(*range(200)) if owner(claimers.replicas, r)[0] == claimers.me]
        slices.append(set(own))
        # Its own slice first, lowest rank first; then the other's, highest rank first.
        order = taken_all(handout)
        ranks = [owner(claimers.replicas, r)[1] for r in order]
        assert set(order[: len(own)]) == set(own)
        assert ranks[: len(own)] == sorted(ranks[: len(own)])
        assert ranks[len(own) :] == sorted(ranks[len(own) :], reverse=True)
    assert slices[0].isdisjoint(slices[1])
    assert slices[0] | slices[1] == set(ids(*range(200)))
    assert 70 < len(slices[0]) < 130  # about even


def test_a_replica_joining_takes_only_its_own_share() -> None:
    runner_ids = ids(*range(300))
    before = {r: owner([A, B], r)[0] for r in runner_ids}
    after = {r: owner([A, B, C], r)[0] for r in runner_ids}
    moved = {r for r in runner_ids if before[r] != after[r]}
    assert moved and all(after[r] == C for r in moved)


def test_two_replicas_claiming_at_once_meet_only_where_a_slice_runs_out() -> None:
    """Each replica's offer is the same stale one (neither has seen the other's claims):
    they take different runners until one slice is empty, and then the thief starts at
    the far end of the other's."""
    whole = offer(range(100))
    handouts = [Handout(), Handout()]
    for handout, claimers in zip(handouts, TWO, strict=True):
        handout.refresh(whole, claimers)
    claimed: dict[str, str] = {}
    collisions = 0
    for _ in range(40):  # in turns, 40 claims each: fewer than either slice holds
        for handout, claimers in zip(handouts, TWO, strict=True):
            offered = handout.take()
            assert offered is not None
            if offered.runner_id in claimed:
                collisions += 1
            claimed[offered.runner_id] = claimers.me or ""
    assert collisions == 0


def claim_until_empty(handouts: list[Handout], stale: Offer) -> tuple[dict[str, str], int]:
    """Replicas claiming in turns from the same stale offer until none finds a runner, a
    check-and-set in Nomad deciding (`claimed`): the runners each got and the
    check-and-sets lost."""
    for handout, claimers in zip(handouts, TWO, strict=True):
        handout.refresh(stale, claimers)
    claimed: dict[str, str] = {}
    lost = 0
    active = list(zip(handouts, TWO, strict=True))
    while active:
        for handout, claimers in list(active):
            offered = handout.take()
            if offered is None:
                active.remove((handout, claimers))
            elif offered.runner_id in claimed:
                lost += 1
                handout.lost(offered.runner_id, stale)
            else:
                claimed[offered.runner_id] = claimers.me or ""
    return claimed, lost


def test_replicas_emptying_a_pool_lose_one_check_and_set_per_other_slice_and_offer() -> None:
    """Near the end of a pool each replica's stale offer still lists the runners the other
    took: a lost check-and-set shows how far the other came, and the rest of that slice
    is passed over rather than tried runner by runner (which lost about one
    check-and-set per runner the other took: 200 here)."""
    handouts = [Handout(), Handout()]
    claimed, lost = claim_until_empty(handouts, offer(range(200)))
    assert sorted(claimed) == ids(*range(200))  # every runner claimed, each once
    assert lost <= 4, lost  # at most one per slice (two) for each replica (two)
    assert [h.passed_over for h in handouts].count(True) >= 1
    # The next offer (it lists the runners still idle) is tried afresh.
    handouts[0].refresh(offer((500, 501)), TWO[0])
    assert not handouts[0].passed_over
    assert sorted(taken_all(handouts[0])) == ids(500, 501)


def test_a_runner_lost_from_an_older_offer_passes_nothing_over() -> None:
    whole = offer(range(40))
    handout = Handout()
    handout.refresh(whole, TWO[0])
    first = handout.take()
    assert first is not None
    handout.refresh(offer(range(41)), TWO[0])  # the holder's next offer came meanwhile
    handout.lost(first.runner_id, whole)
    rest = taken_all(handout)
    assert not handout.passed_over
    assert sorted([first.runner_id, *rest]) == ids(*range(41))


@pytest.mark.parametrize(
    "claimers", [RANDOM, Claimers(A, frozenset({A}))], ids=["outside", "the only replica"]
)
def test_a_process_that_shares_no_slices_passes_nothing_over(claimers: Claimers) -> None:
    whole = offer(range(10))
    handout = Handout(random.Random(4))
    handout.refresh(whole, claimers)
    first = handout.take()
    assert first is not None
    handout.lost(first.runner_id, whole)  # a reconciler's tombstone, say
    assert len(taken_all(handout)) == 9 and not handout.passed_over


def test_claimers_slice_only_when_this_process_is_a_live_replica() -> None:
    assert not RANDOM.slicing
    assert not Claimers(A, frozenset({B})).slicing
    assert Claimers(A, frozenset({A, B})).slicing


def test_a_change_of_replicas_splits_the_same_offer_again() -> None:
    whole = offer(range(50))
    handout = Handout()
    handout.refresh(whole, Claimers(A, frozenset({A})))
    first = handout.take()
    assert first is not None
    handout.refresh(whole, TWO[0])  # B came: A's own slice is now about half
    order = taken_all(handout)
    assert first.runner_id not in order  # handed out stays handed out
    own = [r for r in order if owner([A, B], r)[0] == A]
    assert order[: len(own)] == own


# ---- replica records ----------------------------------------------------------------------


def test_a_replica_record_round_trips_and_bad_items_are_refused() -> None:
    record = ReplicaRecord.written("host-a/12", NOW)
    assert record.expires_at == NOW + REPLICA_TTL
    items = record.to_items()
    assert all(isinstance(v, str) for v in items.values())
    assert ReplicaRecord.from_items(items) == record
    bad_items: list[dict[str, object]] = [
        {},
        {"identity": "x"},
        {"identity": "", "expiresAt": items["expiresAt"]},
        {"identity": "x", "expiresAt": "yesterday"},
        {"identity": 3, "expiresAt": items["expiresAt"]},
    ]
    for bad in bad_items:
        assert ReplicaRecord.from_items(bad) is None


@pytest.mark.parametrize(
    ("written_ago", "live"),
    [
        (timedelta(0), True),
        (REPLICA_TTL - timedelta(seconds=1), True),
        (REPLICA_TTL, False),
        (timedelta(minutes=5), False),
    ],
)
def test_a_replica_counts_for_one_ttl_after_its_record_was_written(
    written_ago: timedelta, live: bool
) -> None:
    record = ReplicaRecord.written("host-a/12", NOW - written_ago)
    assert (live_replicas([record], NOW) == {"host-a/12"}) is live


def test_the_record_path_is_one_segment_per_replica() -> None:
    assert replica_path(replica_segment("host.a/12")) == "poolkeeper/replicas/host-a-12"
