"""The claim path against its physical floor (the `claim.*` keys of `poolkeeper bench`).

A claim cannot avoid one HTTP round trip from its client to the process that answers it
and one Nomad check-and-set create (two with a requestId). The floor is exactly that,
made by idle processes: a round trip to a trivial aiohttp handler served by a child
process that does nothing else, plus bare `cas=0` creates sent by the probing child with
a plain aiohttp session to the same simulator (bench_clients.py). The prober alternates
claims and floor samples, so both meet the same simulator, the same passes and the same
neighbours on the machine.

Claims are measured where they are answered:
- `claim.*`: an API-tier replica (`poolkeeper api`), its pool owned by a reconciler in a
  process of its own (`poolkeeper run`; bench_tier.py);
- `claim.balanced.*`: two API replicas behind HAProxy (throughput only);
- `claim.embedded.*`: one process that reconciles and serves, as `poolkeeper run` does
  alone (small installs);
- `claim.write_latency_2ms.*`: the API tier against a simulator that answers every write
  2 ms late (a Raft commit).

Each has sequential claims (with and without requestId) against their floors, in
`repetitions` runs of `claim_rounds` rounds, and claims per second of concurrent clients
against bare creates per second of as many concurrent writers.
"""

from __future__ import annotations

import contextlib
import logging
import os
import statistics
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from typing import Protocol

import aiohttp

from controller.lab import bench
from controller.lab.bench import Result, Run, ms, percentile, ratio, repeated
from controller.lab.bench_clients import Samples, relay
from controller.lab.bench_tier import ReconcilerOptions, Tier, balancer, claim_urls, tiers
from controller.lab.chaos.balancer import BalancerMissing, haproxy_binary
from controller.standalone import Controller

log = logging.getLogger(__name__)

# The controller's default resync period (ServiceSettings), which the claims run with.
DEFAULT_RESYNC_SECONDS = 10.0
CLAIM_POOL = "claims"
WRITE_LATENCY_MS = 2.0
# A bound on releasing what was claimed and the pools refilling.
SETTLE_SECONDS = 600.0


class Target(Protocol):
    """What claims are sent to: `settle` releases what they claimed and returns once the
    pools are back at their declared size, offered again."""

    @property
    def sim_url(self) -> str: ...

    async def settle(self) -> None: ...


class Embedded:
    """A process that reconciles and serves claims (the standalone controller, or the
    bench's passive one): what it claimed is released through its own claim path."""

    def __init__(self, controller: Controller | bench.PassiveController, sim_url: str):
        self.controller = controller
        self.sim_url = sim_url

    async def settle(self) -> None:
        await bench.release_claimed(self.controller, SETTLE_SECONDS)
        async with aiohttp.ClientSession() as http:
            await bench.collect_garbage(http, self.sim_url)


def blocks(total: int, size: int) -> Iterator[int]:
    """`total` split into blocks of at most `size`."""
    while total > 0:
        yield min(size, total)
        total -= size


Percentiles = dict[str, float]
# A window of concurrent claims or writes: CPU ms per operation by process (CpuShares).
Window = dict[str, float]

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


async def probe_runs(
    run: Run,
    target: Target,
    urls: tuple[str, ...],
    rounds: int,
    block: int,
    *,
    request_ids: bool,
) -> list[Percentiles]:
    """`repetitions` runs of `rounds` prober rounds (claims rotating over `urls`), in
    blocks of `block` with `target.settle()` before the first and after each, so that
    claims keep coming from the declared pools."""
    await target.settle()  # what a measurement before took is given back
    runs = []
    for _ in range(run.sizes.repetitions):
        samples = Samples()
        for count in blocks(rounds, block):
            samples.extend(
                await run.clients.probe(urls, target.sim_url, count, request_ids=request_ids)
            )
            await target.settle()
        runs.append(percentiles(samples))
    return runs


async def bench_claims(run: Run) -> None:
    sizes, out, say = run.sizes, run.out, run.say
    idle, rounds = sizes.claim_pool_idle, sizes.claim_rounds
    doc = bench.pool_doc(CLAIM_POOL, idle, idle * 3)
    options = ReconcilerOptions((doc,), passive=False, resync_seconds=DEFAULT_RESYNC_SECONDS)
    say(
        f"claims: {sizes.repetitions} x {rounds} rounds through the API tier (a reconciler "
        f"apart), a pool of {idle} idle runners"
    )
    async with bench.simulator() as sim, tiers(sim.url, options) as tier:
        urls = claim_urls(tier.url, [CLAIM_POOL])
        runs = await probe_runs(run, tier, urls, rounds, sizes.claim_block, request_ids=True)
        record_claims(out, "claim", runs)
        one_replica = await throughput(
            run,
            tier,
            tier.url,
            "claim",
            sizes.concurrency,
            tier_processes(tier, sim.pid),
            server="api",
            conflicts=tier.claim_conflicts,
        )
        say(f"claims: the same, the simulator answering writes {WRITE_LATENCY_MS:g} ms late")
        await sim.act("set_write_latency", ms=WRITE_LATENCY_MS)
        runs = await probe_runs(run, tier, urls, rounds, sizes.claim_block, request_ids=False)
        record_claims(out, "claim.write_latency_2ms", runs)
        await sim.act("set_write_latency", ms=0)
        await balanced(run, tier, sim.pid, one_replica.windows["claim"])
    out["claim.samples"] = float(rounds)

    say(f"claims: {sizes.repetitions} x {rounds} rounds in one process (embedded)")
    async with (
        bench.simulator() as sim,
        bench.standalone(sim.url, [doc], resync_seconds=DEFAULT_RESYNC_SECONDS) as controller,
    ):
        await bench.wait_for(lambda: bench.all_full(controller.engine), 120, "the pool to fill")
        embedded = Embedded(controller, sim.url)
        urls = claim_urls(controller.url, [CLAIM_POOL])
        runs = await probe_runs(run, embedded, urls, rounds, sizes.claim_block, request_ids=True)
        record_claims(out, "claim.embedded", runs)
        processes = {"controller": [os.getpid()], "simulator": [sim.pid]}
        most = [max(sizes.concurrency)]
        await throughput(run, embedded, controller.url, "claim.embedded", most, processes)


async def throughput(
    run: Run,
    target: Target,
    url: str,
    prefix: str,
    levels: Sequence[int],
    processes: Mapping[str, Sequence[int]],
    *,
    server: str | None = None,
    conflicts: Callable[[], Awaitable[float]] | None = None,
) -> CpuShares:
    """Claims per second of C concurrent clients at `url` (each level from the declared
    pool), and at the most clients, per repetition, against as many concurrent writers of
    bare creates right after; with the CPU time each of `processes` (name -> PIDs) and
    the load's process spent per claim and per create. With `server` (the process in
    `processes` that answers the claims), the relay (bench_clients.py) answers as many
    requests after each repetition, and `cpu_ratio` is that process's CPU per claim
    over the relay's per request. `conflicts`: the lost check-and-sets of claims so
    far, counted per claim of each repetition."""
    sizes, out = run.sizes, run.out
    most = max(levels)
    claims: list[float] = []
    creates: list[float] = []
    relayed: list[float] = []
    lost: list[float] = []
    async with contextlib.AsyncExitStack() as stack:
        measured = {**processes, "load": [await run.clients.load_pid()]}
        relay_url = ""
        if server is not None:
            relay_url, relay_pid = await stack.enter_async_context(relay(target.sim_url))
            measured["relay"] = [relay_pid]
        cpu = CpuShares(measured)
        for clients in levels:
            run.say(f"claims: {clients} concurrent clients ({prefix})")
            repetitions = sizes.repetitions if clients == most else 1
            for _ in range(repetitions):
                await target.settle()
                lost_before = await conflicts() if conflicts is not None else 0.0
                cpu.start()
                row = await run.clients.claims(url, CLAIM_POOL, clients, sizes.concurrent_claims)
                if clients != most:
                    continue
                cpu.stop("claim", sizes.concurrent_claims)
                claims.append(row["claims_per_second"])
                if conflicts is not None:
                    lost.append((await conflicts() - lost_before) / sizes.concurrent_claims)
                cpu.start()
                creates.append(
                    await run.clients.writes(target.sim_url, most, sizes.concurrent_claims)
                )
                cpu.stop("create", sizes.concurrent_claims)
                if server is not None:
                    cpu.start()
                    answered = await run.clients.claims(
                        relay_url, CLAIM_POOL, most, sizes.concurrent_claims
                    )
                    cpu.stop("relay", sizes.concurrent_claims)
                    relayed.append(answered["claims_per_second"])
            for name, value in row.items():
                out[f"{prefix}.clients_{clients}.{name}"] = value
    repeated(out, f"{prefix}.claims_per_second", claims, spread=False)
    repeated(out, f"{prefix}.bare_creates_per_second", creates, spread=False)
    repeated(
        out,
        f"{prefix}.throughput_ratio",
        [ratio(c, w) for c, w in zip(claims, creates, strict=True)],
    )
    if server is not None:
        repeated(out, f"{prefix}.relay_requests_per_second", relayed, spread=False)
        relayed_cpu = cpu_ratios(cpu.windows["claim"], server, cpu.windows["relay"], "relay")
        repeated(out, f"{prefix}.cpu_ratio", relayed_cpu)
    if conflicts is not None:
        repeated(out, f"{prefix}.cas_conflicts_per_claim", lost)
    cpu.record(out, prefix)
    return cpu


class CpuShares:
    """The CPU time processes spend per operation while concurrent clients run: what
    limits claims per second where every process shares the same cores. Per window
    (`start` .. `stop`): each process's CPU milliseconds per operation, and `busy`, the
    CPU all of them used over what the machine's cores could give in that time."""

    def __init__(self, processes: Mapping[str, Sequence[int]]) -> None:
        self.processes = processes
        self.windows: dict[str, list[Window]] = {}
        self._began: tuple[float, dict[str, float]] = (0.0, {})

    def _used(self) -> dict[str, float]:
        return {
            name: sum(bench.cpu_seconds(pid) for pid in pids)
            for name, pids in self.processes.items()
        }

    def start(self) -> None:
        self._began = (time.monotonic(), self._used())

    def stop(self, operation: str, count: int) -> None:
        began, before = self._began
        seconds = time.monotonic() - began
        spent = {name: used - before[name] for name, used in self._used().items()}
        window = {name: used * 1000 / count for name, used in spent.items()}
        window["busy"] = sum(spent.values()) / (seconds * (os.cpu_count() or 1))
        self.windows.setdefault(operation, []).append(window)

    def record(self, out: Result, prefix: str) -> None:
        """Medians over the windows: `<prefix>.cpu_ms_per_<operation>.<process>` and
        `<prefix>.cpu_busy_<operation>`."""
        for operation, windows in self.windows.items():
            for name in windows[0]:
                values = [window[name] for window in windows]
                key = (
                    f"cpu_busy_{operation}" if name == "busy" else f"cpu_ms_per_{operation}.{name}"
                )
                out[f"{prefix}.{key}"] = round(statistics.median(values), 3)


def cpu_ratios(
    windows: Sequence[Window], process: str, floors: Sequence[Window], floor_process: str
) -> list[float]:
    """Per repetition: `process`'s CPU per operation in `windows` over `floor_process`'s
    in `floors` (the same repetition's)."""
    return [
        ratio(window[process], floor[floor_process])
        for window, floor in zip(windows, floors, strict=True)
    ]


def tier_processes(tier: Tier, sim_pid: int) -> dict[str, list[int]]:
    """The API replicas, the reconciler and the simulator, by name."""
    return {"api": tier.pids(), "reconciler": [tier.reconciler_pid], "simulator": [sim_pid]}


async def balanced(run: Run, tier: Tier, sim_pid: int, one_replica: Sequence[Window]) -> None:
    """The most clients against two API replicas behind HAProxy (`claim.balanced.*`;
    `claim.balanced.haproxy` is 0 where there is no HAProxy to start). `cpu_ratio`: the
    two replicas' CPU per claim together over one replica's (`one_replica`: its windows,
    repetition by repetition)."""
    try:
        haproxy_binary()
    except BalancerMissing as missing:
        run.say(f"claims: two replicas behind a balancer not measured: {missing}")
        run.out["claim.balanced.haproxy"] = 0.0
        return
    run.out["claim.balanced.haproxy"] = 1.0
    await tier.add_replica()
    before = await tier.claims_served()
    async with balancer(tier.urls) as url:
        processes = tier_processes(tier, sim_pid)
        most = [max(run.sizes.concurrency)]
        cpu = await throughput(
            run, tier, url, "claim.balanced", most, processes, conflicts=tier.claim_conflicts
        )
    served = [after - was for after, was in zip(await tier.claims_served(), before, strict=True)]
    # How evenly the balancer spread the claims: 0.5 is even.
    run.out["claim.balanced.least_served_share"] = round(min(served) / max(1.0, sum(served)), 3)
    together = cpu_ratios(cpu.windows["claim"], "api", one_replica, "api")
    repeated(run.out, "claim.balanced.cpu_ratio", together)
