"""The client fs API on allocation directories (here without --exec local: fs works in both)."""

from __future__ import annotations

import base64
import json
import re
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from controller.lab.simulator import SimServer, Simulator, sandbox, start_sim
from controller.lab.simulator.allocfs import go_file_mode, go_time, sniff
from tests.simulator.conftest import START_DELAY, Client, service_job
from tests.simulator.exec_support import exists, running_alloc
from tests.support.waiting import wait_until

MODTIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,9})?(Z|[+-]\d\d:\d\d)$")
UNTRUSTED = {
    "Content-Type": "text/plain",
    "X-Content-Type-Options": "nosniff",
    "X-XSS-Protection": "1; mode=block",
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; sandbox",
}


@pytest.fixture
async def alloc_id(client: Client, sim: Simulator) -> str:
    return await running_alloc(client, sim)


@pytest.fixture
def root(sim: Simulator, alloc_id: str) -> Path:
    """The allocation's directory, with a few files in it."""
    path = Path(sim.sandboxes.open(sim.alloc(alloc_id)).path)
    (path / "main/local/hello.txt").write_bytes(b"hello, world\n")
    (path / "main/local/config.json").write_text('{"a": 1}')
    (path / "main/local/page.html").write_text("  <html><body>hi</body></html>")
    (path / "main/local/image.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(20))
    (path / "main/local/empty").write_bytes(b"")
    (path / "main/secrets/token").write_text("s3cret")
    (path / "main/private/key").write_text("k")
    (path / "alloc/data/big").write_bytes(bytes(range(256)) * 400)
    (path / "alloc/data/out").symlink_to("/etc")
    return path


def names(entries: list[dict[str, object]]) -> list[object]:
    return [e["Name"] for e in entries]


# ---------------------------------------------------------------------- ls and stat
async def test_ls_lists_the_layout(client: Client, alloc_id: str, root: Path) -> None:
    status, top, headers = await fs_get(client, "ls", alloc_id)
    assert status == 200 and headers["Content-Type"] == "application/json"
    assert names(top) == ["alloc", "main"]
    assert [(e["IsDir"], e["FileMode"]) for e in top] == [
        (True, "drwxr-xr-x"),
        (True, "drwxrwxrwx"),
    ]
    assert all(set(e) == {"Name", "IsDir", "Size", "FileMode", "ModTime"} for e in top)
    assert all(MODTIME.match(str(e["ModTime"])) for e in top)
    _, task, _ = await fs_get(client, "ls", alloc_id, path="/main")
    assert {e["Name"]: e["FileMode"] for e in task} == {
        "local": "drwxrwxrwx",
        "private": "drwxrwxrwx",
        "secrets": "drwxrwxrwx",
        "tmp": "dtrwxrwxrwx",
    }
    _, logs, _ = await fs_get(client, "ls", alloc_id, path="alloc/logs")
    assert names(logs) == ["main.stderr.0", "main.stdout.0"]
    _, data, _ = await fs_get(client, "ls", alloc_id, path="alloc/data")
    out = next(e for e in data if e["Name"] == "out")
    assert out["FileMode"] == "Lrwxrwxrwx" and out["IsDir"] is False  # links not followed
    _, secrets, _ = await fs_get(client, "ls", alloc_id, path="main/secrets")
    assert names(secrets) == ["token"]  # listing secrets is allowed; reading them is not


async def test_stat_describes_a_file_and_sniffs_its_content(
    client: Client, alloc_id: str, root: Path
) -> None:
    status, info, _ = await fs_get(client, "stat", alloc_id, path="main/local/hello.txt")
    assert status == 200
    assert info["Name"] == "hello.txt" and info["Size"] == 13 and info["IsDir"] is False
    assert info["FileMode"] == go_file_mode((root / "main/local/hello.txt").stat().st_mode)
    assert info["ModTime"] == go_time((root / "main/local/hello.txt").stat().st_mtime_ns)
    assert info["ContentType"] == "text/plain; charset=utf-8"
    kinds = {
        "main/local/config.json": "application/json",
        "main/local/page.html": "text/html; charset=utf-8",
        "main/local/image.png": "image/png",
        "main/local/empty": "application/octet-stream",
        "alloc/data/big": "application/octet-stream",
        "main": "application/octet-stream",
    }
    for path, kind in kinds.items():
        _, info, _ = await fs_get(client, "stat", alloc_id, path=path)
        assert info["ContentType"] == kind, path


def test_go_file_modes() -> None:
    assert go_file_mode(0o100644) == "-rw-r--r--"
    assert go_file_mode(0o41777) == "dtrwxrwxrwx"
    assert go_file_mode(0o120777) == "Lrwxrwxrwx"
    assert go_file_mode(0o20620) == "Dcrw--w----"
    assert go_file_mode(0o104755) == "urwxr-xr-x"


@pytest.mark.parametrize(
    ("zone", "expected"),
    [
        ("UTC", "2023-11-14T22:13:20.12Z"),
        ("CET-1", "2023-11-14T23:13:20.12+01:00"),
        ("EST5", "2023-11-14T17:13:20.12-05:00"),
    ],
)
def test_go_times_in_the_local_zone(
    zone: str, expected: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TZ", zone)
    time.tzset()
    try:
        assert go_time(1_700_000_000_120_000_000) == expected
        assert go_time(1_700_000_000_000_000_000) == expected.replace(".12", "")
    finally:
        monkeypatch.undo()
        time.tzset()


def test_sniffing_follows_go() -> None:
    assert sniff(b"%PDF-1.7") == "application/pdf"
    assert sniff(b"\n<?xml version") == "text/xml; charset=utf-8"
    assert sniff(b"<!-- c -->") == "text/html; charset=utf-8"
    assert sniff(b"<htmlx>") == "text/plain; charset=utf-8"  # not a tag Go knows
    assert sniff(b"PK\x03\x04rest") == "application/zip"
    assert sniff(b"plain text\twith tabs\n") == "text/plain; charset=utf-8"
    assert sniff(b"bin\x00ary") == "application/octet-stream"


# ---------------------------------------------------------------------- cat, readat, stream
async def test_cat_gives_the_bytes_with_the_untrusted_content_headers(
    client: Client, alloc_id: str, root: Path
) -> None:
    status, body, headers = await fs_get(client, "cat", alloc_id, path="/main/local/hello.txt")
    assert (status, body) == (200, "hello, world\n")
    assert {k: headers[k] for k in UNTRUSTED} == UNTRUSTED


async def test_readat_reads_from_an_offset_up_to_a_limit(
    server: SimServer, alloc_id: str, root: Path
) -> None:
    url = f"{server.url}/v1/client/fs/readat/{alloc_id}"
    big = (root / "alloc/data/big").read_bytes()
    async with aiohttp.ClientSession() as http:
        for params, expected in (
            ({"offset": "7", "limit": "3"}, b"wor"),
            ({"offset": "7"}, b"world\n"),
            ({"offset": "100", "limit": "0"}, b""),
        ):
            async with http.get(url, params={"path": "main/local/hello.txt", **params}) as resp:
                assert (resp.status, await resp.read()) == (200, expected)
        async with http.get(url, params={"path": "alloc/data/big", "offset": "1000"}) as resp:
            assert await resp.read() == big[1000:]


async def test_stream_without_follow_gives_frames(
    client: Client, alloc_id: str, root: Path
) -> None:
    status, body, _ = await fs_get(
        client, "stream", alloc_id, path="main/local/hello.txt", follow="false"
    )
    assert status == 200
    assert json.loads(body) == {
        "Offset": 13,
        "Data": "aGVsbG8sIHdvcmxkCg==",
        "File": "main/local/hello.txt",
    }
    _, tail, _ = await fs_get(
        client,
        "stream",
        alloc_id,
        path="main/local/hello.txt",
        follow="false",
        origin="end",
        offset="6",
    )
    assert json.loads(tail)["Data"] == "d29ybGQK"  # "world\n"


async def test_a_followed_stream_ends_when_the_file_is_deleted(
    server: SimServer, alloc_id: str, root: Path
) -> None:
    url = f"{server.url}/v1/client/fs/stream/{alloc_id}"
    params = {"path": "main/local/hello.txt"}
    async with aiohttp.ClientSession() as http, http.get(url, params=params) as resp:
        first = json.loads(await resp.content.readuntil(b"}"))
        assert first["Offset"] == 13
        _remove(root / "main/local/hello.txt")
        rest = (await resp.read()).decode()
    assert rest.endswith('{"Offset":13,"File":"main/local/hello.txt","FileEvent":"file deleted"}')


def _remove(path: Path) -> None:
    path.unlink()


# ---------------------------------------------------------------------- errors
HELLO = "main/local/hello.txt"
NO_FILE = "{root}/nope: no such file or directory"
ESCAPES = "Path escapes the alloc directory"
PARSE_INT = 'strconv.ParseInt: parsing "{}": invalid syntax'
PARSE_BOOL = 'strconv.ParseBool: parsing "{}": invalid syntax'


@pytest.mark.parametrize(
    ("op", "params", "status", "text"),
    [
        ("ls", {"path": "nope"}, 404, "open " + NO_FILE),
        ("ls", {"path": HELLO}, 500, f"readdirent {{root}}/{HELLO}: not a directory"),
        ("ls", {"path": "../.."}, 500, ESCAPES),
        ("ls", {"path": "alloc/data/out"}, 500, ESCAPES),  # a link out of the directory
        ("stat", {}, 400, "must provide a file name"),
        ("stat", {"path": "nope"}, 404, "stat " + NO_FILE),
        ("stat", {"path": "main/../../x"}, 500, ESCAPES),
        ("cat", {}, 400, "must provide a file name"),
        ("cat", {"path": "nope"}, 400, "stat " + NO_FILE),
        ("cat", {"path": "main"}, 400, 'file "main" is a directory'),
        ("cat", {"path": "../x"}, 400, ESCAPES),
        ("cat", {"path": "main/secrets/token"}, 500, "Reading secret file prohibited: {path}"),
        ("cat", {"path": "main/private/key"}, 500, "Reading private file prohibited: {path}"),
        ("readat", {"path": HELLO}, 500, "error parsing offset: " + PARSE_INT.format("")),
        ("readat", {"path": HELLO, "offset": "0", "limit": "x"}, 500,
         "error parsing limit: " + PARSE_INT.format("x")),
        ("readat", {"path": HELLO, "offset": "-1"}, 500,
         "can't seek to offset %!q(int64=-1): seek {root}/" + HELLO + ": invalid argument"),
        ("stream", {"path": HELLO, "origin": "middle"}, 400, "origin must be start or end"),
        ("stream", {"path": HELLO, "follow": "yes"}, 500,
         "failed to parse follow field to boolean: " + PARSE_BOOL.format("yes")),
    ],
)  # fmt: skip
async def test_fs_errors(
    client: Client,
    alloc_id: str,
    root: Path,
    op: str,
    params: dict[str, str],
    status: int,
    text: str,
) -> None:
    got = await fs_get(client, op, alloc_id, **params)
    assert got[:2] == (status, text.format(root=root, path=params.get("path")))
    if op in ("cat", "readat"):
        assert {k: got[2][k] for k in UNTRUSTED} == UNTRUSTED


async def fs_get(client: Client, op: str, alloc_id: str, **query: str) -> tuple[int, Any, Any]:
    """GET /v1/client/fs/<op>/<alloc_id>: (status, JSON or text, headers)."""
    url = f"{client.url}/v1/client/fs/{op}/{alloc_id}"
    async with client.session.get(url, params=query) as resp:
        body = await resp.text()
        if resp.headers.get("Content-Type") == "application/json":
            return resp.status, json.loads(body), resp.headers
        return resp.status, body, resp.headers


async def test_which_allocation(client: Client, sim: Simulator, alloc_id: str) -> None:
    unknown = "6b1f0000-0000-0000-0000-000000000000"
    for op in ("ls", "stat", "cat"):
        assert (await fs_get(client, op, unknown, path="x"))[:2] == (
            404,
            f'Unknown allocation "{unknown}"',
        )
        assert (await fs_get(client, op, "foo", path="x"))[:2] == (
            500,
            "alloc lookup failed: index error: UUID must be 36 characters",
        )
        assert (await fs_get(client, op, "", path="x"))[:2] == (
            400,
            "must provide a valid alloc id",
        )
    assert (await fs_get(client, "logs", alloc_id))[:2] == (500, "must provide task name")
    assert (await fs_get(client, "nope", alloc_id))[:2] == (404, "Invalid method")
    assert (await client.get("/v1/client/fs/ls"))[:2] == (404, "Invalid method")


async def test_a_stopped_allocation_keeps_its_directory_until_collected(
    client: Client, sim: Simulator, alloc_id: str, root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A client keeps a terminal allocation's directory until its garbage collection: of
    # a node's terminal allocations, the newest gc_max_allocs (50; 1 here) are kept.
    monkeypatch.setattr(sandbox, "GC_MAX_ALLOCS", 1)
    await sim.finish_allocation(alloc_id)
    assert exists(str(root))
    status, listed, _ = await fs_get(client, "ls", alloc_id, path="main/local")
    assert status == 200 and "hello.txt" in {f["Name"] for f in listed}
    node = sim.alloc(alloc_id)["NodeID"]
    await client.register(service_job("next", count=1))
    await wait_until(lambda: any(a["ClientStatus"] == "running" for a in sim.allocations("next")))
    (newer,) = sim.allocations("next")
    sim.store.allocs[newer["ID"]]["NodeID"] = node  # on the same node, whatever it picked
    sim.sandboxes.open(newer)
    await sim.finish_allocation(newer["ID"])
    assert not exists(str(root))
    assert (await fs_get(client, "ls", alloc_id))[:2] == (
        404,
        f'Unknown allocation "{alloc_id}"',
    )


async def test_a_task_log(client: Client, sim: Simulator) -> None:
    job = service_job("logger", Type="batch")
    task = job["TaskGroups"][0]["Tasks"][0]
    task.update(Driver="mock_driver", Config={"stdout_string": "a\n", "stdout_repeat": 2})
    await client.register(job)
    await wait_until(lambda: [a["ClientStatus"] for a in sim.allocations("logger")] == ["complete"])
    alloc_id = sim.allocations("logger")[0]["ID"]
    status, body, headers = await fs_get(client, "logs", alloc_id, task="main", type="stdout")
    assert status == 200 and headers["Content-Type"] == "application/json"
    # Not followed: one frame with all of it, then the end.
    assert base64.b64decode(body["Data"]) == b"a\na\na\n"
    assert (body["File"], body["Offset"]) == ("alloc/logs/main.stdout.0", 6)
    plain = await fs_get(client, "logs", alloc_id, task="main", type="stdout", plain="true")
    assert plain[:2] == (200, "a\na\na\n")
    assert (await fs_get(client, "logs", alloc_id, task="main", type="x"))[:2] == (
        500,
        "must provide log type (stdout/stderr)",
    )
    assert (await fs_get(client, "logs", alloc_id, task="nope", type="stdout"))[:2] == (
        400,
        'unknown task name "nope"',
    )


async def test_a_down_node_has_no_path(
    client: Client, sim: Simulator, alloc_id: str, root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sim.scheduler, "schedule", lambda *args: None)  # no plan marks it lost
    await sim.node_down(sim.alloc(alloc_id)["NodeName"])
    assert not exists(str(root))
    assert (await fs_get(client, "ls", alloc_id))[:2] == (404, "No path to node")


# ---------------------------------------------------------------------- ACL
@pytest.fixture
async def acl_client() -> AsyncIterator[tuple[Simulator, Client, Client, str]]:
    """(the simulator, a management client, a read-only client, a running allocation's ID)."""
    sim = Simulator(nodes=["n"], seed=3, start_delay=START_DELAY, acl_enabled=True)
    server = await start_sim(sim)
    root = sim.bootstrap()["SecretID"]
    sim.put_policy("readonly", {"Rules": 'namespace "default" { policy = "read" }'})
    reader = sim.create_token({"Type": "client", "Policies": ["readonly"]})["SecretID"]
    async with (
        aiohttp.ClientSession(headers={"X-Nomad-Token": root}) as admin,
        aiohttp.ClientSession(headers={"X-Nomad-Token": reader}) as limited,
    ):
        admin_client = Client(admin, server.url)
        alloc_id = await running_alloc(admin_client, sim)
        yield sim, admin_client, Client(limited, server.url), alloc_id
    await server.stop()


async def test_a_read_fs_policy_may_read(
    acl_client: tuple[Simulator, Client, Client, str],
) -> None:
    sim, admin, _, alloc_id = acl_client
    sim.put_policy("fs", {"Rules": 'namespace "default" { capabilities = ["read-fs"] }'})
    secret = sim.create_token({"Type": "client", "Policies": ["fs"]})["SecretID"]
    async with aiohttp.ClientSession(headers={"X-Nomad-Token": secret}) as http:
        reader = Client(http, admin.url)
        assert (await fs_get(reader, "ls", alloc_id))[0] == 200
        assert (await fs_get(reader, "cat", alloc_id, path="alloc/logs/main.stdout.0"))[0] == 200
        # The server checks the request's namespace first.
        assert (await fs_get(reader, "ls", alloc_id, namespace="other"))[:2] == (
            403,
            "Permission denied",
        )


async def test_fs_needs_read_fs(acl_client: tuple[Simulator, Client, Client, str]) -> None:
    _, admin, reader, alloc_id = acl_client
    assert (await fs_get(admin, "ls", alloc_id))[0] == 200
    # A plain RPC's refusal is a 403; a streaming RPC's carries no code: 500.
    for op, status in (("ls", 403), ("stat", 403), ("cat", 500), ("readat", 500), ("stream", 500)):
        assert (await fs_get(reader, op, alloc_id, path="alloc", offset="0"))[:2] == (
            status,
            "Permission denied",
        ), op
