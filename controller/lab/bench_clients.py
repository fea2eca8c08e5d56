"""The clients of `poolkeeper bench`, each a child process of its own, started once per
run (on first use) and shared by every section that needs them:

- the **floor server**: a trivial aiohttp handler that reads a request's body and answers
  a claim-sized body with 201, served by a child process that does nothing else;
- the **prober**: sends sequential claims and floor samples (a round trip to the floor
  server, then bare `cas=0` creates of claim-shaped variables to the simulator), in
  rounds whose order flips every round, to whatever target each command names;
- the **load**: C concurrent claimers against a claim URL, or W concurrent bare writers
  against a simulator;
- the **relay** (started per simulator, `relay`): the CPU floor of a claim. It serves a
  claim's `POST` with the HTTP stack an API replica serves claims with (an aiohttp
  server, an aiohttp client to Nomad with as many connections as the replica's) by
  making one `cas=0` create in the simulator and answering a claim-sized JSON body, and
  does nothing else: its CPU per request is what any claim costs a replica.

Real clients are other processes, and none of these shares the controller's CPU time or
event loop; reusing them spares a process start (an interpreter and its imports) per
measurement.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import AsyncIterator, Coroutine
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

import aiohttp
from aiohttp import web

from controller.lab import bench
from controller.lab.bench import NAMESPACE, Child, Result, ms, percentile
from controller.nomad.client import DEFAULT_MAX_CONNECTIONS
from controller.serving import HTTP_IDLE_TIMEOUT_SECONDS
from controller.tasks import freeze_startup_heap

# What the trivial handler answers: about the size of a claim's answer.
FLOOR_ANSWER = b'{"runnerId": "' + b"x" * 380 + b'"}'
# The longest a command to a client child may take (a prober's block of rounds).
COMMAND_SECONDS = 900.0


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
    """Where the prober sends what: claim URLs (claims rotate over them, one pool each),
    the trivial handler, and the simulator for the bare creates."""

    claim_urls: tuple[str, ...]
    floor_url: str
    sim_url: str


@dataclass
class Samples:
    """Seconds per sample, in the order they were taken."""

    claims: list[float] = field(default_factory=list)
    floors: list[float] = field(default_factory=list)
    request_id_claims: list[float] = field(default_factory=list)
    floor_pairs: list[float] = field(default_factory=list)

    def extend(self, other: Samples) -> None:
        self.claims += other.claims
        self.floors += other.floors
        self.request_id_claims += other.request_id_claims
        self.floor_pairs += other.floor_pairs


async def _serve_commands(conn: Connection, answer: Any) -> None:
    """Answer each command from the parent with `answer(command)` until it sends None or
    goes away."""
    loop = asyncio.get_running_loop()
    while (command := await loop.run_in_executor(None, bench.receive, conn)) is not None:
        conn.send(await answer(command))


# ---- the floor server ----------------------------------------------------------------------


def _floor_child(conn: Connection) -> None:
    logging.basicConfig(level=logging.WARNING)
    asyncio.run(_floor_serve(conn))


def floor_answer() -> web.Response:
    return web.Response(body=FLOOR_ANSWER, status=201, content_type="application/json")


async def _floor_serve(conn: Connection) -> None:
    async def answer(request: web.Request) -> web.Response:
        await request.read()
        return floor_answer()

    app = web.Application()
    app.router.add_post("/floor", answer)
    await _serve_until_stopped(conn, app, "/floor")


async def _serve_until_stopped(conn: Connection, app: web.Application, path: str) -> None:
    """Serve `app` on a free loopback port, send its URL (with `path`) to the parent, and
    stop once the parent says so."""
    runner = web.AppRunner(app, access_log=None, keepalive_timeout=HTTP_IDLE_TIMEOUT_SECONDS)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    freeze_startup_heap()  # set up as the replica is, so that floor and claim compare alike
    conn.send(f"http://127.0.0.1:{runner.addresses[0][1]}{path}")
    await asyncio.get_running_loop().run_in_executor(None, bench.wait_for_parent, conn)
    await runner.cleanup()


# ---- the relay ------------------------------------------------------------------------------


def _relay_child(conn: Connection, sim_url: str) -> None:
    logging.basicConfig(level=logging.WARNING)
    asyncio.run(_relay_serve(conn, sim_url))


async def _relay_serve(conn: Connection, sim_url: str) -> None:
    created = 0
    prefix = f"bench/relay/{os.getpid()}"
    connector = aiohttp.TCPConnector(limit=DEFAULT_MAX_CONNECTIONS)
    async with aiohttp.ClientSession(connector=connector) as http:

        async def answer(request: web.Request) -> web.Response:
            nonlocal created
            await request.read()
            created += 1
            await bare_create(http, sim_url, f"{prefix}/{created}", created)
            return floor_answer()

        app = web.Application()
        app.router.add_post(f"/v1/pools/{NAMESPACE}/{{name}}/claims", answer)
        await _serve_until_stopped(conn, app, "")


@contextlib.asynccontextmanager
async def relay(sim_url: str) -> AsyncIterator[tuple[str, int]]:
    """The relay against this simulator, in a child process: its URL (claims are posted
    to it as to a replica) and its process ID."""
    child = Child(_relay_child, sim_url, name="bench-relay")
    try:
        yield str(await child.receive(60.0)), child.pid
    finally:
        await child.stop()


# ---- the prober ----------------------------------------------------------------------------


def _prober_child(conn: Connection) -> None:
    logging.basicConfig(level=logging.WARNING)
    asyncio.run(_probe_serve(conn))


async def _probe_serve(conn: Connection) -> None:
    async with aiohttp.ClientSession() as http:
        probe = _Probe(http)

        async def answer(command: tuple[ProbeTarget, int, int, bool]) -> Samples:
            return await probe.rounds(*command)

        conn.send("ready")
        await _serve_commands(conn, answer)


class _Probe:
    def __init__(self, http: aiohttp.ClientSession) -> None:
        self.http = http
        self.created = 0
        self.warmed: set[ProbeTarget] = set()

    async def claim(self, url: str, body: dict[str, Any]) -> float:
        started = time.perf_counter()
        async with self.http.post(url, json=body) as response:
            payload = await response.read()
            if response.status != 201:
                raise RuntimeError(f"claim failed: {response.status} {payload[:300]!r}")
        return time.perf_counter() - started

    async def floor(self, target: ProbeTarget, creates: int, body: dict[str, Any]) -> float:
        """A round trip to the trivial handler with the claim's body, then `creates`
        bare creates."""
        started = time.perf_counter()
        async with self.http.post(target.floor_url, json=body) as response:
            await response.read()
        for _ in range(creates):
            self.created += 1
            path = f"bench/floor/{self.created}"
            await bare_create(self.http, target.sim_url, path, self.created)
        return time.perf_counter() - started

    async def warm(self, target: ProbeTarget) -> None:
        """Open a new target's connections once (nothing is counted)."""
        if target not in self.warmed:
            await self.floor(target, 1, {})
            await self.claim(target.claim_urls[0], {})
            self.warmed.add(target)

    async def rounds(
        self, target: ProbeTarget, first: int, count: int, request_ids: bool
    ) -> Samples:
        """`count` rounds of a claim and a floor sample (and, with `request_ids`, a claim
        with a requestId and a two-create floor sample), in an order flipped every round
        so that neither side always comes first."""
        await self.warm(target)
        samples = Samples()
        urls = target.claim_urls
        for i in range(first, first + count):
            url = urls[i % len(urls)]
            with_id = {"requestId": f"bench-{i}"}
            steps: list[tuple[list[float], Coroutine[Any, Any, float]]] = [
                (samples.claims, self.claim(url, {})),
                (samples.floors, self.floor(target, 1, {})),
            ]
            if request_ids:
                steps += [
                    (samples.request_id_claims, self.claim(url, with_id)),
                    (samples.floor_pairs, self.floor(target, 2, with_id)),
                ]
            if i % 2:
                steps.reverse()
            for into, step in steps:
                into.append(await step)
        return samples


# ---- the load: concurrent claimers and writers ----------------------------------------------


@dataclass(frozen=True)
class ClaimLoad:
    url: str
    pool: str
    clients: int
    total: int


@dataclass(frozen=True)
class WriteLoad:
    sim_url: str
    prefix: str  # a prefix of its own, so that every run creates
    writers: int
    total: int


def _load_child(conn: Connection) -> None:
    logging.basicConfig(level=logging.WARNING)
    asyncio.run(_load_serve(conn))


async def _load_serve(conn: Connection) -> None:
    async with aiohttp.ClientSession() as http:

        async def answer(load: ClaimLoad | WriteLoad) -> Result:
            if isinstance(load, ClaimLoad):
                await bench.claim(http, load.url, load.pool)  # a warm-up claim, not counted
                return await concurrent_claims(http, load)
            return await concurrent_writes(http, load)

        conn.send("ready")
        await _serve_commands(conn, answer)


async def concurrent_claims(http: aiohttp.ClientSession, load: ClaimLoad) -> Result:
    latencies: list[float] = []
    errors = empty = 0
    remaining = load.total

    async def worker() -> None:
        nonlocal remaining, errors, empty
        while remaining > 0:
            remaining -= 1
            seconds, status, body = await bench.claim(http, load.url, load.pool)
            if status == 201:
                latencies.append(seconds)
            elif isinstance(body, dict) and (body.get("error") or {}).get("code") == "PoolEmpty":
                empty += 1  # claims outran the refill: an answer, not a failure
            else:
                errors += 1

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(load.clients)))
    elapsed = time.perf_counter() - started
    return {
        "p50_ms": ms(percentile(latencies, 50)),
        "p99_ms": ms(percentile(latencies, 99)),
        "claims_per_second": round(len(latencies) / elapsed, 1),
        "pool_empty": float(empty),
        "errors": float(errors),
    }


async def concurrent_writes(http: aiohttp.ClientSession, load: WriteLoad) -> Result:
    await bare_create(http, load.sim_url, f"{load.prefix}/warm", 0)
    remaining = load.total

    async def writer() -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            await bare_create(http, load.sim_url, f"{load.prefix}/{remaining}", remaining)

    started = time.perf_counter()
    await asyncio.gather(*(writer() for _ in range(load.writers)))
    return {"creates_per_second": round(load.total / (time.perf_counter() - started), 1)}


# ---- the children, started on first use ------------------------------------------------------


class Clients:
    """The floor server, the prober and the load, each started the first time it is
    needed and stopped with `close`."""

    def __init__(self) -> None:
        self._floor: Child | None = None
        self._floor_url = ""
        self._prober: Child | None = None
        self._load: Child | None = None
        self._rounds = 0  # rounds sent so far: requestIds stay unique over the run
        self._writes = 0

    async def floor_url(self) -> str:
        if self._floor is None:
            self._floor = Child(_floor_child, name="bench-floor")
            self._floor_url = str(await self._floor.receive(60.0))
        return self._floor_url

    async def _started(self, child: Child) -> Child:
        if await child.receive(60.0) != "ready":
            raise RuntimeError("a client process of the bench did not start")
        return child

    async def probe(
        self, claim_urls: tuple[str, ...], sim_url: str, count: int, *, request_ids: bool
    ) -> Samples:
        """`count` rounds of claims (rotating over `claim_urls`) and floor samples."""
        if self._prober is None:
            self._prober = await self._started(Child(_prober_child, name="bench-prober"))
        target = ProbeTarget(claim_urls, await self.floor_url(), sim_url)
        self._prober.send((target, self._rounds, count, request_ids))
        self._rounds += count
        samples: Samples = await self._prober.receive(COMMAND_SECONDS)
        return samples

    async def load_pid(self) -> int:
        """The process that sends the concurrent claims and writes (started here)."""
        return (await self._loader()).pid

    async def _loader(self) -> Child:
        if self._load is None:
            self._load = await self._started(Child(_load_child, name="bench-load"))
        return self._load

    async def _run_load(self, load: ClaimLoad | WriteLoad) -> Result:
        loader = await self._loader()
        loader.send(load)
        result: Result = await loader.receive(COMMAND_SECONDS)
        return result

    async def claims(self, url: str, pool: str, clients: int, total: int) -> Result:
        """`total` claims from `clients` concurrent clients: p50, p99, claims per second,
        PoolEmpty answers and errors."""
        return await self._run_load(ClaimLoad(url, pool, clients, total))

    async def writes(self, sim_url: str, writers: int, total: int) -> float:
        """Bare creates per second of `writers` concurrent writers, `total` in all."""
        self._writes += 1
        load = WriteLoad(sim_url, f"bench/writers/{self._writes}", writers, total)
        return (await self._run_load(load))["creates_per_second"]

    async def close(self) -> None:
        for child in (self._prober, self._load, self._floor):
            if child is not None:
                await child.stop()


@contextlib.asynccontextmanager
async def clients() -> AsyncIterator[Clients]:
    shared = Clients()
    try:
        yield shared
    finally:
        await shared.close()
