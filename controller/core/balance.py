"""Which reconciler holds which pools: leases spread over the live reconcilers.

Pure. Every reconciler computes the same assignment from the same facts (the live members
and the pools each defines and holds, read from their member records), and
acts on its own part of it: it gives back the leases assigned to others and takes the free
ones assigned to it. Where two reconcilers' views differ for a moment, the leases keep a
pool from ever having two holders; the assignment only decides who tries.

- Balance: with N members defining the same P pools, none is assigned more than ⌈P/N⌉.
- Few moves: a member keeps the pools it holds, up to that share, preferring those it
  weighs highest; only the rest is dealt out, each to the candidate with the fewest so far.
- Every pool a live member defines is assigned to one of the members that define it, and
  not to one whose record says it could not keep the pool's lease (its renewals failed)
  while another defines it too.

Weights are rendezvous hashes of (member, pool): stable, different for each member, so the
pools a member keeps or receives do not depend on the order anything was read in.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping


def weight(member: str, pool: str) -> int:
    """The member's preference for the pool (rendezvous hashing)."""
    digest = hashlib.blake2b(f"{member}\0{pool}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def share(members: Mapping[str, frozenset[str]]) -> int:
    """The most pools one member is assigned: ⌈pools / members⌉ (at least 1)."""
    pools = set().union(*members.values()) if members else set()
    return max(1, -(-len(pools) // max(1, len(members))))


def assign(
    members: Mapping[str, frozenset[str]],
    holders: Mapping[str, str],
    lapsed: Mapping[str, frozenset[str]] | None = None,
) -> dict[str, frozenset[str]]:
    """Member identity -> the pools it is to hold. `members`: the live members and the pools
    each defines; `holders`: pool -> the identity holding its lease now (absent: nobody);
    `lapsed`: member -> the pools whose leases it could not keep."""
    lapsed = lapsed or {}
    most = share(members)
    assigned: dict[str, set[str]] = {identity: set() for identity in members}
    # Keep: what a member holds and defines, up to its share, its highest weights first.
    for identity, defined in members.items():
        held = [pool for pool, holder in holders.items() if holder == identity and pool in defined]
        held.sort(key=lambda pool: weight(identity, pool), reverse=True)
        assigned[identity].update(held[:most])
    kept = set().union(*assigned.values()) if assigned else set()
    # Deal out the rest: each to the candidate with the fewest so far, the heaviest on ties.
    rest = sorted(set().union(*members.values()) - kept) if members else []
    for pool in rest:
        defining = [identity for identity, defined in members.items() if pool in defined]
        fit = [identity for identity in defining if pool not in lapsed.get(identity, ())]
        candidates = fit or defining
        chosen = min(
            candidates, key=lambda identity: (len(assigned[identity]), -weight(identity, pool))
        )
        assigned[chosen].add(pool)
    return {identity: frozenset(pools) for identity, pools in assigned.items()}
