"""`poolkeeper bench [--quick] [--json FILE] [--section NAME]...`: the benchmarks of
docs/performance.md.

Every section runs against a fresh Nomad simulator in a child process (so the simulated
Nomad does not share a controller's event loop or its CPU accounting), on loopback. The
claim path is measured in the shape it ships in: an API-tier replica (`poolkeeper api`,
a child process) answering claims while a reconciler in a process of its own owns the
pools (bench_tier.py), and beside it a process that does both (`poolkeeper run` alone,
here in this process). Clients are child processes too (bench_clients.py), as real
clients are other processes. Sections (`--section` runs some of them):

1. `scale`: reconcile scaling at 1, 10, 100 and 500 pools: wall and CPU time of a
   steady-state pass, Nomad requests per pass, the ratio of the pass to the bare list
   calls it makes (the I/O floor), the process RSS, and from 1,000 runners on claims
   against their floor while passes over all the runners run back to back
   (bench_scale.py);
2. `claims`: sequential claims (with and without requestId) interleaved with their floor,
   then concurrent clients against as many bare writers, through the API tier, two
   replicas behind HAProxy, and one process (bench_claims.py);
3. `refill`: claim to registration of the replacement job, resync 30 s, in one process
   and through the API tier;
4. `churn`: registrations ÷ runners needed while claims and releases run as fast as they
   can;
5. `node-loss`: convergence after a node holding ~30% of the runners goes down;
6. `demand`: a class day replayed with a fixed pool, a demand-sized one and an oracle
   (bench_demand.py);
7. `exec`: first byte, waited executions and uploads through poolkeeper, each against the
   same through a bare exec (bench_exec.py);
8. `shared`: the pass time of each of three reconcilers sharing pools by lease against
   one reconciler alone on the same pools (bench_shared.py); not in `--quick` unless
   `--section shared` names it;
9. `stdin`: the memory of `poolkeeper run` and of an API replica while a client floods
   an execution's stdin, on both APIs (bench_stdin.py); not in `--quick` unless
   `--section stdin` names it.

The JSON is one flat object of dotted keys with numeric values.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import math
import multiprocessing
import os
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp
import yaml
from aiohttp import web
from rich.console import Console
from rich.table import Table

from controller.api.app import create_app
from controller.api.auth import TokenSet
from controller.claims.runners import RunnerClaims
from controller.claims.service import ClaimService
from controller.core.status import count
from controller.core.views import RunnerState
from controller.engine.directory import EngineDirectory
from controller.engine.engine import Engine
from controller.errors import EXIT_FAILURE, EXIT_OK, UsageError
from controller.executions.files import FileOperations
from controller.executions.manager import ExecutionManager
from controller.metrics import Metrics
from controller.model import RunnerPool
from controller.nomad.client import NomadClient
from controller.nomad.config import NomadConfig
from controller.nomad.exec import NomadExec
from controller.standalone import Controller, Settings

if TYPE_CHECKING:
    from controller.lab.bench_clients import Clients

log = logging.getLogger(__name__)

NAMESPACE = "default"
RUNNER_CPU = 10  # MHz per runner: small, so the simulated nodes hold thousands
RUNNER_MEMORY_MB = 16
BIG_NODE_CPU = 10_000_000

Result = dict[str, float]


@dataclass(frozen=True)
class Sizes:
    """How much each section does; `QUICK` for the smoke test, `FULL` for the docs."""

    repetitions: int  # of every measured ratio: the median is reported, and the spread
    reconcile_pools: tuple[int, ...]
    runners_per_pool: int
    reconcile_passes: int  # per repetition
    scale_rounds: int  # claims (and floor samples) per repetition at each size
    claim_pool_idle: int
    claim_rounds: int  # per repetition: a claim and a floor sample, with and without requestId
    claim_block: int  # rounds between releasing what they claimed
    concurrent_claims: int
    concurrency: tuple[int, ...]
    refill_claims: int
    refill_idle: int
    churn_claims: int
    churn_pools: int
    churn_idle: int
    churn_clients: int
    node_loss_pools: int
    node_loss_idle: int
    shared_pools: int  # reconcilers sharing pools by lease (bench_shared.py)
    shared_runners_per_pool: int
    shared_window: float  # seconds of each measured window
    shared_resync_seconds: float


FULL = Sizes(
    repetitions=3,
    reconcile_pools=(1, 10, 100, 500),
    runners_per_pool=100,
    reconcile_passes=3,
    scale_rounds=1000,
    claim_pool_idle=1000,
    claim_rounds=1000,
    claim_block=250,
    # Fewer than the pool holds: a burst that empties it ends in a claim answered at once
    # (`PoolEmpty`) through one replica, but waiting for the refill through two (one of
    # them still offered the other's runners), and the CPU windows then compared a
    # burst with a burst plus a refill.
    concurrent_claims=990,
    concurrency=(1, 10, 50),
    refill_claims=100,
    refill_idle=20,
    churn_claims=1000,
    churn_pools=4,
    churn_idle=50,
    churn_clients=50,
    node_loss_pools=10,
    node_loss_idle=100,
    shared_pools=30,
    shared_runners_per_pool=1000,
    shared_window=60.0,  # a reconciler's whole listing (once a minute) in every window
    shared_resync_seconds=5.0,
)

QUICK = Sizes(
    repetitions=2,
    reconcile_pools=(1, 10, 100),
    runners_per_pool=10,
    reconcile_passes=2,
    scale_rounds=20,
    claim_pool_idle=150,
    claim_rounds=40,
    claim_block=40,
    concurrent_claims=100,
    concurrency=(50,),
    refill_claims=10,
    refill_idle=20,
    churn_claims=150,
    churn_pools=2,
    churn_idle=20,
    churn_clients=20,
    node_loss_pools=5,
    node_loss_idle=20,
    shared_pools=3,
    shared_runners_per_pool=5,
    shared_window=1.5,
    shared_resync_seconds=0.5,
)


@dataclass
class Run:
    """What every section is given: the sizes, where its numbers go, how it says what it
    does, and the client processes it measures with (bench_clients.py)."""

    sizes: Sizes
    out: Result
    say: Callable[[str], None]
    clients: Clients


# ---- numbers -------------------------------------------------------------------------


def percentile(values: Iterable[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100); 0 for no values."""
    ordered = sorted(values)
    if not ordered:
        return 0.0
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def ms(seconds: float) -> float:
    return round(seconds * 1000, 3)


def ratio(numerator: float, denominator: float) -> float:
    return round(numerator / denominator, 3) if denominator > 0 else 0.0


def repeated(out: Result, key: str, values: Sequence[float], *, spread: bool = True) -> None:
    """The median of a number measured in every repetition, under `key`; with `spread`,
    also the lowest and highest and their difference (`key.min`, `.max`, `.spread`)."""
    out[key] = round(statistics.median(values), 3)
    if spread:
        out[f"{key}.min"] = round(min(values), 3)
        out[f"{key}.max"] = round(max(values), 3)
        out[f"{key}.spread"] = round(max(values) - min(values), 3)


def cpu_seconds(pid: int) -> float:
    """User and system CPU time a process has used so far, from /proc (0 where there is
    no /proc, or no such process)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int | str = "self") -> float:
    """Resident set size of a process (this one), from /proc (0 where there is no /proc
    or no such process)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return 0.0


# ---- the simulator in a child process ------------------------------------------------


@dataclass(frozen=True)
class SimOptions:
    nodes: tuple[str, ...] = ("bench-node-1", "bench-node-2", "bench-node-3")
    node_cpu: int = BIG_NODE_CPU
    start_delay: float = 0.05
    algorithm: str = "spread"
    seed: int = 7
    # The simulator's reported time, sped up from an origin (bench_demand.py).
    clock_speed: float = 1.0
    clock_origin_ns: int = 0
    exec_mode: str = "none"  # "local": execs run as real processes (bench_exec.py)
    # Every write answered this much later, as a Raft commit would be.
    write_latency_ms: float = 0.0


# The modules the children run, imported once by the fork server: a child forked from it
# starts in milliseconds, where a spawned one takes about a second of imports.
CHILD_MODULES = [
    "controller.lab.bench_clients",
    "controller.lab.bench_tier",
    "controller.lab.simulator",
    "controller.api_tier",
    "controller.standalone",
]


def child_context() -> multiprocessing.context.ForkServerContext:
    """Children are forked from a fork server: a fresh interpreter with the bench's
    modules imported and nothing running (no event loop, no threads), started with the
    first child."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(CHILD_MODULES)
    return context


class Child:
    """A child process that talks to this one over a pipe; `stop` (or this process
    going away) ends it."""

    def __init__(self, target: Callable[..., None], *args: Any, name: str) -> None:
        context = child_context()
        self._conn, child = context.Pipe()
        self._process = context.Process(target=target, args=(child, *args), daemon=True, name=name)
        self._process.start()
        child.close()

    @property
    def pid(self) -> int:
        return self._process.pid or 0

    async def receive(self, within: float) -> Any:
        loop = asyncio.get_running_loop()
        if not await loop.run_in_executor(None, self._conn.poll, within):
            raise RuntimeError(f"{self._process.name} did not answer within {within:g} s")
        try:
            return self._conn.recv()
        except EOFError:
            raise RuntimeError(f"{self._process.name} died") from None

    def send(self, message: Any) -> None:
        self._conn.send(message)

    async def stop(self) -> None:
        with contextlib.suppress(OSError, BrokenPipeError):
            self._conn.send(None)
        await asyncio.get_running_loop().run_in_executor(None, self._process.join, 10.0)
        if self._process.is_alive():
            self._process.kill()
            self._process.join()
        self._conn.close()


def wait_for_parent(conn: Connection) -> None:
    """Block until the parent sends anything or goes away (a child's last step)."""
    with contextlib.suppress(EOFError, OSError):
        conn.recv()


def receive(conn: Connection) -> Any:
    """The parent's next command; None once it said stop or went away."""
    try:
        return conn.recv()
    except (EOFError, OSError):
        return None


def _sim_child(conn: Connection, options: SimOptions) -> None:
    """Child process: serve a simulator until the parent says stop (or goes away)."""
    logging.basicConfig(level=logging.WARNING)
    asyncio.run(_sim_serve(conn, options))


async def _sim_serve(conn: Connection, options: SimOptions) -> None:
    from controller.lab.simulator import Simulator, start_sim
    from controller.lab.simulator.util import WALL_CLOCK

    WALL_CLOCK.speed, WALL_CLOCK.origin_ns = options.clock_speed, options.clock_origin_ns

    sim = Simulator(
        nodes=list(options.nodes),
        seed=options.seed,
        start_delay=options.start_delay,
        node_cpu=options.node_cpu,
        node_memory_mb=100_000_000,
        algorithm=options.algorithm,
        event_buffer_size=10_000,
        exec_mode=options.exec_mode,
        write_latency_ms=options.write_latency_ms,
    )
    server = await start_sim(sim)
    conn.send(server.url)
    await asyncio.get_running_loop().run_in_executor(None, wait_for_parent, conn)
    await server.stop()


class SimProcess:
    """A simulator serving on a free loopback port in a child process."""

    def __init__(self, options: SimOptions) -> None:
        self._options = options
        self._child: Child | None = None
        self.pid = 0
        self.url = ""
        self._http: aiohttp.ClientSession | None = None

    async def start(self) -> str:
        self._child = Child(_sim_child, self._options, name="bench-sim")
        self.pid = self._child.pid
        self.url = str(await self._child.receive(30.0))
        self._http = aiohttp.ClientSession()
        return self.url

    async def stop(self) -> None:
        if self._http is not None:
            await self._http.close()
        if self._child is not None:
            await self._child.stop()

    async def get(self, path: str) -> Any:
        assert self._http is not None
        async with self._http.get(self.url + path) as response:
            response.raise_for_status()
            return await response.json()

    async def act(self, name: str, **kwargs: Any) -> Any:
        assert self._http is not None
        async with self._http.post(f"{self.url}/_sim/{name}", json=kwargs) as response:
            response.raise_for_status()
            return (await response.json())["Result"]

    async def registrations(self) -> int:
        """Registrations that created a new job (the simulator's counter)."""
        state = await self.get("/_sim/state")
        return int(state["Counters"].get("jobs_created", 0))


@contextlib.asynccontextmanager
async def simulator(options: SimOptions | None = None) -> Any:
    sim = SimProcess(options or SimOptions())
    await sim.start()
    try:
        yield sim
    finally:
        await sim.stop()


# ---- pools and controllers ------------------------------------------------------------


def pool_doc(name: str, idle: int, max_runners: int) -> dict[str, Any]:
    return {
        "apiVersion": "poolkeeper.dev/v1alpha1",
        "kind": "RunnerPool",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "idleRunners": idle,
            "maxRunners": max_runners,
            "runner": {"image": "bench/runner:1", "cpu": RUNNER_CPU, "memoryMB": RUNNER_MEMORY_MB},
        },
    }


def idle_counts(engine: Engine) -> dict[str, tuple[int, int, int]]:
    """Pool key -> (idle, starting, desired idle), as the last pass saw them."""
    out = {}
    for managed in engine.pools.values():
        counts = count(managed.runners)
        out[managed.key] = (counts.idle, counts.starting, managed.policy.desired_idle)
    return out


def all_full(engine: Engine) -> bool:
    return all(
        idle == desired and starting == 0
        for idle, starting, desired in idle_counts(engine).values()
    )


async def wait_for(check: Callable[[], bool], within: float, what: str) -> None:
    deadline = time.monotonic() + within
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {within:g} s waiting for {what}")
        # Not tighter: a check counts every runner, and it shares the controller's loop.
        await asyncio.sleep(0.05)


async def collect_garbage(http: aiohttp.ClientSession, sim_url: str) -> None:
    """Nomad's forced garbage collection (`PUT /v1/system/gc`): the allocations and
    evaluations the runners released so far left terminal are reaped, so that each
    measured window starts from the state its size says. A Nomad collects them within
    the hour (`eval_gc_threshold`); a bench releases hours' worth in minutes, and every
    pass and the simulator would read more of them window by window."""
    async with http.put(f"{sim_url}/v1/system/gc") as response:
        response.raise_for_status()


async def release_claimed(controller: Controller | PassiveController, within: float) -> None:
    """Release every claimed runner and wait until the pools are back to their declared
    size, so each claim level starts from the same pool rather than one that grew by
    the claims of the levels before. Claims the engine has not observed yet show up in
    a later pass, so the scan repeats until nothing is left."""
    engine = controller.engine
    gate = asyncio.Semaphore(20)
    released: set[str] = set()

    async def release(runner_id: str) -> None:
        async with gate:
            await controller.runners.release(runner_id)

    def settled() -> bool:
        return all_full(engine) and all(
            count(managed.runners).total == managed.policy.desired_idle
            for managed in engine.pools.values()
        )

    deadline = time.monotonic() + within
    while not settled():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {within:g} s releasing the claimed runners")
        claimed = [
            runner.id
            for managed in engine.pools.values()
            for runner in managed.runners
            if runner.state is RunnerState.CLAIMED and runner.id not in released
        ]
        released.update(claimed)
        await asyncio.gather(*(release(runner_id) for runner_id in claimed))
        await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def standalone(
    sim_url: str, documents: list[dict[str, Any]], *, resync_seconds: float
) -> Any:
    """The real standalone controller (loops, event watcher, HTTP API), in this process."""
    with tempfile.TemporaryDirectory(prefix="poolkeeper-bench-") as folder:
        pools = Path(folder) / "pools.yaml"
        pools.write_text(yaml.safe_dump_all(documents, sort_keys=False))
        settings = Settings(
            pools_path=pools,
            listen=("127.0.0.1", 0),
            resync_seconds=resync_seconds,
            insecure_no_auth=True,
        )
        controller = Controller(settings, NomadConfig.from_env({"NOMAD_ADDR": sim_url}))
        await controller.start()
        try:
            yield controller
        finally:
            await controller.stop()


class PassiveController:
    """Engine, claims and HTTP API without loops or event watcher: passes run only when
    the benchmark asks, so each one can be timed and its Nomad requests counted. With an
    `identity` the engine holds the pools' leases and publishes the catalog for the API
    tier, as a reconciler of a deployment does (bench_tier.py)."""

    def __init__(self, sim_url: str, surge: int, identity: str | None = None) -> None:
        self.requests: Counter[str] = Counter()
        self.metrics = Metrics()
        config = NomadConfig.from_env({"NOMAD_ADDR": sim_url})
        self.client = NomadClient(config, on_request=self._count)
        self.engine = Engine(
            self.client,
            self.metrics,
            resync_seconds=3600.0,
            surge=surge,
            home_namespace=NAMESPACE,
            identity=identity,
        )
        self.directory = EngineDirectory(self.engine)
        self.claims = ClaimService(self.directory, self.engine.store, self.metrics)
        self.runners = RunnerClaims(self.directory, self.engine.store, self.metrics)
        self.exec = NomadExec(config)
        self.executions = ExecutionManager(
            self.directory, self.runners, self.client, self.exec, self.metrics
        )
        self._runner: web.AppRunner | None = None
        self.url = ""

    def rss_mb(self) -> float:
        return rss_mb()

    def _count(self, endpoint: str, code: str) -> None:
        self.requests[endpoint] += 1
        self.metrics.observe_nomad_request(endpoint, code)

    async def start(self, documents: list[dict[str, Any]]) -> None:
        for document in documents:
            self.engine.upsert_pool(RunnerPool.parse_document(document))
        if self.engine.leases is not None:
            # Kept between the passes the benchmark asks for, as a reconciler's are: a
            # lease whose acquisition was lost is taken again once Nomad frees it.
            self.engine.leases.start()
        app = create_app(
            self.directory,
            self.metrics,
            TokenSet(None),
            self.engine.readiness,
            self.claims,
            self.runners,
            self.executions,
            FileOperations(self.executions.activity, self.exec, self.metrics),
        )
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"

    async def stop(self) -> None:
        await self.claims.drain()
        if self.engine.leases is not None:
            await self.engine.leases.stop(release=True)
        if self._runner is not None:
            await self._runner.cleanup()
        await self.exec.close()
        await self.client.close()


async def fill(passive: PassiveController, within: float) -> None:
    """Passes until every pool holds its idle runners (and, with leases, until this
    process holds every pool's lease, so every pool is in the catalog)."""
    engine = passive.engine
    leases = engine.leases
    deadline = time.monotonic() + within
    while True:
        await engine.reconcile_namespace(NAMESPACE)
        if all_full(engine) and (leases is None or all(leases.holds(k) for k in engine.pools)):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"pools not filled after {within:g} s: {idle_counts(engine)}")
        await asyncio.sleep(0.02)


# ---- HTTP clients of the claim API -----------------------------------------------------


async def claim(
    http: aiohttp.ClientSession, url: str, pool: str, body: dict[str, Any] | None = None
) -> tuple[float, int, Any]:
    """One claim over HTTP: (seconds, status, body)."""
    started = time.perf_counter()
    async with http.post(f"{url}/v1/pools/{NAMESPACE}/{pool}/claims", json=body or {}) as response:
        payload = await response.json(content_type=None)
        status = response.status
    return time.perf_counter() - started, status, payload


# ---- 3. refill latency --------------------------------------------------------------------


async def bench_refill(run: Run) -> None:
    """Claim to the replacement's registration, in a process that reconciles and serves
    (`refill.*`) and through the API tier, whose claims reach a separate reconciler by
    the doorbell (`refill.api_tier.*`)."""
    from controller.lab.bench_tier import ReconcilerOptions, holds_idle, tiers

    idle, n = run.sizes.refill_idle, run.sizes.refill_claims
    doc = pool_doc("refill", idle, idle + n + 10)
    run.say(f"refill: {n} claims on a pool of {idle}, resync 30 s")
    async with simulator() as sim, standalone(sim.url, [doc], resync_seconds=30.0) as controller:
        engine = controller.engine

        async def full() -> None:
            await wait_for(lambda: all_full(engine), 60, "the refill pool to be full")

        latencies = await refills(sim, controller.url, n, full)
    record_refills(run.out, "refill", latencies)
    run.say(f"refill: {n} claims through the API tier, a reconciler apart, resync 30 s")
    options = ReconcilerOptions((doc,), passive=False, resync_seconds=30.0)
    async with simulator() as sim, tiers(sim.url, options) as tier:

        async def offered() -> None:
            await tier.offered(tier.url, holds_idle)

        latencies = await refills(sim, tier.url, n, offered)
    record_refills(run.out, "refill.api_tier", latencies)


async def refills(
    sim: SimProcess, url: str, n: int, full: Callable[[], Awaitable[None]]
) -> list[float]:
    """`n` claims from the pool `refill` at `url`, one at a time with the pool full before
    each: seconds from just before the claim is sent to the `SubmitTime` of the job that
    replaces it (read from the simulator, same clock)."""
    latencies: list[float] = []
    async with aiohttp.ClientSession() as http:

        async def job_times() -> dict[str, int]:
            url = f"{sim.url}/v1/jobs?namespace={NAMESPACE}&prefix=refill-"
            async with http.get(url) as response:
                return {j["ID"]: int(j["SubmitTime"]) for j in await response.json()}

        for _ in range(n):
            await full()
            known = await job_times()
            claimed_ns = time.time_ns()
            _, status, body = await claim(http, url, "refill")
            if status != 201:
                raise RuntimeError(f"claim failed: {status} {body}")
            deadline = time.monotonic() + 10
            while True:
                new = {k: v for k, v in (await job_times()).items() if k not in known}
                if new:
                    latencies.append((min(new.values()) - claimed_ns) / 1e9)
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError("no replacement was registered within 10 s")
                await asyncio.sleep(0.002)
    return latencies


def record_refills(out: Result, prefix: str, latencies: list[float]) -> None:
    out[f"{prefix}.p50_ms"] = ms(percentile(latencies, 50))
    out[f"{prefix}.p99_ms"] = ms(percentile(latencies, 99))
    out[f"{prefix}.max_ms"] = ms(max(latencies))
    out[f"{prefix}.samples"] = float(len(latencies))


# ---- 4. over-creation under churn -----------------------------------------------------


async def bench_churn(run: Run) -> None:
    sizes, out, say = run.sizes, run.out, run.say
    names = [f"churn{i}" for i in range(sizes.churn_pools)]
    idle = sizes.churn_idle
    docs = [pool_doc(name, idle, idle * 4 + sizes.churn_clients) for name in names]
    say(f"churn: {sizes.churn_claims} claims and releases, {sizes.churn_clients} clients")
    async with simulator() as sim, standalone(sim.url, docs, resync_seconds=10.0) as controller:
        engine = controller.engine
        await wait_for(lambda: all_full(engine), 60, "the churn pools to fill")
        fill_registrations = await sim.registrations()
        claimed = 0
        empty = 0
        remaining = sizes.churn_claims
        async with aiohttp.ClientSession() as http:

            async def worker(index: int) -> None:
                nonlocal remaining, claimed, empty
                pool = names[index % len(names)]
                while remaining > 0:
                    remaining -= 1
                    _, status, body = await claim(http, controller.url, pool, {"waitSeconds": 10})
                    if status != 201:
                        empty += 1
                        continue
                    claimed += 1
                    async with http.delete(f"{controller.url}/v1/runners/{body['runnerId']}") as r:
                        await r.read()

            started = time.perf_counter()
            await asyncio.gather(*(worker(i) for i in range(sizes.churn_clients)))
            elapsed = time.perf_counter() - started
        await wait_for(lambda: all_full(engine), 60, "the churn pools to refill")
        # One more resync's worth of passes: anything created late would show now.
        for _ in range(3):
            await engine.reconcile_namespace(NAMESPACE)
            await asyncio.sleep(0.2)
        registrations = await sim.registrations()
    needed = claimed + idle * len(names)
    out["over_creation.ratio"] = round(registrations / needed, 4)
    out["over_creation.registrations"] = float(registrations)
    out["over_creation.fill_registrations"] = float(fill_registrations)
    out["over_creation.needed"] = float(needed)
    out["over_creation.claims"] = float(claimed)
    out["over_creation.failed_claims"] = float(empty)
    out["over_creation.claims_per_second"] = round(claimed / elapsed, 1)


# ---- 5. convergence after a node loss ----------------------------------------------------


async def bench_node_loss(run: Run) -> None:
    sizes, out, say = run.sizes, run.out, run.say
    pools, idle = sizes.node_loss_pools, sizes.node_loss_idle
    runners = pools * idle
    # Five nodes that hold 30% of the runners each; binpack fills them one by one, so the
    # fullest node holds 30% and the other four have room for the replacements.
    per_node = math.ceil(runners * 0.3)
    options = SimOptions(
        nodes=tuple(f"bench-node-{i}" for i in range(1, 6)),
        node_cpu=per_node * RUNNER_CPU,
        algorithm="binpack",
    )
    docs = [pool_doc(f"nl{i}", idle, idle * 3) for i in range(pools)]
    say(f"node loss: {runners} runners, one node of {per_node} goes down")
    async with (
        simulator(options) as sim,
        standalone(sim.url, docs, resync_seconds=10.0) as controller,
    ):
        engine = controller.engine
        await wait_for(lambda: all_full(engine), 120, "the node-loss pools to fill")
        allocs = await sim.get(f"/v1/allocations?namespace={NAMESPACE}&task_states=false")
        on_node = Counter(
            a["NodeName"]
            for a in allocs
            if a["ClientStatus"] == "running" and a["DesiredStatus"] == "run"
        )
        node, held = on_node.most_common(1)[0]
        dipped = False

        def converged() -> bool:
            # Only passes that began after Nomad took the node down count: an older
            # observation would still show the lost runners as idle.
            nonlocal dipped
            if any(m.observation_started < down_at for m in engine.pools.values()):
                return False
            if all_full(engine):
                return True
            dipped = True
            return False

        lost_at = time.monotonic()
        await sim.act("node_down", node_name=node)
        down_at = time.monotonic()
        await wait_for(converged, 120, "the pools to recover from the node loss")
        seconds = time.monotonic() - lost_at
        replaced = await sim.get(f"/v1/allocations?namespace={NAMESPACE}&task_states=false")
        lost = sum(1 for a in replaced if a["ClientStatus"] == "lost")
    out["convergence.node_loss_seconds"] = round(seconds, 3)
    out["convergence.runners"] = float(runners)
    out["convergence.lost_runners"] = float(held)
    out["convergence.lost_fraction"] = round(held / runners, 3)
    out["convergence.lost_allocations"] = float(lost)
    out["convergence.dip_observed"] = 1.0 if dipped else 0.0


# ---- the command -------------------------------------------------------------------------

# Measured against the API tier, a reconciler apart (bench_tier.py), unless `embedded`.
RATIO_KEYS = (
    "claim.p50_ratio",
    "claim.p99_ratio",
    "claim.p99_ratio_request_id",
    "claim.tail_ratio",
    "claim.p50_ratio_10k_runners",
    "claim.p99_ratio_10k_runners",
    "claim.tail_ratio_10k_runners",
    "claim.throughput_ratio",
    "claim.cpu_ratio",
    "claim.cas_conflicts_per_claim",
    "claim.write_latency_2ms.p99_ratio",
    "claim.embedded.p50_ratio",
    "claim.embedded.p99_ratio",
    "claim.embedded.p50_ratio_10k_runners",
    "claim.embedded.p99_ratio_10k_runners",
    "claim.embedded.throughput_ratio",
    "reconcile.floor_ratio",
)
REQUIRED_KEYS = (
    *RATIO_KEYS,
    *(f"{key}.spread" for key in RATIO_KEYS),
    "claim.p50_ms",
    "claim.p99_ms",
    "claim.floor.p50_ms",
    "claim.floor.p99_ms",
    "claim.claims_per_second",
    "claim.bare_creates_per_second",
    "claim.cpu_ms_per_claim.api",
    "claim.cpu_ms_per_create.simulator",
    "claim.cpu_ms_per_relay.relay",
    "claim.cpu_busy_claim",
    "claim.balanced.haproxy",
    "refill.p99_ms",
    "refill.api_tier.p99_ms",
    "over_creation.ratio",
    "reconcile.requests_per_pass",
    "reconcile.requests_per_pass_1_pool",
    "reconcile.requests_per_pass_most_pools",
    "reconcile.requests_independent_of_pools",
    "convergence.node_loss_seconds",
    "memory.kb_per_runner",
    "demand.instant_claims.fixed",
    "demand.instant_claims.demand",
    "demand.instant_claims.oracle",
    "demand.idle_runner_minutes_ratio",
    "exec.first_byte_ratio",
    "exec.waited_p99_ms",
    "files.upload_mb_per_s_ratio",
)
# Sections `--quick` leaves out unless `--section` names them, with the keys they write:
# the leases of reconcilers started one after another take most of a TTL to spread; a
# stdin flood takes half a minute of both cores.
FULL_ONLY_SECTIONS: dict[str, tuple[str, ...]] = {
    "shared": ("shared.pass_ratio",),
    "stdin": ("stdin.rss_growth_max_mb", "stdin.rss_growth_many_mb"),
}

# (key, goal text, check) for the table's goal column.
GOALS: tuple[tuple[str, str, Callable[[float], bool]], ...] = (
    ("claim.p50_ratio", "<= 1.25", lambda v: v <= 1.25),
    ("claim.p99_ratio", "<= 1.5", lambda v: v <= 1.5),
    ("claim.p99_ratio_request_id", "<= 1.5", lambda v: v <= 1.5),
    ("claim.p50_ratio_10k_runners", "<= 1.25", lambda v: v <= 1.25),
    ("claim.p99_ratio_10k_runners", "<= 1.5", lambda v: v <= 1.5),
    ("claim.cpu_ratio", "<= 1.5", lambda v: v <= 1.5),
    ("claim.balanced.cpu_ratio", "<= 1.2", lambda v: v <= 1.2),
    ("claim.balanced.cas_conflicts_per_claim", "<= 0.02", lambda v: v <= 0.02),
    ("refill.p99_ms", "< 100", lambda v: v < 100),
    ("refill.api_tier.p99_ms", "< 100", lambda v: v < 100),
    ("over_creation.ratio", "1.00", lambda v: v <= 1.0),
    ("reconcile.floor_ratio", "<= 1.5", lambda v: v <= 1.5),
    ("reconcile.requests_independent_of_pools", "1 (yes)", lambda v: v == 1),
    ("memory.kb_per_runner", "<= 12", lambda v: v <= 12),
    ("demand.instant_claims.demand", ">= 0.95", lambda v: v >= 0.95),
    ("demand.idle_runner_minutes_ratio", "<= 1.5", lambda v: v <= 1.5),
    ("exec.first_byte_ratio", "<= 1.3", lambda v: v <= 1.3),
    ("files.upload_mb_per_s_ratio", ">= 0.8", lambda v: v >= 0.8),
    ("shared.pass_ratio", "<= 0.5", lambda v: v <= 0.5),
    ("stdin.rss_growth_max_mb", "<= 16", lambda v: v <= 16),
)

# The sections, in the order they run (`--section NAME` runs some of them).
SECTION_NAMES = (
    "scale",
    "claims",
    "refill",
    "churn",
    "node-loss",
    "demand",
    "exec",
    "shared",
    "stdin",
)


def sections() -> dict[str, Callable[[Run], Awaitable[None]]]:
    # The sections build on this module.
    from controller.lab.bench_claims import bench_claims
    from controller.lab.bench_demand import bench_demand
    from controller.lab.bench_exec import bench_exec
    from controller.lab.bench_scale import bench_scale
    from controller.lab.bench_shared import bench_shared
    from controller.lab.bench_stdin import bench_stdin

    found: list[Callable[[Run], Awaitable[None]]] = [
        bench_scale,
        bench_claims,
        bench_refill,
        bench_churn,
        bench_node_loss,
        bench_demand,
        bench_exec,
        bench_shared,
        bench_stdin,
    ]
    return dict(zip(SECTION_NAMES, found, strict=True))


async def run_all(sizes: Sizes, say: Callable[[str], None], only: Sequence[str] = ()) -> Result:
    from controller.lab.bench_clients import clients

    out: Result = {"bench.quick": 1.0 if sizes is QUICK else 0.0}
    started = time.perf_counter()
    async with clients() as shared:
        run = Run(sizes, out, say, shared)
        for name, section in sections().items():
            if name in only or (not only and not (sizes is QUICK and name in FULL_ONLY_SECTIONS)):
                section_started = time.perf_counter()
                await section(run)
                out[f"bench.seconds.{name}"] = round(time.perf_counter() - section_started, 1)
    out["bench.seconds"] = round(time.perf_counter() - started, 1)
    return out


def render(result: Result) -> Table:
    goals = {key: (text, check) for key, text, check in GOALS}
    table = Table(title="poolkeeper bench", expand=False)
    table.add_column("key", no_wrap=True)
    table.add_column("value", justify="right")
    table.add_column("goal")
    for key in sorted(result):
        value = result[key]
        goal = ""
        if key in goals:
            text, check = goals[key]
            goal = f"{text} {'[green]met[/]' if check(value) else '[red]missed[/]'}"
        table.add_row(key, f"{value:g}", goal)
    return table


def main(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    console = Console()
    sizes = QUICK if args.quick else FULL
    only = list(getattr(args, "sections", None) or [])
    unknown = [name for name in only if name not in SECTION_NAMES]
    if unknown:
        raise UsageError(f"--section {unknown[0]!r} is not one of {', '.join(SECTION_NAMES)}")

    def say(text: str) -> None:
        console.log(text)

    try:
        result = asyncio.run(run_all(sizes, say, only))
    except RuntimeError as error:
        console.print(f"[red]poolkeeper bench failed:[/] {error}")
        return EXIT_FAILURE
    # With --section, the keys of the other sections are not there to miss.
    required = [*REQUIRED_KEYS]
    if not args.quick:
        required += [key for keys in FULL_ONLY_SECTIONS.values() for key in keys]
    missing = [] if only else [key for key in required if key not in result]
    console.print(render(result))
    if args.json_file:
        Path(args.json_file).write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    if missing:
        console.print(f"[red]missing keys:[/] {', '.join(missing)}")
        return EXIT_FAILURE
    return EXIT_OK


if __name__ == "__main__":  # pragma: no cover - `poolkeeper bench` is the entry point
    import sys

    sys.exit(main(argparse.Namespace(quick="--quick" in sys.argv, json_file=None, sections=[])))
