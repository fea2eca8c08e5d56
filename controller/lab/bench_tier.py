"""The two tiers of `poolkeeper bench`, as processes of their own: a reconciler that owns
the pools and publishes the catalog, and API-tier replicas (`poolkeeper api`) that answer
claims from it, optionally behind HAProxy.

- The **reconciler** is a child process: either the real standalone controller (`poolkeeper
  run`: loops, event-stream watcher, doorbell, resync) or, with `passive`, an engine that
  holds the pools' leases and publishes the catalog but passes only when the benchmark
  says, back to back (bench_scale.py).
- Each **API replica** is a child process running `controller.api_tier.ApiTier`, the
  object `poolkeeper api` runs.
- The **balancer** is the API tier soak's HAProxy (chaos/balancer.py: the same binary
  finder and configuration, round robin over the replicas), started on loopback and
  stopped again; where there is no HAProxy the benchmark says so and measures without it.

Claims reach the reconciler as they do in a deployment: through Nomad (the claim
variables it lists every pass, and the doorbell it follows with a blocking read).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from controller.lab import bench
from controller.lab.bench import NAMESPACE, Child, PassiveController
from controller.lab.chaos.balancer import Balancer
from controller.lab.chaos.processes import free_port
from controller.nomad.config import NomadConfig
from controller.standalone import Controller
from controller.tasks import freeze_startup_heap

log = logging.getLogger(__name__)

# How long the tiers may take to come up, and to settle after releases.
START_SECONDS = 120.0
SETTLE_SECONDS = 600.0


# ---- the API tier, in a child process ------------------------------------------------------


def _api_child(conn: Connection, sim_url: str) -> None:
    logging.basicConfig(level=logging.WARNING)
    asyncio.run(_api_serve(conn, sim_url))


async def _api_serve(conn: Connection, sim_url: str) -> None:
    from controller.api_tier import ApiTier
    from controller.serving import ServingSettings

    settings = ServingSettings(listen=("127.0.0.1", 0), insecure_no_auth=True)
    tier = ApiTier(settings, NomadConfig.from_env({"NOMAD_ADDR": sim_url}))
    url = await tier.start()
    freeze_startup_heap()  # as `poolkeeper api` does once started
    conn.send(url)
    await asyncio.get_running_loop().run_in_executor(None, bench.wait_for_parent, conn)
    await tier.stop()


# ---- the reconciler, in a child process -----------------------------------------------------


@dataclass(frozen=True)
class ReconcilerOptions:
    documents: tuple[dict[str, Any], ...]
    # True: an engine that passes only when told (back to back); False: `poolkeeper run`.
    passive: bool
    resync_seconds: float = 10.0
    surge: int = 20


RELEASE = "release"
PASSES_ON = "passes on"
PASSES_OFF = "passes off"


def _reconciler_child(conn: Connection, sim_url: str, options: ReconcilerOptions) -> None:
    logging.basicConfig(level=logging.WARNING)
    asyncio.run(_reconcile_serve(conn, sim_url, options))


@contextlib.asynccontextmanager
async def _reconciling(
    sim_url: str, options: ReconcilerOptions
) -> AsyncIterator[Controller | PassiveController]:
    """The reconciler, its pools full (and published)."""
    documents = list(options.documents)
    within = START_SECONDS + sum(d["spec"]["idleRunners"] for d in documents) / 50
    if options.passive:
        passive = PassiveController(sim_url, options.surge, identity=f"bench/{os.getpid()}")
        try:
            await passive.start(documents)
            await bench.fill(passive, within)
            yield passive
        finally:
            await passive.stop()
        return
    async with bench.standalone(
        sim_url, documents, resync_seconds=options.resync_seconds
    ) as controller:
        await bench.wait_for(lambda: bench.all_full(controller.engine), within, "the pools")
        yield controller


async def release(reconciler: Controller | PassiveController) -> None:
    """Release what the API tier claimed. Its claims reach this process only through
    Nomad, so first a pass that began after they were made must have seen them."""
    engine = reconciler.engine
    since = time.monotonic()
    for namespace in engine.namespaces():
        engine.hint_namespace(namespace)  # a passive engine passes back to back anyway
    await bench.wait_for(
        lambda: all(view.observation_started > since for view in engine.pools.values()),
        SETTLE_SECONDS,
        "a pass that saw the claims",
    )
    await bench.release_claimed(reconciler, SETTLE_SECONDS)


async def _reconcile_serve(conn: Connection, sim_url: str, options: ReconcilerOptions) -> None:
    loop = asyncio.get_running_loop()
    async with _reconciling(sim_url, options) as reconciler:
        running = False

        async def passes() -> None:
            while running:
                await reconciler.engine.reconcile_namespace(NAMESPACE)
                await asyncio.sleep(0)  # let a release in between two passes

        looping: asyncio.Task[None] | None = None
        freeze_startup_heap()  # as `poolkeeper run` does once started
        conn.send("ready")
        while True:
            command = await loop.run_in_executor(None, bench.receive, conn)
            if command == RELEASE:
                await release(reconciler)
            elif command == PASSES_ON and looping is None:
                running, looping = True, asyncio.create_task(passes())
            elif command == PASSES_OFF and looping is not None:
                running = False
                await looping
                looping = None
            elif command is None:
                break
            conn.send(command)
        if looping is not None:
            running = False
            await looping


# A pool's status as a replica reads it, and its declared idle runners -> whether to go on.
StatusCheck = Callable[[Mapping[str, Any], int], bool]


def listed(status: Mapping[str, Any], idle: int) -> bool:
    """The pool has been read."""
    return True


def holds_idle(status: Mapping[str, Any], idle: int) -> bool:
    """The pool holds its idle runners, none starting (claimed ones may stay)."""
    return status.get("idleRunners") == idle and status.get("startingRunners") == 0


def settled(status: Mapping[str, Any], idle: int) -> bool:
    """The pool is back at its declared size: its idle runners, none claimed."""
    return holds_idle(status, idle) and status.get("claimedRunners") == 0


# ---- the two tiers together ----------------------------------------------------------------


class Tier:
    """A reconciler and API replicas against one simulator."""

    def __init__(self, sim_url: str, options: ReconcilerOptions) -> None:
        self.sim_url = sim_url
        self.options = options
        self.idle = {
            d["metadata"]["name"]: int(d["spec"]["idleRunners"]) for d in options.documents
        }
        self.reconciler: Child | None = None
        self.replicas: list[Child] = []
        self.urls: list[str] = []
        self._http = aiohttp.ClientSession()

    @property
    def url(self) -> str:
        """The first replica's URL."""
        return self.urls[0]

    async def start(self) -> None:
        self.reconciler = Child(_reconciler_child, self.sim_url, self.options, name="bench-rec")
        await self._command(None, "ready")
        await self.add_replica()

    async def add_replica(self) -> str:
        """Start one more API replica; returns its URL once it has read every pool."""
        child = Child(_api_child, self.sim_url, name=f"bench-api-{len(self.replicas) + 1}")
        self.replicas.append(child)
        url = str(await child.receive(START_SECONDS))
        self.urls.append(url)
        await self.offered(url, listed)
        await self._counting_each_other()
        return url

    async def _counting_each_other(self) -> None:
        """Wait until every replica counts them all live (their replica records): from
        then on they claim from their own slices of the offers."""
        deadline = time.monotonic() + START_SECONDS
        while await self._counted("poolkeeper_api_replicas") != [len(self.urls)] * len(self.urls):
            if time.monotonic() > deadline:
                raise RuntimeError("the API replicas never counted each other live")
            await asyncio.sleep(0.1)

    def pids(self) -> list[int]:
        """The API replicas' processes."""
        return [replica.pid for replica in self.replicas]

    @property
    def reconciler_pid(self) -> int:
        return self.reconciler.pid if self.reconciler is not None else 0

    async def _command(self, command: str | None, answer: str) -> None:
        assert self.reconciler is not None
        if command is not None:
            self.reconciler.send(command)
        if await self.reconciler.receive(SETTLE_SECONDS) != answer:
            raise RuntimeError(f"the reconciler did not answer {answer!r}")

    @contextlib.asynccontextmanager
    async def back_to_back(self) -> AsyncIterator[None]:
        """The passive reconciler's passes back to back while the block runs."""
        await self._command(PASSES_ON, PASSES_ON)
        try:
            yield
        finally:
            await self._command(PASSES_OFF, PASSES_OFF)

    async def settle(self) -> None:
        """Release every claimed runner, wait until the pools are back at their declared
        size, and until every replica offers them so."""
        await self._command(RELEASE, RELEASE)
        await bench.collect_garbage(self._http, self.sim_url)
        for url in self.urls:
            await self.offered(url)

    async def offered(self, url: str, check: StatusCheck | None = None) -> None:
        """Wait until the replica at `url` has read every pool from the catalog in a
        status that passes `check` (by default: settled)."""
        check = check or settled

        async def done() -> bool:
            async with self._http.get(f"{url}/v1/pools") as response:
                if response.status != 200:
                    return False
                listed = (await response.json()).get("pools") or []
            statuses = {p.get("name"): p.get("status") for p in listed}
            return all(
                (status := statuses.get(name)) is not None and check(status, idle)
                for name, idle in self.idle.items()
            )

        deadline = time.monotonic() + SETTLE_SECONDS
        while not await done():
            if time.monotonic() > deadline:
                raise RuntimeError(f"the API replica at {url} never offered the pools")
            await asyncio.sleep(0.05)

    async def claims_served(self) -> list[float]:
        """Claim requests each replica has answered so far (its `poolkeeper_claims_total`)."""
        return await self._counted("poolkeeper_claims_total")

    async def claim_conflicts(self) -> float:
        """Check-and-sets of claims the replicas lost so far, together (their
        `poolkeeper_claim_conflicts_total`)."""
        return sum(await self._counted("poolkeeper_claim_conflicts_total"))

    async def _counted(self, metric: str) -> list[float]:
        """Per replica: the sum of the metric's series."""
        counted = []
        for url in self.urls:
            async with self._http.get(f"{url}/metrics") as response:
                text = await response.text()
            counted.append(
                sum(
                    float(line.rsplit(" ", 1)[1])
                    for line in text.splitlines()
                    if line.startswith((metric + "{", metric + " "))
                )
            )
        return counted

    async def stop(self) -> None:
        await self._http.close()
        for child in [*self.replicas, self.reconciler]:
            if child is not None:
                await child.stop()


@contextlib.asynccontextmanager
async def tiers(sim_url: str, options: ReconcilerOptions) -> AsyncIterator[Tier]:
    tier = Tier(sim_url, options)
    try:
        await tier.start()
        yield tier
    finally:
        await tier.stop()


# ---- HAProxy --------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def balancer(backends: Sequence[str]) -> AsyncIterator[str]:
    """The API tier soak's HAProxy (chaos/balancer.py: its binary, its configuration) on a
    free loopback port in front of `backends`: its URL, once every backend is in its
    rotation. Raises BalancerMissing where there is no HAProxy."""
    ports = [int(urlsplit(url).port or 0) for url in backends]
    with tempfile.TemporaryDirectory(prefix="poolkeeper-bench-haproxy-") as folder:
        proxy = Balancer(Path(folder), free_port(), ports)
        await proxy.start()
        try:
            await _in_rotation(proxy, len(ports))
            yield proxy.url
        finally:
            await proxy.stop()


async def _in_rotation(proxy: Balancer, count: int) -> None:
    deadline = time.monotonic() + 10
    while sum(server.up for server in await proxy.servers()) < count:
        if proxy.exited() is not None:
            raise RuntimeError(f"haproxy exited with {proxy.exited()}: {proxy.log_text()[-500:]}")
        if time.monotonic() > deadline:
            raise RuntimeError("haproxy did not take every API replica within 10 s")
        await asyncio.sleep(0.05)


def claim_urls(url: str, pools: Mapping[str, int] | Sequence[str]) -> tuple[str, ...]:
    """The claim URL of each pool, at `url`."""
    return tuple(f"{url}/v1/pools/{NAMESPACE}/{name}/claims" for name in pools)
