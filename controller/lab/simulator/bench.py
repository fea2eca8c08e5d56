"""A loopback benchmark of the simulator: registrations/s and list latencies.

Client and server share one event loop, so the times include the client's side of the
transfer. Latencies are measured until the whole body has arrived; the client's JSON
decoding is reported separately. "first" calls encode every stub; later calls reuse the
per-alloc encodings until an alloc changes.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import aiohttp

from controller.lab.simulator.cluster import Simulator
from controller.lab.simulator.server import start_sim


def _job(job_id: str) -> dict[str, Any]:
    task = {
        "Name": "runner",
        "Driver": "docker",
        "Config": {"image": "runner:1"},
        "Resources": {"CPU": 10, "MemoryMB": 16},
    }
    return {
        "Job": {
            "ID": job_id,
            "Type": "batch",
            "Meta": {"pool": "bench"},
            "TaskGroups": [{"Name": "g", "Count": 1, "Tasks": [task]}],
        }
    }


async def _timed_get(session: aiohttp.ClientSession, url: str, repeat: int = 3) -> dict[str, float]:
    """Seconds until the whole body has arrived: the first call and the best of the rest."""
    times: list[float] = []
    body = b"[]"
    for _ in range(repeat):
        started = time.perf_counter()
        async with session.get(url) as resp:
            resp.raise_for_status()
            body = await resp.read()
        times.append(time.perf_counter() - started)
    started = time.perf_counter()
    count = len(json.loads(body))
    decode = time.perf_counter() - started
    return {"first": times[0], "best": min(times[1:] or times), "count": count, "decode": decode}


async def measure(n_jobs: int, concurrency: int = 32) -> dict[str, float]:
    """Register n_jobs one-alloc jobs, then time the list calls a controller makes."""
    sim = Simulator(nodes=["bench-1", "bench-2", "bench-3"], seed=0, start_delay=0.0)
    server = await start_sim(sim)
    try:
        connector = aiohttp.TCPConnector(limit=concurrency)
        async with aiohttp.ClientSession(connector=connector) as session:
            queue: asyncio.Queue[int] = asyncio.Queue()
            for i in range(n_jobs):
                queue.put_nowait(i)

            async def worker() -> None:
                while not queue.empty():
                    i = queue.get_nowait()
                    async with session.put(
                        f"{server.url}/v1/jobs", json=_job(f"bench-{i:06d}")
                    ) as r:
                        r.raise_for_status()
                        await r.read()

            started = time.perf_counter()
            await asyncio.gather(*(worker() for _ in range(concurrency)))
            register_seconds = time.perf_counter() - started
            deadline = time.monotonic() + 60 + n_jobs / 100
            while sum(a["ClientStatus"] == "running" for a in sim.allocs.values()) < n_jobs:
                if time.monotonic() > deadline:
                    raise RuntimeError("allocations did not all start")
                await asyncio.sleep(0.05)
            allocs = await _timed_get(session, f"{server.url}/v1/allocations")
            lean = await _timed_get(session, f"{server.url}/v1/allocations?task_states=false")
            jobs = await _timed_get(session, f"{server.url}/v1/jobs?meta=true")
    finally:
        await server.stop()
    return {
        "jobs": float(n_jobs),
        "registrations_per_second": n_jobs / register_seconds,
        "alloc_list_count": allocs["count"],
        "alloc_list_first_seconds": allocs["first"],
        "alloc_list_seconds": allocs["best"],
        "alloc_list_client_decode_seconds": allocs["decode"],
        "alloc_list_no_task_states_seconds": lean["best"],
        "job_list_meta_count": jobs["count"],
        "job_list_meta_first_seconds": jobs["first"],
        "job_list_meta_seconds": jobs["best"],
    }


if __name__ == "__main__":
    import sys

    print(
        json.dumps(
            asyncio.run(measure(int(sys.argv[1]) if len(sys.argv) > 1 else 10_000)), indent=2
        )
    )
