"""Smoke test of the simulator benchmark (no timing assertions)."""

from __future__ import annotations

from controller.lab.simulator.bench import measure


async def test_measure_small() -> None:
    result = await measure(12, concurrency=4)
    assert result["jobs"] == 12
    assert result["alloc_list_count"] == 12 and result["job_list_meta_count"] == 12
    assert result["registrations_per_second"] > 0
    assert all(result[k] > 0 for k in ("alloc_list_seconds", "job_list_meta_seconds"))
