"""Files in a runner end to end: uploads (JSON and tar), listings, downloads and deletes
through a standalone controller, on a simulator whose runner tasks have real directories."""

from __future__ import annotations

import base64
import logging
import os
import secrets
import tarfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from controller.lab.simulator import Simulator
from tests.support.crafted_tars import CRAFTED_ACCEPTED, CRAFTED_REFUSED, extracted
from tests.support.documents import pool_doc
from tests.support.tars import (
    END,
    directory,
    file,
    hardlink,
    header,
    member,
    raw_file,
    symlink,
    tar_of,
)
from tests.support.waiting import wait_until

from .conftest import TOKEN, Harness, write_pools
from .executions_support import (
    Runner,
    abandon_download,
    access_log,
    assert_one_quiet_line,
    claimed_runner,
    readers_of,
)

BINARY = bytes(range(256)) * 257 + b"\x00\xff end"  # every byte value, not UTF-8


@pytest.fixture
async def sim() -> AsyncIterator[Simulator]:
    yield Simulator(seed=1, start_delay=0.05, exec_mode="local")


@pytest.fixture
async def runner(harness: Harness, tmp_path: Path) -> Runner:
    executions = {"maxUploadBytes": 512 * 1024}
    pools = write_pools(tmp_path / "pools.yaml", pool_doc("py", idle=1, executions=executions))
    return await claimed_runner(harness, await harness.start(pools))


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


async def put_raw(runner: Runner, body: bytes, content_type: str, **query: str) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": content_type}
    async with aiohttp.ClientSession() as http:
        url = runner.controller.url + runner.path + "/files"
        async with http.put(url, data=body, headers=headers, params=query) as response:
            text = await response.text()
            return response.status, (await response.json()) if text else None


async def download(runner: Runner, path: str) -> tuple[int, bytes, str | None]:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with aiohttp.ClientSession() as http:
        url = runner.controller.url + runner.path + "/files/content"
        async with http.get(url, params={"path": path}, headers=headers) as response:
            return response.status, await response.read(), response.headers.get("Content-Length")


async def listing(runner: Runner, **query: str) -> dict[str, dict[str, Any]]:
    suffix = "/files" + ("?" + "&".join(f"{k}={v}" for k, v in query.items()) if query else "")
    status, body = await runner.api("GET", suffix)
    assert status == 200, body
    return {entry["path"]: entry for entry in body["files"]}


def tree(root: Path) -> dict[str, tuple[int, bytes]]:
    """Every path under `root` with its mode and, for files, its content."""
    found = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(folder) / name
            content = path.read_bytes() if path.is_file() and not path.is_symlink() else b""
            found[str(path.relative_to(root))] = (path.lstat().st_mode, content)
    return found


async def test_a_round_trip_keeps_every_byte(runner: Runner) -> None:
    status, body = await runner.api(
        "PUT",
        "/files",
        {
            "directories": ["out"],
            "files": [
                {"path": "prog/main.py", "content": b64(b"print('hi')\n"), "mode": "0755"},
                {"path": "prog/data.bin", "content": b64(BINARY)},
            ],
        },
    )
    assert status == 204, body
    archive = tar_of(
        file("nested/deep/blob.bin", BINARY[::-1]), symlink("nested/link", "deep/blob.bin")
    )
    status, body = await put_raw(runner, archive, "application/x-tar", path="unpacked")
    assert status == 204, body

    entries = await listing(runner)
    assert entries["prog/main.py"]["type"] == "file" and entries["prog/main.py"]["mode"] == "0755"
    assert entries["prog/data.bin"]["size"] == len(BINARY)
    assert entries["prog/data.bin"]["mode"] == "0644"
    assert entries["out"]["type"] == "directory"
    assert entries["unpacked/nested/link"]["type"] == "link"
    assert entries["unpacked/nested/link"]["linkTarget"] == "deep/blob.bin"
    assert entries["prog/data.bin"]["modifiedAt"].endswith("Z")
    # Listed paths name what can be downloaded.
    for path, content in (
        ("prog/data.bin", BINARY),
        ("unpacked/nested/deep/blob.bin", BINARY[::-1]),
        ("unpacked/nested/link", BINARY[::-1]),
    ):
        status, data, length = await download(runner, path)
        assert (status, data, length) == (200, content, str(len(content))), path

    one_level = await listing(runner, path="unpacked/nested", recursive="false")
    assert set(one_level) == {"unpacked/nested/deep", "unpacked/nested/link"}
    absolute = await listing(runner, path=str(runner.task_dir() / "prog"))
    assert set(absolute) == {str(runner.task_dir() / "prog" / n) for n in ("main.py", "data.bin")}

    status, body = await runner.api("PUT", "/files", {"delete": ["unpacked", "prog/data.bin"]})
    assert status == 204, body
    entries = await listing(runner)
    assert "prog/main.py" in entries and "prog/data.bin" not in entries
    assert not any(path.startswith("unpacked") for path in entries)
    status, _, _ = await download(runner, "prog/data.bin")
    assert status == 404
    status, body = await runner.api("GET", "/files?path=unpacked")
    assert (status, body["error"]["code"]) == (404, "FileNotFound")


async def test_what_is_no_file_is_refused(runner: Runner) -> None:
    assert (await runner.api("PUT", "/files", {"directories": ["d"]}))[0] == 204
    status, data, _ = await download(runner, "d")
    assert status == 400, data
    status, data, _ = await download(runner, "missing")
    assert status == 404, data


ESCAPES: list[tuple[str, dict[str, Any] | bytes]] = [
    ("file", {"files": [{"path": "../outside.txt", "content": b64(b"x")}]}),
    ("nested file", {"files": [{"path": "a/../../outside.txt", "content": b64(b"x")}]}),
    ("directory", {"directories": ["../outside"]}),
    ("delete", {"delete": ["../local"]}),
    ("a later file", {"directories": ["fine"], "files": [{"path": "..", "content": ""}]}),
    ("tar member", tar_of(file("fine.txt"), file("../outside.txt"))),
    ("tar absolute", tar_of(file("/tmp/outside.txt"))),
    ("tar symlink", tar_of(symlink("out", "../.."))),
    ("tar hardlink", tar_of(hardlink("h", "../secrets/x"))),
    ("tar device", tar_of((member("dev", tarfile.CHRTYPE), None))),
    ("tar setuid", tar_of((member("suid", mode=0o4755), b"x"))),
    # Each link alone stays inside; through the first, the second leads out.
    ("tar link chain", tar_of(symlink("ca", "."), symlink("cb", "ca/.."), file("cb/escaped.txt"))),
    # `d/up` is the top; a hard link to it is a link to `..` at the top.
    (
        "tar hardlink to a link",
        tar_of(directory("d"), symlink("d/up", ".."), hardlink("h", "d/up")),
    ),
    ("not a tar", b"this is not a tar archive" * 40),
]


@pytest.mark.parametrize(("what", "body"), ESCAPES, ids=[what for what, _ in ESCAPES])
async def test_a_path_out_of_the_working_dir_is_400_and_writes_nothing(
    runner: Runner, what: str, body: dict[str, Any] | bytes
) -> None:
    before, index = tree(runner.alloc_dir()), runner.claim_index()
    if isinstance(body, bytes):
        status, answer = await put_raw(runner, body, "application/x-tar")
    else:
        status, answer = await runner.api("PUT", "/files", body)
    assert (status, answer["error"]["code"]) == (400, "InvalidRequest"), answer
    assert tree(runner.alloc_dir()) == before
    assert runner.claim_index() == index  # not even the claim was written


async def test_a_corrupt_header_hides_nothing_from_the_check(
    runner: Runner, tmp_path: Path
) -> None:
    """A good member, a block with a bad checksum, then what the check must not miss:
    a setuid file, a FIFO and a link out of the runner. GNU tar would skip the bad block
    and extract the rest; the upload is refused whole, nothing of it is written, and
    later uploads through the link's name stay inside."""
    outside = tmp_path / "outside"
    outside.mkdir()
    archive = (
        raw_file(b"good.txt")
        + header(b"junk", checksum_off_by=1)
        + raw_file(b"suid", b"#!/bin/sh\n", mode=0o4755)
        + header(b"fifo", tarfile.FIFOTYPE)
        + header(b"l9", tarfile.SYMTYPE, link=str(outside).encode())
        + END
    )
    before = tree(runner.alloc_dir())
    status, answer = await put_raw(runner, archive, TAR)
    assert (status, answer["error"]["code"]) == (400, "InvalidRequest"), answer
    assert "bad checksum" in answer["error"]["message"], answer
    assert tree(runner.alloc_dir()) == before
    status, answer = await runner.api("PUT", "/files", {"files": [{"path": "l9/x", "content": ""}]})
    assert status == 204, answer
    status, answer = await put_raw(runner, tar_of(file("l9/y")), TAR)
    assert status == 204, answer
    assert not list(outside.iterdir())
    assert (runner.task_dir() / "l9").is_dir() and not (runner.task_dir() / "l9").is_symlink()


async def test_crafted_archives_are_refused_whole_or_extracted_as_checked(
    runner: Runner,
) -> None:
    """The crafted archives of the unit tests, through the API into a real runner: each
    refused one writes nothing; each accepted one lands as the check read it."""
    for what, body, problem in CRAFTED_REFUSED:
        before = tree(runner.alloc_dir())
        status, answer = await put_raw(runner, body, TAR)
        assert (status, answer["error"]["code"]) == (400, "InvalidRequest"), (what, answer)
        assert problem in answer["error"]["message"], (what, answer)
        assert tree(runner.alloc_dir()) == before, what
    for index, (what, body, expected) in enumerate(CRAFTED_ACCEPTED):
        status, answer = await put_raw(runner, body, TAR, path=f"case{index}")
        assert status == 204, (what, answer)
        assert extracted(runner.task_dir() / f"case{index}") == expected, what


async def test_a_tar_target_out_of_the_working_dir_is_400(runner: Runner) -> None:
    before = tree(runner.alloc_dir())
    status, answer = await put_raw(runner, tar_of(file("a")), TAR, path="../x")
    assert status == 400, answer
    assert tree(runner.alloc_dir()) == before


TAR = "application/x-tar"


@pytest.mark.parametrize("kind", ["json", "tar", "tar without length"])
async def test_an_oversized_upload_is_413_and_writes_nothing(runner: Runner, kind: str) -> None:
    too_much = os.urandom(512 * 1024 + 1)
    before = tree(runner.alloc_dir())
    if kind == "json":
        files = [{"path": "a.bin", "content": b64(too_much[:300_000])},
                 {"path": "b.bin", "content": b64(too_much[300_000:])}]  # fmt: skip
        status, answer = await runner.api("PUT", "/files", {"files": files})
    elif kind == "tar":
        status, answer = await put_raw(runner, tar_of(file("big", too_much)), TAR)
    else:

        async def chunks() -> AsyncIterator[bytes]:
            body = tar_of(file("big", too_much))
            for start in range(0, len(body), 65536):
                yield body[start : start + 65536]

        status, answer = await put_raw(runner, chunks(), TAR)  # type: ignore[arg-type]
    assert (status, answer["error"]["code"]) == (413, "PayloadTooLarge"), answer
    assert tree(runner.alloc_dir()) == before


async def test_file_requests_are_activity(runner: Runner) -> None:
    _, claim = await runner.api("GET", "")
    moved: dict[str, Any] = {}

    async def expiry_moved() -> bool:
        await listing(runner)  # within a second of the last write it is not written again
        _, now = await runner.api("GET", "")
        moved.update(now)
        return bool(now["expiresAt"] > claim["expiresAt"])

    await wait_until(expiry_moved, what="a file request to move expiresAt")
    _, metrics = await runner.harness.api(runner.controller, "GET", "/metrics", token=None)
    assert 'poolkeeper_file_requests_total{op="list",pool="default/py",result="ok"}' in metrics


async def test_an_abandoned_download_ends_its_command_quietly(
    harness: Harness, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    pools = write_pools(tmp_path / "pools.yaml", pool_doc("py", idle=1))
    runner = await claimed_runner(harness, await harness.start(pools, access_log=True))
    name = f"big-{secrets.token_hex(6)}.bin"
    with (runner.task_dir() / name).open("wb") as big:
        big.truncate(4 * 1024**3)  # sparse: more than a test would ever read
    caplog.set_level(logging.INFO)
    url = runner.controller.url + runner.path + "/files/content"
    await abandon_download(url, {"Authorization": f"Bearer {TOKEN}"}, name)

    await wait_until(lambda: not readers_of(name), within=10, what="the download's cat to end")
    await wait_until(lambda: bool(access_log(caplog)), what="the download's access-log line")
    assert access_log(caplog) == [("/v1/runners/{runnerId}/files/content", 499)]
    assert_one_quiet_line(caplog, runner.id)
