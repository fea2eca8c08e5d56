"""`poolkeeper bench [--quick] [--json FILE]`: the benchmarks of docs/performance.md.

Every section runs against a fresh Nomad simulator in a child process (so the simulated
Nomad does not share the controller's event loop or its CPU accounting), on loopback.
The controller under test runs in this process; sequential claims come from this process
too (interleaved with the bare writes they are compared with), concurrent claims from a
child process, as real clients are other processes. Sections:

1. reconcile scaling: 1, 10, 100 pools; wall and CPU time of a steady-state pass, Nomad
   requests per pass, the ratio of the pass to the bare list calls it makes (the I/O
   floor), sequential claim latency at that size, and the process RSS;
2. claim path: sequential claims (with and without requestId) interleaved with bare
   Variables writes, then 1, 10 and 50 concurrent clients;
3. refill latency: claim to registration of the replacement job, resync 30 s;
4. over-creation under churn: registrations ÷ runners needed while claims and releases
   run as fast as they can;
5. convergence after a node holding ~30% of the runners goes down;
6. demand: a class day replayed with a fixed pool, a demand-sized one and an oracle
   (bench_demand.py);
7. executions and files: first byte, waited executions and uploads through poolkeeper,
   each against the same through a bare exec (bench_exec.py).

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
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from aiohttp import web
from rich.console import Console
from rich.table import Table

from controller.api.app import create_app
from controller.api.auth import TokenSet
from controller.claims.service import ClaimService
from controller.core.claims import CLAIMS_PREFIX
from controller.core.status import count
from controller.core.views import RunnerState
from controller.engine.engine import Engine
from controller.errors import EXIT_FAILURE, EXIT_OK
from controller.executions.files import FileOperations
from controller.executions.manager import ExecutionManager
from controller.metrics import Metrics
from controller.model import RunnerPool
from controller.nomad.client import NomadClient
from controller.nomad.config import NomadConfig
from controller.nomad.exec import NomadExec
from controller.standalone import Controller, Settings

log = logging.getLogger(__name__)

NAMESPACE = "default"
RUNNER_CPU = 10  # MHz per runner: small, so the simulated nodes hold thousands
RUNNER_MEMORY_MB = 16
BIG_NODE_CPU = 10_000_000

Result = dict[str, float]


@dataclass(frozen=True)
class Sizes:
    """How much each section does; `QUICK` for the smoke test, `FULL` for the docs."""

    reconcile_pools: tuple[int, ...]
    runners_per_pool: int
    reconcile_passes: int
    reconcile_claims: int
    sequential_claims: int
    concurrent_claims: int
    concurrency: tuple[int, ...]
    claim_pool_idle: int
    refill_claims: int
    refill_idle: int
    churn_claims: int
    churn_pools: int
    churn_idle: int
    churn_clients: int
    node_loss_pools: int
    node_loss_idle: int


FULL = Sizes(
    reconcile_pools=(1, 10, 100),
    runners_per_pool=100,
    reconcile_passes=15,
    reconcile_claims=30,
    sequential_claims=300,
    concurrent_claims=1000,
    concurrency=(1, 10, 50),
    claim_pool_idle=1000,
    refill_claims=100,
    refill_idle=20,
    churn_claims=1000,
    churn_pools=4,
    churn_idle=50,
    churn_clients=50,
    node_loss_pools=10,
    node_loss_idle=100,
)

QUICK = Sizes(
    reconcile_pools=(1, 10, 100),
    runners_per_pool=10,
    reconcile_passes=5,
    reconcile_claims=5,
    sequential_claims=40,
    concurrent_claims=100,
    concurrency=(1, 10, 50),
    claim_pool_idle=150,
    refill_claims=15,
    refill_idle=20,
    churn_claims=150,
    churn_pools=2,
    churn_idle=20,
    churn_clients=20,
    node_loss_pools=5,
    node_loss_idle=20,
)


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


def rss_mb() -> float:
    """Resident set size of this process, from /proc (0 where there is no /proc)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
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
    )
    server = await start_sim(sim)
    conn.send(server.url)

    def wait_for_parent() -> None:
        with contextlib.suppress(EOFError, OSError):
            conn.recv()

    await asyncio.get_running_loop().run_in_executor(None, wait_for_parent)
    await server.stop()


class SimProcess:
    """A simulator serving on a free loopback port in a child process."""

    def __init__(self, options: SimOptions) -> None:
        context = multiprocessing.get_context("spawn")
        self._conn, child = context.Pipe()
        self._process = context.Process(
            target=_sim_child, args=(child, options), daemon=True, name="bench-sim"
        )
        self._child_conn = child
        self.url = ""
        self._http: aiohttp.ClientSession | None = None

    async def start(self) -> str:
        self._process.start()
        self._child_conn.close()
        loop = asyncio.get_running_loop()
        ready = await loop.run_in_executor(None, self._conn.poll, 30.0)
        if not ready:
            raise RuntimeError("the simulator process did not start")
        self.url = str(self._conn.recv())
        self._http = aiohttp.ClientSession()
        return self.url

    async def stop(self) -> None:
        if self._http is not None:
            await self._http.close()
        with contextlib.suppress(OSError, BrokenPipeError):
            self._conn.send("stop")
        await asyncio.get_running_loop().run_in_executor(None, self._process.join, 10.0)
        if self._process.is_alive():
            self._process.kill()
            self._process.join()
        self._conn.close()

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


async def release_claimed(controller: Controller, within: float) -> None:
    """Release every claimed runner and wait until the pools are back to their declared
    size, so each claim level starts from the same pool rather than one that grew by
    the claims of the levels before. Claims the engine has not observed yet show up in
    a later pass, so the scan repeats until nothing is left."""
    engine = controller.engine
    gate = asyncio.Semaphore(20)
    released: set[str] = set()

    async def release(runner_id: str) -> None:
        async with gate:
            await controller.claims.release(runner_id)

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
    the benchmark asks, so each one can be timed and its Nomad requests counted."""

    def __init__(self, sim_url: str, surge: int) -> None:
        self.requests: Counter[str] = Counter()
        self.metrics = Metrics()
        config = NomadConfig.from_env({"NOMAD_ADDR": sim_url})
        self.client = NomadClient(config, on_request=self._count)
        self.engine = Engine(self.client, self.metrics, resync_seconds=3600.0, surge=surge)
        self.claims = ClaimService(self.engine)
        self.exec = NomadExec(config)
        self.executions = ExecutionManager(
            self.engine, self.claims, self.client, self.exec, self.metrics
        )
        self._runner: web.AppRunner | None = None
        self.url = ""

    def _count(self, endpoint: str, code: str) -> None:
        self.requests[endpoint] += 1
        self.metrics.observe_nomad_request(endpoint, code)

    async def start(self, documents: list[dict[str, Any]]) -> None:
        for document in documents:
            self.engine.upsert_pool(RunnerPool.parse_document(document))
        app = create_app(
            self.engine,
            self.metrics,
            TokenSet(None),
            self.engine.ready,
            self.claims,
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
        if self._runner is not None:
            await self._runner.cleanup()
        await self.exec.close()
        await self.client.close()


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


def claim_items(i: int) -> dict[str, str]:
    """Items shaped like a claim's, for the bare writes."""
    return {
        "pool": f"{NAMESPACE}/bench",
        "allocationId": f"{i:08x}-0000-0000-0000-000000000000",
        "claimedAt": "2026-11-30T09:00:00Z",
        "expiresAt": "2026-11-30T09:05:00Z",
        "inactivityTimeoutSeconds": "300",
        "requestId": "",
        "state": "claimed",
        "allocationRestarts": "0",
        "nodeName": "bench-node-1",
    }


# ---- 1. reconcile scaling -------------------------------------------------------------


async def bench_reconcile(sizes: Sizes, out: Result, say: Callable[[str], None]) -> None:
    out["memory.rss_mb_baseline"] = rss_mb()
    ratios: list[float] = []
    requests: list[float] = []
    for pools in sizes.reconcile_pools:
        per_pool = sizes.runners_per_pool
        say(f"reconcile: {pools} pools x {per_pool} runners")
        async with simulator(SimOptions(start_delay=0.01)) as sim:
            bench = PassiveController(sim.url, surge=per_pool)
            try:
                docs = [pool_doc(f"p{i:03d}", per_pool, per_pool * 2) for i in range(pools)]
                await bench.start(docs)
                await fill(bench.engine, within=120 + pools * per_pool / 50)
                row = await time_passes(bench, sizes.reconcile_passes)
                if pools * per_pool >= max(sizes.reconcile_pools) * per_pool:
                    out["memory.rss_mb_10k_runners"] = rss_mb()
                row.update(await passive_claims(bench, "p000", sizes.reconcile_claims))
            finally:
                await bench.stop()
        row["runners"] = float(pools * per_pool)
        for name, value in row.items():
            out[f"reconcile.pools_{pools}.{name}"] = value
        ratios.append(row["floor_ratio"])
        requests.append(row["requests_per_pass"])
    first, last = sizes.reconcile_pools[0], sizes.reconcile_pools[-1]
    out["reconcile.floor_ratio"] = max(ratios)
    out["reconcile.requests_per_pass"] = max(requests)
    out["reconcile.requests_per_pass_1_pool"] = out[f"reconcile.pools_{first}.requests_per_pass"]
    out["reconcile.requests_per_pass_100_pools"] = out[f"reconcile.pools_{last}.requests_per_pass"]


async def fill(engine: Engine, within: float) -> None:
    deadline = time.monotonic() + within
    while True:
        await engine.reconcile_namespace(NAMESPACE)
        if all_full(engine):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"pools not filled after {within:g} s: {idle_counts(engine)}")
        await asyncio.sleep(0.02)


async def time_passes(bench: PassiveController, passes: int) -> Result:
    """Steady-state passes interleaved with the bare list calls a pass makes (the floor)."""
    client = bench.client
    walls: list[float] = []
    cpus: list[float] = []
    floors: list[float] = []
    floor_cpus: list[float] = []
    per_pass: list[int] = []
    await bench.engine.reconcile_namespace(NAMESPACE)  # warm caches and connections

    async def floor() -> None:
        cpu, started = time.process_time(), time.perf_counter()
        await asyncio.gather(
            client.list_jobs(NAMESPACE),
            client.list_allocations(NAMESPACE),
            client.list_variables(CLAIMS_PREFIX, NAMESPACE),
            client.list_nodes(),
        )
        floors.append(time.perf_counter() - started)
        floor_cpus.append(time.process_time() - cpu)

    async def one_pass() -> None:
        before = sum(bench.requests.values())
        cpu, started = time.process_time(), time.perf_counter()
        result = await bench.engine.reconcile_namespace(NAMESPACE)
        walls.append(time.perf_counter() - started)
        cpus.append(time.process_time() - cpu)
        per_pass.append(sum(bench.requests.values()) - before)
        if result.created or result.destroyed or result.errors:
            raise RuntimeError(f"a steady-state pass acted: {result}")

    for i in range(passes):
        # Alternate the order so neither side always runs on a warmer cache.
        steps = (floor, one_pass) if i % 2 == 0 else (one_pass, floor)
        for step in steps:
            await step()
    wall, floor_wall = statistics.median(walls), statistics.median(floors)
    return {
        "pass_ms": ms(wall),
        "pass_cpu_ms": ms(statistics.median(cpus)),
        "floor_ms": ms(floor_wall),
        "floor_cpu_ms": ms(statistics.median(floor_cpus)),
        "floor_ratio": round(wall / floor_wall, 3),
        "requests_per_pass": float(max(per_pass)),
    }


async def passive_claims(bench: PassiveController, pool: str, n: int) -> Result:
    """Sequential HTTP claims against a controller of this size (no passes in between)."""
    latencies: list[float] = []
    async with aiohttp.ClientSession() as http:
        await claim(http, bench.url, pool)  # warm the connection
        for _ in range(n):
            seconds, status, body = await claim(http, bench.url, pool)
            if status != 201:
                raise RuntimeError(f"claim failed: {status} {body}")
            latencies.append(seconds)
    return {
        "claim_p50_ms": ms(percentile(latencies, 50)),
        "claim_p99_ms": ms(percentile(latencies, 99)),
    }


# ---- 2. claim path ----------------------------------------------------------------------


async def bench_claims(sizes: Sizes, out: Result, say: Callable[[str], None]) -> None:
    idle = sizes.claim_pool_idle
    total = 3 * sizes.sequential_claims + sum(sizes.concurrent_claims for _ in sizes.concurrency)
    doc = pool_doc("claims", idle, idle + total + 10)
    async with simulator() as sim, standalone(sim.url, [doc], resync_seconds=10.0) as controller:
        engine = controller.engine
        say(f"claims: filling a pool of {idle}")
        await wait_for(lambda: all_full(engine), 120, "the claims pool to fill")
        async with aiohttp.ClientSession() as http:
            await sequential_claims(sizes, controller, sim, http, out)
            for clients in sizes.concurrency:
                await release_claimed(controller, 120)
                say(f"claims: {clients} concurrent clients")
                row = await load_process(controller.url, "claims", clients, sizes.concurrent_claims)
                for name, value in row.items():
                    out[f"claim.clients_{clients}.{name}"] = value
    out["claim.claims_per_second"] = out[
        f"claim.clients_{max(sizes.concurrency)}.claims_per_second"
    ]


async def sequential_claims(
    sizes: Sizes,
    controller: Controller,
    sim: SimProcess,
    http: aiohttp.ClientSession,
    out: Result,
) -> None:
    """Claims interleaved with bare writes, so both see the same simulator state."""
    client = controller.client
    plain: list[float] = []
    with_id: list[float] = []
    bare: list[float] = []
    bare_pair: list[float] = []
    raw: list[float] = []
    round_trip: list[float] = []
    n = sizes.sequential_claims

    async def bare_write(path: str, i: int) -> float:
        started = time.perf_counter()
        await client.put_variable(path, claim_items(i), NAMESPACE, cas=0)
        return time.perf_counter() - started

    async def raw_write(path: str, i: int) -> float:
        body = {"Namespace": NAMESPACE, "Path": path, "Items": claim_items(i)}
        started = time.perf_counter()
        async with http.put(f"{sim.url}/v1/var/{path}?namespace={NAMESPACE}&cas=0", json=body) as r:
            await r.read()
            r.raise_for_status()
        return time.perf_counter() - started

    async def healthz() -> float:
        started = time.perf_counter()
        async with http.get(f"{controller.url}/healthz") as r:
            await r.read()
        return time.perf_counter() - started

    # Warm every path once (connections, executor threads).
    await claim(http, controller.url, "claims")
    await bare_write("bench/warm/bare", 0)
    await raw_write("bench/warm/raw", 0)
    for i in range(n):
        seconds, status, body = await claim(http, controller.url, "claims")
        if status != 201:
            raise RuntimeError(f"claim failed: {status} {body}")
        plain.append(seconds)
        bare.append(await bare_write(f"bench/bare/{i}", i))
        raw.append(await raw_write(f"bench/raw/{i}", i))
        round_trip.append(await healthz())
    for i in range(n):
        seconds, status, body = await claim(
            http, controller.url, "claims", {"requestId": f"bench-{i}"}
        )
        if status != 201:
            raise RuntimeError(f"claim failed: {status} {body}")
        with_id.append(seconds)
        bare_pair.append(
            await bare_write(f"bench/pair/{i}/a", i) + await bare_write(f"bench/pair/{i}/b", i)
        )
    await controller.claims.drain()
    out["claim.p50_ms"] = ms(percentile(plain, 50))
    out["claim.p99_ms"] = ms(percentile(plain, 99))
    out["claim.request_id.p50_ms"] = ms(percentile(with_id, 50))
    out["claim.request_id.p99_ms"] = ms(percentile(with_id, 99))
    out["claim.bare_write.p50_ms"] = ms(percentile(bare, 50))
    out["claim.bare_write.p99_ms"] = ms(percentile(bare, 99))
    out["claim.bare_write_pair.p99_ms"] = ms(percentile(bare_pair, 99))
    out["claim.raw_write.p50_ms"] = ms(percentile(raw, 50))
    out["claim.raw_write.p99_ms"] = ms(percentile(raw, 99))
    out["claim.http_round_trip.p50_ms"] = ms(percentile(round_trip, 50))
    out["claim.http_round_trip.p99_ms"] = ms(percentile(round_trip, 99))
    out["claim.p99_ratio"] = round(percentile(plain, 99) / percentile(bare, 99), 3)
    out["claim.p99_ratio_request_id"] = round(
        percentile(with_id, 99) / percentile(bare_pair, 99), 3
    )
    out["claim.p99_ratio_raw_write"] = round(percentile(plain, 99) / percentile(raw, 99), 3)
    out["claim.p50_ratio"] = round(percentile(plain, 50) / percentile(bare, 50), 3)


def _load_child(conn: Connection, url: str, pool: str, clients: int, total: int) -> None:
    """Child process: the concurrent clients, so they do not share the controller's CPU."""

    async def run() -> Result:
        async with aiohttp.ClientSession() as http:
            await claim(http, url, pool)  # one warm-up claim, not counted
            return await concurrent_claims(http, url, pool, clients, total)

    conn.send(asyncio.run(run()))
    conn.close()


async def load_process(url: str, pool: str, clients: int, total: int) -> Result:
    """Run `clients` concurrent claimers for `total` claims in a child process."""
    context = multiprocessing.get_context("spawn")
    parent, child = context.Pipe()
    process = context.Process(
        target=_load_child, args=(child, url, pool, clients, total), daemon=True
    )
    process.start()
    child.close()
    loop = asyncio.get_running_loop()
    try:
        if not await loop.run_in_executor(None, parent.poll, 300.0):
            raise RuntimeError("the load process did not finish")
        result: Result = parent.recv()
    except EOFError:
        raise RuntimeError("the load process died") from None
    finally:
        await loop.run_in_executor(None, process.join, 10.0)
        parent.close()
    return result


async def concurrent_claims(
    http: aiohttp.ClientSession, url: str, pool: str, clients: int, total: int
) -> Result:
    latencies: list[float] = []
    errors = empty = 0
    remaining = total

    async def worker() -> None:
        nonlocal remaining, errors, empty
        while remaining > 0:
            remaining -= 1
            seconds, status, body = await claim(http, url, pool)
            if status == 201:
                latencies.append(seconds)
            elif isinstance(body, dict) and (body.get("error") or {}).get("code") == "PoolEmpty":
                empty += 1  # claims outran the refill: an answer, not a failure
            else:
                errors += 1

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(clients)))
    elapsed = time.perf_counter() - started
    return {
        "p50_ms": ms(percentile(latencies, 50)),
        "p99_ms": ms(percentile(latencies, 99)),
        "claims_per_second": round(len(latencies) / elapsed, 1),
        "pool_empty": float(empty),
        "errors": float(errors),
    }


# ---- 3. refill latency --------------------------------------------------------------------


async def bench_refill(sizes: Sizes, out: Result, say: Callable[[str], None]) -> None:
    idle, n = sizes.refill_idle, sizes.refill_claims
    doc = pool_doc("refill", idle, idle + n + 10)
    say(f"refill: {n} claims on a pool of {idle}, resync 30 s")
    async with simulator() as sim, standalone(sim.url, [doc], resync_seconds=30.0) as controller:
        engine = controller.engine
        await wait_for(lambda: all_full(engine), 60, "the refill pool to fill")
        latencies: list[float] = []
        async with aiohttp.ClientSession() as http:

            async def job_times() -> dict[str, int]:
                url = f"{sim.url}/v1/jobs?namespace={NAMESPACE}&prefix=refill-"
                async with http.get(url) as response:
                    return {j["ID"]: int(j["SubmitTime"]) for j in await response.json()}

            for _ in range(n):
                await wait_for(lambda: all_full(engine), 30, "the refill pool to be full")
                known = await job_times()
                claimed_ns = time.time_ns()
                _, status, body = await claim(http, controller.url, "refill")
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
    out["refill.p50_ms"] = ms(percentile(latencies, 50))
    out["refill.p99_ms"] = ms(percentile(latencies, 99))
    out["refill.max_ms"] = ms(max(latencies))
    out["refill.samples"] = float(len(latencies))


# ---- 4. over-creation under churn -----------------------------------------------------


async def bench_churn(sizes: Sizes, out: Result, say: Callable[[str], None]) -> None:
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


async def bench_node_loss(sizes: Sizes, out: Result, say: Callable[[str], None]) -> None:
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

REQUIRED_KEYS = (
    "claim.p50_ms",
    "claim.p99_ms",
    "claim.p99_ratio",
    "claim.p99_ratio_request_id",
    "claim.claims_per_second",
    "refill.p99_ms",
    "over_creation.ratio",
    "reconcile.floor_ratio",
    "reconcile.requests_per_pass",
    "reconcile.requests_per_pass_1_pool",
    "reconcile.requests_per_pass_100_pools",
    "convergence.node_loss_seconds",
    "memory.rss_mb_10k_runners",
    "demand.instant_claims.fixed",
    "demand.instant_claims.demand",
    "demand.instant_claims.oracle",
    "demand.idle_runner_minutes_ratio",
    "exec.first_byte_ratio",
    "exec.waited_p99_ms",
    "files.upload_mb_per_s_ratio",
)

# (key, goal text, check) for the table's goal column.
GOALS: tuple[tuple[str, str, Callable[[float], bool]], ...] = (
    ("claim.p99_ratio", "<= 1.5", lambda v: v <= 1.5),
    ("claim.p99_ratio_request_id", "<= 1.5", lambda v: v <= 1.5),
    ("claim.claims_per_second", ">= 500", lambda v: v >= 500),
    ("refill.p99_ms", "< 100", lambda v: v < 100),
    ("over_creation.ratio", "1.00", lambda v: v <= 1.0),
    ("reconcile.floor_ratio", "<= 1.5", lambda v: v <= 1.5),
    ("demand.instant_claims.demand", ">= 0.95", lambda v: v >= 0.95),
    ("demand.idle_runner_minutes_ratio", "<= 1.5", lambda v: v <= 1.5),
    ("exec.first_byte_ratio", "<= 1.3", lambda v: v <= 1.3),
    ("files.upload_mb_per_s_ratio", ">= 0.8", lambda v: v >= 0.8),
)


async def run_all(sizes: Sizes, say: Callable[[str], None]) -> Result:
    from controller.lab.bench_demand import bench_demand  # they build on this module
    from controller.lab.bench_exec import bench_exec

    out: Result = {"bench.quick": 1.0 if sizes is QUICK else 0.0}
    started = time.perf_counter()
    sections: list[Callable[[Sizes, Result, Callable[[str], None]], Awaitable[None]]] = [
        bench_reconcile,
        bench_claims,
        bench_refill,
        bench_churn,
        bench_node_loss,
        bench_demand,
        bench_exec,
    ]
    for section in sections:
        await section(sizes, out, say)
    equal = (
        out["reconcile.requests_per_pass_1_pool"] == out["reconcile.requests_per_pass_100_pools"]
    )
    out["reconcile.requests_independent_of_pools"] = 1.0 if equal else 0.0
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

    def say(text: str) -> None:
        console.log(text)

    try:
        result = asyncio.run(run_all(sizes, say))
    except RuntimeError as error:
        console.print(f"[red]poolkeeper bench failed:[/] {error}")
        return EXIT_FAILURE
    missing = [key for key in REQUIRED_KEYS if key not in result]
    console.print(render(result))
    if args.json_file:
        Path(args.json_file).write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    if missing:
        console.print(f"[red]missing keys:[/] {', '.join(missing)}")
        return EXIT_FAILURE
    return EXIT_OK


if __name__ == "__main__":  # pragma: no cover - `poolkeeper bench` is the entry point
    import sys

    sys.exit(main(argparse.Namespace(quick="--quick" in sys.argv, json_file=None)))
