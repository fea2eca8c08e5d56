"""Smoke test of `poolkeeper bench --quick`: it runs to the end and writes every key.

No timing assertions: the numbers depend on the machine. The command runs as a
subprocess, as a user would start it (the simulator is a child process of it).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from controller.lab.bench import REQUIRED_KEYS

pytestmark = pytest.mark.slow


def test_quick_bench_writes_every_required_key(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    done = subprocess.run(
        [sys.executable, "-m", "controller", "bench", "--quick", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
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
    assert "poolkeeper bench" in done.stdout  # the table was printed
