"""The API tier soak (`poolkeeper chaos --api-tier`): two API replicas (`python -m
controller api`) behind HAProxy (balancer.py) and one reconciler (`python -m controller
run`), all against the simulator, which runs executions as local processes. Clients claim
(always with a `requestId`), run a waited `echo`, keep alive, read and release through the
balancer; an API replica is SIGKILLed at random every so often (20-60 s in a long run) and
restarted. Nothing else is done to the system: no Nomad fault, no reconciler restart.

Besides what every soak checks (soak.py: no double claim, no claim lost, maxRunners, no
runner purged under a live claim, nothing leaked at the end, no 5xx but 503 from the API,
no traceback, no unexpected exit, no runner job written by a non-holder), it checks:

* every request that failed reached a killed replica: in flight when it was killed, or sent
  to it dead before the balancer took it out (ledger.py), and a later request of the same
  subject succeeded (a claim: the same requestId, retried for up to ~30 s, since a repeat
  takes a dead claimer's request over only after its `servedUntil`);
* claim availability: of the claim attempts that no kill failed, at least
  AVAILABILITY_GOAL handed a runner out (a `PoolEmpty` answer counts as a failure);
* every claim Nomad held was answered to its client (none taken and never answered);
* no runner job written by an API replica (the simulator's write audit);
* no waiting record outlives its expiry plus the time a reconciler takes to delete it.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from controller.lab.chaos.balancer import Balancer, server_name
from controller.lab.chaos.clients import BalancedApi, Clients, Habits
from controller.lab.chaos.faults import FaultedRunners
from controller.lab.chaos.ledger import Kill, Ledger
from controller.lab.chaos.monitor import MONITOR_INTERVAL, Monitor
from controller.lab.chaos.processes import ApiReplica, ControllerProcess, free_port, pools_file
from controller.lab.chaos.soak import SoakRun
from controller.lab.chaos.world import NODES, START_DELAY
from controller.lab.simulator import SimServer, Simulator, start_sim

REPLICAS: Final = 2
AVAILABILITY_GOAL: Final = 0.999
ROTATION_BOUND_SECONDS: Final = 30.0  # a restarted replica is back in the rotation within
# A replica is killed when a request is on it, if one comes within this (it mostly does).
AIM_SECONDS: Final = 2.0
TAKEOVER_LOG: Final = "its claimer never answered; taken over"


@dataclass(frozen=True)
class TierProfile:
    kill_every: tuple[float, float]  # seconds between two kills
    restart_after: tuple[float, float]  # seconds from a kill to the restart
    clients: int
    settle_seconds: float  # clients work on after the last kill (their retries end)
    final_reserve_seconds: float  # left at the end for the final leak check

    @staticmethod
    def for_minutes(minutes: float) -> TierProfile:
        if minutes < 3:
            return TierProfile((10.0, 20.0), (0.5, 2.0), 4, 15.0, 10.0)
        return TierProfile((20.0, 60.0), (0.5, 3.0), 6, 20.0, 20.0)


@dataclass(frozen=True)
class PlannedKill:
    at: float  # seconds after the clients started
    replica: int
    restart_after: float


def kill_schedule(seed: int, minutes: float, profile: TierProfile) -> list[PlannedKill]:
    """The kills of a run, from the seed alone; the run plays those that fit its time."""
    rng = random.Random(seed ^ 0x4B111)
    kills = []
    at = 0.0
    while at < minutes * 60:
        at += rng.uniform(*profile.kill_every)
        kills.append(PlannedKill(at, rng.randrange(REPLICAS), rng.uniform(*profile.restart_after)))
    return kills


async def tier_soak(seed: int, minutes: float, workdir: Path) -> dict[str, Any]:
    """One API tier soak on a simulator of its own; the report."""
    sim = Simulator(nodes=list(NODES), seed=seed, start_delay=START_DELAY, exec_mode="local")
    server = await start_sim(sim, host="127.0.0.1", port=0)
    try:
        tier = TierSoak(seed, minutes, workdir, server)
    except BaseException:
        await server.stop()
        raise
    return await tier.run()


class TierSoak(SoakRun):
    def __init__(self, seed: int, minutes: float, workdir: Path, server: SimServer) -> None:
        super().__init__(seed, minutes, server)
        self.profile = TierProfile.for_minutes(minutes)
        self.kills_planned = kill_schedule(seed, minutes, self.profile)
        self.habits = Habits((10, 30), claim_attempts=60, wait_seconds=3, execution_share=0.3)
        reconciler_dir = workdir / "reconciler"
        reconciler_dir.mkdir(parents=True, exist_ok=True)
        self.reconciler = ControllerProcess(
            reconciler_dir, server.url, free_port(), pools_file(reconciler_dir, 0)
        )
        self.replicas: list[ControllerProcess] = []
        for index in range(REPLICAS):
            folder = workdir / server_name(index)
            folder.mkdir(exist_ok=True)
            self.replicas.append(ApiReplica(folder, server.url, free_port()))
        self.processes = (self.reconciler, *self.replicas)
        self.balancer = Balancer(workdir, free_port(), [r.port for r in self.replicas])
        self.ledger = Ledger(self.started)
        self.api = BalancedApi(self.balancer.url, self.violations, self.ledger)
        # No fault touches a runner here: a claim may end `lost` for no reason at all.
        faulted = FaultedRunners()
        self.clients = Clients(
            seed, self.habits, self.api, faulted, self.violations, self.world.pools
        )
        self.monitor = Monitor(
            self.world, (self.reconciler,), self.clients, faulted, self.violations
        )
        self.load_average: list[float] = [round(x, 2) for x in os.getloadavg()]
        self.initial_fill_seconds = 0.0

    async def run(self) -> dict[str, Any]:
        watchers = [asyncio.create_task(self.monitor.run()), asyncio.create_task(self.watch())]
        trackers: list[asyncio.Task[None]] = []
        try:
            await self.reconciler.start()
            times = await self.wait_converged("initial fill", 60.0)
            self.initial_fill_seconds = max(times.values()) if times else -1.0
            for replica in self.replicas:
                await replica.start()
            await self.balancer.start()
            await self.wait_in_rotation(set(range(REPLICAS)), "the replicas to start")
            self.clients.resume()
            async with self.clients_at_work(self.profile.clients):
                trackers = await self.play_kills()
                await asyncio.gather(*trackers)
                await asyncio.sleep(self.profile.settle_seconds)
                await self.clients.pause()
        finally:
            for task in [*watchers, *trackers]:
                task.cancel()
            await asyncio.gather(*watchers, *trackers, return_exceptions=True)
            await self.balancer.stop()
            await self.stop()
        self.check_controllers()
        self.check_tier()
        return self.report()

    async def play_kills(self) -> list[asyncio.Task[None]]:
        """SIGKILL the planned replicas until the time is up; a tracker each, which
        restarts the replica and times the balancer's view of it."""
        profile = self.profile
        end = self.started + self.minutes * 60 - profile.settle_seconds
        begun = time.monotonic()
        trackers = []
        for planned in self.kills_planned:
            if begun + planned.at > end - profile.final_reserve_seconds:
                break
            await asyncio.sleep(max(0.0, begun + planned.at - time.monotonic()))
            # One replica at a time: the other one is back first.
            others = set(range(REPLICAS)) - {planned.replica}
            await self.wait_in_rotation(others, "the other replica before a kill")
            await self.aim(planned.replica)
            kill = Kill(server_name(planned.replica), time.monotonic())
            self.ledger.kills.append(kill)
            await self.replicas[planned.replica].kill()
            trackers.append(asyncio.create_task(self.track(planned, kill)))
        return trackers

    async def aim(self, replica: int) -> None:
        """Wait (a little) for a request on the replica: a kill then hits one in flight."""
        deadline = time.monotonic() + AIM_SECONDS
        name = server_name(replica)
        while time.monotonic() < deadline:
            if any(s.name == name and s.sessions for s in await self.balancer.servers()):
                return
            await asyncio.sleep(0.005)

    async def track(self, planned: PlannedKill, kill: Kill) -> None:
        """Restart the killed replica, and note when the balancer took it out and when
        it put it back."""
        restart_at = kill.at + planned.restart_after
        while kill.back_in_rotation_at is None:
            now = time.monotonic()
            up = {s.name: s.up for s in await self.balancer.servers()}
            if kill.out_of_rotation_at is None and not up.get(kill.replica, False):
                kill.out_of_rotation_at = now
            if kill.restarted_at is None and now >= restart_at:
                await self.replicas[planned.replica].ensure_running()
                kill.restarted_at = time.monotonic()
            elif kill.restarted_at is not None and up.get(kill.replica):
                kill.back_in_rotation_at = now
            elif now - kill.at > ROTATION_BOUND_SECONDS:
                self.violations.add(
                    f"{kill.replica} not back in the balancer's rotation "
                    f"{ROTATION_BOUND_SECONDS:.0f} s after its kill"
                )
                return
            await asyncio.sleep(0.02)

    async def wait_in_rotation(self, replicas: set[int], what: str) -> None:
        names = {server_name(i) for i in replicas}
        deadline = time.monotonic() + ROTATION_BOUND_SECONDS
        while time.monotonic() < deadline:
            if names <= {s.name for s in await self.balancer.servers() if s.up}:
                return
            if self.balancer.exited() is not None:
                raise RuntimeError(f"HAProxy exited: {self.balancer.log_text()[-2000:]}")
            await asyncio.sleep(0.05)
        raise RuntimeError(f"waited {ROTATION_BOUND_SECONDS:.0f} s for {what} to be in rotation")

    async def watch(self) -> None:
        """Until cancelled: the requestIds of the claims in Nomad, and the waiting records
        a reconciler should have deleted."""
        while True:
            self.note_claimed_request_ids()
            for overdue in self.overdue_waiting_records():
                self.violations.add_once(overdue, overdue)
            await asyncio.sleep(MONITOR_INTERVAL)

    def check_tier(self) -> None:
        """After the run: the ledger's verdicts, the claims never answered, the writes of
        the API tier, HAProxy's own exit."""
        summary = self.ledger.summary()
        for line in summary["failed_unexplained"]:
            self.violations.add(f"a request failed that no kill explains: {line}")
        for line in summary["failed_not_recovered"]:
            self.violations.add(f"a failed request whose retry never succeeded: {line}")
        availability = summary["claim_availability"]
        if availability is not None and availability < AVAILABILITY_GOAL:
            self.violations.add(
                f"claim availability {availability:.4%} below {AVAILABILITY_GOAL:.1%}"
            )
        for request_id in sorted(self.never_answered()):
            self.violations.add(f"claim of request {request_id} was never answered")
        for write in self.writes_by_api_tier():
            self.violations.add(f"{write} by the API tier")
        if self.clients.stats.claims_given_up:
            self.violations.add(f"{self.clients.stats.claims_given_up} claims given up")

    def writes_by_api_tier(self) -> list[str]:
        return [
            f"{w.kind} of runner {w.job_id} by {w.writer}"
            for w in self.sim.audit.writes
            if w.writer.startswith("api ")
        ]

    def takeovers_logged(self) -> int:
        return sum(
            path.read_text(errors="replace").count(TAKEOVER_LOG)
            for replica in self.replicas
            for path in replica.logs
            if path.exists()
        )

    def report(self) -> dict[str, Any]:
        stats = self.clients.stats
        summary = self.ledger.summary()
        kills = self.ledger.kills
        return {
            "variant": "api-tier",
            "seed": self.seed,
            "minutes": self.minutes,
            "command": f"poolkeeper chaos --api-tier --minutes {self.minutes:g} --seed {self.seed}",
            "duration_seconds": round(time.monotonic() - self.started, 1),
            "load_average_at_start": self.load_average,
            "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
            "replicas": REPLICAS,
            "clients": self.profile.clients,
            "initial_fill_seconds": self.initial_fill_seconds,
            "replica_kills": len(kills),
            "out_of_rotation_seconds_max": _longest(kills, "out_of_rotation_at"),
            "back_in_rotation_seconds_max": _longest(kills, "back_in_rotation_at"),
            **summary,
            "claim_retries_taking_over_logged": self.takeovers_logged(),
            **stats.figures(),
            "executions": stats.executions,
            "claims_never_answered": len(self.never_answered()),
            "claims_given_up": stats.claims_given_up,
            "claims_ended_before_answered": stats.claims_ended_unanswered,
            "runners_leaked": self.leaked_runners,
            "records_leaked": self.leaked_records,
            "records_left": self.records_left,
            "runner_writes": len(self.sim.audit.writes),
            "runner_writes_by_api_tier": len(self.writes_by_api_tier()),
            "runner_writes_by_non_holders": len(self.sim.audit.by_non_holders()),
            "max_runners_excess": self.monitor.max_excess,
            "invariant_violations": self.violations.messages,
            "kills": [
                {
                    "replica": k.replica,
                    "at": round(k.at - self.started, 1),
                    "out_of_rotation_after": _after(k, k.out_of_rotation_at),
                    "restarted_after": _after(k, k.restarted_at),
                    "back_in_rotation_after": _after(k, k.back_in_rotation_at),
                }
                for k in kills
            ],
        }


def _after(kill: Kill, moment: float | None) -> float | None:
    return None if moment is None else round(moment - kill.at, 2)


def _longest(kills: list[Kill], attribute: str) -> float | None:
    times = [_after(k, getattr(k, attribute)) for k in kills]
    return max((t for t in times if t is not None), default=None)
