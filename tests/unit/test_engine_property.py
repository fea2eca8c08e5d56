"""Property test: classify + plan + the engine's real apply code against a tiny model of
Nomad.

Hypothesis draws random interleavings of scheduler and client behaviour (placements,
instant reschedules with the new allocation before the old one's stop, node loss,
disconnects, OOM restarts in place, failures, client updates in either order, jobs
purged behind the controller's back), claims and releases, spec changes, clock jumps
and reconcile ticks. Each tick observes the model, classifies, plans, and hands the plan
to the engine's Applier, which writes to the model through the same Nomad port (and
claim store) it uses against Nomad. Invariants:

- total runner jobs (not dead) never exceed maxRunners;
- a healthy claimed runner is never destroyed, and the controller purges a job only
  while it holds the runner's claim variable as a tombstone (even when a client claims
  the runner between the plan and its application);
- once faults stop and Nomad settles, a few ticks give exactly the desired idle
  runners of the current template, and every job is an idle or claimed runner;
- a removed pool (Drain past its deadline, Delete) leaves no job and no live claim.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controller.core import views
from controller.core.claims import ClaimRecord, ClaimState
from controller.core.classify import classify
from controller.core.plan import DestroyReason, Plan, plan
from controller.core.runner_ids import META_TEMPLATE
from controller.core.times import to_ns
from controller.engine.apply import Applier
from controller.engine.registry import ManagedPool
from controller.metrics import Metrics
from controller.nomad.errors import NomadConflict
from controller.records.claims import ClaimStore
from tests.support.builders import NOW

T = TypeVar("T")
PREFIX = "py-"
POOL = "default/py"
# The states of the runners a client may claim.
CLAIMABLE = (views.RunnerState.IDLE, views.RunnerState.OUTDATED)


@dataclass
class Alloc:
    id: str
    desired: str = "run"
    client: str = "pending"
    created_ns: int = 0
    index: int = 0
    restarts: int = 0

    @property
    def live(self) -> bool:
        return self.desired == "run" and self.client in ("pending", "running")

    @property
    def terminal(self) -> bool:
        return self.client in ("complete", "failed", "lost")


@dataclass
class Job:
    id: str
    template: str
    submit_ns: int
    allocs: list[Alloc] = field(default_factory=list)
    # A failed allocation awaits a delayed reschedule: Nomad keeps the job pending.
    reschedule_pending: bool = False

    @property
    def status(self) -> str:
        if any(not a.terminal for a in self.allocs):
            return "running"
        if not self.allocs or self.reschedule_pending:
            return "pending"
        return "dead"


class Nomad:
    """Just enough of Nomad: jobs with allocations, and check-and-set variables. The
    controller's side reaches it through the port methods the Applier and the claim
    store call (register_job, purge_job, put_variable, delete_variable)."""

    def __init__(self) -> None:
        self.now: datetime = NOW
        self.index = 0
        self.jobs: dict[str, Job] = {}
        self.vars: dict[str, ClaimRecord] = {}
        self.registered = 0
        self.place_on_register = True

    def next_index(self) -> int:
        self.index += 1
        return self.index

    # ---- the port ----------------------------------------------------------------------

    async def register_job(
        self, job: dict[str, Any], *, enforce_index: int | None = None
    ) -> dict[str, Any]:
        job_id = job["ID"]
        if enforce_index == 0 and job_id in self.jobs:
            raise NomadConflict("Enforcing job modify index 0: job already exists")
        self.registered += 1
        self.jobs[job_id] = record = Job(job_id, job["Meta"][META_TEMPLATE], to_ns(self.now))
        if self.place_on_register:
            self.place(record)
        return {"EvalID": "", "JobModifyIndex": self.next_index()}

    async def purge_job(self, job_id: str, namespace: str) -> None:
        # The controller destroys a runner only while it holds the runner's claim
        # variable as a tombstone: a live claim, or none, means a client's runner.
        claim = self.vars.get(job_id)
        assert claim is not None and claim.is_tombstone, (job_id, claim)
        self.purge(job_id)

    async def put_variable(
        self, path: str, items: dict[str, str], namespace: str, *, cas: int | None
    ) -> dict[str, Any]:
        runner_id = path.rpartition("/")[2]
        current = self.vars.get(runner_id)
        if cas is not None and (current.modify_index if current else 0) != cas:
            raise NomadConflict("cas conflict", status=409)
        variable = {
            "Namespace": namespace,
            "Path": path,
            "ModifyIndex": self.next_index(),
            "ModifyTime": to_ns(self.now),
            "Items": dict(items),
        }
        self.vars[runner_id] = ClaimRecord.from_variable(variable)
        return variable

    async def list_variables(self, prefix: str, namespace: str) -> list[dict[str, Any]]:
        return [
            {"Path": f"poolkeeper/claims/{r}"} for r in self.vars if prefix == "poolkeeper/claims/"
        ]

    async def read_variable(self, path: str, namespace: str) -> dict[str, Any] | None:
        record = self.vars.get(path.rpartition("/")[2])
        if record is None:
            return None
        return {
            "Namespace": namespace,
            "Path": path,
            "ModifyIndex": record.modify_index,
            "ModifyTime": record.modify_time_ns,
            "Items": record.to_items(),
        }

    async def delete_variable(self, path: str, namespace: str, *, cas: int | None = None) -> None:
        runner_id = path.rpartition("/")[2]
        current = self.vars.get(runner_id)
        if current is None or not path.startswith("poolkeeper/claims/"):
            return  # request records are not modelled
        if cas is not None and current.modify_index != cas:
            raise NomadConflict("cas conflict", status=409)
        del self.vars[runner_id]

    # ---- the world's side ----------------------------------------------------------------

    def place(self, job: Job) -> Alloc:
        index = self.next_index()
        new = Alloc(f"{job.id}/{index}", created_ns=to_ns(self.now), index=index)
        job.allocs.append(new)
        job.reschedule_pending = False
        return new

    def purge(self, job_id: str) -> None:
        self.jobs.pop(job_id, None)

    def put_var(self, record: ClaimRecord, cas: int) -> bool:
        current = self.vars.get(record.runner_id)
        if (current.modify_index if current else 0) != cas:
            return False
        self.vars[record.runner_id] = dataclasses.replace(
            record, modify_index=self.next_index(), modify_time_ns=to_ns(self.now)
        )
        return True

    def observe(self) -> views.PoolObservation:
        jobs = tuple(
            views.JobView(j.id, "default", POOL, j.template, j.status, False, j.submit_ns)
            for j in self.jobs.values()
        )
        allocations = {
            j.id: tuple(
                views.AllocationView(
                    a.id,
                    j.id,
                    "default",
                    "n",
                    a.desired,
                    a.client,
                    a.created_ns,
                    a.created_ns,
                    a.index,
                    a.restarts,
                )
                for a in j.allocs
            )
            for j in self.jobs.values()
        }
        return views.PoolObservation(jobs, allocations, dict(self.vars), frozenset())

    def total(self) -> int:
        return sum(1 for j in self.jobs.values() if j.status != "dead")

    def live_allocs(self) -> list[tuple[Job, Alloc]]:
        return [(j, a) for j in self.jobs.values() for a in j.allocs if a.live]


def pick(items: list[T], arg: int) -> T | None:
    return items[arg % len(items)] if items else None


@dataclass
class World:
    nomad: Nomad
    policy: views.PoolPolicy
    max_claims: int
    max_desired: int
    applier: Applier = field(init=False)

    def __post_init__(self) -> None:
        port = self.nomad
        self.applier = Applier(
            port, ClaimStore(port), Metrics(), lambda event: None, random.Random(0)
        )

    def runners(self) -> list[views.Runner]:
        return classify(self.policy, self.nomad.observe(), self.nomad.now)

    def check(self) -> None:
        assert self.nomad.total() <= self.policy.max_runners

    # ---- faults and client behaviour ----------------------------------------------

    async def fault(self, op: str, arg: int) -> None:
        nomad = self.nomad
        jobs = sorted(nomad.jobs.values(), key=lambda j: j.id)
        live = nomad.live_allocs()
        if arg % 4 == 1:  # often aim at claimed runners, where loss matters most
            claimed = [(j, a) for j, a in live if j.id in nomad.vars]
            live = claimed or live
        if op == "place":
            job = pick(
                [j for j in jobs if j.status != "dead" and not any(a.live for a in j.allocs)], arg
            )
            if job is not None:
                nomad.place(job)
        elif op == "start":
            target = pick([(j, a) for j, a in live if a.client == "pending"], arg)
            if target is not None:
                target[1].client = "running"
        elif op == "reschedule":  # instant: the new alloc first, then the old one's stop
            target = pick(live, arg)
            if target is not None:
                nomad.place(target[0])
                target[1].desired = "stop"
        elif op == "client_stopped":  # the old alloc's client reports, whenever it does
            target = pick([(j, a) for j in jobs for a in j.allocs
                           if a.desired == "stop" and not a.terminal], arg)  # fmt: skip
            if target is not None:
                target[1].client = "complete"
        elif op == "node_loss":
            target = pick(live, arg)
            if target is not None:
                target[1].desired, target[1].client = "stop", "lost"
                nomad.place(target[0])
        elif op == "disconnect":
            target = pick(live, arg)
            if target is not None:
                target[1].client = "unknown"
                nomad.place(target[0])
        elif op == "oom":
            target = pick([(j, a) for j, a in live if a.client == "running"], arg)
            if target is not None:
                target[1].restarts += 1
        elif op == "fail":
            target = pick(live, arg)
            if target is not None:
                target[1].client = "failed"
                target[0].reschedule_pending = arg % 2 == 0
        elif op == "vanish":  # purged behind our back (Poseidon saw only JobDeregistered)
            job = pick(jobs, arg)
            if job is not None:
                nomad.purge(job.id)
        elif op == "claim":
            self.claim(arg)
        elif op == "release":
            claims = sorted(
                (c for c in nomad.vars.values() if not c.is_tombstone), key=lambda c: c.runner_id
            )
            chosen = pick(claims, arg)
            if chosen is not None and nomad.put_var(
                chosen.with_state(ClaimState.RELEASED), chosen.modify_index
            ):
                nomad.purge(chosen.runner_id)
        elif op == "advance":
            nomad.now += timedelta(seconds=1 + arg % 120)
        elif op == "template":
            self.policy = dataclasses.replace(self.policy, template_hash=f"t{arg % 3}")
        elif op == "scale":
            self.policy = dataclasses.replace(
                self.policy, desired_idle=arg % (self.max_desired + 1)
            )
        elif op == "heal":  # a quiet moment: clients report, the scheduler catches up
            self.settle_nomad()
        elif op == "tick":
            await self.tick(place=arg % 3 != 0)
        elif op == "race":
            await self.tick(race=arg)
        else:  # pragma: no cover - the strategy draws only the names above
            raise AssertionError(op)

    def claim(self, arg: int, among: list[views.Runner] | None = None) -> None:
        nomad = self.nomad
        if sum(1 for c in nomad.vars.values() if not c.is_tombstone) >= self.max_claims:
            return
        idle = [r for r in self.runners() if r.state in CLAIMABLE]
        chosen = pick(among or idle, arg)
        if chosen is None or chosen.allocation is None:
            return
        record = ClaimRecord.new(
            runner_id=chosen.id,
            namespace="default",
            pool=POOL,
            allocation_id=chosen.allocation.id,
            now=nomad.now,
            inactivity_timeout_seconds=10 + arg % 240,
            allocation_restarts=chosen.allocation.restarts,
        )
        nomad.put_var(record, cas=0)

    # ---- the controller -------------------------------------------------------------

    async def tick(self, place: bool = True, race: int | None = None) -> Plan:
        """One reconcile pass. With `race`, a client claims a runner between the plan and
        its application, preferably one the plan is about to retire: the apply code must
        then leave it claimed."""
        nomad = self.nomad
        observation = nomad.observe()
        runners = classify(self.policy, observation, nomad.now)
        todo = plan(
            self.policy,
            observation,
            runners,
            nomad.now,
            creation_allowed=True,
            target=self.policy.desired_idle,
        )
        by_id = {r.id: r for r in runners}
        for destroy in todo.destroy:
            if by_id[destroy.runner_id].state is views.RunnerState.CLAIMED:
                # only a removed pool may take a healthy claimed runner
                assert destroy.reason in (DestroyReason.DRAIN, DestroyReason.DELETE)
        if race is not None:
            retiring = [by_id[d.runner_id] for d in todo.destroy if d.claim is None]
            self.claim(race, among=[r for r in retiring if r.state in CLAIMABLE] or None)
        nomad.place_on_register = place
        managed = ManagedPool(None, self.policy, {}, 0, 0)
        applied = await self.applier.apply(managed, todo, runners, nomad.now)
        assert applied.errors == 0
        return todo

    def settle_nomad(self) -> None:
        """Faults over: clients report, the scheduler places, everything starts."""
        for job in self.nomad.jobs.values():
            for a in job.allocs:
                if a.desired == "stop" and not a.terminal:
                    a.client = "complete"
                if a.client == "unknown":  # reconnect: the scheduler stops the old one
                    a.desired, a.client = "stop", "complete"
            if job.status != "dead" and not any(a.live for a in job.allocs):
                self.nomad.place(job)
            for a in job.allocs:
                if a.live:
                    a.client = "running"


async def settle(world: World) -> None:
    """Faults stop: a few rounds of "Nomad settles, one tick, a second passes" suffice.

    Ends right after a tick that had nothing to do, so the state is judged at the
    moment that tick saw it.
    """
    for _ in range(4 * world.policy.max_runners + 4):
        world.settle_nomad()
        todo = await world.tick()
        world.check()
        if not (todo.create or todo.destroy):
            break
        world.nomad.now += timedelta(seconds=1)
    world.settle_nomad()


FAULTS = [
    "place", "start", "reschedule", "client_stopped", "node_loss", "disconnect", "oom",
    "fail", "vanish", "claim", "claim", "release", "advance", "template", "scale",
    "tick", "tick", "tick", "heal", "heal", "claim", "race", "race",
]  # fmt: skip


@pytest.mark.slow
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    sizes=st.integers(1, 8).flatmap(lambda m: st.tuples(st.just(m), st.integers(0, m))),
    surge=st.integers(1, 4),
    startup_timeout=st.integers(30, 300),
    steps=st.lists(
        st.tuples(st.sampled_from(FAULTS), st.integers(0, 10_000)), min_size=30, max_size=150
    ),
    removal=st.sampled_from([None, views.PoolMode.DRAIN, views.PoolMode.DELETE]),
)
def test_pool_converges_and_never_exceeds_max(
    sizes: tuple[int, int],
    surge: int,
    startup_timeout: int,
    steps: list[tuple[str, int]],
    removal: views.PoolMode | None,
) -> None:
    max_runners, desired = sizes
    world = World(
        Nomad(),
        views.PoolPolicy(
            key=POOL,
            nomad_namespace="default",
            job_prefix=PREFIX,
            desired_idle=desired,
            max_runners=max_runners,
            startup_timeout_seconds=startup_timeout,
            template_hash="t0",
            surge=surge,
        ),
        # claims never take the room the idle runners need, or convergence is impossible
        max_claims=max_runners - desired,
        max_desired=desired,
    )
    asyncio.run(play(world, steps, removal))


async def play(world: World, steps: list[tuple[str, int]], removal: views.PoolMode | None) -> None:
    max_runners = world.policy.max_runners
    await settle(world)  # start from a full pool, so faults hit runners
    for op, arg in steps:
        await world.fault(op, arg)
        world.check()
    await settle(world)
    # Judged on the model itself, not through classify.
    nomad, pool = world.nomad, world.policy
    live_claims = {c.runner_id: c for c in nomad.vars.values() if not c.is_tombstone}
    unclaimed = [j for j in nomad.jobs.values() if j.id not in nomad.vars]
    assert len(unclaimed) == pool.desired_idle, unclaimed
    for job in unclaimed:
        assert job.template == pool.template_hash
        assert any(a.live and a.client == "running" for a in job.allocs), job
    # no leaked job: every other job holds a valid live claim (tombstoned ones are gone)
    for job in nomad.jobs.values():
        if job.id in nomad.vars:
            assert job.id in live_claims, (job, nomad.vars[job.id])
    for c in live_claims.values():
        job = nomad.jobs[c.runner_id]  # a live claim never outlives its job
        [claimed] = [a for a in job.allocs if a.id == c.allocation_id]
        assert claimed.live and claimed.restarts == c.allocation_restarts
        assert nomad.now < c.expires_at
    assert nomad.total() <= max_runners

    if removal is not None:
        # The pool is removed (drain deadline already passed): nothing may be left.
        world.policy = dataclasses.replace(pool, mode=removal, drain_deadline=nomad.now)
        await settle(world)
        assert nomad.jobs == {}
        assert all(c.is_tombstone for c in nomad.vars.values())


async def test_seed_instant_reschedule_never_over_or_under_creates() -> None:
    """The seed story on the model: an idle runner's alloc is rescheduled instantly and
    the ticks see every intermediate state; the pool never registers an extra job."""
    world = World(
        Nomad(),
        views.PoolPolicy(POOL, "default", PREFIX, 2, 4, 120, "t0"),
        max_claims=0,
        max_desired=2,
    )
    await world.tick()
    world.settle_nomad()
    assert (await world.tick()).empty and world.nomad.registered == 2
    job = world.nomad.jobs[sorted(world.nomad.jobs)[0]]
    old = job.allocs[-1]
    sequence: list[Callable[[], object]] = [
        lambda: world.nomad.place(job),  # the new alloc's event comes first
        lambda: setattr(old, "desired", "stop"),
        lambda: setattr(job.allocs[-1], "client", "running"),
        lambda: setattr(old, "client", "complete"),
    ]
    for step in sequence:
        step()
        await world.tick()
        assert len(world.runners()) == 2
    assert world.nomad.registered == 2  # the runner was neither lost nor duplicated
    assert [r.state for r in world.runners()] == [views.RunnerState.IDLE] * 2
