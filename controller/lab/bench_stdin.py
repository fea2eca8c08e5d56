"""The stdin section of `poolkeeper bench`: a process's memory while a client floods an
execution's stdin.

A simulator with `--exec local` (commands run as real processes here) in a child
process; `poolkeeper run --poseidon-api` and an API replica (`poolkeeper api
--poseidon-api`) as processes of their own, as they are deployed. For each of them and
each API (/v1's stream, Poseidon's WebSocket), a client claims a runner, starts `sleep`
(which never reads its stdin) and sends 1 MiB stdin frames as fast as the socket takes
them, for FLOOD_SECONDS or FLOOD_MIB. The process's resident memory is sampled
throughout:

- `stdin.<process>.<api>.sent_mib`: what the client got to send;
- `stdin.<process>.<api>.rss_before_mb` and `.rss_peak_mb`: the process's resident
  memory before the flood, and its highest while the client sent;
- `stdin.rss_growth_max_mb`: the largest growth of the four;
- `stdin.run.v1_48_streams.*` and `stdin.rss_growth_many_mb`: the same with 48 floods at
  once into `poolkeeper run`, more than its bound on buffered stdin for all executions
  (32 MiB, docs/reference.md, "Executions") holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from controller.lab import bench
from controller.lab.chaos.processes import TOKEN, ApiReplica, ControllerProcess, free_port
from controller.model import POSEIDON_ENVIRONMENT_LABEL

MIB = 1024 * 1024
FLOOD_SECONDS = 8.0
FLOOD_MIB = 1500
ENVIRONMENT = 10
SAMPLE_SECONDS = 0.05
# Floods at once into one process: more than its stdin bound holds at a MiB each.
MANY_STREAMS = 48
START_SECONDS = 60.0
CLOSE = aiohttp.ClientWSTimeout(ws_close=1.0)


async def bench_stdin(run: bench.Run) -> None:
    run.say(f"stdin: 1 MiB frames for {FLOOD_SECONDS:g} s into a command that reads none")
    with tempfile.TemporaryDirectory(prefix="poolkeeper-bench-stdin-") as folder:
        async with bench.simulator(bench.SimOptions(exec_mode="local")) as sim:
            workdir = Path(folder)
            pools = workdir / "pools.yaml"
            pools.write_text(yaml.safe_dump(_pool()))
            growth = []
            auth = {"Authorization": f"Bearer {TOKEN}"}
            async with aiohttp.ClientSession(headers=auth) as http:
                # A fresh process for each flood: what one flood left allocated would
                # count in the next one's "before".
                for api in ("v1", "poseidon"):
                    run_dir, api_dir = workdir / f"run-{api}", workdir / f"api-{api}"
                    run_dir.mkdir()
                    api_dir.mkdir()
                    async with _running(_Run(run_dir, sim.url, free_port(), pools)) as standalone:
                        growth.append(await _measure(run, http, standalone, api))
                        async with _running(_Api(api_dir, sim.url, free_port())) as replica:
                            growth.append(await _measure(run, http, replica, api))
                many_dir = workdir / "run-many"
                many_dir.mkdir()
                async with _running(_Run(many_dir, sim.url, free_port(), pools)) as standalone:
                    many = await _measure(run, http, standalone, "v1", streams=MANY_STREAMS)
            run.out["stdin.rss_growth_many_mb"] = round(many, 1)
            run.out["stdin.rss_growth_max_mb"] = round(max(growth), 1)


async def _measure(
    run: bench.Run,
    http: aiohttp.ClientSession,
    process: ControllerProcess,
    api: str,
    streams: int = 1,
) -> float:
    """One flood's numbers into the results; how much the process grew."""
    key = f"stdin.{process.name}.{api}" + (f"_{streams}_streams" if streams > 1 else "")
    sent, before, peak = await _flood(http, process, api, streams)
    run.out[f"{key}.sent_mib"] = round(sent / MIB, 1)
    run.out[f"{key}.rss_before_mb"] = before
    run.out[f"{key}.rss_peak_mb"] = peak
    run.say(f"  {key}: {sent / MIB:.0f} MiB sent, RSS {before} -> {peak} MB")
    return peak - before


def _pool() -> dict[str, Any]:
    document = bench.pool_doc("flood", 4, 10)
    document["spec"]["executions"] = {"maxConcurrent": MANY_STREAMS}
    document["metadata"]["labels"] = {POSEIDON_ENVIRONMENT_LABEL: str(ENVIRONMENT)}
    return document


class _Run(ControllerProcess):
    name = "run"

    def arguments(self) -> list[str]:
        return [*super().arguments(), "--poseidon-api"]


class _Api(ApiReplica):
    name = "api"

    def arguments(self) -> list[str]:
        return [*super().arguments(), "--poseidon-api"]


@contextlib.asynccontextmanager
async def _running(process: ControllerProcess) -> AsyncIterator[ControllerProcess]:
    await process.start()
    try:
        deadline = time.monotonic() + START_SECONDS
        async with aiohttp.ClientSession() as http:
            while not await _ready(http, process.url):
                if time.monotonic() > deadline:
                    logs = process.logs[-1].read_text(errors="replace")[-2000:]
                    raise RuntimeError(f"{process.name} not ready in {START_SECONDS:g} s: {logs}")
                await asyncio.sleep(0.2)
        yield process
    finally:
        await process.stop()


async def _ready(http: aiohttp.ClientSession, url: str) -> bool:
    """The process answers, and sees the pool with idle runners."""
    headers = {"Authorization": f"Bearer {TOKEN}"}
    try:
        async with http.get(f"{url}/v1/pools", headers=headers) as response:
            pools = (await response.json())["pools"] if response.status == 200 else []
    except aiohttp.ClientError:
        return False
    idle = [p["status"].get("idleRunners", 0) for p in pools if p["name"] == "flood"]
    return bool(idle) and idle[0] >= 2


async def _flood(
    http: aiohttp.ClientSession, process: ControllerProcess, api: str, streams: int
) -> tuple[int, float, float]:
    """Bytes sent over `streams` executions of one runner, the process's resident memory
    (MB) before and at its highest meanwhile."""
    assert process.proc is not None
    pid = process.proc.pid
    create = _poseidon_execution if api == "poseidon" else _v1_execution
    runner = await create(http, process.url, None)
    frame = (
        "x" * (MIB - 64)  # a frame is less than 1 MiB
        if api == "poseidon"
        else json.dumps({"type": "stdin", "data": "x" * (MIB - 64)})
    )
    sockets = []
    sent = 0
    try:
        for _ in range(streams):  # each connected once created: few may wait unconnected
            url = await create(http, process.url, runner)
            sockets.append(
                await http.ws_connect(url, headers={"Poseidon-Token": TOKEN}, timeout=CLOSE)
            )
        before = bench.rss_mb(pid)
        peak = before

        async def send(ws: aiohttp.ClientWebSocketResponse) -> None:
            nonlocal sent
            try:
                while sent < FLOOD_MIB * MIB:
                    await ws.send_str(frame)
                    sent += MIB
            except ConnectionError as error:
                logs = process.logs[-1].read_text(errors="replace")[-3000:]
                raise RuntimeError(f"{process.name} dropped the flood ({error}): {logs}") from None

        floods = [asyncio.create_task(send(ws)) for ws in sockets]
        deadline = time.monotonic() + FLOOD_SECONDS + 1.0  # and what it takes in after
        while time.monotonic() < deadline:
            peak = max(peak, bench.rss_mb(pid))
            await asyncio.sleep(SAMPLE_SECONDS)
            if any(f.done() and f.exception() for f in floods):
                break
        for flood in floods:
            flood.cancel()
        for result in await asyncio.gather(*floods, return_exceptions=True):
            if isinstance(result, RuntimeError):
                raise result
    finally:
        # The server reads no more of them: their closing handshakes time out.
        await asyncio.gather(*(ws.close() for ws in sockets))
    return sent, before, max(peak, bench.rss_mb(pid))


async def _v1_execution(http: aiohttp.ClientSession, base: str, runner: str | None) -> str:
    """A runner claimed (`runner` None), or the stream URL of a `sleep` in it."""
    if runner is None:
        claims = f"{base}/v1/pools/{bench.NAMESPACE}/flood/claims"
        async with http.post(claims, json={}) as response:
            return f"{base}/v1/runners/{(await _json(response, 201))['runnerId']}"
    body = {"command": ["sleep", "60"], "timeLimitSeconds": 60}
    async with http.post(f"{runner}/executions", json=body) as response:
        return str((await _json(response, 201))["streamUrl"])


async def _poseidon_execution(http: aiohttp.ClientSession, base: str, runner: str | None) -> str:
    """A runner claimed (`runner` None), or the WebSocket URL of a `sleep` in it."""
    headers = {"Poseidon-Token": TOKEN}
    if runner is None:
        body = {"executionEnvironmentId": ENVIRONMENT, "inactivityTimeout": 120}
        async with http.post(f"{base}/api/v1/runners", json=body, headers=headers) as response:
            return f"{base}/api/v1/runners/{(await _json(response, 200))['runnerId']}"
    execute = {"command": "sleep 60", "timeLimit": 60}
    async with http.post(f"{runner}/execute", json=execute, headers=headers) as response:
        return str((await _json(response, 200))["websocketUrl"])


async def _json(response: aiohttp.ClientResponse, status: int) -> dict[str, Any]:
    if response.status != status:
        raise RuntimeError(f"{response.url} answered {response.status}: {await response.text()}")
    answer: dict[str, Any] = await response.json()
    return answer
