"""Leases spread over the live reconcilers (core/balance.py)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from controller.core.balance import assign, share

POOLS = frozenset(f"default/p{i:02d}" for i in range(30))


def held_by(assignment: dict[str, frozenset[str]]) -> dict[str, str]:
    return {pool: member for member, pools in assignment.items() for pool in pools}


def test_one_member_is_assigned_every_pool() -> None:
    assert assign({"a/1": POOLS}, {}) == {"a/1": POOLS}


def test_a_member_that_joins_takes_its_share_from_the_one_holding_everything() -> None:
    alone = assign({"a/1": POOLS}, {})
    together = assign({"a/1": POOLS, "b/2": POOLS}, held_by(alone))
    assert sorted(len(p) for p in together.values()) == [15, 15]
    assert together["a/1"] <= alone["a/1"]  # a keeps what it holds; only the excess moves
    three = assign({"a/1": POOLS, "b/2": POOLS, "c/3": POOLS}, held_by(together))
    assert sorted(len(p) for p in three.values()) == [10, 10, 10]
    moved = sum(len(three[m] - together[m]) for m in ("a/1", "b/2"))
    assert moved == 0  # the newcomer's ten came from the others' excess alone


def test_a_member_that_goes_leaves_its_pools_to_the_others() -> None:
    three = assign({"a/1": POOLS, "b/2": POOLS, "c/3": POOLS}, {})
    two = assign({"a/1": POOLS, "b/2": POOLS}, held_by(three))
    assert sorted(len(p) for p in two.values()) == [15, 15]
    assert two["a/1"] >= three["a/1"] and two["b/2"] >= three["b/2"]


def test_a_pool_only_one_member_defines_is_its_own() -> None:
    theirs = frozenset({"other/x"})
    assignment = assign({"a/1": POOLS, "b/2": POOLS | theirs}, {})
    assert "other/x" in assignment["b/2"]


def test_every_member_computes_the_same() -> None:
    members = {"b/2": POOLS, "a/1": POOLS, "c/3": POOLS}
    reordered = dict(sorted(members.items()))
    assert assign(members, {}) == assign(reordered, {})


names = st.lists(st.sampled_from(sorted(POOLS)), unique=True, min_size=1)


@given(
    count=st.integers(1, 5),
    pools=names,
    holders=st.dictionaries(st.sampled_from(sorted(POOLS)), st.integers(0, 6)),
)
def test_balanced_and_complete_whoever_holds_what(
    count: int, pools: list[str], holders: dict[str, int]
) -> None:
    members = {f"m/{i}": frozenset(pools) for i in range(count)}
    assignment = assign(members, {pool: f"m/{i}" for pool, i in holders.items()})
    assigned = [pool for member_pools in assignment.values() for pool in member_pools]
    assert sorted(assigned) == sorted(pools)  # every pool once, to one member
    assert max(len(p) for p in assignment.values()) <= share(members)
    assert share(members) == -(-len(pools) // count)


def test_a_pool_whose_lease_a_member_could_not_keep_goes_to_another() -> None:
    pool = "default/py"
    both = frozenset({pool})
    members = {"host-a/1": both, "host-b/2": both}
    preferred = next(m for m, pools in assign(members, {}).items() if pool in pools)
    other = next(m for m in members if m != preferred)
    moved = assign(members, {}, {preferred: both})
    assert moved[other] == both and moved[preferred] == frozenset()
    # Alone, it keeps trying: nobody else could take the pool.
    assert assign({preferred: both}, {}, {preferred: both}) == {preferred: both}
