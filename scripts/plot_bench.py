"""Plot `poolkeeper bench --json` output: claim latency and reconcile time against size.

    .venv/bin/pip install matplotlib   # only for this script; not a dependency
    .venv/bin/python scripts/plot_bench.py bench.json docs/performance-claims-reconcile.png

Not part of `make test`: matplotlib is not among poolkeeper's dependencies.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def main(source: str, target: str) -> None:
    data: dict[str, float] = json.loads(Path(source).read_text())
    sizes = sorted(
        {
            int(k.split(".")[1].removeprefix("pools_"))
            for k in data
            if k.startswith("reconcile.pools_")
        }
    )
    runners = [data[f"reconcile.pools_{n}.runners"] for n in sizes]

    def series(name: str) -> list[float]:
        return [data[f"reconcile.pools_{n}.{name}"] for n in sizes]

    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2), dpi=110)
    left.plot(runners, series("pass_ms"), "o-", label="reconcile pass (wall)")
    left.plot(runners, series("pass_cpu_ms"), "s--", label="reconcile pass (CPU)")
    left.plot(runners, series("floor_ms"), "^-", label="I/O floor: the list calls of a pass")
    for x, n, ratio in zip(runners, sizes, series("floor_ratio"), strict=True):
        left.annotate(f"{n} pools\nratio {ratio:.2f}", (x, data[f"reconcile.pools_{n}.pass_ms"]),
                      textcoords="offset points", xytext=(6, -22), fontsize=8)  # fmt: skip
    dress(left, "runners (pools x runners per pool)", "steady-state reconcile pass")

    # Claims were measured while passes over all the runners ran back to back, from the
    # sizes that have enough runners to claim from (bench_scale.py): through the API tier
    # (the passes in a reconciler apart) and in the process whose passes run (embedded).
    claimed = [n for n in sizes if f"reconcile.pools_{n}.claim.p50_ms" in data]
    at = [data[f"reconcile.pools_{n}.runners"] for n in claimed]

    def claims(name: str) -> list[float]:
        return [data[f"reconcile.pools_{n}.{name}"] for n in claimed]

    right.plot(at, claims("claim.p50_ms"), "o-", label="API tier: claim p50")
    right.plot(at, claims("claim.p99_ms"), "s-", label="API tier: claim p99")
    right.plot(at, claims("embedded.claim.p50_ms"), "o--", label="one process: claim p50")
    right.plot(at, claims("embedded.claim.p99_ms"), "s--", label="one process: claim p99")
    right.plot(at, claims("claim.floor.p50_ms"), "^:", color="grey",
               label="floor p50 (idle round trip + bare create)")  # fmt: skip
    right.plot(at, claims("claim.floor.p99_ms"), "v:", color="black",
               label="floor p99")  # fmt: skip
    dress(right, "runners reconciled", "claims while passes run back to back")
    figure.suptitle("poolkeeper bench (simulator on loopback, 2 cores)", fontsize=10)
    figure.tight_layout()
    figure.savefig(target)


def dress(axes: Any, xlabel: str, title: str) -> None:
    """Both plots: log-log in milliseconds, a grid, a small legend."""
    axes.set_xscale("log")
    axes.set_yscale("log")
    axes.set_xlabel(xlabel)
    axes.set_ylabel("ms")
    axes.set_title(title)
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(fontsize=8)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
