"""Guards against the footguns of operating poolkeeper: an emptied or truncated pool file,
pool files too large to parse on a reload, a port in use, an API without tokens; and one
log line per reload."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from controller.core.runner_ids import META_POOL
from controller.standalone import Controller
from tests.support.documents import pool_doc
from tests.support.waiting import wait_until

from .conftest import Harness, write_pools


async def live_jobs(harness: Harness, pool: str) -> list[str]:
    return [
        job["ID"]
        for job in harness.sim.job_list("*")
        if (job.get("Meta") or {}).get(META_POOL) == pool and job["Status"] != "dead"
    ]


async def settled_on(
    harness: Harness,
    tmp_path: Path,
    *pools: dict[str, Any],
    allow_empty: bool = False,
    allow_shrink: bool = False,
) -> tuple[Controller, Path]:
    """A controller serving `pools` from a pool file, once it has settled; and the file."""
    pools_file = write_pools(tmp_path / "pools.yaml", *pools)
    controller = await harness.start(pools_file, allow_empty=allow_empty, allow_shrink=allow_shrink)
    await harness.settled(controller)
    return controller, pools_file


async def test_an_emptied_pool_file_is_refused_and_destroys_nothing(
    harness: Harness, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    controller, pools = await settled_on(
        harness, tmp_path, pool_doc("a", idle=2), pool_doc("b", idle=1)
    )
    before = harness.sim.counters["deregister_calls"]
    pools.write_text("")  # what a config tool leaves mid-update
    with caplog.at_level(logging.ERROR):
        await controller.reload()
    refusal = f"reload refused: {pools} defines no pool; pass --allow-empty to remove every pool"
    assert refusal in caplog.messages
    await harness.settled(controller)
    assert sorted(controller.engine.pools) == ["default/a", "default/b"]
    assert harness.sim.counters["deregister_calls"] == before
    assert len(await live_jobs(harness, "default/a")) == 2


async def test_allow_empty_lets_an_empty_file_remove_every_pool(
    harness: Harness, tmp_path: Path
) -> None:
    controller, pools = await settled_on(harness, tmp_path, pool_doc("a", idle=2), allow_empty=True)
    pools.write_text("")
    await controller.reload()

    async def drained() -> bool:
        await controller.engine.reconcile_namespace("default")
        return not await live_jobs(harness, "default/a")

    await wait_until(drained, what="the pool to be drained")


async def test_a_file_truncated_at_a_document_boundary_is_refused_and_drains_nothing(
    harness: Harness, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    controller, pools = await settled_on(
        harness, tmp_path, *(pool_doc(name, idle=1) for name in ("a", "b", "c", "d"))
    )
    before = harness.sim.counters["deregister_calls"]
    pools.write_text(pools.read_text().split("---")[0])  # only the first document is left
    with caplog.at_level(logging.INFO, logger="controller.standalone"):
        await controller.reload()
    assert [m for m in caplog.messages if m.startswith("reload")] == [
        f"reload refused: {pools} would remove 3 of 4 pools (default/b, default/c, "
        "default/d), more than --max-removed-share 0.5; pass --allow-shrink to remove them"
    ]
    await harness.settled(controller)
    assert sorted(controller.engine.pools) == ["default/a", "default/b", "default/c", "default/d"]
    assert harness.sim.counters["deregister_calls"] == before
    assert len(await live_jobs(harness, "default/d")) == 1


async def test_allow_shrink_lets_a_reload_remove_most_pools(
    harness: Harness, tmp_path: Path
) -> None:
    controller, pools = await settled_on(
        harness, tmp_path, pool_doc("a", idle=1), pool_doc("b", idle=1), allow_shrink=True
    )
    write_pools(pools, pool_doc("renamed", idle=1))
    await controller.reload()

    async def drained() -> bool:
        await controller.engine.reconcile_namespace("default")
        return not await live_jobs(harness, "default/a") + await live_jobs(harness, "default/b")

    await wait_until(drained, what="the removed pools to be drained")
    assert len(await live_jobs(harness, "default/renamed")) == 1


async def test_every_reload_logs_one_line_of_what_changed(
    harness: Harness, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    controller, pools = await settled_on(
        harness, tmp_path, pool_doc("keep", idle=1), pool_doc("gone", idle=1), pool_doc("old")
    )
    write_pools(
        pools,
        pool_doc("keep", idle=2),
        pool_doc("new", idle=1),
        pool_doc("bad", idle=1, nomad={"jobPrefix": "keep-"}),
        pool_doc("old", idle=1, nomad={"jobPrefix": "moved-"}),
        pool_doc("broken", idle=-1),
    )
    with caplog.at_level(logging.INFO, logger="controller.standalone"):
        await controller.reload()
    lines = [m for m in caplog.messages if m.startswith("reloaded ")]
    assert lines == [
        f"reloaded {pools}: added default/new, default/bad; changed default/keep; "
        "removed default/gone; refused default/old (spec.nomad.jobPrefix ('old-' cannot "
        "become 'moved-'): immutable; the previous version keeps running. Delete and "
        "re-create the pool to move it.), default/broken "
        f"({pools}:4: spec.idleRunners: input should be greater than or equal to 0)"
    ]
    write_pools(
        pools,
        pool_doc("keep", idle=2),
        pool_doc("new", idle=1),
        pool_doc("bad", idle=1, nomad={"jobPrefix": "keep-"}),
        pool_doc("old"),
    )
    with caplog.at_level(logging.INFO, logger="controller.standalone"):
        await controller.reload()
    assert caplog.messages[-1] == f"reloaded {pools}: no change"


def laughs(levels: int) -> str:
    """A pool document whose jobTemplate is a YAML "billion laughs": 9**levels strings in a
    few hundred bytes."""
    lines = ["        l0: &l0 [x, x, x, x, x, x, x, x, x]"]
    lines += [
        f"        l{n}: &l{n} [{', '.join([f'*l{n - 1}'] * 9)}]" for n in range(1, levels + 1)
    ]
    document = yaml.safe_dump(pool_doc("laughs", nomad={"jobTemplate": {"Meta": None}}))
    return document.replace("    Meta: null\n", "    Meta:\n" + "\n".join(lines) + "\n")


@pytest.mark.parametrize(
    ("content", "refusal"),
    [
        (laughs(9), "YAML nodes by"),
        ("#" * (1024 * 1024), "bytes of pool files, over the limit of 1048576"),
    ],
)  # fmt: skip
async def test_pool_files_over_a_limit_are_refused_and_the_pools_kept(
    harness: Harness, tmp_path: Path, caplog: pytest.LogCaptureFixture, content: str, refusal: str
) -> None:
    controller, pools = await settled_on(harness, tmp_path, pool_doc("a", idle=1))
    pools.write_text(pools.read_text() + "---\n" + content + "\n")
    with caplog.at_level(logging.INFO, logger="controller.standalone"):
        await controller.reload()
    (line,) = [m for m in caplog.messages if m.startswith("reload")]
    assert line.startswith(f"reload refused: {pools}") and refusal in line
    assert line.endswith("; the current pools keep running")
    assert sorted(controller.engine.pools) == ["default/a"]


async def test_healthz_answers_while_a_large_reload_is_parsed(
    harness: Harness, tmp_path: Path
) -> None:
    controller, pools = await settled_on(harness, tmp_path, pool_doc("a", idle=1))
    meta = {f"key{i}": "value" for i in range(20_000)}  # 40,000 YAML nodes
    write_pools(
        pools, pool_doc("a", idle=1), pool_doc("big", idle=0, nomad={"jobTemplate": {"Meta": meta}})
    )
    # As the SIGHUP handler runs it: a callback on the event loop.
    asyncio.get_running_loop().call_soon(controller.reload)
    answered_during_the_reload = 0
    while "default/big" not in controller.engine.pools:
        status, _ = await harness.api(controller, "GET", "/healthz", token=None)
        assert status == 200
        answered_during_the_reload += "default/big" not in controller.engine.pools
    assert answered_during_the_reload > 0


async def test_insecure_no_auth_warns(
    harness: Harness, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from controller.nomad.config import NomadConfig
    from controller.standalone import Settings

    settings = Settings(
        pools_path=write_pools(tmp_path / "p.yaml", pool_doc("a", idle=1)),
        listen=("127.0.0.1", 0),
        insecure_no_auth=True,
    )
    controller = Controller(settings, NomadConfig.from_env({"NOMAD_ADDR": harness.server.url}))
    with caplog.at_level(logging.WARNING):
        await controller.start()
    try:
        assert any("--insecure-no-auth" in m and "anyone" in m for m in caplog.messages)
    finally:
        await controller.stop()


@pytest.mark.parametrize("command", ["run", "api"])
def test_a_port_in_use_is_one_line_and_exit_2(tmp_path: Path, command: str) -> None:
    pools = write_pools(tmp_path / "p.yaml", pool_doc("a", idle=1))
    arguments = ["--pools", str(pools)] if command == "run" else []
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "-m", "controller", command, *arguments,
             "--insecure-no-auth", "--listen", f"127.0.0.1:{port}"],
            env={**os.environ, "NOMAD_ADDR": "http://127.0.0.1:1"},
            capture_output=True,
            text=True,
            timeout=60,
        )  # fmt: skip
    assert result.returncode == 2
    expected = f"poolkeeper {command}: --listen 127.0.0.1:{port}: Address already in use"
    assert result.stderr.splitlines() == [expected], result.stderr
