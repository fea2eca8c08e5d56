"""One soak from start to report: rounds of faults, the convergence after each, the final
leak check, and the checks of the controllers' exits, logs and writes."""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import time
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp

from controller.lab.chaos.clients import Api, Clients, ControllerApi, Habits
from controller.lab.chaos.faults import Faults
from controller.lab.chaos.monitor import Monitor
from controller.lab.chaos.processes import (
    RESYNC_SECONDS,
    RIVAL_EXTRA_IDLE,
    ControllerProcess,
    OperatorProcess,
    free_port,
    kube_with_pools,
    pools_file,
)
from controller.lab.chaos.schedule import Profile, Round, make_schedule
from controller.lab.chaos.violations import Violations
from controller.lab.chaos.world import (
    NODES,
    POOLS,
    REQUESTS_PREFIX,
    START_DELAY,
    PoolSpec,
    World,
    converged,
)
from controller.lab.kube import KubeCluster
from controller.lab.simulator import SimServer, Simulator, start_sim
from controller.records.waiting import FORGET_AFTER

# A reconciler deletes a waiting record FORGET_AFTER after it expired, on its next read of
# the records (a resync or the doorbell): one still there after this is a leak.
WAITING_RECORD_LIFE = FORGET_AFTER + timedelta(seconds=3 * RESYNC_SECONDS + 5)


def percentile(values: Sequence[float], share: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    rank = max(0, math.ceil(share * len(ordered)) - 1)
    return round(ordered[rank], 2)


def convergence_figures(seconds: Sequence[float]) -> dict[str, Any]:
    """How long the pools took to converge again after each round, as a report says it."""
    return {
        "convergence_samples": len(seconds),
        "convergence_p50_seconds": percentile(seconds, 0.5),
        "convergence_p99_seconds": percentile(seconds, 0.99),
        "convergence_max_seconds": max(seconds, default=None),
    }


async def soak(
    seed: int, minutes: float, workdir: Path, *, operator_rival: bool = False
) -> dict[str, Any]:
    """One soak on a simulator of its own; the report. With `operator_rival` the second
    controller is an operator reading the pools from a kube-apiserver of its own."""
    kube = None
    if operator_rival:
        kube = await kube_with_pools(workdir / "kube", POOLS, RIVAL_EXTRA_IDLE)
    try:
        sim = Simulator(nodes=list(NODES), seed=seed, start_delay=START_DELAY)
        server = await start_sim(sim, host="127.0.0.1", port=0)
        return await Soak(seed, minutes, workdir, server, kube).run()
    finally:
        if kube is not None:
            kube.stop()


class SoakRun:
    """What every soak shares: the simulator (`server`, stopped by the soak), what Nomad
    holds (the world), the violations, the wait for convergence, the final leak check and
    the checks of the processes' exits, logs and writes, and the claims never answered. A
    soak sets `habits`, `api`, `clients` and `processes` before it runs."""

    habits: Habits
    api: Api
    clients: Clients
    processes: tuple[ControllerProcess, ...]

    def __init__(
        self, seed: int, minutes: float, server: SimServer, pools: tuple[PoolSpec, ...] = POOLS
    ) -> None:
        self.seed = seed
        self.minutes = minutes
        self.server = server
        self.sim = server.sim
        self.world = World(self.sim, pools)
        self.started = time.monotonic()
        self.violations = Violations(self.started)
        self.leaked_runners = 0
        self.leaked_records = 0
        self.records_left: dict[str, int] = {}
        self.claimed_request_ids: set[str] = set()  # every requestId a claim in Nomad carried

    @contextlib.asynccontextmanager
    async def clients_at_work(self, count: int) -> AsyncIterator[None]:
        """`count` clients at work while the body runs, then the final check (`finish`);
        the clients are stopped in the end, also when the body fails."""
        async with aiohttp.ClientSession() as http:
            clients = [asyncio.create_task(self.clients.work(n, http)) for n in range(count)]
            try:
                yield
                await self.finish(http)
            finally:
                for task in clients:
                    task.cancel()
                await asyncio.gather(*clients, return_exceptions=True)

    def out_of_time(self, final_reserve_seconds: float) -> bool:
        """No round may start now: what is left of the run is for the final check."""
        return time.monotonic() - self.started >= self.minutes * 60 - final_reserve_seconds

    async def wait_converged(self, what: str, bound: float) -> dict[str, float] | None:
        """Seconds until each pool converged, or None (a violation) after `bound`."""
        started = time.monotonic()
        times: dict[str, float] = {}
        while True:
            claims = self.world.claims()
            for pool in self.world.pools:
                if pool.key not in times and converged(pool, self.world.pool_state(pool, claims)):
                    times[pool.key] = round(time.monotonic() - started, 2)
            if len(times) == len(self.world.pools):
                return times
            if time.monotonic() - started > bound:
                states = {
                    p.key: self.world.pool_state(p, claims)
                    for p in self.world.pools
                    if p.key not in times
                }
                self.violations.add(
                    f"{what}: pools did not converge within {bound:.0f} s: {states}"
                )
                return None
            await asyncio.sleep(0.1)

    async def hold_converged(self, seconds: float, what: str) -> None:
        """Without faults and claims a converged pool stays converged."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            claims = self.world.claims()
            for pool in self.world.pools:
                state = self.world.pool_state(pool, claims)
                if (
                    state["idle"] != pool.idle
                    or state["starting"]
                    or state["total"] > pool.max_runners
                ):
                    self.violations.add_once(
                        f"unstable:{what}:{pool.key}",
                        f"{what}: pool {pool.key} left convergence without a fault: {state}",
                    )
            await asyncio.sleep(0.2)

    async def finish(self, http: aiohttp.ClientSession) -> None:
        """Everything released, unanswered claims expired: nothing may be left."""
        # Unanswered claims expire (inactivity), abandoned request records are collected
        # once a minute old, on a pass every 30 s (engine/requests_gc.py).
        bound = self.habits.inactivity[1] + 6 * RESYNC_SECONDS + 120
        started = time.monotonic()
        while True:
            claims = self.world.claims()
            live = [r for r, items in claims.items() if items.get("state", "claimed") == "claimed"]
            leaks: list[str] = [f"live claim variable of runner {r}" for r in sorted(live)]
            leaked_runners = len(live)
            for pool in self.world.pools:
                state = self.world.pool_state(pool, claims)
                extra = state["total"] - state["idle"] + max(0, state["idle"] - pool.idle)
                leaked_runners += max(0, extra)
                if extra > 0 or state["idle"] != pool.idle:
                    leaks.append(f"pool {pool.key}: {state}")
            # A request record lives as long as its claim or its tombstone.
            carried = {items.get("requestId") for items in claims.values()}
            records = [
                f"request record {REQUESTS_PREFIX}{request_id} without a claim: {items}"
                for request_id, items in self.world.request_records().items()
                if request_id not in carried
            ] + self.overdue_waiting_records()
            if not leaks and not records:
                break
            if time.monotonic() - started > bound:
                self.leaked_runners, self.leaked_records = leaked_runners, len(records)
                for leak in leaks + records:
                    self.violations.add(f"final state, {bound:.0f} s after the last fault: {leak}")
                break
            await asyncio.sleep(0.25)
        self.records_left = self.world.records_left()
        # The controller must agree with Nomad.
        status, payload = await self.api.request(http, "GET", "/v1/pools")
        if status != 200:
            self.violations.add(f"GET /v1/pools answered {status} at the end")
            return
        for entry in payload["pools"]:
            known = next((p for p in self.world.pools if p.name == entry["name"]), None)
            if known is not None and entry["status"].get("idleRunners") != known.idle:
                self.violations.add(
                    f"controller reports {entry['status'].get('idleRunners')} idle runners "
                    f"for {known.key}, Nomad holds {known.idle}"
                )

    def note_claimed_request_ids(self) -> None:
        """The requestIds of the claims Nomad holds now (a watcher's, several times a second)."""
        for items in self.world.claims().values():
            if items.get("requestId"):
                self.claimed_request_ids.add(items["requestId"])

    def never_answered(self) -> set[str]:
        """The requestIds of claims Nomad held that no client was answered."""
        return self.claimed_request_ids - set(self.clients.claimed_by.values())

    def overdue_waiting_records(self) -> list[str]:
        """Waiting records a reconciler should have deleted by now (a dead replica's)."""
        now = datetime.now(UTC)
        overdue = []
        for path, record in self.world.waiting_records().items():
            if record is None:
                overdue.append(f"waiting record {path} does not decode")
            elif now - record.expires_at > WAITING_RECORD_LIFE:
                overdue.append(f"waiting record {path} expired at {record.expires_at}")
        return overdue

    async def stop(self) -> None:
        """Stop the processes, in their order, then the simulator."""
        for process in self.processes:
            await process.stop()
        await self.server.stop()

    def check_controllers(self) -> None:
        """After the run: no exit the driver did not cause, no traceback in a log, and no
        runner written by a process that did not hold the pool's lease."""
        for process in self.processes:
            for exit_ in process.unexpected_exits:
                self.violations.add(exit_)
            for traceback in process.tracebacks():
                self.violations.add(f"{process.name} log: {traceback}")
        for write in self.sim.audit.by_non_holders():
            self.violations.add(
                f"{write.kind} of runner {write.job_id} by {write.writer} while "
                f"{write.holder or 'nobody'} held the lease of {write.pool}"
            )


class Soak(SoakRun):
    """Plays the schedule's rounds until the time is up, then checks that nothing leaked;
    stops the controllers and the simulator (`server`) when done."""

    def __init__(
        self,
        seed: int,
        minutes: float,
        workdir: Path,
        server: SimServer,
        kube: KubeCluster | None = None,
    ) -> None:
        super().__init__(seed, minutes, server)
        self.profile = Profile.for_minutes(minutes)
        self.habits = Habits(self.profile.inactivity)
        self.schedule = make_schedule(seed, minutes, self.profile)
        self.controller = ControllerProcess(
            workdir, server.url, free_port(), pools_file(workdir, 0)
        )
        # A second controller with a different spec for the same pools, started and
        # SIGKILLed by the fault `second_controller`; it must never write a pool it does
        # not hold the lease of, and serves some of the clients' requests while it runs.
        # With a kube-apiserver it is an operator reading them as RunnerPools.
        rival_dir = workdir / "second-controller"
        rival_dir.mkdir(exist_ok=True)
        self.rival = (
            ControllerProcess(
                rival_dir, server.url, free_port(), pools_file(rival_dir, RIVAL_EXTRA_IDLE)
            )
            if kube is None
            else OperatorProcess(
                rival_dir, server.url, free_port(), kube.admin_kubeconfig, "second-controller"
            )
        )
        self.operator_rival = kube is not None
        # Stopped in this order: the rival first, so that it takes over none of the leases
        # the controller gives back as it stops.
        self.processes = (self.rival, self.controller)
        self.api = ControllerApi(
            self.controller, self.rival, self.violations, random.Random(seed ^ 0xB1A5)
        )
        self.faults = Faults(self.sim, self.world, self.controller, self.rival)
        self.clients = Clients(
            seed, self.habits, self.api, self.faults.hit, self.violations, self.world.pools
        )
        self.monitor = Monitor(
            self.world, (self.controller,), self.clients, self.faults.hit, self.violations
        )
        self.convergence: list[float] = []
        self.convergence_rounds: list[dict[str, Any]] = []
        self.rounds_played = 0
        self.initial_fill_seconds = 0.0

    async def run(self) -> dict[str, Any]:
        monitor = asyncio.create_task(self.monitor.run())
        try:
            await self.controller.start()
            times = await self.wait_converged("initial fill", 60.0)
            self.initial_fill_seconds = max(times.values()) if times else -1.0
            async with self.clients_at_work(self.profile.clients):
                for round_ in self.schedule:
                    await self.play_round(round_)
                    self.rounds_played += 1
                    if self.out_of_time(self.profile.final_reserve_seconds):
                        break
        finally:
            monitor.cancel()
            await asyncio.gather(monitor, return_exceptions=True)
            await self.stop()
        self.check_controllers()
        return self.report()

    async def play_round(self, round_: Round) -> None:
        """The fault window with the clients at work, then every fault off, the clients
        paused, and the time until every pool converged."""
        window_start = time.monotonic()
        self.clients.resume()
        for event in round_.events:
            delay = window_start + event.at - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            await self.faults.inject(event, round_.index)
        remaining = window_start + self.profile.window_seconds - time.monotonic()
        if remaining > 0:
            await asyncio.sleep(remaining)
        await self.faults.end_all()
        await self.clients.pause()
        times = await self.wait_converged(f"round {round_.index}", self.profile.convergence_bound)
        if times is not None:
            self.convergence.extend(times.values())
            await self.hold_converged(self.profile.quiet_seconds, f"round {round_.index}")
        self.convergence_rounds.append({"round": round_.index, "seconds": times})

    def writes_as_holder(self, process: ControllerProcess) -> int:
        """Runner jobs written by any incarnation of `process` while it held the pool's
        lease."""
        mine = set(process.identities)
        return sum(
            1
            for write in self.sim.audit.writes
            if write.writer == write.holder and write.holder in mine
        )

    def report(self) -> dict[str, Any]:
        stats = self.clients.stats
        faults = self.faults
        return {
            "seed": self.seed,
            "minutes": self.minutes,
            "command": f"poolkeeper chaos --minutes {self.minutes:g} --seed {self.seed}"
            + (" --operators 1" if self.operator_rival else ""),
            "second_controller_kind": "operator" if self.operator_rival else "run",
            "duration_seconds": round(time.monotonic() - self.started, 1),
            "rounds": self.rounds_played,
            "rounds_scheduled": len(self.schedule),
            "pools": [
                {"pool": p.key, "idleRunners": p.idle, "maxRunners": p.max_runners}
                for p in self.world.pools
            ],
            "faults_injected": dict(sorted(faults.injected.items())),
            **stats.figures(),
            "unavailable_answers": stats.unavailable,
            "controller_restarts": faults.restarts,
            "second_controller_starts": faults.rival_starts,
            "sigterm_handover_seconds": faults.handovers,
            "runner_writes": len(self.sim.audit.writes),
            "runner_writes_by_second_controller_as_holder": self.writes_as_holder(self.rival),
            "runner_writes_by_non_holders": len(self.sim.audit.by_non_holders()),
            "initial_fill_seconds": self.initial_fill_seconds,
            **convergence_figures(self.convergence),
            "runners_leaked": self.leaked_runners,
            "request_records_leaked": self.leaked_records,
            "max_runners_excess": self.monitor.max_excess,
            "job_registrations": self.sim.registrations(),
            "controller_error_log_lines": len(self.controller.error_lines())
            + len(self.rival.error_lines()),
            "invariant_violations": self.violations.messages,
            "convergence_by_round": self.convergence_rounds,
            "faults": faults.log,
        }
