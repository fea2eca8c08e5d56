"""Smoke test of `poolkeeper bench --quick`: it runs to the end and writes every key.

No timing assertions: the numbers depend on the machine. The command runs as a
subprocess, as a user would start it (the simulator is a child process of it).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from controller.lab.bench import REQUIRED_KEYS
from controller.lab.chaos.balancer import ENVIRONMENT_VARIABLE, BalancerMissing, haproxy_binary

pytestmark = pytest.mark.slow


def bench(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "controller", "bench", "--quick", *args],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env=env,
    )


def haproxy_found() -> bool:
    try:
        haproxy_binary()
    except BalancerMissing:
        return False
    return True


def test_quick_bench_writes_every_required_key(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    done = bench("--json", str(out))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert isinstance(result, dict)
    missing = [key for key in REQUIRED_KEYS if key not in result]
    assert not missing, missing
    for key, value in result.items():
        assert isinstance(value, int | float) and not isinstance(value, bool), (key, value)
        assert math.isfinite(value), (key, value)
    assert result["bench.quick"] == 1
    # Counts that do not depend on timing.
    assert result["reconcile.requests_per_pass_1_pool"] >= 3
    assert result["over_creation.needed"] > 0
    # Where the CPU of concurrent claims goes: the API replica and the simulator used some.
    assert result["claim.cpu_ms_per_claim.api"] > 0 < result["claim.cpu_ms_per_create.simulator"]
    assert 0 < result["claim.cpu_busy_claim"] <= 1.1
    # Two API replicas behind HAProxy where there is one to start; said so where not.
    assert result["claim.balanced.haproxy"] == (1 if haproxy_found() else 0)
    assert "poolkeeper bench" in done.stdout  # the table was printed


def test_a_section_runs_alone_and_an_unknown_one_is_a_usage_error(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    done = bench("--section", "node-loss", "--section", "shared", "--json", str(out))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert "convergence.node_loss_seconds" in result and "bench.seconds.node-loss" in result
    # The section --quick leaves out runs when named: three reconcilers held every pool.
    assert result["shared.pools"] == 3 and result["shared.pass_ratio"] > 0
    assert not [key for key in result if key.startswith(("claim.", "reconcile.", "demand."))]
    done = bench("--section", "claim")
    assert done.returncode == 2
    assert "--section 'claim' is not one of scale, claims" in done.stderr


def test_the_balancer_is_found_as_the_soak_finds_it(tmp_path: Path) -> None:
    # The soak's finder takes $POOLKEEPER_HAPROXY first: naming no executable there leaves
    # the bench without a balancer even where one is on PATH, and it says why.
    out = tmp_path / "bench.json"
    missing = str(tmp_path / "no-haproxy")
    env = {**os.environ, ENVIRONMENT_VARIABLE: missing}
    done = bench("--section", "claims", "--json", str(out), env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["claim.balanced.haproxy"] == 0
    assert "claim.balanced.claims_per_second" not in result
    assert f"${ENVIRONMENT_VARIABLE} names" in " ".join(done.stdout.split())
