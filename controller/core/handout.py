"""Handing out one pool's offer to the claims of one process: every runner once, and
each API replica from its own slice first. Pure.

One place hands out candidates and forgets them (as Agones' allocator does): a claim
takes the next runner from the pool's `Handout`, which never hands that runner out again
while the offer lists it. A lost check-and-set drops the runner (another claimer or a
scale-down has it); only a claim this process withdrew itself (`give_back`) makes it a
candidate again. So concurrent claims of one process never try one runner twice.

Slices: the live API replicas (their replica records, core/replicas.py) split every
offer by rendezvous hashing: a runner belongs to the replica whose score for it is the
highest (`score`), so every replica computes the same split from the same set of
replicas, and a replica joining or leaving moves only its own share. A replica takes
from its own slice, lowest rank first (a runner's rank is its owner's score), and only
when that is empty from the others' slices, highest rank first: it meets their owners,
and so their claims, only where a slice is nearly empty, even when its offer is older
than their last claims. Where they meet, a lost check-and-set tells how far the other
came: lost in another's slice, its owner (lowest rank first) has taken every runner of
it that this offer ranks lower; lost in the own slice, another replica (highest rank
first) has taken every one ranked higher. Either way the rest of that slice is taken,
and it is passed over until the next offer (`passed_over`): replicas whose offers are
older than each other's claims lose one check-and-set per slice and offer, not one per
runner the other took. A process outside the replicas (a reconciler serving claims)
takes at random. Whatever the slices, current runners come before the rest (outdated
ones, those on nodes that drain), as the offer orders them.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterable
from dataclasses import dataclass

from controller.core.offers import Offer, Offered


def score(replica: str, runner_id: str) -> int:
    """The replica's rendezvous score for the runner: the same in every process."""
    digest = hashlib.blake2b(f"{replica}\n{runner_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def owner(replicas: Iterable[str], runner_id: str) -> tuple[str, int]:
    """The replica whose slice the runner is in, and its score (the runner's rank); a tie,
    which a 64-bit hash all but never makes, goes to the greatest name."""
    rank, holder = max((score(replica, runner_id), replica) for replica in replicas)
    return holder, rank


@dataclass(frozen=True)
class Claimers:
    """Who shares pools' offers by slices: this process (`me`, None when it keeps no
    replica record: it takes at random) and the live replicas, `me` among them."""

    me: str | None = None
    replicas: frozenset[str] = frozenset()

    @property
    def slicing(self) -> bool:
        return self.me is not None and self.me in self.replicas


RANDOM = Claimers()

# A candidate in a list ordered for `pop()`: (sort key, runner ID, the runner).
_Entry = tuple[int | float, str, Offered]


class Handout:
    """One pool's runners for this process's claims, made of the pool's latest offer."""

    def __init__(self, rng: random.Random | None = None) -> None:
        self._rng = rng or random.Random()
        self._offer: Offer | None = None
        self._claimers = RANDOM
        # Runners handed out (claimed or lost) that the offer may still list.
        self._out: set[str] = set()
        # Per runner of the offer, under `_claimers`: the replica whose slice it is in, and
        # its rank.
        self._ranks: dict[str, tuple[str, int]] = {}
        # Replicas whose slice of this offer a lost check-and-set showed taken.
        self._spent: set[str] = set()
        self.passed_over = False  # runners of a spent slice were passed over
        # In the order they are taken: own current, others' current, own rest, others' rest.
        self._lists: tuple[list[_Entry], ...] = ()

    def refresh(self, offer: Offer, claimers: Claimers) -> None:
        """Hand out from `offer` (the pool's latest) with the slices of `claimers`: made
        again only when either changed. Runners handed out stay out while it lists them."""
        if offer is self._offer and claimers == self._claimers:
            return
        if claimers != self._claimers:
            self._ranks = {}
        self._offer, self._claimers = offer, claimers
        self._spent, self.passed_over = set(), False
        self._out &= offer.runner_ids  # an offer made after their claims lists them no more
        if claimers.slicing:
            self._ranks = {
                runner_id: self._ranks.get(runner_id) or self._rank(runner_id)
                for runner_id in offer.runner_ids
            }
        lists: list[list[_Entry]] = []
        for group in (offer.current, offer.rest):
            mine: list[_Entry] = []
            others: list[_Entry] = []
            for offered in group:
                runner_id = offered.runner_id
                if runner_id in self._out:
                    continue
                if not claimers.slicing:
                    others.append((0, runner_id, offered))
                    continue
                holder, rank = self._ranks[runner_id]
                if holder == claimers.me:
                    mine.append((-rank, runner_id, offered))  # pop(): the lowest rank
                else:
                    others.append((rank, runner_id, offered))  # pop(): the highest
            mine.sort()
            others.sort()
            lists += [mine, others]
        self._lists = tuple(lists)

    def _rank(self, runner_id: str) -> tuple[str, int]:
        return owner(self._claimers.replicas, runner_id)

    @property
    def offer(self) -> Offer | None:
        """The offer it hands out from (its latest refresh)."""
        return self._offer

    def __len__(self) -> int:
        """How many runners are still to be handed out (some may turn out unsettled)."""
        return sum(map(len, self._lists))

    def take(self, unsettled: frozenset[str] = frozenset()) -> Offered | None:
        """The next runner to claim, handed out once; None when there is none. Runners in
        `unsettled` (their job changed after the offer was made) are passed over until an
        offer lists them again."""
        for candidates in self._lists:
            while candidates:
                if self._claimers.slicing:
                    _, runner_id, offered = candidates.pop()
                else:
                    # At random: swap a random candidate to the end, then take it.
                    i = self._rng.randrange(len(candidates))
                    candidates[i], candidates[-1] = candidates[-1], candidates[i]
                    _, runner_id, offered = candidates.pop()
                if runner_id in unsettled:
                    continue
                if self._spent and self._ranks[runner_id][0] in self._spent:
                    self.passed_over = True
                    continue
                self._out.add(runner_id)
                return offered
        return None

    def lost(self, runner_id: str, offer: Offer | None) -> None:
        """The claim of a runner taken from `offer` lost its check-and-set: it stays out.
        While that is still the offer handed out, and other replicas share it, the rest of
        the runner's slice is passed over until the next offer (see the module's docstring;
        a replica alone lost it to a reconciler's tombstone, which tells nothing of the
        rest)."""
        if offer is not self._offer or not self._claimers.slicing:
            return
        if len(self._claimers.replicas) < 2:
            return
        ranked = self._ranks.get(runner_id)
        if ranked is not None:
            self._spent.add(ranked[0])

    def give_back(self, runner_id: str) -> None:
        """A runner taken here whose claim was withdrawn (it is idle again): a candidate
        again, from the next refresh on."""
        if runner_id in self._out:
            self._out.discard(runner_id)
            self._offer = None
