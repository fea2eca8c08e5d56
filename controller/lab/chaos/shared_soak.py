"""The shared reconcilers' soak (`poolkeeper chaos --reconcilers 3 --pools 30`): several
reconcilers (`python -m controller run`, a process each, all on one pools file) share many
small pools by their leases, against the simulator. With `--operators K`, K of them are
operators (`python -m controller operator`, as the chart runs them) reading the same pools
as RunnerPool resources from a real etcd and kube-apiserver on loopback (`make kube`).
Clients claim (always with a `requestId`), keep alive, read and release through the API
of a running reconciler drawn at random for each request. The run is a sequence of
rounds: in a round's window the clients work and one reconciler drawn at random is
SIGKILLed or SIGTERMed (the first round SIGTERMs, the second SIGKILLs, later ones SIGTERM
one time in four) and restarted 0.5-3 s later, while Nomad's faults (every class the
simulator offers, drawn by the classic soak's weights) hit the runners, nodes, event
stream and API; at the window's end every fault ends, the clients release what they hold
and pause, and the soak waits until every pool converged and the leases are balanced
again. One reconciler is down at a time.

Besides what every soak checks (soak.py: no double claim, no claim lost, `maxRunners`, no
runner purged under a live claim, every pool converged after each round and holding still,
nothing leaked at the end, no 5xx but 503 from the API, no traceback, no unexpected exit,
no runner job written by a non-holder), it checks:

* no pool is without a live holder (its lease locked by a running reconciler) for longer
  than the lock's bound, 2 x TTL + lock delay + a retry, plus a pass on a shared machine
  (TAKEOVER_BOUND), checked throughout but for the time Nomad's API is refused,
  leaderless or slow (no lease can be renewed then) and the bound after it;
* after each round the leases are balanced within BALANCE_BOUND of the window's end: every
  pool's lease held by a running reconciler, none holding more than ⌈pools / running
  reconcilers⌉; and they stay so while the pools hold still;
* every claim Nomad held was answered to its client, and no claim was given up.
"""

from __future__ import annotations

import asyncio
import math
import os
import random
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from controller.core.leases import DEFAULT_TTL_SECONDS, takeover_seconds
from controller.lab.chaos.clients import AnyApi, Clients, Habits
from controller.lab.chaos.faults import NomadFaults
from controller.lab.chaos.monitor import MONITOR_INTERVAL, Monitor
from controller.lab.chaos.processes import (
    ControllerProcess,
    OperatorProcess,
    free_port,
    kube_with_pools,
    pools_file,
)
from controller.lab.chaos.schedule import FaultEvent, nomad_faults
from controller.lab.chaos.soak import SoakRun, convergence_figures
from controller.lab.chaos.world import NODES, START_DELAY, many_pools
from controller.lab.kube import KubeCluster
from controller.lab.simulator import SimServer, Simulator, start_sim

# The reconcilers run with the default lease TTL.
TAKEOVER_BOUND: Final = takeover_seconds(DEFAULT_TTL_SECONDS) + 5.0
CONVERGENCE_BOUND: Final = TAKEOVER_BOUND + 60.0  # from a window's end
# From a window's end: a killed reconciler's locks freed, the restarted one's share taken.
BALANCE_BOUND: Final = TAKEOVER_BOUND + 2 * DEFAULT_TTL_SECONDS
INITIAL_BOUND: Final = 120.0  # the first fill and spread, every process starting at once
SIGTERM_SHARE: Final = 0.25


@dataclass(frozen=True)
class SharedProfile:
    window_seconds: float  # clients work; one reconciler is signalled and restarted in it
    signal_within: tuple[float, float]  # when, as shares of the window
    restart_after: tuple[float, float]  # seconds from the signal to the restart
    clients: int
    quiet_seconds: float  # the pools and leases must hold still after converging
    final_reserve_seconds: float  # no round starts later than this before the end
    nomad_faults_per_window: tuple[int, int]

    @staticmethod
    def for_minutes(minutes: float) -> SharedProfile:
        if minutes < 3:
            return SharedProfile(20.0, (0.2, 0.5), (0.5, 3.0), 4, 3.0, 30.0, (3, 5))
        return SharedProfile(30.0, (0.2, 0.6), (0.5, 3.0), 6, 5.0, 60.0, (4, 8))


@dataclass(frozen=True)
class PlannedSignal:
    at: float  # seconds into the round's window
    reconciler: int
    kind: str  # "sigkill" | "sigterm"
    restart_after: float
    nomad_faults: tuple[FaultEvent, ...]  # in the same window


def signal_schedule(
    seed: int, minutes: float, reconcilers: int, profile: SharedProfile
) -> list[PlannedSignal]:
    """A signal and Nomad's faults per round, from the seed alone; a run plays those that
    fit its time."""
    rng = random.Random(seed ^ 0x5A4ED)
    fault_rng = random.Random(seed ^ 0xFA017)
    window = profile.window_seconds
    plan = []
    for index in range(math.ceil(minutes * 60 / profile.window_seconds)):
        if index < 2:
            kind = ("sigterm", "sigkill")[index]  # every run rehearses both
        else:
            kind = "sigterm" if rng.random() < SIGTERM_SHARE else "sigkill"
        plan.append(
            PlannedSignal(
                rng.uniform(*profile.signal_within) * profile.window_seconds,
                rng.randrange(reconcilers),
                kind,
                rng.uniform(*profile.restart_after),
                nomad_faults(
                    fault_rng, fault_rng.randint(*profile.nomad_faults_per_window), window
                ),
            )
        )
    return plan


async def shared_soak(
    seed: int, minutes: float, workdir: Path, reconcilers: int, pools: int, operators: int = 0
) -> dict[str, Any]:
    """One shared reconcilers' soak on a simulator (and, with operators, a kube-apiserver)
    of its own; the report."""
    kube = await kube_with_pools(workdir / "kube", many_pools(pools)) if operators else None
    try:
        sim = Simulator(nodes=list(NODES), seed=seed, start_delay=START_DELAY)
        server = await start_sim(sim, host="127.0.0.1", port=0)
        try:
            run = SharedSoak(seed, minutes, workdir, server, reconcilers, pools, operators, kube)
        except BaseException:
            await server.stop()
            raise
        return await run.run()
    finally:
        if kube is not None:
            kube.stop()


class SharedSoak(SoakRun):
    def __init__(
        self,
        seed: int,
        minutes: float,
        workdir: Path,
        server: SimServer,
        reconcilers: int,
        pools: int,
        operators: int = 0,
        kube: KubeCluster | None = None,
    ) -> None:
        super().__init__(seed, minutes, server, many_pools(pools))
        self.profile = SharedProfile.for_minutes(minutes)
        self.plan = signal_schedule(seed, minutes, reconcilers, self.profile)
        self.habits = Habits((10, 30), claim_attempts=60, wait_seconds=1)
        shared_file = pools_file(workdir, 0, self.world.pools)
        self.reconcilers: list[ControllerProcess] = []
        for index in range(reconcilers):
            name = f"reconciler-{index + 1}"
            folder = workdir / name
            folder.mkdir(parents=True, exist_ok=True)
            if index < reconcilers - operators:
                process = ControllerProcess(folder, server.url, free_port(), shared_file, name)
            else:
                assert kube is not None, "operators need a kube-apiserver"
                name = f"operator-{index + 1}"
                process = OperatorProcess(
                    folder, server.url, free_port(), kube.admin_kubeconfig, name
                )
            self.reconcilers.append(process)
        self.processes = tuple(self.reconcilers)
        self.api = AnyApi(self.reconcilers, self.violations, random.Random(seed ^ 0xA11))
        self.faults = NomadFaults(self.sim, self.world)
        self.clients = Clients(
            seed, self.habits, self.api, self.faults.hit, self.violations, self.world.pools
        )
        self.monitor = Monitor(
            self.world, self.reconcilers, self.clients, self.faults.hit, self.violations
        )
        self.load_average: list[float] = [round(x, 2) for x in os.getloadavg()]
        self.initial_fill_seconds = 0.0
        self.initial_balance_seconds: float | None = None
        self.convergence: list[float] = []
        self.rounds: list[dict[str, Any]] = []
        self.takeovers: dict[str, list[float]] = {"sigkill": [], "sigterm": []}
        # Takeovers Nomad's API was faulted in: no lease could be renewed or taken.
        self.takeovers_api_faulted: list[float] = []
        self.sigterm_exit_seconds: list[float] = []
        self.last_live_holder: dict[str, float] = {}  # pool key -> when it last had one
        self.longest_without_live_holder = 0.0

    async def run(self) -> dict[str, Any]:
        monitor = asyncio.create_task(self.monitor.run())
        watchers = [monitor]
        try:
            for process in self.reconcilers:
                await process.start()
            begun = time.monotonic()
            times = await self.wait_converged("initial fill", INITIAL_BOUND)
            self.initial_fill_seconds = max(times.values()) if times else -1.0
            self.initial_balance_seconds = await self.wait_balanced(
                "initial spread", INITIAL_BOUND, begun
            )
            watchers.append(asyncio.create_task(self.watch()))
            async with self.clients_at_work(self.profile.clients):
                for index, planned in enumerate(self.plan):
                    await self.play_round(index, planned)
                    if self.out_of_time(self.profile.final_reserve_seconds):
                        break
        finally:
            for task in watchers:
                task.cancel()
            await asyncio.gather(*watchers, return_exceptions=True)
            await self.stop()
        self.check_controllers()
        self.check_claims()
        return self.report()

    async def play_round(self, index: int, planned: PlannedSignal) -> None:
        """The window: clients at work, one reconciler signalled and restarted; then the
        clients pause, and the pools must converge and the leases be balanced again."""
        window_start = time.monotonic()
        self.clients.resume()
        faults = asyncio.create_task(self.inject(index, planned.nomad_faults, window_start))
        await asyncio.sleep(max(0.0, window_start + planned.at - time.monotonic()))
        process = self.reconcilers[planned.reconciler]
        signalled = time.monotonic()
        takeover = asyncio.create_task(self.time_takeover(planned.kind, signalled))
        if planned.kind == "sigterm":
            self.sigterm_exit_seconds.append(round(await process.terminate(), 2))
        else:
            await process.kill()
        await asyncio.sleep(max(0.0, signalled + planned.restart_after - time.monotonic()))
        await process.ensure_running()
        await asyncio.sleep(max(0.0, window_start + self.profile.window_seconds - time.monotonic()))
        faults.cancel()
        await asyncio.gather(faults, return_exceptions=True)
        await self.faults.end_all()
        await self.clients.pause()
        window_end = time.monotonic()
        what = f"round {index}"
        times = await self.wait_converged(what, CONVERGENCE_BOUND)
        balanced = await self.wait_balanced(what, BALANCE_BOUND, window_end)
        took_over = await takeover
        if times is not None:
            self.convergence.extend(times.values())
        if times is not None and balanced is not None:
            await asyncio.gather(
                self.hold_converged(self.profile.quiet_seconds, what),
                self.hold_balanced(self.profile.quiet_seconds, what),
            )
        self.rounds.append(
            {
                "round": index,
                "signal": planned.kind,
                "reconciler": process.name,
                "at": round(signalled - self.started, 1),
                "restart_after": round(planned.restart_after, 2),
                "every_pool_held_again_after": took_over,
                "converged_after_max": max(times.values()) if times else None,
                "balanced_after": balanced,
            }
        )

    async def inject(self, index: int, events: tuple[FaultEvent, ...], window_start: float) -> None:
        """Nomad's faults of a round, each at its time in the window."""
        for event in events:
            await asyncio.sleep(max(0.0, window_start + event.at - time.monotonic()))
            await self.faults.inject(event, index)

    def live_identities(self) -> set[str]:
        return {i for p in self.reconcilers if (i := p.identity()) is not None}

    def live_holders(self) -> dict[str, str]:
        """Pool key -> its lease's holder, for the pools a running reconciler holds."""
        live = self.live_identities()
        return {
            pool: holder for pool, holder in self.world.lease_holders().items() if holder in live
        }

    def unbalanced(self) -> str | None:
        """Why the leases are not balanced now, or None when they are."""
        holders = self.live_holders()
        running = len(self.live_identities())
        most = math.ceil(len(self.world.pools) / max(1, running))
        held = Counter(holders.values())
        if len(holders) < len(self.world.pools):
            return f"{len(self.world.pools) - len(holders)} pools without a live holder"
        if max(held.values()) > most:
            return f"{sorted(held.values())} leases held, more than {most} by one"
        return None

    async def wait_balanced(self, what: str, bound: float, since: float) -> float | None:
        """Seconds from `since` until the leases were balanced, or None (a violation)."""
        while (why := self.unbalanced()) is not None:
            if time.monotonic() - since > bound:
                self.violations.add(f"{what}: leases not balanced within {bound:.0f} s: {why}")
                return None
            await asyncio.sleep(0.1)
        return round(time.monotonic() - since, 2)

    async def hold_balanced(self, seconds: float, what: str) -> None:
        """Balanced leases stay so while no reconciler comes or goes."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            why = self.unbalanced()
            if why is not None:
                self.violations.add_once(
                    f"unbalanced:{what}", f"{what}: leases left their balance: {why}"
                )
            await asyncio.sleep(0.2)

    async def time_takeover(self, kind: str, signalled: float) -> float | None:
        """Seconds from the signal until every pool had a live holder again (None: not
        within TAKEOVER_BOUND; the watcher reports the pools)."""
        api_faulted = False
        while len(self.live_holders()) < len(self.world.pools):
            api_faulted = api_faulted or self.faults.api_faulted()
            if time.monotonic() - signalled > TAKEOVER_BOUND:
                return None
            await asyncio.sleep(0.05)
        seconds = round(time.monotonic() - signalled, 2)
        (self.takeovers_api_faulted if api_faulted else self.takeovers[kind]).append(seconds)
        return seconds

    async def watch(self) -> None:
        """Until cancelled: the requestIds of the claims in Nomad, and how long each pool
        has been without a live holder."""
        for pool in self.world.pools:
            self.last_live_holder[pool.key] = time.monotonic()
        while True:
            self.note_claimed_request_ids()
            now = time.monotonic()
            # No lease is renewed while the API is faulted: the bound runs from its end.
            held = set(self.live_holders())
            if self.faults.api_faulted():
                held = {pool.key for pool in self.world.pools}
            for pool in self.world.pools:
                if pool.key in held:
                    self.last_live_holder[pool.key] = now
                    continue
                without = now - self.last_live_holder[pool.key]
                self.longest_without_live_holder = max(self.longest_without_live_holder, without)
                if without > TAKEOVER_BOUND:
                    self.violations.add_once(
                        f"unheld:{pool.key}:{self.last_live_holder[pool.key]}",
                        f"pool {pool.key} without a live holder for more than "
                        f"{TAKEOVER_BOUND:.1f} s",
                    )
            await asyncio.sleep(MONITOR_INTERVAL)

    def operators(self) -> int:
        return sum(isinstance(p, OperatorProcess) for p in self.reconcilers)

    def check_claims(self) -> None:
        for request_id in sorted(self.never_answered()):
            self.violations.add(f"claim of request {request_id} was never answered")
        if self.clients.stats.claims_given_up:
            self.violations.add(f"{self.clients.stats.claims_given_up} claims given up")

    def report(self) -> dict[str, Any]:
        stats = self.clients.stats
        writes = self.sim.audit.writes
        signals = Counter(r["signal"] for r in self.rounds)
        balanced = [r["balanced_after"] for r in self.rounds if r["balanced_after"] is not None]
        return {
            "variant": "shared-reconcilers",
            "seed": self.seed,
            "minutes": self.minutes,
            "command": (
                f"poolkeeper chaos --reconcilers {len(self.reconcilers)} "
                f"--pools {len(self.world.pools)} --minutes {self.minutes:g} --seed {self.seed}"
                + (f" --operators {self.operators()}" if self.operators() else "")
            ),
            "duration_seconds": round(time.monotonic() - self.started, 1),
            "load_average_at_start": self.load_average,
            "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
            "reconcilers": len(self.reconcilers),
            "operators": self.operators(),
            "pools": len(self.world.pools),
            "idle_runners_target": sum(p.idle for p in self.world.pools),
            "clients": self.profile.clients,
            "lease_ttl_seconds": DEFAULT_TTL_SECONDS,
            "takeover_bound_seconds": round(TAKEOVER_BOUND, 1),
            "rounds": len(self.rounds),
            "sigkills": signals["sigkill"],
            "sigterms": signals["sigterm"],
            "reconciler_starts": sum(len(p.identities) for p in self.reconcilers),
            "initial_fill_seconds": self.initial_fill_seconds,
            "initial_balance_seconds": self.initial_balance_seconds,
            "sigterm_exit_seconds_max": max(self.sigterm_exit_seconds, default=None),
            "sigterm_every_pool_held_again_seconds": self.takeovers["sigterm"],
            "sigkill_every_pool_held_again_seconds": self.takeovers["sigkill"],
            "every_pool_held_again_in_api_faults_seconds": self.takeovers_api_faulted,
            "pool_without_live_holder_seconds_max": round(self.longest_without_live_holder, 2),
            "balanced_after_round_seconds_max": max(balanced, default=None),
            **convergence_figures(self.convergence),
            **stats.figures(),
            "unavailable_answers": stats.unavailable,
            "claims_never_answered": len(self.never_answered()),
            "claims_given_up": stats.claims_given_up,
            "runners_leaked": self.leaked_runners,
            "request_records_leaked": self.leaked_records,
            "records_left": self.records_left,
            "runner_writes": len(writes),
            "runner_writers": len({w.writer for w in writes}),
            "runner_writes_by_non_holders": len(self.sim.audit.by_non_holders()),
            "max_runners_excess": self.monitor.max_excess,
            "job_registrations": self.sim.registrations(),
            "controller_error_log_lines": sum(len(p.error_lines()) for p in self.reconcilers),
            "faults_injected": dict(sorted(self.faults.injected.items())),
            "invariant_violations": self.violations.messages,
            "convergence_by_round": self.rounds,
            "faults": self.faults.log,
        }
