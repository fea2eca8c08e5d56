"""The shared reconcilers' soak (`poolkeeper chaos --reconcilers 3 --pools 30`): its signal
schedule, its flags, its part of docs/reliability.md, and a short run of it (the long one:
`poolkeeper chaos --reconcilers 3 --pools 30 --minutes 30`)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from controller.cli import main as cli_main
from controller.lab.chaos import rendered, run_shared_chaos
from controller.lab.chaos.report import SHARED, TIER, render_shared_section
from controller.lab.chaos.schedule import PROCESS_FAULTS, WEIGHTS
from controller.lab.chaos.shared_soak import SharedProfile, signal_schedule

SEED = 5
MINUTES = 1.5  # two rounds (a SIGTERM, a SIGKILL): about 2 minutes on a shared 2-core machine


def test_the_signals_and_faults_come_from_the_seed_alone_and_rehearse_both_kinds() -> None:
    for minutes in (MINUTES, 30):
        profile = SharedProfile.for_minutes(minutes)
        plan = signal_schedule(SEED, minutes, 3, profile)
        assert plan == signal_schedule(SEED, minutes, 3, profile)
        assert plan != signal_schedule(SEED + 1, minutes, 3, profile)
        assert len(plan) * profile.window_seconds >= minutes * 60  # a run plays a prefix
        assert [p.kind for p in plan[:2]] == ["sigterm", "sigkill"]
        low, high = profile.signal_within
        for planned in plan:
            assert low * profile.window_seconds <= planned.at <= high * profile.window_seconds
            # Restarted within the window: the round ends with every reconciler running.
            assert planned.at + planned.restart_after < profile.window_seconds
            # Nomad's faults, each ended within the window.
            low_count, high_count = profile.nomad_faults_per_window
            assert low_count <= len(planned.nomad_faults) <= high_count
            for event in planned.nomad_faults:
                assert event.kind not in PROCESS_FAULTS
                assert event.at > 0 and event.at + event.duration <= profile.window_seconds
    long_plan = signal_schedule(SEED, 30, 3, SharedProfile.for_minutes(30))
    assert {p.reconciler for p in long_plan} == {0, 1, 2}
    assert {p.kind for p in long_plan[2:]} == {"sigkill", "sigterm"}
    # Every class of Nomad's faults comes up in a long run.
    drawn = {event.kind for planned in long_plan for event in planned.nomad_faults}
    assert drawn == set(WEIGHTS) - PROCESS_FAULTS


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--pools", "30"], "--pools needs --reconcilers"),
        (["--reconcilers", "1"], "--reconcilers must be at least 2"),
        (["--reconcilers", "3", "--api-tier"], "two different soaks"),
        (["--reconcilers", "3", "--pools", "2"], "--pools must be at least --reconcilers"),
        (["--operators", "2"], "--operators of the chaos soak is 0 or 1"),
        (["--api-tier", "--operators", "1"], "not --api-tier"),
        (["--reconcilers", "3", "--operators", "4"], "--operators must be between 0 and"),
        (["--reconcilers", "3", "--operators", "-1"], "--operators must be between 0 and"),
        (["--report", "r.json"], "--report renders a saved report"),
        (["--report", "r.json", "--operators", "1"], "--report renders"),
        (["--report", "r.json", "--markdown", "p.md", "--api-tier"], "--report renders"),
    ],
)
def test_flags_that_do_not_go_together_are_refused_before_anything_runs(
    arguments: list[str],
    message: str,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    assert cli_main(["chaos", *arguments]) == 2
    assert message in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_a_saved_report_renders_its_section_and_keeps_the_others(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    page = tmp_path / "reliability.md"
    tier = f"{TIER.begin}\n\n## The API tier\n\n{TIER.end}\n"
    page.write_text("# Reliability\n\nthe chaos soak's figures\n\n" + tier)
    saved = tmp_path / "shared.json"
    saved.write_text(json.dumps(_report()))
    assert cli_main(["chaos", "--report", str(saved), "--markdown", str(page)]) == 0
    text = page.read_text()
    assert TIER.of(text) == tier
    section = SHARED.of(text)
    assert "| convergence after a round, p99 (s) | 12.5 |" in section
    assert f"--json {saved} && poolkeeper chaos --report {saved}" in section
    # A file that is not a report changes nothing.
    saved.write_text("{}")
    assert cli_main(["chaos", "--report", str(saved), "--markdown", str(page)]) == 2
    assert "is not a soak's report" in capsys.readouterr().err
    assert page.read_text() == text


def test_the_chaos_soak_renders_its_page_anew_and_keeps_both_sections() -> None:
    tier = f"{TIER.begin}\n\n## The API tier\n\n{TIER.end}\n"
    shared = f"{SHARED.begin}\n\n## Shared\n\n{SHARED.end}\n"
    old = "# Reliability\n\nold figures\n\n" + tier + "\n" + shared
    classic = {
        "seed": 1,
        "faults_injected": {"sigkill": 2},
        "max_runners_excess": {},
        "sigterm_handover_seconds": [0.2],
        "claims_ended": {"Released": 3},
        "invariant_violations": [],
    }
    page = rendered(old, classic, "poolkeeper chaos --minutes 1 --seed 1 --markdown p.md")
    assert "old figures" not in page
    assert "| sigkill | 2 |" in page
    assert (TIER.of(page), SHARED.of(page)) == (tier, shared)


def _report() -> dict[str, object]:
    """A shared reconcilers' report as a soak writes it, with made-up figures."""
    return {
        "variant": "shared-reconcilers",
        "command": "poolkeeper chaos --reconcilers 3 --pools 30 --minutes 1 --seed 5",
        "seed": 5,
        "minutes": 1,
        "duration_seconds": 80.0,
        "load_average_at_start": [1.0, 1.0, 1.0],
        "load_average_at_end": [2.0, 1.0, 1.0],
        "reconcilers": 3,
        "operators": 1,
        "pools": 30,
        "idle_runners_target": 45,
        "clients": 4,
        "lease_ttl_seconds": 10.0,
        "takeover_bound_seconds": 33.3,
        "rounds": 1,
        "sigkills": 0,
        "sigterms": 1,
        "initial_fill_seconds": 9.0,
        "initial_balance_seconds": 20.0,
        "sigterm_every_pool_held_again_seconds": [0.4],
        "sigkill_every_pool_held_again_seconds": [],
        "every_pool_held_again_in_api_faults_seconds": [],
        "faults_injected": {"no_leader": 1, "node_down": 2},
        "pool_without_live_holder_seconds_max": 0.4,
        "balanced_after_round_seconds_max": 11.0,
        "convergence_p50_seconds": 2.0,
        "convergence_p99_seconds": 12.5,
        "convergence_max_seconds": 12.5,
        "claims_served": 40,
        "claims_answered_again": 2,
        "pool_empty_answers": 3,
        "unavailable_answers": 4,
        "double_claims": 0,
        "claims_lost": 0,
        "claims_never_answered": 0,
        "claims_given_up": 0,
        "runners_leaked": 0,
        "request_records_leaked": 0,
        "records_left": {"claim tombstones": 40},
        "runner_writes": 120,
        "runner_writers": 4,
        "runner_writes_by_non_holders": 0,
        "max_runners_excess": {"default/shared-00": 0},
        "claims_ended": {"Released": 40},
        "invariant_violations": [],
        "convergence_by_round": [
            {
                "round": 0,
                "signal": "sigterm",
                "reconciler": "reconciler-2",
                "at": 30.0,
                "restart_after": 1.2,
                "every_pool_held_again_after": 0.4,
                "converged_after_max": 12.5,
                "balanced_after": 11.0,
            }
        ],
    }


def test_the_section_renders_every_round() -> None:
    section = render_shared_section(_report(), "poolkeeper chaos --reconcilers 3")
    assert section.startswith(SHARED.begin) and section.rstrip().endswith(SHARED.end)
    assert "| 0 | sigterm | reconciler-2 | 30.0 | 1.2 | 0.4 | 12.5 | 11.0 |" in section
    assert "- none" in section  # no violation
    assert "| Nomad's faults injected | no_leader 1, node_down 2 |" in section
    assert "(operators among them); pools (idle runners in all); clients | 3 (1); 30 (45); 4 |" in (
        section
    )


@pytest.mark.slow
async def test_short_shared_soak_holds_every_invariant(tmp_path: Path, kube_bin_dir: Path) -> None:
    # One of the three is an operator reading the pools as RunnerPools from a kube-apiserver.
    report = await run_shared_chaos(SEED, MINUTES, tmp_path, reconcilers=3, pools=30, operators=1)
    assert report["invariant_violations"] == [], report["invariant_violations"]
    assert (report["sigterms"], report["sigkills"]) == (1, 1), report["convergence_by_round"]
    assert report["reconciler_starts"] == 3 + 2
    assert report["operators"] == 1
    assert report["double_claims"] == 0
    assert report["claims_lost"] == 0
    assert report["claims_never_answered"] == 0
    assert report["runners_leaked"] == 0
    assert report["request_records_leaked"] == 0
    # The pools were written by several processes, each only while holding the lease.
    assert report["runner_writes"] > 0
    assert report["runner_writers"] >= 3
    assert report["runner_writes_by_non_holders"] == 0
    # Every pool converged after each round, and the leases were balanced again.
    assert report["convergence_samples"] == 30 * report["rounds"]
    assert all(r["balanced_after"] is not None for r in report["convergence_by_round"])
    # Every pool held again after each signal (or, when an API fault stopped the leases
    # meanwhile, counted apart).
    takeovers = (
        report["sigterm_every_pool_held_again_seconds"]
        + report["sigkill_every_pool_held_again_seconds"]
        + report["every_pool_held_again_in_api_faults_seconds"]
    )
    assert len(takeovers) == 2, report["convergence_by_round"]
    # Nomad's faults hit the pools meanwhile.
    assert sum(report["faults_injected"].values()) >= 4, report["faults"]
    assert report["claims_served"] >= 10
    assert all(excess == 0 for excess in report["max_runners_excess"].values())


@pytest.mark.slow
def test_a_sigterm_stops_the_soak_and_every_process_it_started(
    tmp_path: Path, kube_bin_dir: Path
) -> None:
    """A soak stopped from outside (a CI timeout, `kill`) leaves no reconciler, operator,
    etcd or kube-apiserver running."""
    workdir = tmp_path / "soak"
    soak = subprocess.Popen(
        [sys.executable, "-m", "controller", "chaos", "--reconcilers", "2", "--operators", "1",
         "--pools", "2", "--minutes", "1", "--workdir", str(workdir)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while len(_started_by(workdir)) < 4:  # etcd, kube-apiserver and both reconcilers
            assert soak.poll() is None and time.monotonic() < deadline, "the soak did not start"
            time.sleep(0.2)
        soak.send_signal(signal.SIGTERM)
        _, err = soak.communicate(timeout=60)
        assert soak.returncode == 143, err
        assert "stopped by SIGTERM" in err
        assert _started_by(workdir) == []
    finally:
        soak.kill()
        for pid in _started_by(workdir):
            os.kill(pid, signal.SIGKILL)


def _started_by(workdir: Path) -> list[int]:
    """The live processes whose command line names `workdir` (zombies are not alive)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            command = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError, ValueError):
            continue
        if str(workdir) in command and state != "Z" and "controller chaos" not in command:
            found.append(int(proc.name))
    return found
