"""The executions section of `poolkeeper bench`: what poolkeeper adds to Nomad's exec.

A simulator with `--exec local` (commands run as real processes here) in a child
process, the standalone controller in this one, one claimed runner. Each measurement is
interleaved with the same work done through a bare aiohttp WebSocket to the simulator's
exec endpoint, the floor poolkeeper is compared with:

- `exec.first_byte_ratio`: from `POST …/executions` of `echo`, through opening its stream,
  to its first stdout frame; ÷ from opening a bare exec of the same `echo` to its first
  stdout frame (medians). Where the difference goes: `exec.create_p50_ms` (the POST),
  `exec.stream_open_p50_ms` (the stream's upgrade), and `exec.first_byte_wrapped_p50_ms`,
  a bare exec of the command line poolkeeper runs (the launcher, `timeout`, `echo`) to
  the echo's first byte: `exec.first_byte_ratio_wrapped` is poolkeeper against that;
- `exec.waited_p99_ms`: a waited `echo`, the whole request;
- `files.upload_mb_per_s_ratio`: a 16 MiB tar archive (2 MiB with --quick) uploaded
  through poolkeeper ÷ the same bytes streamed to a bare exec of `tar -x`, in the same
  64 KiB stdin frames (medians of MB/s).
"""

from __future__ import annotations

import base64
import io
import json
import os
import statistics
import tarfile
import time
from typing import Any

import aiohttp

from controller.executions.commands import PidMarker, execution_command
from controller.lab import bench
from controller.nomad.exec import STDIN_CHUNK
from controller.nomad.jobs import TASK_NAME

ECHO = ["echo", "first byte"]
# The same echo as poolkeeper runs it, with the pool's default time limit.
WRAPPED_ECHO = execution_command(ECHO, time_limit_seconds=60, directory="", env={}, wrapper=[])
MIB = 1024 * 1024
# Samples of the first byte and of waited executions, uploads and their size. The
# simulator decodes stdin frames as Go's JSON decoder does, in Python, at about 1 MB/s:
# the quick run uploads less.
FULL = (200, 200, 3, 16 * MIB)
QUICK = (30, 30, 1, 2 * MIB)


async def bench_exec(run: bench.Run) -> None:
    out, say = run.out, run.say
    first_bytes, waited, uploads, size = QUICK if run.sizes is bench.QUICK else FULL
    say(
        f"executions: {first_bytes} streamed and {waited} waited echos, "
        f"{uploads} uploads of {size // MIB} MiB"
    )
    doc = bench.pool_doc("exec", 1, 5)
    async with (
        bench.simulator(bench.SimOptions(exec_mode="local")) as sim,
        bench.standalone(sim.url, [doc], resync_seconds=10.0) as controller,
    ):
        await bench.wait_for(lambda: bench.all_full(controller.engine), 60, "a runner")
        async with aiohttp.ClientSession() as http:
            claim = await _claim(http, controller.url)
            runner = _Runner(http, controller.url, sim.url, claim)
            await runner.warm_up()
            ours, bare, wrapped = [], [], []
            for _ in range(first_bytes):
                ours.append(await runner.first_byte())
                bare.append(await runner.bare_first_byte(ECHO))
                wrapped.append(await runner.bare_first_byte(WRAPPED_ECHO, launcher=True))
            waits = [await runner.waited() for _ in range(waited)]
            archive = _archive(size)
            through, direct = [], []
            for _ in range(uploads):
                through.append(size / 1e6 / await runner.upload(archive))
                direct.append(size / 1e6 / await runner.bare_upload(archive))
    first = statistics.median(ours)
    out["exec.first_byte_p50_ms"] = bench.ms(first)
    out["exec.first_byte_bare_p50_ms"] = bench.ms(statistics.median(bare))
    out["exec.first_byte_ratio"] = round(first / statistics.median(bare), 3)
    out["exec.first_byte_wrapped_p50_ms"] = bench.ms(statistics.median(wrapped))
    out["exec.first_byte_ratio_wrapped"] = round(first / statistics.median(wrapped), 3)
    out["exec.create_p50_ms"] = bench.ms(statistics.median(runner.creates))
    out["exec.stream_open_p50_ms"] = bench.ms(statistics.median(runner.opens))
    out["exec.waited_p50_ms"] = bench.ms(bench.percentile(waits, 50))
    out["exec.waited_p99_ms"] = bench.ms(bench.percentile(waits, 99))
    out["files.upload_mb_per_s"] = round(statistics.median(through), 1)
    out["files.upload_bare_mb_per_s"] = round(statistics.median(direct), 1)
    out["files.upload_mb_per_s_ratio"] = round(
        statistics.median(through) / statistics.median(direct), 3
    )


async def _claim(http: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    async with http.post(f"{url}/v1/pools/{bench.NAMESPACE}/exec/claims", json={}) as response:
        if response.status != 201:
            raise RuntimeError(f"claim failed: {response.status} {await response.text()}")
        claim: dict[str, Any] = await response.json()
        return claim


def _archive(size: int) -> bytes:
    """A tar archive of one file of `size` random bytes."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        entry = tarfile.TarInfo("upload.bin")
        entry.size = size
        archive.addfile(entry, io.BytesIO(os.urandom(size)))
    return buffer.getvalue()


class _Runner:
    def __init__(
        self, http: aiohttp.ClientSession, url: str, sim_url: str, claim: dict[str, Any]
    ) -> None:
        self.http = http
        self.runner = f"{url}/v1/runners/{claim['runnerId']}"
        self.creates: list[float] = []
        self.opens: list[float] = []
        self.exec_url = f"{sim_url}/v1/client/allocation/{claim['allocationId']}/exec"

    async def warm_up(self) -> None:
        for _ in range(3):
            await self.first_byte()
            await self.bare_first_byte(ECHO)
        self.creates.clear()
        self.opens.clear()

    async def first_byte(self) -> float:
        started = time.perf_counter()
        async with self.http.post(f"{self.runner}/executions", json={"command": ECHO}) as response:
            created = await response.json()
        self.creates.append(time.perf_counter() - started)
        first, last = 0.0, None
        async with self.http.ws_connect(created["streamUrl"]) as ws:
            self.opens.append(time.perf_counter() - started - self.creates[-1])
            async for message in ws:
                last = message.json()
                if last["type"] == "stdout" and not first:
                    first = time.perf_counter() - started
        if last != {"type": "exit", "exitCode": 0} or not first:
            raise RuntimeError(f"echo through poolkeeper ended with {last}")
        return first

    async def bare_first_byte(self, command: list[str], *, launcher: bool = False) -> float:
        """Opening a bare exec to the command's first stdout byte (with `launcher`, the
        one after the launcher's PID, as poolkeeper takes that off)."""
        started = time.perf_counter()
        marker = PidMarker() if launcher else None
        async with self._bare(command) as ws:
            first = 0.0
            async for message in ws:
                data = json.loads(message.data).get("stdout", {}).get("data")
                if data and not first:
                    own = marker.feed(base64.b64decode(data)) if marker is not None else data
                    first = time.perf_counter() - started if own else 0.0
            if not first:
                raise RuntimeError("the bare echo printed nothing")
            return first

    async def waited(self) -> float:
        started = time.perf_counter()
        body = {"command": ECHO, "wait": True}
        async with self.http.post(f"{self.runner}/executions", json=body) as response:
            result = await response.json()
        if result.get("exitCode") != 0:
            raise RuntimeError(f"the waited echo answered {result}")
        return time.perf_counter() - started

    async def upload(self, archive: bytes) -> float:
        started = time.perf_counter()
        headers = {"Content-Type": "application/x-tar"}
        async with self.http.put(f"{self.runner}/files", data=archive, headers=headers) as r:
            if r.status != 204:
                raise RuntimeError(f"the upload answered {r.status}: {await r.text()}")
        return time.perf_counter() - started

    async def bare_upload(self, archive: bytes) -> float:
        started = time.perf_counter()
        async with self._bare(["tar", "-x", "-f", "-"]) as ws:
            for start in range(0, len(archive), STDIN_CHUNK):
                data = base64.b64encode(archive[start : start + STDIN_CHUNK]).decode()
                await ws.send_str(json.dumps({"stdin": {"data": data}}))
            await ws.send_str(json.dumps({"stdin": {"close": True}}))
            async for message in ws:
                frame = json.loads(message.data)
                if frame.get("exited") and frame.get("result"):
                    raise RuntimeError(f"the bare tar -x ended with {frame}")
        return time.perf_counter() - started

    def _bare(self, command: list[str]) -> Any:
        params = {"task": TASK_NAME, "command": json.dumps(command), "namespace": "default"}
        return self.http.ws_connect(self.exec_url, params=params)
