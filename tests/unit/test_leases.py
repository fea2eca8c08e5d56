"""Leases: taking, renewing, fencing by time, losing and giving back a pool's lease."""

from __future__ import annotations

import asyncio
from collections.abc import Collection
from typing import Any

import pytest

from controller.core.events import EventKind, PoolEvent
from controller.core.leases import (
    LOCK_DELAY_SECONDS,
    LeaseItems,
    LeaseStanding,
    LeaseState,
    takeover_seconds,
)
from controller.core.members import Membership
from controller.core.paths import lease_path
from controller.core.times import utcnow
from controller.engine.leases import Leases
from controller.nomad.errors import NomadConflict, NomadUnavailable
from controller.nomad.port import LockTerms
from controller.records.leases import LeaseRecords
from controller.records.members import Members
from tests.support.waiting import wait_until

KEY = "default/py.312"
TTL = 10.0
LOST_AND_TAKEN_AGAIN = [EventKind.LEASE_ACQUIRED, EventKind.LEASE_LOST, EventKind.LEASE_ACQUIRED]


class FakeLocks:
    """Nomad's variable locks as one process sees them; `other` holds a lock elsewhere."""

    def __init__(self) -> None:
        self.held: dict[str, str] = {}  # path -> lock ID
        self.items: dict[str, dict[str, str]] = {}
        self.down = False
        self.calls: list[tuple[str, str]] = []
        self.next_id = 0

    def _check(self, op: str, path: str) -> None:
        self.calls.append((op, path))
        if self.down:
            raise NomadUnavailable("PUT /v1/var/:path: cannot reach Nomad")

    async def acquire_lock(
        self, path: str, items: dict[str, str], namespace: str, terms: LockTerms
    ) -> dict[str, Any] | None:
        self._check("acquire", path)
        if path in self.held:
            return None
        self.next_id += 1
        self.held[path] = f"lock-{self.next_id}"
        self.items[path] = dict(items)
        return {"Path": path, "Items": items, "Lock": {"ID": self.held[path]}}

    async def renew_lock(self, path: str, namespace: str, lock_id: str) -> bool:
        self._check("renew", path)
        return self.held.get(path) == lock_id

    async def release_lock(self, path: str, namespace: str, lock_id: str) -> None:
        self._check("release", path)
        if self.held.get(path) == lock_id:
            del self.held[path]

    async def write_locked(
        self, path: str, items: dict[str, str], namespace: str, lock_id: str
    ) -> dict[str, Any]:
        self._check("write", path)
        assert self.held[path] == lock_id
        self.items[path] = dict(items)
        return {"Path": path, "Items": items}

    async def read_variable(self, path: str, namespace: str) -> dict[str, Any] | None:
        self._check("read", path)
        return {"Path": path, "Items": self.items[path]} if path in self.items else None

    async def list_variables(self, prefix: str, namespace: str) -> list[dict[str, Any]]:
        self._check("list", prefix)
        return [{"Path": path} for path in self.items if path.startswith(prefix)]

    async def delete_variable(self, path: str, namespace: str, *, cas: int | None = None) -> None:
        self._check("delete", path)
        if path in self.held:  # Nomad deletes no locked variable
            raise NomadConflict(f"{path} is locked")
        self.items.pop(path, None)

    async def wait_variable(
        self, path: str, namespace: str, index: int, wait_seconds: float
    ) -> tuple[dict[str, Any] | None, int]:
        return await self.read_variable(path, namespace), index


def lease_records(port: FakeLocks, watcher: Any = None, ttl: float = TTL) -> LeaseRecords:
    return LeaseRecords(port, watcher or port, LockTerms(ttl, LOCK_DELAY_SECONDS))


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def world() -> tuple[FakeLocks, Clock, list[PoolEvent], Leases]:
    port, clock = FakeLocks(), Clock()
    events: list[PoolEvent] = []
    leases = Leases(
        lease_records(port), "host/1", events.append, on_change=lambda ns: None, monotonic=clock
    )
    return port, clock, events, leases


async def test_a_free_lease_is_taken_and_names_its_holder_and_spec(world) -> None:
    port, _, events, leases = world
    leases.want(KEY, "default", "spec-a")
    await leases.refresh([KEY])
    assert leases.holds(KEY)
    assert leases.state(KEY) == LeaseState(LeaseStanding.HELD, "host/1", "spec-a")
    path = lease_path(KEY)
    assert path == "poolkeeper/leases/default~py~312"
    items = LeaseItems.from_variable({"Items": port.items[path]})
    assert items is not None and (items.holder, items.spec_hash) == ("host/1", "spec-a")
    assert [e.kind for e in events] == [EventKind.LEASE_ACQUIRED]


async def test_a_held_lease_is_reported_with_its_holder(world) -> None:
    port, _, _, leases = world
    path = lease_path(KEY)
    port.held[path] = "theirs"
    port.items[path] = {"holder": "other/7", "specHash": "spec-b", "acquiredAt": ""}
    leases.want(KEY, "default", "spec-a")
    await leases.refresh([KEY])
    state = leases.state(KEY)
    assert not leases.holds(KEY)
    assert state == LeaseState(LeaseStanding.ELSEWHERE, "other/7", "spec-b")
    assert state.differs("spec-a") and state.reconciled
    assert not state.differs("spec-b")


async def test_refresh_is_a_no_op_within_a_third_of_the_ttl(world) -> None:
    port, clock, _, leases = world
    leases.want(KEY, "default", "spec-a")
    await leases.refresh([KEY])
    await leases.refresh([KEY])
    assert [op for op, _ in port.calls] == ["acquire"]
    clock.now += TTL / 3
    await leases.refresh([KEY])
    assert [op for op, _ in port.calls] == ["acquire", "renew"]


async def test_fencing_by_time_stops_writing_a_ttl_after_the_last_renewal(world) -> None:
    port, clock, _, leases = world
    leases.want(KEY, "default", "spec-a")
    await leases.refresh([KEY])
    port.down = True  # Nomad unreachable: renewals fail, the lock is not known lost
    for _ in range(2):
        clock.now += TTL / 3
        await leases.refresh([KEY])
        assert leases.holds(KEY)
    clock.now += TTL / 3 + 0.01  # a whole TTL since the last successful renewal was sent
    assert not leases.holds(KEY)
    # Nomad frees an unrenewed lock only after twice the TTL plus the lock delay, and a
    # waiting process retries every TTL/3: well after this process stopped writing.
    assert takeover_seconds(TTL) > TTL
    port.down = False
    await leases.refresh([KEY])  # the lock was still ours: renewed, held again
    assert leases.holds(KEY)


async def test_a_lapse_and_a_recovery_are_said_once_each(world) -> None:
    port, clock, events, leases = world
    leases.want(KEY, "default", "spec-a")
    await leases.refresh([KEY])
    port.down = True
    for _ in range(6):  # two TTLs of failing renewals
        clock.now += TTL / 3
        await leases.refresh([KEY])
    assert not leases.holds(KEY)
    lost = events[1:]
    assert [e.kind for e in lost] == [EventKind.LEASE_LOST]
    assert lost[0].message == (
        "host/1 lost the pool's lease (no renewal succeeded for 10 s: PUT /v1/var/:path: "
        "cannot reach Nomad) and stopped writing the pool"
    )
    port.down = False
    clock.now += TTL / 3
    await leases.refresh([KEY])  # Nomad had not freed the lock yet: ours again
    assert leases.holds(KEY)
    assert [e.kind for e in events] == LOST_AND_TAKEN_AGAIN


async def test_a_lapsed_lease_that_nomad_freed_is_not_said_lost_twice(world) -> None:
    port, clock, events, leases = world
    leases.want(KEY, "default", "spec-a")
    await leases.refresh([KEY])
    port.down = True
    for _ in range(4):
        clock.now += TTL / 3
        await leases.refresh([KEY])
    port.down = False
    port.held[lease_path(KEY)] = "taken-over"
    clock.now += TTL / 3
    await leases.refresh([KEY])  # refused: the lapse was said already
    assert not leases.holds(KEY)
    assert [e.kind for e in events] == [EventKind.LEASE_ACQUIRED, EventKind.LEASE_LOST]
    assert "no renewal succeeded" in events[1].message


async def test_a_refused_renewal_loses_the_lease_and_says_so(world) -> None:
    port, clock, events, leases = world
    leases.want(KEY, "default", "spec-a")
    await leases.refresh([KEY])
    port.held[lease_path(KEY)] = "taken-over"
    clock.now += TTL / 3
    await leases.refresh([KEY])
    assert not leases.holds(KEY)
    assert [e.kind for e in events] == [EventKind.LEASE_ACQUIRED, EventKind.LEASE_LOST]


async def test_a_lease_nomad_forgot_is_taken_again_in_the_same_round(world) -> None:
    port, clock, events, leases = world
    leases.want(KEY, "default", "spec-a")
    await leases.refresh([KEY])
    port.held.clear()  # Nomad lost its state: the renewal is refused (404), nobody holds it
    port.items.clear()
    clock.now += TTL / 3
    await leases.refresh([KEY])
    assert leases.holds(KEY)
    assert [op for op, _ in port.calls] == ["acquire", "renew", "acquire"]
    assert port.items[lease_path(KEY)]["holder"] == "host/1"
    assert [e.kind for e in events] == LOST_AND_TAKEN_AGAIN


async def test_a_lease_nobody_is_known_to_hold_is_free_not_held_elsewhere(world) -> None:
    port, clock, _, leases = world
    leases.want(KEY, "default", "spec-a")
    assert leases.state(KEY) == LeaseState(LeaseStanding.FREE)  # not tried yet
    port.items[lease_path(KEY)] = {"holder": "other/7", "specHash": "spec-b"}  # released
    await leases.refresh([KEY])
    assert leases.state(KEY).held
    port.down = True
    for _ in range(4):  # Nomad does not answer for over a TTL: the lease lapses
        clock.now += TTL / 3
        await leases.refresh([KEY])
    state = leases.state(KEY)
    assert state == LeaseState(LeaseStanding.FREE) and not state.reconciled


async def test_a_lease_held_under_our_own_identity_is_a_stale_one(world) -> None:
    port, _, _, leases = world
    path = lease_path(KEY)
    port.held[path] = "the-process-before-a-restart"
    port.items[path] = {"holder": "host/1", "specHash": "spec-a", "acquiredAt": ""}
    leases.want(KEY, "default", "spec-a")
    await leases.refresh([KEY])
    state = leases.state(KEY)
    assert state == LeaseState(LeaseStanding.STALE, "host/1", "spec-a")
    assert not state.reconciled and not state.differs("spec-b")


async def test_a_spec_change_is_written_into_the_held_lease(world) -> None:
    port, clock, _, leases = world
    leases.want(KEY, "default", "spec-a")
    await leases.refresh([KEY])
    leases.want(KEY, "default", "spec-b")
    clock.now += TTL / 3
    await leases.refresh([KEY])
    assert port.items[lease_path(KEY)]["specHash"] == "spec-b"


async def test_stopping_gives_held_leases_back_and_drop_releases_one(world) -> None:
    port, _, _, leases = world
    leases.want(KEY, "default", "spec-a")
    leases.want("default/other", "default", "spec-c")
    await leases.refresh([KEY, "default/other"])
    await leases.drop("default/other")
    assert lease_path("default/other") not in port.held
    # The pool is gone from this process: its lease variable goes too.
    assert lease_path("default/other") not in port.items
    await leases.stop(release=True)
    assert port.held == {}
    assert not leases.holds(KEY)
    assert lease_path(KEY) in port.items  # stopping gives back; the pool lives on


async def test_a_dropped_lease_another_process_holds_stays(world) -> None:
    port, _, _, leases = world
    path = lease_path(KEY)
    port.held[path] = "theirs"
    port.items[path] = LeaseItems.taken("other/2", "s", utcnow()).to_items()
    leases.want(KEY, "default", "spec-a")
    await leases.refresh([KEY])
    await leases.drop(KEY)
    assert port.items[path]["holder"] == "other/2"


async def test_asking_whether_another_process_holds_a_lease_gives_a_free_one_back(world) -> None:
    port, _, events, leases = world
    path = lease_path(KEY)
    assert not await leases.held_elsewhere(KEY, "default", take=False)
    assert path not in port.held and [op for op, _ in port.calls] == ["acquire", "release"]
    port.held[path] = "theirs"
    assert await leases.held_elsewhere(KEY, "default", take=False)
    port.held.clear()
    port.down = True  # no answer: counted as held, nothing is taken for a pool not ours
    assert await leases.held_elsewhere(KEY, "default", take=True)
    port.down = False
    assert not await leases.held_elsewhere(KEY, "default", take=True)  # kept, to drain it
    assert leases.holds(KEY) and port.items[path]["specHash"] == ""
    assert [e.kind for e in events] == [EventKind.LEASE_ACQUIRED]


class Watcher:
    """Blocking reads on a session of their own: records what it was asked to wait on."""

    def __init__(self, port: FakeLocks) -> None:
        self.port = port
        self.waited: list[str] = []

    async def wait_variable(
        self, path: str, namespace: str, index: int, wait_seconds: float
    ) -> tuple[dict[str, Any] | None, int]:
        self.waited.append(path)
        await asyncio.sleep(wait_seconds)  # nothing changes: a blocking read waits it out
        return await self.port.read_variable(path, namespace), index


async def test_a_lease_held_elsewhere_is_watched_on_the_watch_session() -> None:
    """The blocking reads of leases held elsewhere hold their connection for TTL/3: on the
    API session's 16 connections, twenty such pools would starve passes and claims."""
    port = FakeLocks()
    port.held[lease_path(KEY)] = "theirs"
    port.items[lease_path(KEY)] = LeaseItems.taken("other/1", "s", utcnow()).to_items()
    watcher = Watcher(port)
    leases = Leases(lease_records(port, watcher), "me/1", lambda _: None, on_change=lambda _: None)
    leases.want(KEY, "default", "s")
    leases.start()
    try:
        for _ in range(100):
            if watcher.waited:
                break
            await asyncio.sleep(0.01)
    finally:
        await leases.stop(release=False)
    assert watcher.waited == [lease_path(KEY)] * len(watcher.waited) and watcher.waited


@pytest.mark.parametrize(
    ("state", "resource", "speaker", "speaks"),
    [
        (LeaseState(LeaseStanding.HELD, "me"), "uid-1", False, True),
        # Held elsewhere for the same RunnerPool: its holder writes the status.
        (LeaseState(LeaseStanding.ELSEWHERE, "b", holder_resource="uid-1"), "uid-1", True, False),
        # Held by a process writing another resource (a pool file's holder): only here.
        (LeaseState(LeaseStanding.ELSEWHERE, "b", holder_resource=""), "uid-1", False, True),
        (LeaseState(LeaseStanding.ELSEWHERE, "b", holder_resource="uid-2"), "uid-1", False, True),
        (LeaseState(LeaseStanding.ELSEWHERE, "b", holder_resource="uid-1"), "", False, True),
        # Nobody holds it: the first live reconciler speaks.
        (LeaseState(LeaseStanding.FREE), "uid-1", True, True),
        (LeaseState(LeaseStanding.FREE), "uid-1", False, False),
        (LeaseState(LeaseStanding.STALE, "me"), "uid-1", False, False),
    ],
)
def test_who_speaks_for_a_pool(
    state: LeaseState, resource: str, speaker: bool, speaks: bool
) -> None:
    assert state.speaks_here(resource, speaker) is speaks


async def _write_in_flight(leases: Leases, port: FakeLocks, landed: list[bool]) -> asyncio.Event:
    """Start a write of KEY that stays in flight until the returned event is set; it
    notes whether the lease was still held in Nomad when the write landed."""
    arrive = asyncio.Event()

    async def write() -> None:
        with leases.writing(KEY) as allowed:
            assert allowed
            await arrive.wait()
            landed.append(lease_path(KEY) in port.held)

    asyncio.get_running_loop().create_task(write())
    await asyncio.sleep(0)
    return arrive


@pytest.mark.parametrize("give_back", ["drop", "stop"])
async def test_a_lease_is_given_back_only_after_the_writes_in_flight_landed(
    world, give_back: str
) -> None:
    port, _, _, leases = world
    leases.want(KEY, "default", "spec-a")
    await leases.refresh([KEY])
    landed: list[bool] = []
    arrive = await _write_in_flight(leases, port, landed)
    releasing = asyncio.get_running_loop().create_task(
        leases.drop(KEY) if give_back == "drop" else leases.stop(release=True)
    )
    await asyncio.sleep(0.05)
    assert lease_path(KEY) in port.held  # not released under the write in flight
    with leases.writing(KEY) as allowed:
        assert not allowed  # and no new write starts
    arrive.set()
    await releasing
    assert landed == [True]
    assert lease_path(KEY) not in port.held


async def test_a_write_that_never_lands_keeps_the_lock_until_it_expires(world) -> None:
    port, _, _, leases = world
    leases.want(KEY, "default", "spec-a")
    await leases.refresh([KEY])
    await _write_in_flight(leases, port, [])
    leases.ttl = 0.1  # how long a release waits for the writes in flight
    await leases.drop(KEY)
    assert lease_path(KEY) in port.held  # Nomad frees it after 2 x TTL, never under a write
    assert not leases.holds(KEY)


async def test_a_stopped_process_takes_no_lease_until_it_starts_again(world) -> None:
    port, _, _, leases = world
    await leases.stop(release=True)
    leases.want(KEY, "default", "spec-a")  # a pass still finishing after the stop
    await leases.refresh([KEY])
    assert not leases.holds(KEY)
    assert port.held == {}
    leases.start()  # an operator replica active again
    await leases.refresh([KEY])
    assert leases.holds(KEY)
    await leases.stop(release=True)


class StallingMembers(Members):
    """Members whose first reading never ends and whose second fails as no Nomad call
    should; from the third on, `other/2` defines the same pools."""

    def __init__(self, pools: frozenset[str]) -> None:
        super().__init__(FakeLocks(), "default", "host/1", TTL, utcnow)  # type: ignore[arg-type]
        self.pools = pools
        self.readings = 0

    async def beat(
        self, pools: Collection[str], holds: Collection[str], lapsed: Collection[str] = ()
    ) -> None:
        pass

    async def live(self, *, collect: bool = True) -> Membership:
        self.readings += 1
        if self.readings == 1:
            await asyncio.Event().wait()
        if self.readings == 2:
            raise RuntimeError("a reading that failed in no way Nomad's calls do")
        return Membership({"host/1": self.pools, "other/2": self.pools}, {})


async def test_the_balancer_outlives_a_reading_that_hangs_or_fails() -> None:
    pools = frozenset({KEY, "default/other"})
    members = StallingMembers(pools)
    leases = Leases(
        lease_records(FakeLocks(), ttl=0.3), "host/1", lambda event: None,
        on_change=lambda ns: None, members=members,
    )  # fmt: skip
    for key in pools:
        leases.want(key, "default", "spec-a")
    leases.start()
    try:
        await wait_until(
            lambda: sum(leases.holds(key) for key in pools) == 1,  # its share of the two
            within=10,
            what="the balancer to read the members again and take its share",
        )
        assert members.readings >= 3
    finally:
        await leases.stop(release=False)


class FixedMembers(Members):
    """Members as the test says: who defines which pools, who holds which."""

    def __init__(self, defines: dict[str, frozenset[str]], holders: dict[str, str]) -> None:
        super().__init__(FakeLocks(), "default", "host/1", TTL, utcnow)  # type: ignore[arg-type]
        self.membership = Membership(defines, holders)

    async def beat(
        self, pools: Collection[str], holds: Collection[str], lapsed: Collection[str] = ()
    ) -> None:
        pass

    async def live(self, *, collect: bool = True) -> Membership:
        return Membership(dict(self.membership.defines), dict(self.membership.holders))

    def hand_over(self, key: str, holder: str) -> None:
        """The pool goes to `holder`'s share (the balancer keeps a pool with its holder)."""
        holders = {**self.membership.holders, key: holder}
        self.membership = Membership(dict(self.membership.defines), holders)


class BlockingLocks(FakeLocks):
    """FakeLocks whose blocking query waits, as Nomad's does (followers then pace)."""

    async def wait_variable(
        self, path: str, namespace: str, index: int, wait_seconds: float
    ) -> tuple[dict[str, Any] | None, int]:
        await asyncio.sleep(wait_seconds)
        return await super().wait_variable(path, namespace, index, wait_seconds)


def sharing_the_pool_with(other: str) -> tuple[BlockingLocks, FixedMembers, Leases]:
    """host/1's leases (TTL 0.3 s), KEY defined by host/1 and `other` and in host/1's
    share."""
    port = BlockingLocks()
    both = frozenset({KEY})
    members = FixedMembers({"host/1": both, other: both}, {KEY: "host/1"})
    leases = Leases(
        lease_records(port, ttl=0.3), "host/1", lambda event: None,
        on_change=lambda ns: None, members=members,
    )  # fmt: skip
    return port, members, leases


async def test_a_lease_nomad_would_not_take_back_is_renewed_and_given_back_later() -> None:
    port, members, leases = sharing_the_pool_with("other/2")
    leases.want(KEY, "default", "spec-a")
    leases.start()
    path = lease_path(KEY)
    try:
        await wait_until(lambda: leases.holds(KEY), within=5, what="the lease taken")
        # The pool goes to the other reconciler's share while Nomad has no leader.
        port.down = True
        members.hand_over(KEY, "other/2")
        await wait_until(lambda: ("release", path) in port.calls, within=5, what="a release")
        assert not leases.holds(KEY)  # not written meanwhile
        port.down = False
        # Still locked in Nomad under this process: it is renewed, then given back, not
        # left locked until Nomad expires it.
        await wait_until(lambda: path not in port.held, within=5, what="the lease given back")
    finally:
        await leases.stop(release=False)


async def test_a_free_lease_in_this_reconcilers_share_is_spoken_for_here() -> None:
    """A pool in this process's share whose lease nobody holds yet (Nomad refuses to lock
    it) is this process's to speak for, also when another live reconciler comes first by
    identity: the pool's status has one writer, the one that is to take its lease."""
    port, _, leases = sharing_the_pool_with("a/0")
    leases.want(KEY, "default", "spec-a", "RunnerPool default/py.312")
    port.down = True
    leases.start()
    try:
        await wait_until(lambda: leases.speaker(KEY), within=5, what="this share spoken for")
        assert not leases.holds(KEY) and lease_path(KEY) not in port.held
        # A pool in nobody's share: the first live reconciler by identity, a/0.
        assert not leases.speaker("default/never-valid")
    finally:
        await leases.stop(release=False)


async def test_a_lease_given_to_another_reconcilers_share_is_not_spoken_for_here() -> None:
    """A pool whose lease this process gave back because it is another live reconciler's
    share is that one's to speak for (write its status), also before it has taken the
    lease: the first reconciler by identity speaks only for pools in nobody's share. (The
    old holder wrote the status of a pool it had just given away, after its new holder.)"""
    port, members, leases = sharing_the_pool_with("other/2")
    leases.want(KEY, "default", "spec-a", "RunnerPool default/py.312")
    leases.start()
    try:
        await wait_until(lambda: leases.holds(KEY), within=5, what="the lease taken")
        members.hand_over(KEY, "other/2")
        await wait_until(lambda: lease_path(KEY) not in port.held, within=5, what="a release")
        state = leases.state(KEY)
        assert state.standing is LeaseStanding.FREE  # other/2 has not taken it yet
        assert not state.speaks_here("RunnerPool default/py.312", leases.speaker(KEY))
        # A pool in nobody's share: the first live reconciler by identity, this one.
        assert leases.speaker("default/never-valid")
    finally:
        await leases.stop(release=False)
