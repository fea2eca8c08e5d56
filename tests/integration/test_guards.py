"""Guards against the footguns of operating poolkeeper: an emptied pool file, a port in use,
an API without tokens; and one log line per reload."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

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
    harness: Harness, tmp_path: Path, *pools: dict[str, Any], allow_empty: bool = False
) -> tuple[Controller, Path]:
    """A controller serving `pools` from a pool file, once it has settled; and the file."""
    pools_file = write_pools(tmp_path / "pools.yaml", *pools)
    controller = await harness.start(pools_file, allow_empty=allow_empty)
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
        controller.reload()
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
    controller.reload()

    async def drained() -> bool:
        await controller.engine.reconcile_namespace("default")
        return not await live_jobs(harness, "default/a")

    await wait_until(drained, what="the pool to be drained")


async def test_every_reload_logs_one_line_of_what_changed(
    harness: Harness, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    controller, pools = await settled_on(
        harness, tmp_path, pool_doc("keep", idle=1), pool_doc("gone", idle=1)
    )
    write_pools(
        pools,
        pool_doc("keep", idle=2),
        pool_doc("new", idle=1),
        pool_doc("bad", idle=1, nomad={"jobPrefix": "keep-"}),
    )
    with caplog.at_level(logging.INFO, logger="controller.standalone"):
        controller.reload()
    lines = [m for m in caplog.messages if m.startswith("reloaded ")]
    assert lines == [
        f"reloaded {pools}: added default/new, default/bad; changed default/keep; "
        "removed default/gone"
    ]
    with caplog.at_level(logging.INFO, logger="controller.standalone"):
        controller.reload()
    assert caplog.messages[-1] == f"reloaded {pools}: no change"


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


def test_a_port_in_use_is_one_line_and_exit_2(tmp_path: Path) -> None:
    pools = write_pools(tmp_path / "p.yaml", pool_doc("a", idle=1))
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "-m", "controller", "run", "--pools", str(pools),
             "--insecure-no-auth", "--listen", f"127.0.0.1:{port}"],
            env={**os.environ, "NOMAD_ADDR": "http://127.0.0.1:1"},
            capture_output=True,
            text=True,
            timeout=60,
        )  # fmt: skip
    assert result.returncode == 2
    expected = f"poolkeeper run: --listen 127.0.0.1:{port}: Address already in use"
    assert result.stderr.splitlines() == [expected], result.stderr
