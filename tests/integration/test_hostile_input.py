"""Hostile input against the HTTP API: fuzzing from the OpenAPI document,
oversized and malformed payloads, slow-loris clients and auth on every `/v1` route.

Whatever a client sends: never a 5xx other than the documented 503s, never a traceback
in the body, errors in the `{"error": {"code", "message"}}` shape, and no change in Nomad
(jobs, variables) when the request was rejected.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, TypedDict, Unpack
from urllib.parse import quote

import aiohttp
import pytest
from hypothesis import given
from hypothesis import strategies as st

import controller.api.bodies as common
import controller.serving as serving
from controller.api.app import MAX_BODY_BYTES
from controller.api_tier import ApiTier
from controller.core.paths import RECONCILER_RECORDS
from controller.lab.simulator import Simulator
from controller.standalone import Controller
from tests.support.fuzzing import against_live_service
from tests.support.waiting import wait_until

from .conftest import TOKEN, Harness, write_pools
from .test_poseidon import READONLY, environment_pool


class Sending(TypedDict, total=False):
    """What a request sends besides its method and path (the token: TOKEN unless given;
    None sends no Authorization header)."""

    body: bytes | None
    headers: dict[str, str] | None
    token: str | None


POOL_PATH = "/v1/pools/default/py/claims"
POSEIDON_ENVIRONMENT = 10
METHODS = ["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"]
TRACEBACK = re.compile(r"Traceback|File \"|\.py\", line")

Snapshot = tuple[frozenset[str], tuple[tuple[str, int], ...]]


class Api:
    """A filled pool behind a controller, and raw access to both."""

    def __init__(
        self, harness: Harness, controller: Controller | ApiTier, openapi: dict[str, Any]
    ) -> None:
        self.harness = harness
        self.sim: Simulator = harness.sim
        self.controller = controller
        self.openapi = openapi
        self.http = aiohttp.ClientSession()

    def snapshot(self) -> Snapshot:
        jobs = frozenset(job["ID"] for job in self.sim.job_list("*"))
        variables = tuple(
            sorted(
                (path, int(var["ModifyIndex"]))
                for path, var in self.sim.variables("*").items()
                if not path.startswith(RECONCILER_RECORDS)  # on reconcilers' own schedule
            )
        )
        return jobs, variables

    async def quiescent(self) -> None:
        """Wait until Nomad stops changing (after a request that was accepted)."""
        previous = self.snapshot()
        stable_since = time.monotonic()

        async def still() -> bool:
            nonlocal previous, stable_since
            current = self.snapshot()
            pending = any(a["ClientStatus"] == "pending" for a in self.sim.allocations())
            if current != previous or pending:
                previous, stable_since = current, time.monotonic()
            return time.monotonic() - stable_since > 0.6

        await wait_until(still, within=20, what="Nomad to stop changing")

    async def send(self, method: str, path: str, **options: Unpack[Sending]) -> tuple[int, str]:
        body = options.get("body")
        all_headers = dict(options.get("headers") or {})
        token = options.get("token", TOKEN)
        if token is not None:
            all_headers.setdefault("Authorization", f"Bearer {token}")
        async with self.http.request(
            method,
            self.controller.url + path,
            data=body,
            headers=all_headers,
            skip_auto_headers={"Content-Type"} if body is None else set(),
            timeout=aiohttp.ClientTimeout(total=40),
        ) as response:
            return response.status, await response.text()

    def documented(self, method: str, path: str, status: int) -> bool:
        """Is this status documented for the route this path matches?"""
        for template, operations in self.openapi["paths"].items():
            pattern = "^" + re.sub(r"\{[^}]+\}", "[^/]+", template) + "$"
            if re.match(pattern, path) and method.lower() in operations:
                return str(status) in operations[method.lower()].get("responses", {})
        return False

    async def check(
        self, method: str, path: str, *, json_errors: bool = True, **options: Unpack[Sending]
    ) -> tuple[int, str]:
        """Send, then assert the API's promises for hostile input."""
        before = self.snapshot()
        status, text = await self.send(method, path, **options)
        assert not TRACEBACK.search(text), (method, path, status, text[:500])
        assert status < 500 or (status == 503 and self.documented(method, path, 503)), (
            method,
            path,
            status,
            text[:500],
        )
        if status >= 400 and json_errors:
            error = json.loads(text)["error"]
            assert isinstance(error["code"], str) and isinstance(error["message"], str)
        if status >= 400:
            assert self.snapshot() == before, (
                f"{method} {path} was rejected ({status}) but changed Nomad"
            )
        elif method in ("POST", "DELETE"):
            await self.quiescent()
        return status, text


@pytest.fixture(params=["one process", "API tier"])
async def api(
    harness: Harness, tmp_path: Path, request: pytest.FixtureRequest
) -> AsyncIterator[Api]:
    """The API of one process that also reconciles, or of an API replica beside it: both
    reject the same way."""
    pool = environment_pool("py", POSEIDON_ENVIRONMENT, idle=2, maxRunners=200)
    controller = await harness.start(write_pools(tmp_path / "pools.yaml", pool), poseidon=READONLY)
    await harness.settled(controller)
    server = (
        controller
        if request.param == "one process"
        else await harness.start_api_tier(poseidon=READONLY)
    )
    status, openapi = await harness.api(server, "GET", "/openapi.json", token=None)
    assert status == 200
    client = Api(harness, server, openapi)
    await client.quiescent()
    yield client
    await client.http.close()


# ---- generated requests -----------------------------------------------------------------

# Path parameters a hostile client might send: malformed IDs, traversal, unicode, huge.
segments = st.one_of(
    st.sampled_from(
        [
            "py",
            "default",
            "py-000000000000",
            "py-zzzzzzzzzzzz",
            "PY-0123456789AB",
            "..",
            ".",
            "%00",
            "a" * 2000,
            "py-" + "0" * 200,
            "nomad",
            "poolkeeper",
        ]
    ),
    st.text(min_size=1, max_size=80),
    st.from_regex(r"[a-z0-9]{1,20}-[0-9a-f]{12}", fullmatch=True),
)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=80),
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=20), children, max_size=5)
    ),
    max_leaves=20,
)
# Claim bodies near the schema: known keys with hostile values (waitSeconds kept out of
# its valid range, or the example would wait for a runner).
claim_bodies = st.fixed_dictionaries(
    {},
    optional={
        "inactivityTimeoutSeconds": json_values | st.integers(-5, 10**20),
        "requestId": json_values | st.text(max_size=100),
        "waitSeconds": st.one_of(
            st.floats(max_value=-0.001), st.floats(min_value=30.001), st.text(), st.booleans()
        ),
        "extra": json_values,
    },
)


def _fill(template: str, values: list[str]) -> str:
    parts = iter(values)
    return re.sub(r"\{[^}]+\}", lambda _: quote(next(parts), safe=""), template)


@st.composite
def requests(draw: st.DrawFn, paths: list[str]) -> tuple[str, str, bytes | None]:
    method = draw(st.sampled_from(METHODS))
    template = draw(st.sampled_from(paths))
    holes = template.count("{")
    path = _fill(template, [draw(segments) for _ in range(holes)])
    if draw(st.booleans()):
        path += draw(st.sampled_from(["", "/", "/x", "?a=1", "//", "/../.."]))
    kind = draw(st.sampled_from(["none", "json", "claim", "bytes"]))
    body: bytes | None
    if kind == "none":
        body = None
    elif kind == "json":
        body = json.dumps(draw(json_values)).encode()
    elif kind == "claim":
        body = json.dumps(draw(claim_bodies)).encode()
    else:
        body = draw(st.binary(max_size=300))
    return method, path, body


def _openapi_paths() -> list[str]:
    from controller.api.openapi import document

    return [*sorted(document()["paths"]), "/v1", "/v1/", "/v1/nope", "/nope"]


@against_live_service(max_examples=150)
@given(request=requests(_openapi_paths()))
async def test_fuzz_routes_from_the_openapi_document(
    api: Api, request: tuple[str, str, bytes | None]
) -> None:
    method, path, body = request
    await api.check(method, path, body=body, headers={"Content-Type": "application/json"})


@pytest.mark.slow
@against_live_service(max_examples=60)
@given(
    body=st.binary(max_size=2000),
    content_type=st.sampled_from(
        ["application/json", "text/plain", "application/x-www-form-urlencoded", "", "x/\x7f"]
    ),
    route=st.sampled_from([("POST", POOL_PATH), ("POST", "/v1/runners/py-0123456789ab/keepalive")]),
)
async def test_fuzz_raw_bodies(
    api: Api, body: bytes, content_type: str, route: tuple[str, str]
) -> None:
    method, path = route
    headers = {"Content-Type": content_type} if content_type.isprintable() else {}
    status, _ = await api.check(method, path, body=body, headers=headers)
    if path == POOL_PATH:
        # A body that is not a JSON object of known fields is refused.
        try:
            parsed = json.loads(body)
        except (ValueError, RecursionError):
            parsed = None
        if not (isinstance(parsed, dict) and set(parsed) <= {"requestId"}) and body.strip():
            assert status == 400


# ---- malformed and oversized payloads ------------------------------------------------------

MALFORMED = [
    b"{",
    b"[]",
    b"null",
    b"42",
    b'"a string"',
    b"\xff\xfe\x00{",
    b'{"inactivityTimeoutSeconds": NaN}',
    b'{"inactivityTimeoutSeconds": Infinity}',
    b'{"inactivityTimeoutSeconds": 1e999999}',
    b'{"inactivityTimeoutSeconds": 10.5}',
    b'{"inactivityTimeoutSeconds": true}',
    b'{"inactivityTimeoutSeconds": "60"}',
    b'{"inactivityTimeoutSeconds": 0}',
    b'{"inactivityTimeoutSeconds": 99999999999999999999999999}',
    b'{"waitSeconds": 31}',
    b'{"waitSeconds": -1}',
    b'{"requestId": ""}',
    b'{"requestId": "has space"}',
    b'{"requestId": "' + b"a" * 65 + b'"}',
    b'{"requestId": 5}',
    b'{"unknown": 1}',
    b'{"a": 1, "a": 2}',
]


@pytest.mark.parametrize("body", MALFORMED, ids=[repr(b[:30]) for b in MALFORMED])
async def test_malformed_claim_bodies_are_400(api: Api, body: bytes) -> None:
    status, text = await api.check(
        "POST", POOL_PATH, body=body, headers={"Content-Type": "application/json"}
    )
    assert status == 400, text
    assert json.loads(text)["error"]["code"] == "InvalidRequest"


@pytest.mark.parametrize("depth", [100, 5_000, 30_000])
async def test_deeply_nested_json_is_400(api: Api, depth: int) -> None:
    """Within the size limit, nesting deep enough to exhaust Python's recursion limit
    must still be bad input (400), not an internal error (500)."""
    status, text = await api.check("POST", POOL_PATH, body=b"[" * depth + b"]" * depth)
    assert status == 400, text


# JSON that Python's parser does not take as Go's does, or at all.
HOSTILE_JSON = {
    "nesting 3,000 deep": "[" * 3_000 + "]" * 3_000,
    "nesting 20,000 deep": "[" * 20_000 + "]" * 20_000,
    "objects nesting 3,000 deep": '{"a":' * 3_000 + "1" + "}" * 3_000,
    "an integer of 4,301 digits": "1" + "0" * 4_300,
    "a negative integer of 5,000 digits": "-" + "9" * 5_000,
    "a number with 400 exponent digits": "1e" + "9" * 400,
    "a lone surrogate": '"a\\ud800"',
    "lone surrogates in a list": '["\\udc00", "x\\ud800"]',
    "an object keyed by a lone surrogate": '{"\\ud800": "\\udfff"}',
}
# The JSON routes of both APIs that need no runner, and their fields (x: unknown).
JSON_ROUTES = [
    ("POST", POOL_PATH, ["requestId", "inactivityTimeoutSeconds", "waitSeconds", "x"]),
    ("POST", "/api/v1/runners", ["executionEnvironmentId", "inactivityTimeout", "x"]),
    (
        "PUT",
        f"/api/v1/execution-environments/{POSEIDON_ENVIRONMENT}",
        ["prewarmingPoolSize", "image", "exposedPorts", "x"],
    ),
]
PYTHON_ERRORS = re.compile(r"\b\w*(Error|Exception)\b|int_max_str_digits")


async def test_hostile_json_is_never_a_server_error_on_either_api(api: Api) -> None:
    """Deep nesting, huge numbers and lone surrogates, as the whole body and in every
    field: /v1 refuses them (400); Poseidon's API answers as Go's decoder reads them
    (its 10,000 levels, a number's text in its errors, U+FFFD for a lone surrogate)."""
    headers = {"Content-Type": "application/json", "Poseidon-Token": TOKEN}
    for method, path, fields in JSON_ROUTES:
        for what, value in HOSTILE_JSON.items():
            for body in [value, *(f'{{"{field}": {value}}}' for field in fields)]:
                status, text = await api.check(
                    method, path, body=body.encode(), headers=headers, json_errors=False
                )
                where = (method, path, what, body[:60], status, text[:300])
                assert status < 500, where
                assert not PYTHON_ERRORS.search(text), where
                if path.startswith("/v1"):
                    assert status == 400, where


@pytest.mark.parametrize("size", [MAX_BODY_BYTES + 1, 4 * 1024 * 1024])
async def test_oversized_bodies_are_413(api: Api, size: int) -> None:
    body = b'{"requestId": "' + b"a" * size + b'"}'
    status, text = await api.check("POST", POOL_PATH, body=body)
    assert status == 413, text
    assert json.loads(text)["error"]["code"] == "PayloadTooLarge"


async def test_oversized_headers_are_refused(api: Api) -> None:
    # aiohttp refuses these before the app sees them (max_field_size, max_line_size), with
    # its own plain-text body rather than the API's JSON error.
    status, _ = await api.check(
        "GET", "/v1/pools", headers={"X-Padding": "a" * 20_000}, json_errors=False
    )
    assert 400 <= status < 500
    status, _ = await api.check("GET", "/v1/runners/" + "a" * 20_000, json_errors=False)
    assert 400 <= status < 500


# Requests aiohttp cannot parse, each answered 4xx before the application sees it.
MALFORMED_REQUESTS = [
    b"GET /v1/pools HTTP/1.1\r\nHost: x\r\nX-Padding: " + b"a" * 20_000 + b"\r\n\r\n",
    b"GET /v1/pools HTTP/1.1\r\nHost: x\r\n" + b"X-Many: 1\r\n" * 200 + b"\r\n",
    b"GET /" + b"a" * 20_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
    b"POST /v1/claims HTTP/1.1\r\nHost: x\r\nContent-Length: ten\r\n\r\n",
    b"GET /v1/pools HTTP/1.1\r\nHost: x\r\nBad Header: 1\r\n\r\n",
    b"GET /v1/pools HTTP/9.9\r\nHost: x\r\n\r\n",
]


async def _answer_to(api: Api, raw: bytes) -> bytes:
    host, port = api.controller.url.removeprefix("http://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(raw)
        await writer.drain()
        return await asyncio.wait_for(reader.read(200), 10)
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


async def test_malformed_requests_are_brief_lines_not_tracebacks(
    api: Api, caplog: pytest.LogCaptureFixture
) -> None:
    """Anyone who can connect can send these: each is refused, and the log says so in a
    line at most a second, never with a traceback or at ERROR."""
    caplog.set_level(logging.INFO)
    await asyncio.sleep(1.1)  # the second in which an earlier test's line came is over
    for _ in range(5):
        for raw in MALFORMED_REQUESTS:
            answer = await _answer_to(api, raw)
            assert answer.startswith((b"HTTP/1.1 4", b"HTTP/1.0 4")), (raw[:60], answer)
    loud = [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info]
    assert not loud, [(r.name, r.levelname, r.getMessage()) for r in loud]
    lines = [r.getMessage() for r in caplog.records if "malformed request" in r.getMessage()]
    assert 1 <= len(lines) <= 3, lines  # 30 requests within a second or two


# ---- auth ------------------------------------------------------------------------------

BAD_AUTH = [
    None,
    "",
    "Bearer",
    "Bearer ",
    "Bearer wrong-token",
    f"Basic {TOKEN}",
    f"Bearer {TOKEN}x",
    f"Bearer {TOKEN[:-1]}",
    f"Token {TOKEN}",
]


async def test_every_v1_route_needs_a_token(api: Api) -> None:
    routes = [
        (
            method.upper(),
            _fill(
                template, ["default", "py"] if "{namespace}" in template else ["py-0123456789ab"]
            ),
        )
        for template, operations in api.openapi["paths"].items()
        if template.startswith("/v1")
        for method, operation in operations.items()
        # An execution's stream has a credential of its own: its ID (test_execution_hostile).
        if method.upper() in METHODS and operation.get("security") != []
    ]
    assert {path for _, path in routes} >= {"/v1/pools", POOL_PATH}
    assert len(routes) >= 6
    for method, path in routes:
        for header in BAD_AUTH:
            headers = {} if header is None else {"Authorization": header}
            body = b"{}" if method == "POST" else None
            status, text = await api.check(method, path, body=body, headers=headers, token=None)
            assert status == 401, (method, path, header, status)
            assert json.loads(text)["error"]["code"] == "Unauthorized"
            assert TOKEN not in text


async def test_open_routes_need_no_token(api: Api) -> None:
    for path in ("/healthz", "/readyz", "/metrics", "/openapi.json"):
        status, text = await api.send("GET", path, token=None)
        assert status == 200, (path, text)
        assert TOKEN not in text


async def test_a_valid_token_is_accepted_on_every_v1_route(api: Api) -> None:
    status, _ = await api.check("GET", "/v1/pools")
    assert status == 200
    status, _ = await api.check("GET", POOL_PATH)
    assert status == 200
    status, _ = await api.check("GET", "/v1/runners/py-0123456789ab")
    assert status == 404


# ---- slow-loris clients ------------------------------------------------------------------


async def _served_meanwhile(api: Api, seconds: float) -> list[float]:
    """Latencies of ordinary requests made while the slow client is connected."""
    latencies = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        started = time.monotonic()
        status, _ = await api.send("GET", "/v1/pools")
        assert status == 200
        latencies.append(time.monotonic() - started)
        await asyncio.sleep(0.2)
    return latencies


async def _dribble(host: str, port: int, prefix: bytes, data: bytes, interval: float) -> float:
    """Send `prefix` at once, then `data` one byte per `interval`; seconds until the
    server closed the connection or answered (a whole request sent means it never cut
    the client off)."""
    reader, writer = await asyncio.open_connection(host, port)
    started = time.monotonic()
    try:
        writer.write(prefix)
        for byte in data:
            if reader.at_eof():
                break
            writer.write(bytes([byte]))
            try:
                await writer.drain()
                chunk = await asyncio.wait_for(reader.read(1024), timeout=interval)
            except TimeoutError:
                continue
            except ConnectionError:
                break
            if not chunk or chunk.startswith(b"HTTP/"):
                break
        return time.monotonic() - started
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


@pytest.fixture
def short_http_timeout(monkeypatch: pytest.MonkeyPatch) -> float:
    monkeypatch.setattr(serving, "HTTP_IDLE_TIMEOUT_SECONDS", 1.5)
    monkeypatch.setattr(common, "BODY_READ_TIMEOUT_SECONDS", 1.5)
    return 1.5


@pytest.mark.slow
async def test_slow_headers_are_cut_off_while_others_are_served(
    short_http_timeout: float, api: Api
) -> None:
    host, port = api.controller.url.removeprefix("http://").rsplit(":", 1)
    request = (
        f"POST {POOL_PATH} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
        "Content-Type: application/json\r\nX-Slow: " + "a" * 200 + "\r\n\r\n{}"
    ).encode()
    slow = [asyncio.create_task(_dribble(host, int(port), b"", request, 0.3)) for _ in range(20)]
    latencies = await _served_meanwhile(api, short_http_timeout + 1)
    held = await asyncio.gather(*slow)
    # Sending it all would take 80 s; the server cuts each one off after its timeout.
    assert max(held) < short_http_timeout + 5, held
    assert max(latencies) < 2.0, latencies


@pytest.mark.slow
async def test_slow_bodies_are_cut_off_while_others_are_served(
    short_http_timeout: float, api: Api
) -> None:
    host, port = api.controller.url.removeprefix("http://").rsplit(":", 1)
    body = b'{"requestId": "' + b"a" * 40 + b'"}'
    head = (
        f"POST {POOL_PATH} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    slow = asyncio.create_task(_dribble(host, int(port), head, body, 0.5))
    latencies = await _served_meanwhile(api, 2.0)
    assert max(latencies) < 2.0, latencies
    held = await slow
    # Sending the body takes 30 s; a server timeout must cut it off well before.
    assert held < 10, held
