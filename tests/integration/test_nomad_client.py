"""NomadClient against small aiohttp servers answering as Nomad does (reference §3, §4, §6, §8)."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from controller.nomad.client import NomadClient
from controller.nomad.config import NomadConfig
from controller.nomad.errors import (
    NomadBadRequest,
    NomadConflict,
    NomadError,
    NomadPermissionDenied,
    NomadUnavailable,
)
from controller.nomad.exec import ExecRefused
from tests.integration.fake_http import Loopback, multi_query
from tests.support.ports import free_port

TOKEN = "9f3c1e2a-token-never-to-be-seen"
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass
class Seen:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: Any
    peer: Any


@dataclass
class FakeNomad:
    url: str = ""
    seen: list[Seen] = field(default_factory=list)


def text(status: int, body: str) -> web.Response:
    # Nomad's errors are text/plain, not JSON (reference §6).
    return web.Response(status=status, text=body, content_type="text/plain")


@pytest.fixture
def serve(loopback: Loopback) -> Callable[..., Awaitable[FakeNomad]]:
    async def start(routes: dict[str, Handler], ssl_context: Any = None) -> FakeNomad:
        fake = FakeNomad()

        async def dispatch(request: web.Request) -> web.StreamResponse:
            raw = await request.read()
            query = multi_query(request)
            fake.seen.append(
                Seen(
                    request.method,
                    request.path,
                    query,
                    dict(request.headers),
                    json.loads(raw) if raw else None,
                    request.transport.get_extra_info("peername") if request.transport else None,
                )
            )
            handler = routes.get(f"{request.method} {request.path}")
            if handler is None:
                return text(404, "resource not found")
            return await handler(request)

        fake.url = await loopback.serve("*", "/{tail:.*}", dispatch, ssl_context)
        return fake

    return start


@pytest.fixture
async def make_client() -> AsyncIterator[Callable[..., NomadClient]]:
    clients: list[NomadClient] = []

    def make(url: str, **kwargs: Any) -> NomadClient:
        config_args = kwargs.pop("config", {})
        config = NomadConfig(address=url, token=config_args.pop("token", TOKEN), **config_args)
        kwargs.setdefault("backoff_base", 0.01)
        kwargs.setdefault("timeout", 2.0)
        client = NomadClient(config, **kwargs)
        clients.append(client)
        return client

    yield make
    for client in clients:
        await client.close()


def sequence(*responses: Callable[[], web.StreamResponse]) -> Handler:
    """A handler answering with the given responses in turn, repeating the last one."""
    calls = 0

    async def handle(request: web.Request) -> web.StreamResponse:
        nonlocal calls
        answer = responses[min(calls, len(responses) - 1)]
        calls += 1
        return answer()

    return handle


def stored_variable(path: str, items: dict[str, str], index: int) -> dict[str, Any]:
    return {
        "Namespace": "default",
        "Path": path,
        "CreateIndex": index,
        "CreateTime": 1,
        "ModifyIndex": index,
        "ModifyTime": 1,
        "Items": items,
    }


# -- variables ---------------------------------------------------------------------------


async def test_put_variable_sends_cas_token_and_returns_stored_variable(serve, make_client):
    path = "poolkeeper/claims/py-0123456789ab"

    async def put(request: web.Request) -> web.Response:
        body = await request.json()
        return web.json_response(stored_variable(path, body["Items"], 42))

    fake = await serve({f"PUT /v1/var/{path}": put})
    calls: list[tuple[str, str]] = []
    client = make_client(fake.url, on_request=lambda e, c: calls.append((e, c)))

    stored = await client.put_variable(path, {"state": "retired"}, "runners", cas=0)

    assert stored["ModifyIndex"] == 42
    (request,) = fake.seen
    assert request.query == {"namespace": ["runners"], "cas": ["0"]}
    assert request.headers["X-Nomad-Token"] == TOKEN
    assert request.body == {"Namespace": "runners", "Path": path, "Items": {"state": "retired"}}
    assert calls == [("/v1/var/:path", "200")]


async def test_variable_conflict_carries_current_and_is_not_retried(serve, make_client):
    path = "poolkeeper/claims/py-0123456789ab"
    current = stored_variable(path, {"state": "claimed", "requestId": "r1"}, 77)
    fake = await serve(
        {f"PUT /v1/var/{path}": sequence(lambda: web.json_response(current, status=409))}
    )
    calls: list[tuple[str, str]] = []
    client = make_client(fake.url, on_request=lambda e, c: calls.append((e, c)))

    with pytest.raises(NomadConflict) as info:
        await client.put_variable(path, {"state": "retired"}, "default", cas=0)

    assert info.value.current == current
    assert info.value.status == 409
    assert len(fake.seen) == 1
    assert calls == [("/v1/var/:path", "409")]


async def test_read_and_delete_variable(serve, make_client):
    path = "poolkeeper/claims/py-0123456789ab"
    fake = await serve(
        {
            f"GET /v1/var/{path}": sequence(
                lambda: web.json_response(stored_variable(path, {"a": "b"}, 5)),
                lambda: text(404, "variable not found"),
            ),
            f"DELETE /v1/var/{path}": sequence(
                lambda: web.Response(status=200),
                lambda: web.json_response(stored_variable(path, {"a": "c"}, 9), status=409),
                lambda: text(404, "variable not found"),
            ),
        }
    )
    client = make_client(fake.url)

    assert (await client.read_variable(path, "default") or {})["Items"] == {"a": "b"}
    assert await client.read_variable(path, "default") is None
    await client.delete_variable(path, "default", cas=5)
    with pytest.raises(NomadConflict) as info:
        await client.delete_variable(path, "default", cas=5)
    assert info.value.current["ModifyIndex"] == 9
    await client.delete_variable(path, "default")  # missing is success
    deletes = [s.query for s in fake.seen if s.method == "DELETE"]
    assert deletes == [
        {"namespace": ["default"], "cas": ["5"]},
        {"namespace": ["default"], "cas": ["5"]},
        {"namespace": ["default"]},
    ]


# -- jobs ----------------------------------------------------------------------------------


async def test_job_cas_500_is_a_conflict_and_not_retried(serve, make_client):
    fake = await serve(
        {
            "POST /v1/jobs": sequence(
                lambda: text(500, "Enforcing job modify index 0: job already exists")
            )
        }
    )
    client = make_client(fake.url)
    job = {"ID": "py-0123456789ab", "Namespace": "runners", "Type": "batch"}

    with pytest.raises(NomadConflict) as info:
        await client.register_job(job, enforce_index=0)

    assert info.value.current == {}
    (request,) = fake.seen
    assert request.body == {"Job": job, "EnforceIndex": True, "JobModifyIndex": 0}
    assert request.query == {"namespace": ["runners"]}


async def test_register_job_returns_response(serve, make_client):
    reply = {"EvalID": "e1", "EvalCreateIndex": 10, "JobModifyIndex": 10, "Index": 10}
    fake = await serve({"POST /v1/jobs": sequence(lambda: web.json_response(reply))})
    client = make_client(fake.url)

    assert await client.register_job({"ID": "j1"}) == reply
    assert fake.seen[0].body == {"Job": {"ID": "j1"}}  # no EnforceIndex unless asked


async def test_purge_job_treats_missing_job_as_success(serve, make_client):
    fake = await serve(
        {
            "DELETE /v1/job/py-0123456789ab": sequence(
                lambda: web.json_response({"EvalID": "", "JobModifyIndex": 0}),
                lambda: text(404, "job not found"),
            )
        }
    )
    client = make_client(fake.url)
    await client.purge_job("py-0123456789ab", "runners")
    await client.purge_job("py-0123456789ab", "runners")
    assert [s.query for s in fake.seen] == [{"namespace": ["runners"], "purge": ["true"]}] * 2


# -- retries -------------------------------------------------------------------------------


async def test_read_is_retried_after_no_cluster_leader(serve, make_client):
    jobs = [{"ID": "py-0123456789ab", "Meta": {"poolkeeper_pool": "default/py"}}]
    fake = await serve(
        {
            "GET /v1/jobs": sequence(
                lambda: text(500, "No cluster leader"),
                lambda: text(500, "No cluster leader"),
                lambda: web.json_response(jobs),
            )
        }
    )
    calls: list[tuple[str, str]] = []
    client = make_client(fake.url, on_request=lambda e, c: calls.append((e, c)))

    assert await client.list_jobs("default") == jobs

    assert calls == [("/v1/jobs", "500"), ("/v1/jobs", "500"), ("/v1/jobs", "200")]
    # meta=true so Meta comes in the list; never a stale read.
    assert fake.seen[-1].query == {"namespace": ["default"], "meta": ["true"]}


async def test_read_gives_up_after_bounded_attempts(serve, make_client):
    fake = await serve({"GET /v1/jobs": sequence(lambda: text(502, "bad gateway"))})
    client = make_client(fake.url, attempts=3)
    with pytest.raises(NomadUnavailable) as info:
        await client.list_jobs("default")
    assert info.value.status == 502
    assert len(fake.seen) == 3


async def test_ambiguous_write_failure_is_not_retried(serve, make_client):
    path = "poolkeeper/claims/py-0123456789ab"
    fake = await serve({f"PUT /v1/var/{path}": sequence(lambda: text(500, "rpc error: EOF"))})
    client = make_client(fake.url)
    with pytest.raises(NomadUnavailable) as info:
        await client.put_variable(path, {"a": "b"}, "default", cas=0)
    assert info.value.maybe_applied
    assert len(fake.seen) == 1


async def test_write_refused_for_lack_of_leader_is_resent(serve, make_client):
    path = "poolkeeper/claims/py-0123456789ab"
    fake = await serve(
        {
            f"PUT /v1/var/{path}": sequence(
                lambda: text(500, "No cluster leader"),
                lambda: web.json_response(stored_variable(path, {"a": "b"}, 3)),
            )
        }
    )
    client = make_client(fake.url)
    stored = await client.put_variable(path, {"a": "b"}, "default", cas=0)
    assert stored["ModifyIndex"] == 3
    assert len(fake.seen) == 2


async def test_write_timeout_is_not_retried(serve, make_client):
    path = "poolkeeper/claims/py-0123456789ab"

    async def slow(request: web.Request) -> web.Response:
        await asyncio.sleep(0.5)
        return web.json_response(stored_variable(path, {"a": "b"}, 3))

    fake = await serve({f"PUT /v1/var/{path}": slow})
    client = make_client(fake.url, timeout=0.1)
    with pytest.raises(NomadUnavailable) as info:
        await client.put_variable(path, {"a": "b"}, "default", cas=0)
    # The write may have been applied: a resend could only report a false conflict.
    assert info.value.maybe_applied
    assert len(fake.seen) == 1


async def test_connection_refused(make_client):
    calls: list[tuple[str, str]] = []
    client = make_client(
        f"http://127.0.0.1:{free_port()}", on_request=lambda e, c: calls.append((e, c))
    )
    with pytest.raises(NomadUnavailable) as info:
        await client.list_variables("poolkeeper/", "default")
    assert not info.value.maybe_applied
    assert calls == [("/v1/vars", "error")] * 4
    # Never sent, so even a check-and-set write may be resent.
    calls.clear()
    with pytest.raises(NomadUnavailable):
        await client.put_variable("poolkeeper/x", {"a": "b"}, "default", cas=0)
    assert calls == [("/v1/var/:path", "error")] * 4


async def test_status_codes_map_to_domain_errors(serve, make_client):
    fake = await serve(
        {
            "GET /v1/jobs": sequence(lambda: text(403, "Permission denied")),
            "GET /v1/allocations": sequence(lambda: text(400, "Invalid index")),
            "GET /v1/vars": sequence(lambda: text(405, "Invalid method")),
        }
    )
    client = make_client(fake.url)
    with pytest.raises(NomadPermissionDenied):
        await client.list_jobs("default")
    with pytest.raises(NomadBadRequest):
        await client.list_allocations("default")
    with pytest.raises(NomadError) as info:
        await client.list_variables("", "default")
    assert info.value.status == 405
    assert len(fake.seen) == 3  # none of them is worth a retry


# -- pagination ------------------------------------------------------------------------------


def paged(pages: dict[str | None, tuple[list[dict[str, Any]], str | None]]) -> Handler:
    async def handle(request: web.Request) -> web.Response:
        items, next_token = pages[request.query.get("next_token")]
        # Go canonicalises the header name this way on the wire.
        headers = {"X-Nomad-Nexttoken": next_token} if next_token else {}
        return web.json_response(items, headers=headers)

    return handle


async def test_lists_follow_next_token(serve, make_client):
    allocs = {
        None: ([{"ID": "a1", "JobID": "py-000000000001"}], "2.a2"),
        "2.a2": ([{"ID": "a2", "JobID": "other-000000000001"}], "3.a3"),
        "3.a3": ([{"ID": "a3", "JobID": "py-000000000002"}], None),
    }
    variables = {
        None: ([{"Path": "poolkeeper/claims/a"}], "default.poolkeeper/claims/b"),
        "default.poolkeeper/claims/b": ([{"Path": "poolkeeper/claims/b"}], None),
    }
    fake = await serve(
        {
            "GET /v1/allocations": paged(allocs),
            "GET /v1/vars": paged(variables),
            "GET /v1/jobs": paged({None: ([{"ID": "j1"}], "default.j2"), "default.j2": ([], None)}),
        }
    )
    client = make_client(fake.url)

    everything = await client.list_allocations("default")
    assert [a["ID"] for a in everything] == ["a1", "a2", "a3"]
    assert [v["Path"] for v in await client.list_variables("poolkeeper/", "default")] == [
        "poolkeeper/claims/a",
        "poolkeeper/claims/b",
    ]
    assert await client.list_jobs("default") == [{"ID": "j1"}]

    alloc_queries = [s.query for s in fake.seen if s.path == "/v1/allocations"][:3]
    assert alloc_queries == [
        {"namespace": ["default"], "task_states": ["true"]},
        {"namespace": ["default"], "task_states": ["true"], "next_token": ["2.a2"]},
        {"namespace": ["default"], "task_states": ["true"], "next_token": ["3.a3"]},
    ]


# -- connections, environment -------------------------------------------------------------


async def test_concurrency_is_bounded_and_connections_are_reused(serve, make_client):
    in_flight = 0
    peak = 0

    async def get(request: web.Request) -> web.Response:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0.02)
        in_flight -= 1
        return web.json_response("127.0.0.1:4647")

    fake = await serve({"GET /v1/status/leader": get})
    client = make_client(fake.url, max_connections=3)

    results = await asyncio.gather(*(client.leader() for _ in range(12)))

    assert results == ["127.0.0.1:4647"] * 12
    assert peak == 3
    # Connections are kept alive and reused: never more sockets than the limit.
    assert len({s.peer for s in fake.seen}) <= 3


async def test_process_environment_is_not_consulted(serve, make_client, monkeypatch):
    monkeypatch.setenv("NOMAD_TOKEN", "from-the-environment")
    monkeypatch.setenv("NOMAD_NAMESPACE", "from-the-environment")
    fake = await serve({"GET /v1/vars": sequence(lambda: web.json_response([]))})
    client = make_client(fake.url, config={"token": None})
    await client.list_variables("poolkeeper/", "default")
    assert "X-Nomad-Token" not in fake.seen[0].headers
    assert fake.seen[0].query["namespace"] == ["default"]


async def test_proxy_from_the_environment_is_used_unless_bypassed(serve, make_client, monkeypatch):
    # The fake answers as a forward proxy would, for a Nomad that does not resolve.
    proxy = await serve({"GET /v1/status/leader": sequence(lambda: web.json_response("p:4647"))})
    monkeypatch.setenv("HTTP_PROXY", proxy.url)
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    assert await make_client("http://nomad.invalid:4646").leader() == "p:4647"
    assert proxy.seen[0].headers["Host"] == "nomad.invalid:4646"

    monkeypatch.setenv("NO_PROXY", "nomad.invalid")
    with pytest.raises(NomadUnavailable) as info:
        await make_client("http://nomad.invalid:4646").leader()
    assert not info.value.maybe_applied  # a DNS failure: nothing was sent
    assert len(proxy.seen) == 1


async def test_a_proxy_with_credentials_is_sent_them(serve, make_client, monkeypatch):
    # aiohttp 3.14 deprecates proxy_auth for proxy_headers, which reach only a CONNECT:
    # a plain http:// Nomad behind the proxy would lose the header.
    proxy = await serve({"GET /v1/status/leader": sequence(lambda: web.json_response("p:4647"))})
    monkeypatch.setenv("HTTP_PROXY", proxy.url.replace("http://", "http://puser:ppass@"))
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    assert await make_client("http://nomad.invalid:4646").leader() == "p:4647"
    sent = proxy.seen[0].headers["Proxy-Authorization"]
    assert sent == "Basic " + base64.b64encode(b"puser:ppass").decode()


async def test_token_never_in_errors_or_logs(serve, make_client, caplog):
    caplog.set_level(logging.DEBUG)

    async def echo(request: web.Request) -> web.Response:
        # A pathological proxy that echoes the request headers into its error body.
        return text(500, f"upstream failed for {dict(request.headers)}")

    fake = await serve({"GET /v1/jobs": echo, "PUT /v1/var/x": echo, "GET /v1/vars": echo})
    client = make_client(fake.url)
    errors: list[BaseException] = []
    for call in (
        client.list_jobs("default"),
        client.put_variable("x", {"a": "b"}, "default", cas=0),
        client.list_variables("", "default"),
    ):
        with pytest.raises(NomadError) as info:
            await call
        errors.append(info.value)
    refused = make_client(f"http://127.0.0.1:{free_port()}")
    with pytest.raises(NomadUnavailable) as info:
        await refused.list_jobs("default")
    errors.append(info.value)

    assert "upstream failed" in str(errors[0])  # the body is kept, the token is not
    for error in errors:
        assert TOKEN not in str(error)
        assert TOKEN not in repr(error)
    assert caplog.records, "retries should have been logged"
    assert TOKEN not in caplog.text
    assert TOKEN not in repr(client)


async def test_url_credentials_never_in_errors_or_logs(serve, make_client, caplog, monkeypatch):
    caplog.set_level(logging.DEBUG)

    async def leaky(_: web.Request) -> web.Response:
        # A proxy in front of Nomad that names its upstream, credentials and all.
        return text(500, "upstream https://admin:hunter2@nomad-internal:4646 refused")

    fake = await serve({"GET /v1/jobs": leaky})
    errors: list[BaseException] = []
    with pytest.raises(NomadError) as info:
        await make_client(fake.url).list_jobs("default")
    errors.append(info.value)
    # A forward proxy with credentials that does not answer.
    monkeypatch.setenv("HTTP_PROXY", f"http://proxy-user:hunter2@127.0.0.1:{free_port()}")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    with pytest.raises(NomadUnavailable) as info:
        await make_client("http://nomad.invalid:4646").leader()
    errors.append(info.value)
    errors.append(ExecRefused(1011, "dial https://admin:hunter2@10.0.0.1:4647: refused"))

    assert "upstream https://<redacted>@nomad-internal:4646 refused" in str(errors[0])
    for error in errors:
        assert "hunter2" not in str(error), error
    assert "hunter2" not in caplog.text


# -- TLS -----------------------------------------------------------------------------------------


def make_tls(directory: Path) -> tuple[Path, Path, Path]:
    """A CA and a server certificate for 127.0.0.1 signed by it: (ca, cert, key)."""

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True)

    openssl(
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem",
        "-days", "1", "-subj", "/CN=poolkeeper test CA",
    )  # fmt: skip
    openssl(
        "req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr",
        "-subj", "/CN=127.0.0.1",
    )  # fmt: skip
    (directory / "san.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    openssl(
        "x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
        "-CAcreateserial", "-out", "server.pem", "-days", "1", "-extfile", "san.cnf",
    )  # fmt: skip
    return directory / "ca.pem", directory / "server.pem", directory / "server.key"


def make_client_cert(directory: Path) -> tuple[Path, Path]:
    """A client certificate signed by make_tls's CA in `directory`: (cert, key)."""
    subprocess.run(
        ["openssl", "req", "-newkey", "rsa:2048", "-nodes", "-keyout", "client.key",
         "-out", "client.csr", "-subj", "/CN=poolkeeper"],
        cwd=directory, check=True, capture_output=True,
    )  # fmt: skip
    subprocess.run(
        ["openssl", "x509", "-req", "-in", "client.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
         "-CAcreateserial", "-out", "client.pem", "-days", "1"],
        cwd=directory, check=True, capture_output=True,
    )  # fmt: skip
    return directory / "client.pem", directory / "client.key"


@pytest.fixture
def tls_files(tmp_path: Path) -> tuple[Path, Path, Path]:
    return make_tls(tmp_path)


def server_context(cert: Path, key: Path) -> Any:
    import ssl

    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert, key)
    return ctx


async def test_tls_is_verified_by_default(serve, tls_files):
    ca, cert, key = tls_files
    leader = sequence(lambda: web.json_response("10.0.0.1:4647"))
    fake = await serve({"GET /v1/status/leader": leader}, ssl_context=server_context(cert, key))

    async def probe(env: dict[str, str]) -> str:
        client = NomadClient(NomadConfig.from_env({"NOMAD_ADDR": fake.url, **env}))
        try:
            return await client.leader()
        finally:
            await client.close()

    with pytest.raises(NomadUnavailable, match="TLS"):
        await probe({})
    with pytest.raises(NomadUnavailable, match="TLS"):
        await probe({"NOMAD_SKIP_VERIFY": "false"})  # false still verifies
    assert await probe({"NOMAD_CACERT": str(ca)}) == "10.0.0.1:4647"
    assert await probe({"NOMAD_CACERT": str(ca), "NOMAD_SKIP_VERIFY": "false"}) == "10.0.0.1:4647"
    assert await probe({"NOMAD_SKIP_VERIFY": "true"}) == "10.0.0.1:4647"
    # Two verified requests and one unverified reached the server; the failed ones did not.
    assert len(fake.seen) == 3


# -- against the simulator -----------------------------------------------------------------------


def batch_job(job_id: str) -> dict[str, Any]:
    return {
        "ID": job_id,
        "Name": job_id,
        "Namespace": "default",
        "Type": "batch",
        "Datacenters": ["*"],
        "Meta": {"poolkeeper_pool": "default/py"},
        "TaskGroups": [
            {
                "Name": "runner",
                "Count": 1,
                "Tasks": [
                    {
                        "Name": "runner",
                        "Driver": "docker",
                        "Config": {"image": "python:3.12-slim", "command": "sleep"},
                        "Resources": {"CPU": 100, "MemoryMB": 128},
                    }
                ],
            }
        ],
    }


@pytest.fixture
async def sim_client() -> AsyncIterator[NomadClient]:
    from controller.lab.simulator import Simulator, start_sim

    server = await start_sim(Simulator(seed=0, start_delay=0.01), host="127.0.0.1", port=0)
    client = NomadClient(NomadConfig(address=server.url), backoff_base=0.01)
    try:
        yield client
    finally:
        await client.close()
        await server.stop()


async def test_simulator_job_lifecycle(sim_client: NomadClient):
    job_id = "py-0123456789ab"
    reply = await sim_client.register_job(batch_job(job_id), enforce_index=0)
    assert reply["EvalID"]
    with pytest.raises(NomadConflict):
        await sim_client.register_job(batch_job(job_id), enforce_index=0)

    jobs = await sim_client.list_jobs("default")
    assert [(j["ID"], j["Meta"]) for j in jobs] == [(job_id, {"poolkeeper_pool": "default/py"})]
    assert await sim_client.list_jobs("other") == []

    async def allocated() -> list[dict[str, Any]]:
        for _ in range(200):
            allocs = await sim_client.list_allocations("default")
            if allocs:
                return allocs
            await asyncio.sleep(0.01)
        raise AssertionError("no allocation placed")

    (alloc,) = await allocated()
    assert alloc["JobID"] == job_id
    await sim_client.purge_job(job_id, "default")
    await sim_client.purge_job(job_id, "default")  # already gone: still fine
    assert await sim_client.list_jobs("default") == []
    assert isinstance(await sim_client.leader(), str)


async def test_simulator_variables_check_and_set(sim_client: NomadClient):
    path = "poolkeeper/claims/py-0123456789ab"
    created = await sim_client.put_variable(path, {"state": "claimed"}, "default", cas=0)
    with pytest.raises(NomadConflict) as info:
        await sim_client.put_variable(path, {"state": "retired"}, "default", cas=0)
    assert info.value.current["ModifyIndex"] == created["ModifyIndex"]
    assert info.value.current["Items"] == {"state": "claimed"}

    updated = await sim_client.put_variable(
        path, {"state": "released"}, "default", cas=created["ModifyIndex"]
    )
    assert updated["ModifyIndex"] > created["ModifyIndex"]
    assert (await sim_client.read_variable(path, "default") or {})["Items"] == {"state": "released"}
    listed = await sim_client.list_variables("poolkeeper/claims/", "default")
    assert [v["Path"] for v in listed] == [path]
    assert "Items" not in listed[0]

    with pytest.raises(NomadConflict):
        await sim_client.delete_variable(path, "default", cas=created["ModifyIndex"])
    await sim_client.delete_variable(path, "default", cas=updated["ModifyIndex"])
    assert await sim_client.read_variable(path, "default") is None


async def test_mutual_tls_sends_the_client_certificate(serve, tmp_path: Path):
    import ssl

    ca, cert, key = make_tls(tmp_path)
    client_cert, client_key = make_client_cert(tmp_path)
    ctx = server_context(cert, key)
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.load_verify_locations(ca)
    fake = await serve(
        {"GET /v1/status/leader": sequence(lambda: web.json_response("10.0.0.1:4647"))},
        ssl_context=ctx,
    )

    async def probe(env: dict[str, str]) -> str:
        base = {"NOMAD_ADDR": fake.url, "NOMAD_CACERT": str(ca)}
        client = NomadClient(NomadConfig.from_env({**base, **env}), backoff_base=0.01)
        try:
            return await client.leader()
        finally:
            await client.close()

    with pytest.raises(NomadUnavailable):
        await probe({})
    env = {"NOMAD_CLIENT_CERT": str(client_cert), "NOMAD_CLIENT_KEY": str(client_key)}
    assert await probe(env) == "10.0.0.1:4647"


async def test_a_closed_client_refuses_calls(make_client):
    client = make_client(f"http://127.0.0.1:{free_port()}")
    await client.close()
    with pytest.raises(NomadUnavailable, match="closed"):
        await client.leader()


async def test_a_lock_renewal_without_a_leader_fails_and_never_says_the_lock_is_lost(
    serve, make_client
):
    path = "poolkeeper/leases/default~py"
    fake = await serve({f"PUT /v1/var/{path}": sequence(lambda: text(500, "No cluster leader"))})
    client = make_client(fake.url, attempts=2)
    # The lock is still ours: the holder fences itself by time and renews after the fault.
    with pytest.raises(NomadUnavailable):
        await client.renew_lock(path, "default", "lock-1")


async def test_a_lock_renewal_refused_for_the_lock_says_it_is_lost(serve, make_client):
    path = "poolkeeper/leases/default~py"
    fake = await serve(
        {f"PUT /v1/var/{path}": sequence(lambda: text(500, "rpc error: variable lock not held"))}
    )
    client = make_client(fake.url)
    assert await client.renew_lock(path, "default", "lock-1") is False
