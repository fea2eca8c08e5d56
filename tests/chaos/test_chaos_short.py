"""The short seeded chaos soak of `make test` (the long one: `poolkeeper chaos`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from controller.lab.chaos import FAULT_KINDS, Profile, make_schedule, run_chaos

SEED = 7
MINUTES = 0.5  # one round: about 20-30 s on a shared 2-core machine


def test_the_schedule_comes_from_the_seed_alone() -> None:
    profile = Profile.for_minutes(30)
    first = make_schedule(1, 30, profile)
    assert first == make_schedule(1, 30, profile)
    assert first != make_schedule(2, 30, profile)
    assert len(first) >= 50  # twice what 30 minutes need; a run plays a prefix
    # A long run injects every fault class the simulator offers, and SIGKILLs.
    kinds = {event.kind for round_ in first for event in round_.events}
    assert kinds == set(FAULT_KINDS)
    for round_ in first:
        assert all(0 < e.at < profile.window_seconds for e in round_.events)
        assert all(e.at + e.duration <= profile.window_seconds + 1e-9 for e in round_.events)


def test_every_run_restarts_the_controller_and_rehearses_a_handover() -> None:
    for minutes in (MINUTES, 30):
        for seed in range(20):
            schedule = make_schedule(seed, minutes, Profile.for_minutes(minutes))
            events = schedule[0].events
            assert "sigkill" in {e.kind for e in events}
            rival = next(e for e in events if e.kind == "second_controller")
            sigterm = next(e for e in events if e.kind == "sigterm")
            # The second controller is up when the holder is SIGTERMed, and stays.
            assert rival.at < sigterm.at < rival.at + rival.duration
            assert rival.at + rival.duration == pytest.approx(
                Profile.for_minutes(minutes).window_seconds
            )


@pytest.mark.slow
async def test_short_soak_holds_every_invariant(tmp_path: Path, kube_bin_dir: Path) -> None:
    # The second controller is an operator reading the pools from a kube-apiserver (the
    # shared soak runs `poolkeeper run` processes beside one).
    report = await run_chaos(SEED, MINUTES, tmp_path, operator_rival=True)
    assert report["invariant_violations"] == [], report["invariant_violations"]
    assert report["second_controller_kind"] == "operator"
    assert report["double_claims"] == 0
    assert report["claims_lost"] == 0
    assert report["runners_leaked"] == 0
    assert report["controller_restarts"] >= 1
    assert report["second_controller_starts"] >= 1
    # Two controllers, one writer per pool at any instant (the simulator's write audit).
    assert report["runner_writes"] > 0
    assert report["runner_writes_by_non_holders"] == 0
    # The rehearsal: the SIGTERMed holder handed every lease over within a second, and
    # the second controller (one more idle runner per pool) then wrote as their holder.
    assert report["sigterm_handover_seconds"], report["faults"][:20]
    assert max(report["sigterm_handover_seconds"]) < 1.0
    assert report["runner_writes_by_second_controller_as_holder"] > 0
    assert report["claims_served"] >= 5
    assert sum(report["faults_injected"].values()) >= 8
    # Every pool converged after the round (one sample per pool).
    assert report["convergence_samples"] == 3 * report["rounds"]
    assert all(excess == 0 for excess in report["max_runners_excess"].values())
