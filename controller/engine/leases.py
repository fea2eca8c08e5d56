"""Taking, keeping and giving back the pools' leases (core/leases.py says what they are).

Each wanted lease has a follower task: while it holds the lease it renews it every TTL/3;
while another process holds it, it watches the lease variable with a blocking query and
tries again as soon as the variable changes (a release, or Nomad freeing an expired lock)
or TTL/3 passes. So a pool given back on SIGTERM is taken over within a moment.

With members (records/members.py), leases are spread over the live reconcilers
(core/balance.py): every TTL/3 a process says which pools it defines, reads who else
does, gives back the leases assigned to others and takes the free ones assigned to it; a
lease that comes free is taken only by the process it is assigned to (which reads the
members again first, so a stopped process's share is taken at once). A lease of a pool only
being drained (no spec) is not spread: any process takes it.

A holder whose renewals fail for a TTL (LeaseLost) says so in its member record for the
takeover time: the others assign the pool to another member, and the holder gives the
lock back at its next balancing. So a process whose other writes succeed while its
renewals fail does not keep the pool from everyone; alone, it keeps trying.

Fencing is by time: a lease counts as held only until one TTL after the last renewal that
succeeded (measured from when it was sent), while Nomad frees an unrenewed lock only twice
its TTL after the last renewal, then keeps it for the lock delay. So a holder that cannot
renew stops writing before anyone else can take the pool. Writes go through `writing()`,
and a lease is given back only once the writes in flight under it have landed (a
registration sent just before a release must not reach Nomad after it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from controller.core.balance import assign
from controller.core.events import EventSink, lease_acquired, lease_lost
from controller.core.leases import LeaseItems, LeaseStanding, LeaseState, takeover_seconds
from controller.core.times import utcnow
from controller.nomad.errors import NomadError
from controller.records.leases import LeaseRecords
from controller.records.members import Members

log = logging.getLogger(__name__)

# How long stopping may spend giving leases back.
RELEASE_SECONDS = 2.0
# A lease that comes free reads the members again at most this often.
REBALANCE_SECONDS = 0.25


@dataclass
class _Lease:
    key: str
    namespace: str  # the pool's Nomad namespace: where its runners, and its lease, are
    spec_hash: str
    resource: str = ""  # the resource this process writes the pool's status to
    lock_id: str | None = None  # ours, while we hold it
    valid_until: float = 0.0  # monotonic: we may write the pool until then
    written_spec: str = ""  # the spec hash in the lease's items while we hold it
    written_resource: str = ""  # and the resource
    holder: str = ""
    holder_spec: str = ""
    holder_resource: str = ""
    refused: bool = False  # Nomad refused our last acquisition: the lock is someone's
    seen_index: int = 0  # the lease variable's ModifyIndex when last read
    changed_at: float = -float("inf")  # monotonic: when its variable was last seen changing
    last_round: float | None = None  # monotonic time of the last renewal or attempt
    lapsed: bool = False  # no renewal succeeded for a TTL: not written, LeaseLost said
    # Until then (monotonic) its member record says this process could not keep the lease,
    # so that another member takes the pool (set by a lapse, cleared by a renewal).
    unfit_until: float = 0.0
    busy: asyncio.Lock = field(default_factory=asyncio.Lock)  # one round at a time
    writes: int = 0  # writes of the pool in flight under the lease
    settled: asyncio.Event = field(default_factory=asyncio.Event)  # set: none in flight
    follower: asyncio.Task[None] | None = None


class Leases:
    def __init__(
        self,
        records: LeaseRecords,
        identity: str,
        events: EventSink,
        *,
        on_change: Callable[[str], None],
        monotonic: Callable[[], float] = time.monotonic,
        members: Members | None = None,
    ) -> None:
        """`members`, when given, spreads the leases over the live reconcilers."""
        self._records = records
        self.identity = identity
        self._events = events
        self.ttl = records.terms.ttl_seconds
        self._on_change = on_change  # a lease was gained or lost: the pool's namespace
        self._monotonic = monotonic
        self._leases: dict[str, _Lease] = {}
        self._running = False
        self._stopped = False  # stop() ran: no lease is taken until start() again
        self._members = members
        # The pools assigned to this process (None: take any, as without members); empty
        # until the members were first read.
        self._target: frozenset[str] | None = None if members is None else frozenset()
        self._read_at = -float("inf")  # monotonic: when the last reading of them began
        self._live: dict[str, frozenset[str]] = {}  # the members as last read
        self._balancing = asyncio.Lock()
        self._balancer: asyncio.Task[None] | None = None
        self._wakeups: set[asyncio.Task[None]] = set()

    # -- what the engine asks ----------------------------------------------------------

    def want(self, key: str, namespace: str, spec_hash: str, resource: str = "") -> None:
        """Hold this pool's lease, for this spec (and this resource, where this process
        writes the pool's status)."""
        lease = self._leases.get(key)
        if lease is None:
            lease = self._leases[key] = _Lease(key, namespace, spec_hash)
            self._follow(lease)
            if self._members is not None and self._running:
                self._soon(self._balance())  # the pools it defines changed: its share too
        lease.spec_hash, lease.resource = spec_hash, resource

    def speaker(self, key: str | None = None) -> bool:
        """Whether this process speaks for pool `key` while nobody holds its lease, so
        that one process writes its status: the live reconciler whose share it is (a lease
        this process just gave to another's share is that one's to speak for, also
        before it has taken it); for a pool in nobody's share (never valid, or the shares
        unknown), the first of the live reconcilers by identity."""
        lease = self._leases.get(key) if key is not None else None
        if lease is not None and lease.spec_hash and self._target is not None:
            return lease.key in self._target
        return not self._live or min(self._live) == self.identity

    def wanted(self, namespace: str) -> set[str]:
        return {k for k, lease in self._leases.items() if lease.namespace == namespace}

    async def drop(self, key: str) -> None:
        """Stop holding this pool's lease (the pool is gone from this process), and delete
        its variable unless another process holds it: a lease outlives no pool."""
        lease = self._leases.pop(key, None)
        if lease is not None:
            await self._stop_following(lease)
            await self._release(lease)
            await self._records.forget(key, lease.namespace)

    def holds(self, key: str) -> bool:
        lease = self._leases.get(key)
        return bool(lease and lease.lock_id and self._monotonic() < lease.valid_until)

    @contextlib.contextmanager
    def writing(self, key: str) -> Iterator[bool]:
        """Whether this process may write the pool now; while the block runs (the write is
        in flight) the lease is not given back."""
        lease = self._leases.get(key)
        if lease is None or not self.holds(key):
            yield False
            return
        lease.writes += 1
        lease.settled.clear()
        try:
            yield True
        finally:
            lease.writes -= 1
            if not lease.writes:
                lease.settled.set()

    def state(self, key: str) -> LeaseState:
        lease = self._leases.get(key)
        if lease is None:
            return LeaseState(LeaseStanding.FREE)
        if self.holds(key):
            return LeaseState(LeaseStanding.HELD, self.identity, lease.spec_hash)
        if not lease.refused:
            if self._shared_with(lease):
                # Not tried (another reconciler's share): its items name a live member.
                return LeaseState(
                    LeaseStanding.ELSEWHERE, lease.holder, lease.holder_spec, lease.holder_resource
                )
            return LeaseState(LeaseStanding.FREE)
        # The items name who took the lock; our own identity there is a process before us.
        mine = lease.holder == self.identity
        standing = LeaseStanding.STALE if mine else LeaseStanding.ELSEWHERE
        return LeaseState(standing, lease.holder, lease.holder_spec, lease.holder_resource)

    async def held_elsewhere(self, key: str, namespace: str, *, take: bool) -> bool:
        """Whether a live process holds the lease of a pool this process does not define:
        Nomad refuses the lock (it is held, or in its lock delay), or does not answer. A
        lease Nomad gives is kept with `take` (the caller drains the pool as its holder),
        given back at once otherwise."""
        if take:
            self.want(key, namespace, "")
            await self.refresh([key])
            if self.holds(key):
                return False
            await self.drop(key)
            return True
        try:
            return await self._records.taken(
                key, namespace, LeaseItems.taken(self.identity, "", utcnow())
            )
        except NomadError as error:
            log.debug("probing the lease of pool %s: %s", key, error)
            return True

    async def collect_stale(self, namespace: str) -> None:
        """Delete the leases in this namespace of pools no live reconciler defines, left by
        a process that died (only with members: who defines what is read from them)."""
        if self._members is None or not self._live:
            return
        defined = set(self._leases).union(*self._live.values())
        await self._records.collect_stale(namespace, defined)

    async def refresh(self, keys: Iterable[str]) -> None:
        """Renew or try these leases now unless that was done within TTL/3 (a pass calls
        this first, so it acts on what the lease is now, with or without the followers)."""
        await asyncio.gather(*(self._keep(self._leases[k]) for k in keys if k in self._leases))

    # -- running -----------------------------------------------------------------------

    def start(self) -> None:
        self._running, self._stopped = True, False  # an operator replica active again
        for lease in self._leases.values():
            self._follow(lease)
        if self._members is not None and self._balancer is None:
            self._balancer = asyncio.create_task(self._keep_balancing(), name="lease balance")

    async def stop(self, *, release: bool = True) -> None:
        """Stop following; with `release` (a graceful stop) give every held lease back, so
        that a successor takes over at once rather than after the TTL."""
        self._running, self._stopped = False, True
        if self._balancer is not None:
            self._balancer.cancel()
            await asyncio.gather(self._balancer, *self._wakeups, return_exceptions=True)
            self._balancer = None
        leases = list(self._leases.values())
        self._leases.clear()
        for lease in leases:
            await self._stop_following(lease)
        if release and self._members is not None:
            # First no longer a member: whoever sees a lease come free takes it at once.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(RELEASE_SECONDS):
                    await self._members.leave()
        if release:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(RELEASE_SECONDS):
                    await asyncio.gather(*(self._release(lease) for lease in leases))

    def _follow(self, lease: _Lease) -> None:
        if self._running and lease.follower is None:
            lease.follower = asyncio.create_task(self._follower(lease), name=f"lease:{lease.key}")

    async def _stop_following(self, lease: _Lease) -> None:
        task, lease.follower = lease.follower, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _follower(self, lease: _Lease) -> None:
        while self._leases.get(lease.key) is lease:
            if lease.lock_id is not None:
                await asyncio.sleep(self.ttl / 3)
                await self._keep(lease)
                continue
            changed = await self._wait_for_change(lease)
            await self._keep(lease, force=changed)

    async def _wait_for_change(self, lease: _Lease) -> bool:
        """Block (at most TTL/3) until the lease variable changes; whether it did."""
        try:
            holder, index = await self._records.wait(
                lease.key, lease.namespace, lease.seen_index, self.ttl / 3
            )
        except NomadError as error:
            log.debug("watching the lease of pool %s: %s", lease.key, error)
            await asyncio.sleep(self.ttl / 3)
            return False
        changed = index != lease.seen_index
        if changed:
            lease.changed_at = self._monotonic()
        lease.seen_index = index
        self._note_holder(lease, holder)
        return changed

    async def _keep(self, lease: _Lease, *, force: bool = False) -> None:
        async with lease.busy:
            last = lease.last_round
            # A lapsed lease is tried whenever asked: a pass asks once Nomad answers again.
            due = force or lease.lapsed or last is None or self._monotonic() - last >= self.ttl / 3
            if not due or self._stopped or self._leases.get(lease.key) is not lease:
                return
            lease.last_round = self._monotonic()
            try:
                if lease.lock_id is None:
                    await self._acquire(lease)
                else:
                    await self._renew(lease)
            except NomadError as error:
                log.warning("lease of pool %s: %s", lease.key, error)
                self._note_lapse(lease, error)

    async def _acquire(self, lease: _Lease) -> None:
        if not await self._may_take(lease):
            self._note_holder(lease, await self._records.holder(lease.key, lease.namespace))
            return
        sent = self._monotonic()
        items = LeaseItems.taken(self.identity, lease.spec_hash, utcnow(), lease.resource)
        lock_id = await self._records.take(lease.key, lease.namespace, items)
        lease.refused = lock_id is None
        if lock_id is None:
            self._note_holder(lease, await self._records.holder(lease.key, lease.namespace))
            return
        lease.lock_id = lock_id
        lease.valid_until = sent + self.ttl
        lease.written_spec, lease.written_resource = lease.spec_hash, lease.resource
        lease.holder, lease.holder_spec, lease.holder_resource = "", "", ""
        self._events(lease_acquired(lease.key, self.identity))
        self._on_change(lease.namespace)

    async def _renew(self, lease: _Lease) -> None:
        assert lease.lock_id is not None
        sent = self._monotonic()
        if not await self._records.renew(lease.key, lease.namespace, lease.lock_id):
            announced, lease.lapsed = lease.lapsed, False
            lease.lock_id, lease.valid_until = None, 0.0
            if not announced:
                self._events(lease_lost(lease.key, self.identity, "Nomad refused its renewal"))
            self._on_change(lease.namespace)
            # The lock expired, was taken, or Nomad lost it with its state: try at once, so
            # that a lock nobody holds does not leave the pool unreconciled until a change.
            await self._acquire(lease)
            return
        lease.valid_until = sent + self.ttl
        if lease.lapsed:
            lease.lapsed, lease.unfit_until = False, 0.0
            self._events(lease_acquired(lease.key, self.identity))
            self._on_change(lease.namespace)
        if (lease.written_spec, lease.written_resource) != (lease.spec_hash, lease.resource):
            items = LeaseItems.taken(self.identity, lease.spec_hash, utcnow(), lease.resource)
            await self._records.rewrite(lease.key, lease.namespace, items, lease.lock_id)
            lease.written_spec, lease.written_resource = lease.spec_hash, lease.resource

    # -- spreading the leases ------------------------------------------------------------

    async def _may_take(self, lease: _Lease) -> bool:
        """Whether this process is to take the lease now. One not assigned to it is looked
        at again with the members read anew if its variable changed since they were last
        read (the process it was assigned to may just have stopped and released it), or at
        most every REBALANCE_SECONDS otherwise."""
        if self._assigned(lease):
            return True
        unknown = lease.key not in self._live.get(self.identity, frozenset())
        stale = max(lease.changed_at, self._monotonic() - REBALANCE_SECONDS) >= self._read_at
        if unknown or stale:
            # A pool defined since the last reading is said at once; otherwise the record
            # stays as it is, so that the others, reading it too, deal out the same.
            await self._balance(beat=unknown)
        return self._assigned(lease)

    def _shared_with(self, lease: _Lease) -> bool:
        """Whether the lease's last holder is another live reconciler that defines the
        pool (the lease is its share: this process leaves it alone)."""
        holder = lease.holder
        return (
            bool(holder)
            and holder != self.identity
            and lease.key in self._live.get(holder, frozenset())
        )

    def _unfit(self, lease: _Lease) -> bool:
        """Whether this process could not keep the lease lately (its renewals failed
        while, maybe, its other writes succeed): another member is to take the pool."""
        return self._monotonic() < lease.unfit_until

    def _assigned(self, lease: _Lease) -> bool:
        return self._target is None or not lease.spec_hash or lease.key in self._target

    async def _keep_balancing(self) -> None:
        """Balance every TTL/3, whatever one round does (a failure is logged): a balancer
        that stopped would leave this process taking any free lease, or its member record
        expiring, for good."""
        while True:
            try:
                await self._balance()
            except Exception:
                log.exception("balancing the leases failed; trying again")
                self._target = None
            await asyncio.sleep(self.ttl / 3)

    async def _balance(self, *, beat: bool = True) -> None:
        """Say which pools this process defines (with `beat`), read the members, and act on
        the assignment: give back what is assigned to others, take what is free and ours."""
        assert self._members is not None
        async with self._balancing:
            spread = {k: lease for k, lease in self._leases.items() if lease.spec_hash}
            self._read_at = self._monotonic()
            unfit = frozenset(k for k, lease in spread.items() if self._unfit(lease))
            try:
                # Bounded: every lease waiting to be taken waits for this lock.
                async with asyncio.timeout(self.ttl):
                    if beat:
                        held = [key for key in spread if self.holds(key)]
                        await self._members.beat(spread, held, unfit)
                    membership = await self._members.live()
            except (NomadError, TimeoutError) as error:
                why = str(error) or f"no answer within {self.ttl:g} s"
                log.warning("reading the reconcilers sharing the pools: %s", why)
                self._target = None  # leases still keep every pool to one holder
                return
            members, holders = membership.defines, membership.holders
            members[self.identity] = frozenset(spread)
            lapsed = membership.lapsed | {self.identity: unfit}
            self._live = members
            self._target = assign(members, holders, lapsed).get(self.identity, frozenset())
        for key, lease in spread.items():
            if key in self._target:
                if not self.holds(key) and not self._shared_with(lease):
                    self._wake(lease)  # free, or its holder is no member any more
            elif (self.holds(key) or lease.lapsed) and self._leases.get(key) is lease:
                log.info("pool %s: the lease goes to another reconciler's share", key)
                await self._release(lease)
                self._on_change(lease.namespace)

    def _wake(self, lease: _Lease) -> None:
        """Try a free lease assigned to this process now, not at its follower's next turn."""
        self._soon(self._keep(lease, force=True))

    def _soon(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._wakeups.add(task)
        task.add_done_callback(self._wakeups.discard)

    def _note_lapse(self, lease: _Lease, error: NomadError) -> None:
        """A held lease whose renewals kept failing for a whole TTL is no longer written
        (holds() says so): say it once. The lock may still be ours when Nomad answers
        again; a renewal that then succeeds takes the pool up again."""
        if lease.lock_id is None or lease.lapsed or self._monotonic() < lease.valid_until:
            return
        lease.lapsed = True
        lease.unfit_until = self._monotonic() + takeover_seconds(self.ttl)
        why = f"no renewal succeeded for {self.ttl:g} s: {error}"
        self._events(lease_lost(lease.key, self.identity, why))
        self._on_change(lease.namespace)

    def _note_holder(self, lease: _Lease, items: LeaseItems | None) -> None:
        holder = (items.holder, items.spec_hash, items.resource) if items else ("", "", "")
        if holder != (lease.holder, lease.holder_spec, lease.holder_resource):
            lease.holder, lease.holder_spec, lease.holder_resource = holder
            self._on_change(lease.namespace)

    async def _release(self, lease: _Lease) -> None:
        lock_id, lease.lock_id, lease.valid_until = lease.lock_id, None, 0.0
        lease.lapsed = False
        if lock_id is None:
            return
        if lease.writes:
            try:
                async with asyncio.timeout(self.ttl):
                    await lease.settled.wait()
            except TimeoutError:
                log.warning(
                    "pool %s: a write still in flight after %g s; the lease is left to expire",
                    lease.key,
                    self.ttl,
                )
                return
        try:
            await self._records.give_back(lease.key, lease.namespace, lock_id)
        except NomadError as error:
            log.warning("could not release the lease of pool %s: %s", lease.key, error)
            if self._running and self._leases.get(lease.key) is lease:
                # Still ours in Nomad: renewed (written again only once a renewal
                # succeeds) and given back at the next balancing, rather than left locked
                # until Nomad expires it.
                lease.lock_id = lock_id
