"""Reconcile scaling (the `reconcile.*` and `memory.*` keys of `poolkeeper bench`).

For each size (pools of `runners_per_pool` runners in one namespace), against a fresh
simulator: the wall and CPU time of a steady-state pass against the I/O floor (the list
calls a pass makes, with the same client), Nomad requests per pass, the memory the
controller holds per runner, and from 1,000 runners on, sequential claims (with their
floor samples, bench_claims.py) while passes over all the runners run back to back:

- `reconcile.pools_N.embedded.claim.*`: claims answered by the process whose passes run
  (the bench's passive controller, as `poolkeeper run` answers them alone);
- `reconcile.pools_N.claim.*`: claims answered by an API-tier replica while a reconciler
  in a process of its own runs the passes and publishes the catalog (bench_tier.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import time
from collections.abc import AsyncIterator

from controller.lab import bench
from controller.lab.bench import (
    NAMESPACE,
    PassiveController,
    Result,
    Run,
    Sizes,
    ms,
    ratio,
    repeated,
)
from controller.lab.bench_claims import Embedded, Target, probe_runs, record_claims
from controller.lab.bench_tier import ReconcilerOptions, claim_urls, tiers

# Sizes below this many runners take no claims (a pool of 100 would run dry).
CLAIMS_FROM_RUNNERS = 1_000
# The size whose claims while passes run are the `claim.*_10k_runners` keys.
TAIL_RUNNERS = 10_000
# Through the API tier, claims while passes run are measured up to the goals' size: at
# 50,000 runners (500 pools) the replica did not offer every pool within SETTLE_SECONDS
# on a 2-core machine (docs/performance.md), and the run failed there.
API_TIER_CLAIMS_UP_TO_RUNNERS = TAIL_RUNNERS


async def bench_scale(run: Run) -> None:
    sizes, out, say = run.sizes, run.out, run.say
    per_pool = sizes.runners_per_pool
    for pools in sizes.reconcile_pools:
        runners = pools * per_pool
        say(f"reconcile: {pools} pools x {per_pool} runners")
        row: Result = {"runners": float(runners)}
        docs = [bench.pool_doc(f"p{i:03d}", per_pool, per_pool * 3) for i in range(pools)]
        async with bench.simulator(bench.SimOptions(start_delay=0.01)) as sim:
            passive = PassiveController(sim.url, surge=per_pool)
            try:
                await passive.start(docs)
                row["rss_mb_baseline"] = passive.rss_mb()
                await bench.fill(passive, within=120 + runners / 50)
                row.update(await time_passes(passive, sizes))
                row["rss_mb"] = passive.rss_mb()
                if runners >= CLAIMS_FROM_RUNNERS:
                    say(f"reconcile: claims while passes over {runners} runners run (embedded)")
                    async with back_to_back(passive):
                        embedded = Embedded(passive, sim.url)
                        await claims_during_passes(run, embedded, passive.url, row, "embedded.")
            finally:
                await passive.stop()
            if CLAIMS_FROM_RUNNERS <= runners <= API_TIER_CLAIMS_UP_TO_RUNNERS:
                say("reconcile: the same through the API tier, the passes in a process apart")
                options = ReconcilerOptions(tuple(docs), passive=True, surge=per_pool)
                async with tiers(sim.url, options) as tier, tier.back_to_back():
                    await claims_during_passes(run, tier, tier.url, row, "")
        row["kb_per_runner"] = round((row["rss_mb"] - row["rss_mb_baseline"]) * 1024 / runners, 2)
        for name, value in row.items():
            out[f"reconcile.pools_{pools}.{name}"] = value
    summarize(sizes, out)


def summarize(sizes: Sizes, out: Result) -> None:
    """The keys across sizes: the worst floor ratio, requests per pass at the fewest and
    the most pools, memory at the largest size, the claim tail while a pass runs."""
    keys = [f"reconcile.pools_{pools}" for pools in sizes.reconcile_pools]
    worst = max(keys, key=lambda k: out[f"{k}.floor_ratio"])
    for suffix in ("", ".min", ".max", ".spread"):
        out[f"reconcile.floor_ratio{suffix}"] = out[f"{worst}.floor_ratio{suffix}"]
    out["reconcile.floor_ratio_runners"] = out[f"{worst}.runners"]
    requests = [out[f"{k}.requests_per_pass"] for k in keys]
    out["reconcile.requests_per_pass"] = max(requests)
    out["reconcile.requests_per_pass_max"] = max(out[f"{k}.requests_per_pass_max"] for k in keys)
    out["reconcile.requests_per_pass_1_pool"] = requests[0]
    out["reconcile.requests_per_pass_most_pools"] = requests[-1]
    out["reconcile.requests_independent_of_pools"] = 1.0 if requests[0] == requests[-1] else 0.0
    largest = keys[-1]
    out["memory.runners"] = out[f"{largest}.runners"]
    out["memory.rss_mb_baseline"] = out[f"{largest}.rss_mb_baseline"]
    out["memory.rss_mb"] = out[f"{largest}.rss_mb"]
    out["memory.kb_per_runner"] = out[f"{largest}.kb_per_runner"]
    with_claims = [k for k in keys if out[f"{k}.runners"] >= CLAIMS_FROM_RUNNERS]
    tail = min(with_claims, key=lambda k: abs(out[f"{k}.runners"] - TAIL_RUNNERS))
    for shape in ("", "embedded."):
        for name in ("p50_ratio", "p99_ratio", "tail_ratio"):
            for suffix in ("", ".min", ".max", ".spread"):
                out[f"claim.{shape}{name}_10k_runners{suffix}"] = out[
                    f"{tail}.{shape}claim.{name}{suffix}"
                ]
    out["claim.runners_10k_runners"] = out[f"{tail}.runners"]


async def time_passes(passive: PassiveController, sizes: Sizes) -> Result:
    """Steady-state passes interleaved with the bare list calls a pass makes (the floor),
    `reconcile_passes` of each per repetition; the floor ratio of a repetition is the
    median pass over the median floor."""
    client = passive.client
    walls: list[float] = []
    cpus: list[float] = []
    floors: list[float] = []
    floor_cpus: list[float] = []
    per_pass: list[int] = []
    ratios: list[float] = []
    await passive.engine.reconcile_namespace(NAMESPACE)  # warm caches and connections

    async def floor() -> None:
        cpu, started = time.process_time(), time.perf_counter()
        await asyncio.gather(
            client.list_jobs(NAMESPACE),
            client.list_allocations(NAMESPACE),
            passive.engine.store.list(NAMESPACE),
            client.list_nodes(),
        )
        floors.append(time.perf_counter() - started)
        floor_cpus.append(time.process_time() - cpu)

    async def one_pass() -> None:
        before = sum(passive.requests.values())
        cpu, started = time.process_time(), time.perf_counter()
        result = await passive.engine.reconcile_namespace(NAMESPACE)
        walls.append(time.perf_counter() - started)
        cpus.append(time.process_time() - cpu)
        per_pass.append(sum(passive.requests.values()) - before)
        if result.created or result.destroyed or result.errors:
            raise RuntimeError(f"a steady-state pass acted: {result}")

    n = sizes.reconcile_passes
    for _ in range(sizes.repetitions):
        for i in range(n):
            # Alternate the order so neither side always runs on a warmer cache.
            steps = (floor, one_pass) if i % 2 == 0 else (one_pass, floor)
            for step in steps:
                await step()
        ratios.append(ratio(statistics.median(walls[-n:]), statistics.median(floors[-n:])))
    row: Result = {
        "pass_ms": ms(statistics.median(walls)),
        "pass_cpu_ms": ms(statistics.median(cpus)),
        "floor_ms": ms(statistics.median(floors)),
        "floor_cpu_ms": ms(statistics.median(floor_cpus)),
        # The median pass: once every 30 s (REQUEST_GC_SECONDS, engine/reconcile.py) a
        # pass also lists the request records, so where the timed passes take longer
        # than that one of them makes one request more, whatever the number of pools
        # (`requests_per_pass_max` counts it).
        "requests_per_pass": float(statistics.median(per_pass)),
        "requests_per_pass_max": float(max(per_pass)),
    }
    repeated(row, "floor_ratio", ratios)
    return row


@contextlib.asynccontextmanager
async def back_to_back(passive: PassiveController) -> AsyncIterator[None]:
    """Passes of the passive controller back to back while the block runs."""
    running = True

    async def passes() -> None:
        while running:
            await passive.engine.reconcile_namespace(NAMESPACE)
            await asyncio.sleep(0)  # let a waiting claim in between two passes

    looping = asyncio.create_task(passes())
    try:
        yield
    finally:
        running = False
        await looping


async def claims_during_passes(
    run: Run, target: Target, url: str, row: Result, prefix: str
) -> None:
    """Sequential claims at `url` (rotating over the pools) with their floor samples,
    while passes over every runner run back to back; what they claimed is released after
    each block of a quarter of the runners, so the size stays what it says."""
    sizes = run.sizes
    pools = int(row["runners"]) // sizes.runners_per_pool
    urls = claim_urls(url, [f"p{i:03d}" for i in range(pools)])
    block = max(1, pools * sizes.runners_per_pool // 4)
    runs = await probe_runs(run, target, urls, sizes.scale_rounds, block, request_ids=False)
    claims: Result = {}
    record_claims(claims, f"{prefix}claim", runs)
    row.update(claims)
