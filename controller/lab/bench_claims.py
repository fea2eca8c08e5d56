"""The claim path against its physical floor (the `claim.*` keys of `poolkeeper bench`).

A claim cannot avoid one HTTP round trip from its client to the controller and one Nomad
check-and-set create (two with a requestId). The floor is exactly that, made by idle
processes: a round trip to a trivial aiohttp handler served by a child process that does
nothing else, plus bare `cas=0` creates sent by the probing child with a plain aiohttp
session to the same simulator. The prober (a child process too, so neither claims nor
floor share the controller's CPU) alternates claims and floor samples, so both meet the
same simulator, the same passes and the same neighbours on the machine.

Sections: sequential claims (with and without requestId) against their floors, in
`repetitions` runs of `claim_rounds` rounds each; claims per second at 50 concurrent
clients against bare creates per second at 50 concurrent writers; and sequential claims
against a simulator that answers every write 2 ms late (a Raft commit).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import aiohttp
from aiohttp import web

from controller.lab import bench
from controller.lab.bench import NAMESPACE, Child, Result, Sizes, ms, percentile, ratio, repeated
from controller.standalone import Controller

log = logging.getLogger(__name__)

# What the trivial handler answers: about the size of a claim's answer.
FLOOR_ANSWER = b'{"runnerId": "' + b"x" * 380 + b'"}'
# The controller's default resync period (ServiceSettings), which the claims run with.
DEFAULT_RESYNC_SECONDS = 10.0
CLAIM_POOL = "claims"
WRITE_LATENCY_MS = 2.0


def claim_items(i: int) -> dict[str, str]:
    """Items shaped like a claim's, for the bare creates."""
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


async def bare_create(http: aiohttp.ClientSession, sim_url: str, path: str, i: int) -> None:
    """One `cas=0` create of a claim-sized variable, with a plain aiohttp session."""
    body = {"Namespace": NAMESPACE, "Path": path, "Items": claim_items(i)}
    params = {"namespace": NAMESPACE, "cas": "0"}
    async with http.put(f"{sim_url}/v1/var/{path}", params=params, json=body) as response:
        await response.read()
        response.raise_for_status()


@dataclass(frozen=True)
class ProbeTarget:
    """Where the prober sends what: the controller's claim URLs (claims rotate over them,
    one pool each), the trivial handler, and the simulator for the bare creates."""

    claim_urls: tuple[str, ...]
    floor_url: str
    sim_url: str


@dataclass
class Samples:
    """Seconds per sample, in the order they were taken."""

    claims: list[float]
    floors: list[float]
    request_id_claims: list[float]
    floor_pairs: list[float]

    @classmethod
    def empty(cls) -> Samples:
        return cls([], [], [], [])

    def extend(self, other: Samples) -> None:
        self.claims += other.claims
        self.floors += other.floors
        self.request_id_claims += other.request_id_claims
        self.floor_pairs += other.floor_pairs


# ---- the trivial handler, in a child process ---------------------------------------------


def _floor_child(conn: Connection) -> None:
    logging.basicConfig(level=logging.WARNING)
    asyncio.run(_floor_serve(conn))


async def _floor_serve(conn: Connection) -> None:
    async def answer(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=FLOOR_ANSWER, status=201, content_type="application/json")

    app = web.Application()
    app.router.add_post("/floor", answer)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    conn.send(f"http://127.0.0.1:{runner.addresses[0][1]}/floor")
    await asyncio.get_running_loop().run_in_executor(None, bench.wait_for_parent, conn)
    await runner.cleanup()


@contextlib.asynccontextmanager
async def floor_server() -> Any:
    """The URL of the trivial handler, served by an idle child process."""
    child = Child(_floor_child, name="bench-floor")
    try:
        yield str(await child.receive(30.0))
    finally:
        await child.stop()


# ---- the prober, in a child process -------------------------------------------------------


def _prober_child(conn: Connection, target: ProbeTarget) -> None:
    logging.basicConfig(level=logging.WARNING)
    asyncio.run(_probe_serve(conn, target))


async def _probe_serve(conn: Connection, target: ProbeTarget) -> None:
    loop = asyncio.get_running_loop()
    async with aiohttp.ClientSession() as http:
        probe = _Probe(http, target)
        await probe.warm()
        conn.send("ready")
        while True:
            command = await loop.run_in_executor(None, _receive, conn)
            if command is None:
                return
            first, count, request_ids = command
            conn.send(await probe.rounds(first, count, request_ids))


def _receive(conn: Connection) -> Any:
    try:
        return conn.recv()
    except (EOFError, OSError):
        return None


class _Probe:
    def __init__(self, http: aiohttp.ClientSession, target: ProbeTarget) -> None:
        self.http = http
        self.target = target
        self.created = 0

    async def claim(self, url: str, body: dict[str, Any]) -> float:
        started = time.perf_counter()
        async with self.http.post(url, json=body) as response:
            payload = await response.read()
            if response.status != 201:
                raise RuntimeError(f"claim failed: {response.status} {payload[:300]!r}")
        return time.perf_counter() - started

    async def floor(self, creates: int, body: dict[str, Any]) -> float:
        """A round trip to the trivial handler with the claim's body, then `creates`
        bare creates."""
        started = time.perf_counter()
        async with self.http.post(self.target.floor_url, json=body) as response:
            await response.read()
        for _ in range(creates):
            self.created += 1
            path = f"bench/floor/{self.created}"
            await bare_create(self.http, self.target.sim_url, path, self.created)
        return time.perf_counter() - started

    async def warm(self) -> None:
        """Open the connections once (nothing is counted)."""
        await self.floor(1, {})
        await self.claim(self.target.claim_urls[0], {})

    async def rounds(self, first: int, count: int, request_ids: bool) -> Samples:
        """`count` rounds of a claim and a floor sample (and, with `request_ids`, a claim
        with a requestId and a two-create floor sample), in an order flipped every round
        so that neither side always comes first."""
        samples = Samples.empty()
        urls = self.target.claim_urls
        for i in range(first, first + count):
            url = urls[i % len(urls)]
            with_id = {"requestId": f"bench-{i}"}
            steps: list[tuple[list[float], Coroutine[Any, Any, float]]] = [
                (samples.claims, self.claim(url, {})),
                (samples.floors, self.floor(1, {})),
            ]
            if request_ids:
                steps += [
                    (samples.request_id_claims, self.claim(url, with_id)),
                    (samples.floor_pairs, self.floor(2, with_id)),
                ]
            if i % 2:
                steps.reverse()
            for into, step in steps:
                into.append(await step)
        return samples


class Prober:
    """The probing child process; `rounds` runs rounds there and returns the samples."""

    def __init__(self, target: ProbeTarget) -> None:
        self._child = Child(_prober_child, target, name="bench-prober")
        self._next = 0

    async def rounds(self, count: int, *, request_ids: bool) -> Samples:
        self._child.send((self._next, count, request_ids))
        self._next += count
        samples: Samples = await self._child.receive(900.0)
        return samples

    async def stop(self) -> None:
        await self._child.stop()


@contextlib.asynccontextmanager
async def prober(target: ProbeTarget) -> Any:
    probe = Prober(target)
    try:
        if await probe._child.receive(60.0) != "ready":
            raise RuntimeError("the prober did not start")
        yield probe
    finally:
        await probe.stop()


def blocks(total: int, size: int) -> Iterator[int]:
    """`total` split into blocks of at most `size`."""
    while total > 0:
        yield min(size, total)
        total -= size


async def probe_claims(
    probe: Prober,
    rounds: int,
    block: int,
    *,
    request_ids: bool,
    between: Callable[[], Coroutine[Any, Any, None]],
) -> Samples:
    """`rounds` rounds in blocks of `block`, `between` awaited after each block (it
    releases what the block claimed, so claims keep coming from the declared pool)."""
    samples = Samples.empty()
    for count in blocks(rounds, block):
        samples.extend(await probe.rounds(count, request_ids=request_ids))
        await between()
    return samples


# ---- concurrent clients and writers, in child processes ------------------------------------


def _load_child(conn: Connection, url: str, pool: str, clients: int, total: int) -> None:
    """Child process: the concurrent clients, so they do not share the controller's CPU."""

    async def run() -> Result:
        async with aiohttp.ClientSession() as http:
            await bench.claim(http, url, pool)  # one warm-up claim, not counted
            return await concurrent_claims(http, url, pool, clients, total)

    conn.send(asyncio.run(run()))
    conn.close()


def _writers_child(conn: Connection, sim_url: str, run: int, writers: int, total: int) -> None:
    """Child process: `writers` concurrent bare creates, `total` in all (under a prefix of
    their own, so that every run creates)."""
    prefix = f"bench/writers/{run}"

    async def run_all() -> Result:
        async with aiohttp.ClientSession() as http:
            await bare_create(http, sim_url, f"{prefix}/warm", 0)
            remaining = total

            async def writer() -> None:
                nonlocal remaining
                while remaining > 0:
                    remaining -= 1
                    await bare_create(http, sim_url, f"{prefix}/{remaining}", remaining)

            started = time.perf_counter()
            await asyncio.gather(*(writer() for _ in range(writers)))
            return {"creates_per_second": round(total / (time.perf_counter() - started), 1)}

    conn.send(asyncio.run(run_all()))
    conn.close()


async def in_child(target: Callable[..., None], *args: Any) -> Result:
    child = Child(target, *args, name="bench-load")
    try:
        result: Result = await child.receive(300.0)
    finally:
        await child.stop()
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
            seconds, status, body = await bench.claim(http, url, pool)
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


# ---- the section -------------------------------------------------------------------------


Percentiles = dict[str, float]

# ratio key -> (numerator, denominator), keys of `percentiles`.
RATIOS = {
    "p50_ratio": ("p50_ms", "floor.p50_ms"),
    "p99_ratio": ("p99_ms", "floor.p99_ms"),
    "tail_ratio": ("p99_ms", "p50_ms"),
    "p99_ratio_request_id": ("request_id.p99_ms", "floor_pair.p99_ms"),
}


def percentiles(samples: Samples) -> Percentiles:
    """One repetition's p50 and p99 (seconds) of each kind of sample, by the key they
    are reported under."""
    found: Percentiles = {}
    for kind, values in (
        ("", samples.claims),
        ("floor.", samples.floors),
        ("request_id.", samples.request_id_claims),
        ("floor_pair.", samples.floor_pairs),
    ):
        if values:
            found[f"{kind}p50_ms"] = percentile(values, 50)
            found[f"{kind}p99_ms"] = percentile(values, 99)
    return found


def record_claims(out: Result, prefix: str, runs: list[Percentiles]) -> None:
    """The repetitions' percentiles (their medians) and ratios (medians with spread)."""
    for name in runs[0]:
        repeated(out, f"{prefix}.{name}", [ms(run[name]) for run in runs], spread=False)
    for name, (numerator, denominator) in RATIOS.items():
        if numerator in runs[0] and denominator in runs[0]:
            values = [ratio(run[numerator], run[denominator]) for run in runs]
            repeated(out, f"{prefix}.{name}", values)


async def bench_claims(sizes: Sizes, out: Result, say: Callable[[str], None]) -> None:
    idle, rounds = sizes.claim_pool_idle, sizes.claim_rounds
    say(f"claims: {sizes.repetitions} x {rounds} rounds against a pool of {idle} idle runners")
    runs = await sequential(sizes, bench.SimOptions(), request_ids=True, say=say, out=out)
    record_claims(out, "claim", runs)
    out["claim.samples"] = float(rounds)
    say(f"claims: the same against a simulator answering writes {WRITE_LATENCY_MS:g} ms late")
    options = bench.SimOptions(write_latency_ms=WRITE_LATENCY_MS)
    slow = await sequential(sizes, options, request_ids=False, say=say, out=None)
    record_claims(out, "claim.write_latency_2ms", slow)


async def sequential(
    sizes: Sizes,
    options: bench.SimOptions,
    *,
    request_ids: bool,
    say: Callable[[str], None],
    out: Result | None,
) -> list[Percentiles]:
    """Sequential claims and their floors against a controller with one pool of
    `claim_pool_idle` runners, in `repetitions` runs; with `out`, also the concurrent
    clients and writers against the same simulator."""
    idle = sizes.claim_pool_idle
    doc = bench.pool_doc(CLAIM_POOL, idle, idle * 3)
    async with (
        bench.simulator(options) as sim,
        bench.standalone(sim.url, [doc], resync_seconds=DEFAULT_RESYNC_SECONDS) as controller,
        floor_server() as floor_url,
    ):
        await bench.wait_for(lambda: bench.all_full(controller.engine), 120, "the pool to fill")
        claim_url = f"{controller.url}/v1/pools/{NAMESPACE}/{CLAIM_POOL}/claims"

        async def release() -> None:
            await bench.release_claimed(controller, 120)

        async with prober(ProbeTarget((claim_url,), floor_url, sim.url)) as probe:
            runs = [
                percentiles(
                    await probe_claims(
                        probe,
                        sizes.claim_rounds,
                        sizes.claim_block,
                        request_ids=request_ids,
                        between=release,
                    )
                )
                for _ in range(sizes.repetitions)
            ]
        if out is not None:
            await throughput(sizes, controller, sim.url, out, say)
    return runs


async def throughput(
    sizes: Sizes, controller: Controller, sim_url: str, out: Result, say: Callable[[str], None]
) -> None:
    """Claims per second of C concurrent clients (each level from the declared pool), and
    at the most clients against as many concurrent writers of bare creates."""
    most = max(sizes.concurrency)
    claims: list[float] = []
    creates: list[float] = []
    for clients in sizes.concurrency:
        say(f"claims: {clients} concurrent clients")
        repetitions = sizes.repetitions if clients == most else 1
        for _ in range(repetitions):
            await bench.release_claimed(controller, 120)
            row = await in_child(
                _load_child, controller.url, CLAIM_POOL, clients, sizes.concurrent_claims
            )
            if clients == most:
                claims.append(row["claims_per_second"])
                written = await in_child(
                    _writers_child, sim_url, len(creates), most, sizes.concurrent_claims
                )
                creates.append(written["creates_per_second"])
        for name, value in row.items():
            out[f"claim.clients_{clients}.{name}"] = value
    repeated(out, "claim.claims_per_second", claims, spread=False)
    repeated(out, "claim.bare_creates_per_second", creates, spread=False)
    repeated(
        out,
        "claim.throughput_ratio",
        [ratio(c, w) for c, w in zip(claims, creates, strict=True)],
    )
