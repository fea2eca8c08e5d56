"""Reconcile scaling (the `reconcile.*` and `memory.*` keys of `poolkeeper bench`).

For each size (pools of `runners_per_pool` runners in one namespace), against a fresh
simulator: the wall and CPU time of a steady-state pass against the I/O floor (the list
calls a pass makes, with the same client), Nomad requests per pass, the memory the
controller holds per runner, and from 1,000 runners on, sequential claims (with their
floor samples, bench_claims.py) while passes over all the runners run back to back.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Callable

from controller.core.claims import CLAIMS_PREFIX
from controller.lab import bench
from controller.lab.bench import NAMESPACE, PassiveController, Result, Sizes, ms, ratio, repeated
from controller.lab.bench_claims import (
    ProbeTarget,
    floor_server,
    percentiles,
    probe_claims,
    prober,
    record_claims,
)

# Sizes below this many runners take no claims (a pool of 100 would run dry).
CLAIMS_FROM_RUNNERS = 1_000
# The size whose claims while a pass runs are `claim.tail_ratio_10k_runners`.
TAIL_RUNNERS = 10_000


async def bench_scale(sizes: Sizes, out: Result, say: Callable[[str], None]) -> None:
    per_pool = sizes.runners_per_pool
    for pools in sizes.reconcile_pools:
        runners = pools * per_pool
        say(f"reconcile: {pools} pools x {per_pool} runners")
        row: Result = {"runners": float(runners)}
        async with (
            bench.simulator(bench.SimOptions(start_delay=0.01)) as sim,
            floor_server() as floor_url,
        ):
            passive = PassiveController(sim.url, surge=per_pool)
            try:
                docs = [bench.pool_doc(f"p{i:03d}", per_pool, per_pool * 3) for i in range(pools)]
                await passive.start(docs)
                row["rss_mb_baseline"] = passive.rss_mb()
                await fill(passive, within=120 + runners / 50)
                row.update(await time_passes(passive, sizes))
                row["rss_mb"] = passive.rss_mb()
                if runners >= CLAIMS_FROM_RUNNERS:
                    say(f"reconcile: claims while passes over {runners} runners run")
                    await claims_during_passes(passive, sim.url, floor_url, pools, sizes, row)
            finally:
                await passive.stop()
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
    for suffix in ("", ".min", ".max", ".spread"):
        out[f"claim.tail_ratio_10k_runners{suffix}"] = out[f"{tail}.claim.tail_ratio{suffix}"]
    out["claim.tail_ratio_10k_runners.runners"] = out[f"{tail}.runners"]


async def fill(passive: PassiveController, within: float) -> None:
    engine = passive.engine
    deadline = time.monotonic() + within
    while True:
        await engine.reconcile_namespace(NAMESPACE)
        if bench.all_full(engine):
            return
        if time.monotonic() > deadline:
            counts = bench.idle_counts(engine)
            raise RuntimeError(f"pools not filled after {within:g} s: {counts}")
        await asyncio.sleep(0.02)


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
            client.list_variables(CLAIMS_PREFIX, NAMESPACE),
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


async def claims_during_passes(
    passive: PassiveController,
    sim_url: str,
    floor_url: str,
    pools: int,
    sizes: Sizes,
    row: Result,
) -> None:
    """Sequential claims (rotating over the pools) with their floor samples while passes
    over every runner run back to back; what they claimed is released after each block of
    a quarter of the runners, so the size stays what it says."""
    urls = tuple(f"{passive.url}/v1/pools/{NAMESPACE}/p{i:03d}/claims" for i in range(pools))
    running = True

    async def passes() -> None:
        while running:
            await passive.engine.reconcile_namespace(NAMESPACE)
            await asyncio.sleep(0)  # let a waiting claim in between two passes

    async def release() -> None:
        await bench.release_claimed(passive, 600)

    looping = asyncio.create_task(passes())
    try:
        async with prober(ProbeTarget(urls, floor_url, sim_url)) as probe:
            block = max(1, pools * sizes.runners_per_pool // 4)
            runs = [
                percentiles(
                    await probe_claims(
                        probe, sizes.scale_rounds, block, request_ids=False, between=release
                    )
                )
                for _ in range(sizes.repetitions)
            ]
    finally:
        running = False
        await looping
    claims: Result = {}
    record_claims(claims, "claim", runs)
    row.update(claims)
