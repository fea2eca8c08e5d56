"""EventWatcher against an aiohttp server speaking Nomad's NDJSON event stream (reference §2)."""

from __future__ import annotations

import asyncio
import json
import logging
import random
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from controller.nomad.config import NomadConfig
from controller.nomad.events import EventWatcher
from tests.integration.fake_http import Loopback, multi_query
from tests.integration.test_nomad_client import make_tls, server_context
from tests.support.waiting import wait_until

TOKEN = "6b1d-event-token-never-to-be-seen"
Script = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass
class Connect:
    at: float
    query: dict[str, list[str]]
    token: str | None


@dataclass
class FakeStream:
    url: str = ""
    connects: list[Connect] = field(default_factory=list)
    closed_at: list[float] = field(default_factory=list)


def frame(index: int, *events: dict[str, Any]) -> bytes:
    return json.dumps({"Index": index, "Events": list(events)}).encode() + b"\n"


def job_event(job_id: str, index: int) -> dict[str, Any]:
    return {
        "Topic": "Job",
        "Type": "JobRegistered",
        "Key": job_id,
        "Namespace": "runners",
        "Index": index,
        "Payload": {"Job": {"ID": job_id}},
    }


def alloc_event(alloc_id: str, job_id: str, index: int) -> dict[str, Any]:
    return {
        "Topic": "Allocation",
        "Type": "PlanResult",
        "Key": alloc_id,
        "Namespace": "runners",
        "FilterKeys": [job_id, ""],
        "Index": index,
        "Payload": {"Allocation": {"ID": alloc_id, "JobID": job_id}},
    }


async def open_stream(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "application/json"})
    await resp.prepare(request)
    await resp.write(b"{}\n")  # Nomad's heartbeat on connect
    return resp


def stream_of(*chunks: bytes, then: str = "close", hold: float = 0.0) -> Script:
    """A 200 stream writing `chunks`; then closes cleanly, aborts mid-chunk, or stays open."""

    async def script(request: web.Request) -> web.StreamResponse:
        resp = await open_stream(request)
        for chunk in chunks:
            await resp.write(chunk)
        await asyncio.sleep(hold)
        if then == "abort":
            await resp.write(b'{"Index": 99, "Ev')
            assert request.transport is not None
            request.transport.close()  # a chunked body cut short
            return resp
        if then == "open":
            await asyncio.sleep(3600)
        await resp.write_eof()
        return resp

    return script


def status(code: int, body: str) -> Script:
    async def script(request: web.Request) -> web.StreamResponse:
        return web.Response(status=code, text=body, content_type="text/plain")

    return script


@pytest.fixture
def serve(loopback: Loopback) -> Callable[..., Awaitable[FakeStream]]:
    async def start(*scripts: Script, ssl_context: Any = None) -> FakeStream:
        """Connection n gets scripts[n]; connections past the end get the last one."""
        fake = FakeStream()

        async def handle(request: web.Request) -> web.StreamResponse:
            query = multi_query(request)
            n = len(fake.connects)
            fake.connects.append(
                Connect(time.monotonic(), query, request.headers.get("X-Nomad-Token"))
            )
            try:
                return await scripts[min(n, len(scripts) - 1)](request)
            finally:
                fake.closed_at.append(time.monotonic())

        fake.url = await loopback.serve("GET", "/v1/event/stream", handle, ssl_context)
        return fake

    return start


@dataclass
class Recorder:
    jobs: list[str] = field(default_factory=list)
    states: list[bool] = field(default_factory=list)
    threads: set[str] = field(default_factory=set)

    def on_job(self, job_id: str) -> None:
        self.threads.add(threading.current_thread().name)
        self.jobs.append(job_id)

    def on_state(self, up: bool) -> None:
        self.states.append(up)


@pytest.fixture
async def watchers() -> AsyncIterator[list[EventWatcher]]:
    made: list[EventWatcher] = []
    yield made
    for watcher in made:
        await watcher.stop()


def watch(made: list[EventWatcher], url: str, recorder: Recorder, **kwargs: Any) -> EventWatcher:
    config = kwargs.pop("config", None) or NomadConfig(address=url, token=TOKEN)
    kwargs.setdefault("backoff_base", 0.02)
    kwargs.setdefault("backoff_max", 0.5)
    kwargs.setdefault("rng", random.Random(0))
    watcher = EventWatcher(config, "runners", recorder.on_job, on_state=recorder.on_state, **kwargs)
    made.append(watcher)
    watcher.start()
    return watcher


async def test_events_become_job_hints_and_the_stream_resumes_after_the_last_index(serve, watchers):
    fake = await serve(
        stream_of(
            frame(10, job_event("py-000000000001", 10), alloc_event("a1", "py-000000000002", 10)),
            b"{}\n",  # a heartbeat is no event
            frame(11, alloc_event("a2", "py-000000000002", 11), job_event("py-000000000002", 11)),
            then="close",
        ),
        status(500, "No cluster leader"),
        stream_of(b"not json at all\n", frame(12, job_event("py-000000000003", 12)), then="open"),
    )
    recorder = Recorder()
    watcher = watch(watchers, fake.url, recorder)

    await wait_until(lambda: "py-000000000003" in recorder.jobs)

    # Duplicates within a frame are folded; every Job key and Allocation JobID is a hint.
    assert recorder.jobs == ["py-000000000001", "py-000000000002", "py-000000000002",
                             "py-000000000003"]  # fmt: skip
    assert recorder.threads == {threading.current_thread().name}  # on the event loop
    first, after_drop, after_error = fake.connects
    assert first.query["topic"] == ["Job:*", "Allocation:*"]
    assert first.query["namespace"] == ["runners"]
    assert first.query["index"] == ["0"]
    assert after_drop.query["index"] == ["12"]  # last seen Index 11, plus one
    assert after_error.query["index"] == ["12"]
    assert {c.token for c in fake.connects} == {TOKEN}
    assert recorder.states == [False, True, False, True]
    assert watcher.up
    assert watcher.last_index == 12


async def test_backoff_grows_while_failing_and_resets_after_a_healthy_period(serve, watchers):
    failing = status(500, "rpc error: EOF")
    fake = await serve(
        failing, failing, failing, failing, failing,
        stream_of(hold=0.3, then="close"),  # healthy for longer than healthy_after
        failing,
    )  # fmt: skip
    recorder = Recorder()
    watch(watchers, fake.url, recorder, backoff_base=0.02, backoff_max=5, healthy_after=0.2)

    await wait_until(lambda: len(fake.connects) >= 7)

    gaps = [b.at - a for a, b in zip(fake.closed_at, fake.connects[1:], strict=False)]
    # Delays are drawn from [c/2, c] with c = 0.02 * 2**(n-1): 0.01-0.02, ..., 0.16-0.32.
    assert gaps[4] > 2 * gaps[0]
    assert gaps[4] >= 0.15
    assert gaps[0] < 0.12
    # After the long-lived connection the next delay starts from the base again.
    assert gaps[5] < 0.25  # without the reset: 0.32 to 0.64
    assert recorder.states == [False, True, False]


async def test_never_dies_on_errors_and_logs_each_kind_once(serve, watchers, caplog):
    caplog.set_level(logging.DEBUG, logger="controller.nomad.events")
    fake = await serve(
        status(403, f"Permission denied for token {TOKEN}"),
        status(403, "Permission denied"),
        stream_of(frame(5, job_event("py-000000000001", 5)), then="abort"),
        stream_of(then="close"),  # 200 then closed with no events (a v2 ACL failure)
        status(403, "Permission denied"),
        stream_of(frame(6, job_event("py-000000000009", 6)), then="open"),
    )
    recorder = Recorder()
    watch(watchers, fake.url, recorder, backoff_base=0.005)

    await wait_until(lambda: "py-000000000009" in recorder.jobs)

    assert len(fake.connects) == 6
    assert fake.connects[3].query["index"] == ["6"]  # resumes after the aborted stream
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len([w for w in warnings if "403" in w]) == 1
    assert len([w for w in warnings if "403" not in w]) == 2  # the abort and the clean end
    assert TOKEN not in caplog.text


async def test_stop_is_prompt_while_streaming_and_while_backing_off(serve, watchers):
    fake = await serve(stream_of(then="open"))
    recorder = Recorder()
    watcher = watch(watchers, fake.url, recorder)
    await wait_until(lambda: recorder.states[-1:] == [True])
    started = time.monotonic()
    await watcher.stop()
    assert time.monotonic() - started < 1
    assert recorder.states == [False, True, False]

    failing = await serve(status(500, "boom"))
    backing_off = watch(watchers, failing.url, Recorder(), backoff_base=30, backoff_max=30)
    await wait_until(lambda: len(failing.connects) == 1)
    started = time.monotonic()
    await backing_off.stop()
    assert time.monotonic() - started < 1


async def test_follows_a_tls_stream_only_when_the_certificate_verifies(
    serve, watchers, tmp_path: Path
):
    ca, cert, key = make_tls(tmp_path)
    fake = await serve(
        stream_of(frame(3, job_event("py-000000000001", 3)), then="open"),
        ssl_context=server_context(cert, key),
    )

    untrusted = Recorder()
    watch(watchers, fake.url, untrusted, config=NomadConfig.from_env({"NOMAD_ADDR": fake.url}))
    trusted = Recorder()
    env = {"NOMAD_ADDR": fake.url, "NOMAD_CACERT": str(ca), "NOMAD_SKIP_VERIFY": "false"}
    watch(watchers, fake.url, trusted, config=NomadConfig.from_env(env))

    await wait_until(lambda: trusted.jobs == ["py-000000000001"])
    await asyncio.sleep(0.1)
    assert untrusted.jobs == []
    assert untrusted.states == [False]
    assert len(fake.connects) == 1  # the untrusted watcher never got past the handshake


async def test_simulator_events_wake_jobs_and_survive_a_disconnect(watchers):
    from controller.lab.simulator import Simulator, start_sim
    from controller.nomad.client import NomadClient
    from tests.integration.test_nomad_client import batch_job

    server = await start_sim(Simulator(seed=0, start_delay=0.01), host="127.0.0.1", port=0)
    client = NomadClient(NomadConfig(address=server.url))
    try:
        recorder = Recorder()
        watcher = EventWatcher(
            NomadConfig(address=server.url),
            "default",
            recorder.on_job,
            on_state=recorder.on_state,
            backoff_base=0.01,
        )
        watchers.append(watcher)
        watcher.start()
        await wait_until(lambda: recorder.states[-1:] == [True])

        await client.register_job(batch_job("py-000000000001"), enforce_index=0)
        await wait_until(lambda: "py-000000000001" in recorder.jobs)
        seen = watcher.last_index
        assert seen > 0

        server.sim.disconnect_event_streams()
        await wait_until(lambda: recorder.states[-2:] == [False, True])
        await client.register_job(batch_job("py-000000000002"), enforce_index=0)
        await wait_until(lambda: "py-000000000002" in recorder.jobs)
        assert watcher.last_index > seen
        assert set(recorder.jobs) == {"py-000000000001", "py-000000000002"}
    finally:
        await client.close()
        for watcher in watchers:
            await watcher.stop()
        await server.stop()
