"""The `demand` section of `poolkeeper bench`: a class day replayed on the simulator.

Three pools of `idleRunners: 5` run side by side in one controller, and every learner of
the day claims from each of them at the same moment (in an order drawn afresh each time):
- `fixed`: idleRunners alone;
- `demand`: with `spec.demand` (maxIdleRunners 60, the default window and measured cover);
- `oracle`: idleRunners raised by the benchmark itself before each burst to what the
  burst needs (the demand formula with the true rate and start time), the burst starting
  once the oracle holds them, and lowered again when the burst's last claim arrives.

The day (`FULL_DAY`): a quiet hour (a claim every five minutes), a burst of 200 claims in
60 s, 30 quiet minutes, a second burst, a quiet hour. Runners start in START_SECONDS. The
quiet stretches are stepped through a minute at a time: passes run until one changes
nothing with no runner starting, then the simulator's clock and the controller's jump a
minute. The bursts run in real time: the controller's own latency (its passes, the claim
API, the learners' HTTP round trips) is real time, and on a sped-up clock it would count
that many times over, against a start time that does not; that costs a pool reacting to
claims more than one that knew in advance (docs/performance.md). `--quick` replays a
shorter day (`QUICK_DAY`) four times faster: a smoke test of the section, not its figures.

A learner claims without waiting; a 503 counts as not instant and is retried with
`waitSeconds`. Then it releases the runner. Idle runner-minutes integrate each pool's
claimable runners over the day's time (a jumped minute counts at the count held before
the jump).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from controller.core.status import count
from controller.core.views import RunnerState
from controller.lab import bench
from controller.nomad.config import NomadConfig
from controller.standalone import Controller, Settings

POOLS = ("fixed", "demand", "oracle")
FLOOR = 5
MAX_RUNNERS = 400
START_SECONDS = 2.0
QUIET_CLAIM_EVERY_MINUTES = 5
RETRY_WAIT_SECONDS = 30
SEED = 16
# Real seconds a quiet step may take to settle (a refill starts in START_SECONDS ÷ speed).
SETTLE_SECONDS = 30.0


@dataclass(frozen=True)
class ClassDay:
    burst_claims: int
    burst_seconds: float
    quiet_minutes: tuple[int, int, int]  # before the first burst, between the bursts, after
    speed: float  # day seconds per real second

    @property
    def claims_per_second(self) -> float:
        return self.burst_claims / self.burst_seconds


FULL_DAY = ClassDay(200, 60.0, (60, 30, 60), speed=1.0)
QUICK_DAY = ClassDay(20, 6.0, (3, 3, 3), speed=4.0)


class DayClock:
    """The controller's clock: real time sped up `speed` times from `origin_ns`, moved
    forward by the quiet-minute jumps; the simulator's WallClock does the same."""

    def __init__(self, origin_ns: int, speed: float) -> None:
        self.origin_ns = origin_ns
        self.speed = speed
        self.offset_ns = 0

    def now_ns(self) -> int:
        real = time.time_ns()
        return real + int((self.speed - 1.0) * (real - self.origin_ns)) + self.offset_ns

    def __call__(self) -> datetime:
        return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=self.now_ns() // 1000)

    def seconds(self) -> float:
        """Day seconds since the origin."""
        return (self.now_ns() - self.origin_ns) / 1e9

    def advance(self, seconds: float) -> None:
        self.offset_ns += int(seconds * 1e9)


def pool_documents(oracle_idle: int) -> list[dict[str, Any]]:
    documents = []
    for name in POOLS:
        document = bench.pool_doc(name, oracle_idle if name == "oracle" else FLOOR, MAX_RUNNERS)
        if name == "demand":
            document["spec"]["demand"] = {"maxIdleRunners": 60}
        documents.append(document)
    return documents


def oracle_burst_idle(day: ClassDay) -> int:
    """What a burst needs, known in advance: its claims over the cover time the demand
    pool measures (the start time plus half), with the same Poisson margin."""
    expected = day.claims_per_second * START_SECONDS * 1.5
    return max(FLOOR, math.ceil(expected + math.sqrt(expected)))


@dataclass
class Tally:
    claims: dict[str, int] = field(default_factory=lambda: dict.fromkeys(POOLS, 0))
    instant: dict[str, int] = field(default_factory=lambda: dict.fromkeys(POOLS, 0))
    failed: dict[str, int] = field(default_factory=lambda: dict.fromkeys(POOLS, 0))
    idle_minutes: dict[str, float] = field(default_factory=lambda: dict.fromkeys(POOLS, 0.0))
    peak_target: int = 0

    def add_idle(self, idle: dict[str, int], seconds: float) -> None:
        for name, value in idle.items():
            self.idle_minutes[name] += value * seconds / 60


@dataclass
class Day:
    day: ClassDay
    controller: Controller
    sim: bench.SimProcess
    clock: DayClock
    pools_file: Path
    tally: Tally = field(default_factory=Tally)
    http: aiohttp.ClientSession = field(default_factory=aiohttp.ClientSession)
    # Which pool a learner asks first: drawn apart from the arrivals, which stay those
    # of SEED whatever else changes.
    order: random.Random = field(default_factory=lambda: random.Random(SEED + 1))

    def idle(self) -> dict[str, int]:
        engine = self.controller.engine
        return {
            name: count(engine.pools[f"{bench.NAMESPACE}/{name}"].runners).idle for name in POOLS
        }

    def _starting(self) -> bool:
        return any(
            runner.state is RunnerState.STARTING
            for view in self.controller.engine.pools.values()
            for runner in view.runners
        )

    async def settle(self) -> None:
        """Passes until one creates and destroys nothing and no runner is starting, so
        every refill has started before the clocks jump: a start spanning a jump would
        be measured (by the demand pool) a minute long."""
        deadline = time.monotonic() + SETTLE_SECONDS
        while True:
            done = await self.controller.engine.reconcile_namespace(bench.NAMESPACE)
            if done.created == 0 and done.destroyed == 0 and not self._starting():
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the pools did not settle within {SETTLE_SECONDS:g} s")
            await asyncio.sleep(0.05)

    async def learner(self, name: str) -> None:
        url = f"{self.controller.url}/v1/pools/{bench.NAMESPACE}/{name}/claims"
        self.tally.claims[name] += 1
        async with self.http.post(url, json={}) as response:
            body = await response.json(content_type=None)
            status = response.status
        if status == 201:
            self.tally.instant[name] += 1
        else:
            async with self.http.post(url, json={"waitSeconds": RETRY_WAIT_SECONDS}) as response:
                body = await response.json(content_type=None)
                status = response.status
        if status != 201:
            self.tally.failed[name] += 1
            return
        async with self.http.delete(f"{self.controller.url}/v1/runners/{body['runnerId']}") as r:
            await r.read()

    async def learners(self) -> None:
        """One learner claims from every pool at once."""
        order = self.order.sample(POOLS, len(POOLS))
        await asyncio.gather(*(self.learner(name) for name in order))

    async def quiet(self, minutes: int) -> None:
        """Step through quiet minutes: a claim on each pool every few minutes, the pools
        settle, both clocks jump a minute."""
        for minute in range(minutes):
            if minute % QUIET_CLAIM_EVERY_MINUTES == 0:
                await self.learners()
            await self.settle()
            self.note_target()
            self.tally.add_idle(self.idle(), 60)
            await self.sim.act("advance_clock", seconds=60)
            self.clock.advance(60)
        await self.settle()

    async def burst(self, arrivals: list[float]) -> None:
        sampling = asyncio.create_task(self.sample())
        oracle_idle = oracle_burst_idle(self.day)
        await self.set_oracle(oracle_idle)
        await bench.wait_for(
            lambda: self.idle()["oracle"] >= oracle_idle, SETTLE_SECONDS, "the oracle's buffer"
        )
        start = self.clock.seconds()
        learners = []
        for at in arrivals:
            await asyncio.sleep(max(0.0, start + at - self.clock.seconds()) / self.clock.speed)
            learners.append(asyncio.create_task(self.learners()))
        await self.set_oracle(FLOOR)
        await asyncio.gather(*learners)
        sampling.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sampling
        await self.settle()

    async def sample(self) -> None:
        """Integrate idle runners over the burst's (continuous) time."""
        last, idle = self.clock.seconds(), self.idle()
        while True:
            await asyncio.sleep(0.05)
            now = self.clock.seconds()
            self.tally.add_idle(idle, now - last)
            last, idle = now, self.idle()
            self.note_target()

    def note_target(self) -> None:
        view = self.controller.engine.pools[f"{bench.NAMESPACE}/demand"]
        self.tally.peak_target = max(self.tally.peak_target, view.idle_target.idle_runners)

    async def set_oracle(self, idle: int) -> None:
        self.pools_file.write_text(yaml.safe_dump_all(pool_documents(idle), sort_keys=False))
        await self.controller.reload()
        self.controller.engine.hint_namespace(bench.NAMESPACE)

    async def close(self) -> None:
        await self.http.close()


@contextlib.asynccontextmanager
async def day_controller(sim_url: str, clock: DayClock) -> AsyncIterator[tuple[Controller, Path]]:
    with tempfile.TemporaryDirectory(prefix="poolkeeper-bench-demand-") as folder:
        pools = Path(folder) / "pools.yaml"
        pools.write_text(yaml.safe_dump_all(pool_documents(FLOOR), sort_keys=False))
        settings = Settings(
            pools_path=pools, listen=("127.0.0.1", 0), resync_seconds=2.0, insecure_no_auth=True
        )
        controller = Controller(
            settings, NomadConfig.from_env({"NOMAD_ADDR": sim_url}), clock=clock
        )
        await controller.start()
        try:
            yield controller, pools
        finally:
            await controller.stop()


async def bench_demand(run: bench.Run) -> None:
    out, say = run.out, run.say
    day = QUICK_DAY if run.sizes is bench.QUICK else FULL_DAY
    say(
        f"demand: a class day ({day.burst_claims} claims in {day.burst_seconds:g} s, twice), "
        f"{day.speed:g}x"
    )
    origin = time.time_ns()
    clock = DayClock(origin, day.speed)
    options = bench.SimOptions(
        start_delay=START_SECONDS / day.speed, clock_speed=day.speed, clock_origin_ns=origin
    )
    rng = random.Random(SEED)
    bursts = [
        sorted(rng.uniform(0, day.burst_seconds) for _ in range(day.burst_claims)) for _ in range(2)
    ]
    async with (
        bench.simulator(options) as sim,
        day_controller(sim.url, clock) as (controller, pools),
    ):
        replay = Day(day, controller, sim, clock, pools)
        try:
            await bench.wait_for(lambda: bench.all_full(controller.engine), 60, "the pools to fill")
            before, between, after = day.quiet_minutes
            await replay.quiet(before)
            await replay.burst(bursts[0])
            await replay.quiet(between)
            await replay.burst(bursts[1])
            await replay.quiet(after)
        finally:
            await replay.close()
    tally = replay.tally
    for name in POOLS:
        out[f"demand.instant_claims.{name}"] = round(tally.instant[name] / tally.claims[name], 4)
        out[f"demand.idle_runner_minutes.{name}"] = round(tally.idle_minutes[name], 1)
        out[f"demand.failed_claims.{name}"] = float(tally.failed[name])
    out["demand.claims_per_pool"] = float(tally.claims["demand"])
    out["demand.peak_target"] = float(tally.peak_target)
    out["demand.oracle_burst_idle"] = float(oracle_burst_idle(day))
    out["demand.idle_runner_minutes_ratio"] = round(
        tally.idle_minutes["demand"] / tally.idle_minutes["oracle"], 3
    )
    out["demand.speed"] = day.speed
