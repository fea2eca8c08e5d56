"""Classify (one state per runner job) and the engine's data types."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from controller.core.claims import ClaimRecord, ClaimState, MalformedClaim
from controller.core.classify import classify, counting_allocation
from controller.core.paths import claim_path
from controller.core.split import split_observation
from controller.core.times import format_time, parse_time
from controller.core.views import (
    AllocationView,
    Failure,
    JobView,
    Runner,
    RunnerState,
    placement_failure,
)
from tests.support.builders import NOW, POLICY, POOL, alloc, claim, job, observe, rid

# ---- classify ------------------------------------------------------------------------


@dataclass
class Case:
    id: str
    jobs: list[JobView]
    allocs: list[AllocationView] = field(default_factory=list)
    claims: list[ClaimRecord] = field(default_factory=list)
    malformed: list[str] = field(default_factory=list)
    # expected (state, counting allocation ID) of runner 1
    state: RunnerState = RunnerState.IDLE
    allocation: str | None = None
    reason: str = ""
    failure: Failure | None = None


RECENT = NOW - timedelta(seconds=10)
CASES = [
    Case("job without allocation yet", [job(1, status="pending", submitted=RECENT)],
         state=RunnerState.STARTING),
    Case(
        "seed: new pending alloc and old desired-stop alloc still running",
        [job(1)],
        [alloc(1, "old", desired="stop", client="running", index=10),
         alloc(1, "new", client="pending", created=RECENT, index=20)],
        state=RunnerState.STARTING, allocation="new",
    ),
    Case(
        "seed: new running, old stop still reporting running",
        [job(1)],
        [alloc(1, "new", client="running", created=RECENT, index=20),
         alloc(1, "old", desired="stop", client="running", index=10)],
        state=RunnerState.IDLE, allocation="new",
    ),
    Case(
        "seed: new running, old stop complete",
        [job(1)],
        [alloc(1, "old", desired="stop", client="complete", index=10),
         alloc(1, "new", client="running", created=RECENT, index=20)],
        state=RunnerState.IDLE, allocation="new",
    ),
    Case(
        "desired stop with client running never counts",
        [job(1, submitted=RECENT)],
        [alloc(1, "a", desired="stop", client="running")],
        state=RunnerState.STARTING, allocation=None,
    ),
    Case(
        "desired stop and pending (dying node) never counts",
        [job(1, submitted=RECENT)],
        [alloc(1, "a", desired="stop", client="pending")],
        state=RunnerState.STARTING, allocation=None,
    ),
    Case(
        "evicted (preempted) alloc never counts",
        [job(1, submitted=RECENT)],
        [alloc(1, "a", desired="evict", client="running")],
        state=RunnerState.STARTING, allocation=None,
    ),
    Case(
        "lost alloc with a pending replacement",
        [job(1)],
        [alloc(1, "old", desired="stop", client="lost"),
         alloc(1, "new", client="pending", created=RECENT, index=20)],
        state=RunnerState.STARTING, allocation="new",
    ),
    Case(
        "lost alloc with a running replacement",
        [job(1)],
        [alloc(1, "old", desired="stop", client="lost"),
         alloc(1, "new", client="running", created=RECENT, index=20)],
        state=RunnerState.IDLE, allocation="new",
    ),
    Case(
        "lost alloc without replacement on a recent job",
        [job(1, status="pending", submitted=RECENT)],
        [alloc(1, "old", desired="stop", client="lost")],
        state=RunnerState.STARTING,
    ),
    Case(
        "lost alloc without replacement, old job: timed out",
        [job(1, status="pending")],
        [alloc(1, "old", desired="stop", client="lost")],
        state=RunnerState.FAILED, reason="not running", failure=Failure.ENDED,
    ),
    Case(
        "failed alloc awaiting reschedule on a recent job",
        [job(1, submitted=RECENT)],
        [alloc(1, "a", client="failed", created=RECENT)],
        state=RunnerState.STARTING,
    ),
    Case(
        "failed alloc, job dead",
        [job(1, status="dead", submitted=RECENT)],
        [alloc(1, "a", client="failed", created=RECENT)],
        state=RunnerState.FAILED, reason="dead", failure=Failure.FAILED_TO_START,
    ),
    Case(
        "failed alloc with a running replacement",
        [job(1)],
        [alloc(1, "old", desired="stop", client="failed"),
         alloc(1, "new", client="running", created=RECENT, index=20)],
        state=RunnerState.IDLE, allocation="new",
    ),
    Case(
        "unknown client status (disconnected) alone does not count",
        [job(1, submitted=RECENT)],
        [alloc(1, "a", client="unknown")],
        state=RunnerState.STARTING, allocation=None,
    ),
    Case(
        "unknown alloc plus running replacement",
        [job(1)],
        [alloc(1, "old", client="unknown"),
         alloc(1, "new", client="running", created=RECENT, index=20)],
        state=RunnerState.IDLE, allocation="new",
    ),
    Case(
        "running preferred over a newer pending alloc",
        [job(1)],
        [alloc(1, "run", client="running", index=10),
         alloc(1, "pend", client="pending", created=RECENT, index=20)],
        state=RunnerState.IDLE, allocation="run",
    ),
    Case(
        "running with another template is outdated",
        [job(1, template="t0")],
        [alloc(1, "a")],
        state=RunnerState.OUTDATED, allocation="a",
    ),
    Case(
        "pending alloc 119 s after submit is still starting",
        [job(1, status="pending", submitted=NOW - timedelta(seconds=119))],
        [alloc(1, "a", client="pending", created=NOW - timedelta(seconds=119))],
        state=RunnerState.STARTING, allocation="a",
    ),
    Case(
        "pending alloc 120 s after submit has timed out",
        [job(1, status="pending", submitted=NOW - timedelta(seconds=120))],
        [alloc(1, "a", client="pending", created=NOW - timedelta(seconds=120))],
        state=RunnerState.FAILED, reason="120 s", failure=Failure.STARTUP_TIMEOUT,
    ),
    Case(
        "timeout measured from the newest live alloc, not the old submit",
        [job(1, submitted=NOW - timedelta(hours=1))],
        [alloc(1, "old", desired="stop", client="lost"),
         alloc(1, "new", client="pending", created=NOW - timedelta(seconds=30), index=20)],
        state=RunnerState.STARTING, allocation="new",
    ),
    Case(
        "job stopped outside poolkeeper",
        [job(1, stop=True)],
        [alloc(1, "a")],
        state=RunnerState.FAILED, reason="stopped", failure=Failure.STOPPED,
    ),
    # claims
    Case("live claim on its running alloc", [job(1)], [alloc(1, "a")], [claim(1, "a")],
         state=RunnerState.CLAIMED, allocation="a"),
    Case(
        "claim on an outdated runner is still claimed",
        [job(1, template="t0")], [alloc(1, "a")], [claim(1, "a")],
        state=RunnerState.CLAIMED,
    ),
    Case(
        "claim expires exactly at the deadline",
        [job(1)], [alloc(1, "a")], [claim(1, "a", expires=NOW)],
        state=RunnerState.EXPIRED,
    ),
    Case(
        "claim one microsecond before the deadline",
        [job(1)], [alloc(1, "a")], [claim(1, "a", expires=NOW + timedelta(microseconds=1))],
        state=RunnerState.CLAIMED,
    ),
    Case(
        "claimed alloc replaced by a reschedule (seed on a claimed runner)",
        [job(1)],
        [alloc(1, "a", desired="stop", client="running"),
         alloc(1, "b", client="pending", created=RECENT, index=20)],
        [claim(1, "a")],
        state=RunnerState.LOST, reason="replaced",
    ),
    Case(
        "claimed alloc re-announced running by its client is still lost once stopped",
        [job(1)],
        [alloc(1, "a", desired="stop", client="running")],
        [claim(1, "a")],
        state=RunnerState.LOST, reason="gone",
    ),
    Case(
        "claimed alloc restarted in place (OOM)",
        [job(1)], [alloc(1, "a", restarts=1)], [claim(1, "a", restarts=0)],
        state=RunnerState.LOST, reason="restarted",
    ),
    Case(
        "restart count unchanged since the claim",
        [job(1)], [alloc(1, "a", restarts=2)], [claim(1, "a", restarts=2)],
        state=RunnerState.CLAIMED,
    ),
    Case(
        "claim without a recorded restart count ignores restarts",
        [job(1)], [alloc(1, "a", restarts=4)], [claim(1, "a")],
        state=RunnerState.CLAIMED,
    ),
    Case(
        "lost wins over expired",
        [job(1)], [alloc(1, "b")], [claim(1, "a", expires=NOW - timedelta(hours=1))],
        state=RunnerState.LOST,
    ),
    Case(
        "claimed alloc still live beside a new one (reconnect) stays claimed",
        [job(1)],
        [alloc(1, "a", client="running"),
         alloc(1, "b", client="running", created=RECENT, index=20)],
        [claim(1, "a")],
        state=RunnerState.CLAIMED, allocation="a",
    ),
    Case(
        "tombstone on a running job is terminating, never idle",
        [job(1)], [alloc(1, "a")], [claim(1, "a", state=ClaimState.RETIRED)],
        state=RunnerState.TERMINATING,
    ),
    Case(
        "released tombstone on a dead job is terminating",
        [job(1, status="dead", stop=True)], [], [claim(1, "a", state=ClaimState.RELEASED)],
        state=RunnerState.TERMINATING,
    ),
    Case(
        "malformed claim variable: claimed, never idle",
        [job(1)], [alloc(1, "a")], malformed=[rid(1)],
        state=RunnerState.CLAIMED,
    ),
    # Why a runner failed: only a runner that never ran failed to start.
    Case(
        "drained: the job ended after its runner ran",
        [job(1, status="dead")], [alloc(1, "a", desired="stop", client="complete")],
        state=RunnerState.FAILED, failure=Failure.ENDED,
    ),
    Case(
        "never ran: the job is dead, Nomad's reason is kept",
        [job(1, status="dead", submitted=RECENT)],
        [alloc(1, "a", client="failed", failure="Driver Failure: Failed to pull image")],
        state=RunnerState.FAILED, failure=Failure.FAILED_TO_START,
        reason="Driver Failure: Failed to pull image",
    ),
    Case(
        "lost with its node, the replacement not running in time: not a failed start",
        [job(1)],
        [alloc(1, "old", desired="stop", client="lost"),
         alloc(1, "new", client="pending", created=NOW - timedelta(minutes=5), index=20)],
        state=RunnerState.FAILED, failure=Failure.ENDED,
    ),
    Case(
        "never placed within the startup timeout",
        [job(1, status="pending", submitted=NOW - timedelta(minutes=5))],
        state=RunnerState.FAILED, failure=Failure.STARTUP_TIMEOUT, reason="startup timeout",
    ),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_classify(case: Case) -> None:
    runners = classify(POLICY, observe(case.jobs, case.allocs, case.claims, case.malformed), NOW)
    assert len(runners) == len(case.jobs)  # one runner per job, never per allocation
    runner = runners[0]
    assert runner.state is case.state, runner.reason
    if case.allocation is not None or case.state is RunnerState.STARTING:
        assert (runner.allocation.id if runner.allocation else None) == case.allocation
    assert case.reason in runner.reason
    assert runner.failure is case.failure


def test_malformed_claim_is_flagged_for_status() -> None:
    [runner] = classify(POLICY, observe([job(1)], [alloc(1, "a")], malformed=[rid(1)]), NOW)
    assert runner.malformed_claim and runner.claim is None


def test_seed_sequence_every_intermediate_state_is_one_runner() -> None:
    """The instant reschedule from the seed, frame by frame: never two runners, never zero,
    and never idle while only the stopping allocation runs."""
    old_running = alloc(1, "old", client="running", index=10)
    new_pending = alloc(1, "new", client="pending", created=RECENT, index=20)
    old_stopping = alloc(1, "old", desired="stop", client="running", index=10)
    old_complete = alloc(1, "old", desired="stop", client="complete", index=10)
    new_running = alloc(1, "new", client="running", created=RECENT, index=20)
    frames = [
        ([old_running], RunnerState.IDLE),
        ([old_running, new_pending], RunnerState.IDLE),  # new placed, stop not yet seen
        ([new_pending, old_stopping], RunnerState.STARTING),
        ([new_pending, old_complete], RunnerState.STARTING),
        ([new_running, old_stopping], RunnerState.IDLE),  # client updates in either order
        ([new_running, old_complete], RunnerState.IDLE),
    ]
    for allocs, expected in frames:
        runners = classify(POLICY, observe([job(1)], allocs), NOW)
        assert [r.state for r in runners] == [expected]


def test_counting_allocation_prefers_running_then_newest() -> None:
    older = alloc(1, "older", index=5)
    newer = alloc(1, "newer", index=9)
    pending = alloc(1, "pending", client="pending", index=20)
    assert counting_allocation([older, pending, newer]) == newer
    assert counting_allocation([alloc(1, "x", desired="stop")]) is None


def test_runners_sorted_by_id_and_one_per_job() -> None:
    jobs = [job(3), job(1), job(2, status="pending", submitted=RECENT)]
    allocs = [alloc(1, "a"), alloc(1, "b", client="pending", index=11), alloc(3, "c")]
    runners = classify(POLICY, observe(jobs, allocs), NOW)
    assert [r.id for r in runners] == [rid(1), rid(2), rid(3)]
    assert [r.state for r in runners] == [
        RunnerState.IDLE,
        RunnerState.STARTING,
        RunnerState.IDLE,
    ]


# ---- Nomad stubs ---------------------------------------------------------------------


def test_job_from_minimal_stub_uses_defaults() -> None:
    view = JobView.from_stub({"ID": "python-0123456789ab"})
    assert view == JobView("python-0123456789ab", "default", "", "", "pending", False, 0)


def test_job_from_stub_reads_meta_stop_and_submit_time() -> None:
    stub: dict[str, Any] = {
        "ID": "python-0123456789ab",
        "Namespace": "ci",
        "Status": "dead",
        "Stop": True,
        "SubmitTime": 1764493200000000000,
        "Meta": {"poolkeeper_pool": POOL, "poolkeeper_template": "t9", "other": "x"},
    }
    view = JobView.from_stub(stub)
    assert (view.namespace, view.pool, view.template) == ("ci", POOL, "t9")
    assert view.stop and view.dead and view.submit_time_ns == 1764493200000000000


def test_job_from_stub_with_null_meta() -> None:
    assert JobView.from_stub({"ID": "x", "Meta": None}).pool == ""


def test_allocation_from_stub_sums_task_restarts() -> None:
    stub: dict[str, Any] = {
        "ID": "a1",
        "JobID": "python-0123456789ab",
        "DesiredStatus": "run",
        "ClientStatus": "running",
        "CreateIndex": 7,
        "CreateTime": 5,
        "TaskStates": {"main": {"Restarts": 2}, "sidecar": {"Restarts": 1}, "x": {}},
    }
    view = AllocationView.from_stub(stub)
    assert view.restarts == 3 and view.live and view.create_index == 7
    assert AllocationView.from_stub({"ID": "a", "TaskStates": None}).restarts == 0


def event(kind: str, message: str, fails: bool = False) -> dict[str, Any]:
    return {"Type": kind, "DisplayMessage": message, "FailsTask": fails}


@pytest.mark.parametrize(
    ("task_states", "started", "failure"),
    [
        ({"runner": {"StartedAt": None, "Events": []}}, False, ""),
        ({"runner": {"StartedAt": "0001-01-01T00:00:00Z"}}, False, ""),  # Go's zero time
        ({"runner": {"StartedAt": "2026-12-01T09:00:00.5Z"}}, True, ""),
        (
            {"runner": {"Events": [event("Received", "received"),
                                   event("Driver Failure", "Failed to pull `img`")]}},
            False,
            "Driver Failure: Failed to pull `img`",
        ),
        (  # the newest failing event wins; Terminated with FailsTask counts too
            {"runner": {"StartedAt": "2026-12-01T09:00:00Z",
                        "Events": [event("Driver Failure", "first"), event("Started", "ok"),
                                   event("Terminated", "Exit Code: 1", fails=True)]}},
            True,
            "Terminated: Exit Code: 1",
        ),
        ({"runner": {"Events": "not a list"}}, False, ""),
    ],
)  # fmt: skip
def test_allocation_from_stub_reads_whether_it_ran_and_why_it_failed(
    task_states: dict[str, Any], started: bool, failure: str
) -> None:
    view = AllocationView.from_stub({"ID": "a", "TaskStates": task_states})
    assert (view.started, view.failure) == (started, failure)


def nomad_event(kind: str, display: str = "", **fields: Any) -> dict[str, Any]:
    """A task event as Nomad's API sends it (DisplayMessage may be empty)."""
    return {"Type": kind, "DisplayMessage": display, "FailsTask": False, "Details": {}, **fields}


NOT_RESTARTING = nomad_event(
    "Not Restarting",
    "Error was unrecoverable",
    FailsTask=True,
    RestartReason="Error was unrecoverable",
    Details={"restart_reason": "Error was unrecoverable", "fails_task": "true"},
)
PULL = "Failed to pull `python:3.12`: manifest unknown"


@pytest.mark.parametrize(
    ("events", "failure"),
    [
        (  # an image that does not exist: the driver's error, not the final verdict
            [nomad_event("Received", "Task received by client"),
             nomad_event("Task Setup", "Building Task Directory"),
             nomad_event("Driver", "Downloading image"),
             nomad_event("Driver Failure", PULL, DriverError=PULL), NOT_RESTARTING],
            f"Driver Failure: {PULL}",
        ),
        (  # restarted until the policy gave up: the newest driver error
            [nomad_event("Driver Failure", "registry timeout"),
             nomad_event("Restarting", "Task restarting in 15s"),
             nomad_event("Driver Failure", "registry refused"),
             nomad_event("Not Restarting", "Exceeded allowed attempts 3 in interval 24h0m0s",
                         FailsTask=True)],
            "Driver Failure: registry refused",
        ),
        (  # no DisplayMessage: the Details say it
            [nomad_event("Driver Failure", Details={"driver_error": "no such image"}),
             NOT_RESTARTING],
            "Driver Failure: no such image",
        ),
        (
            [nomad_event("Task hook failed", "prestart hook failed: artifact"), NOT_RESTARTING],
            "Task hook failed: prestart hook failed: artifact",
        ),
        (  # a kill that failed the task (a template that cannot render)
            [nomad_event("Killing", "Template failed: missing key", FailsTask=True),
             nomad_event("Killed", "Task successfully killed")],
            "Killing: Template failed: missing key",
        ),
        (  # it ran and kept exiting 1
            [nomad_event("Started", "Task started by client"),
             nomad_event("Terminated", "Exit Code: 1", ExitCode=1),
             nomad_event("Not Restarting", "Exceeded allowed attempts 3 in interval 24h0m0s",
                         FailsTask=True)],
            "Terminated: Exit Code: 1",
        ),
        (  # nothing says why: the event that failed the task
            [nomad_event("Received"), NOT_RESTARTING],
            "Not Restarting: Error was unrecoverable",
        ),
        (  # ran and completed: no failure
            [nomad_event("Started"), nomad_event("Terminated", "Exit Code: 0")],
            "",
        ),
    ],
)  # fmt: skip
def test_the_failure_is_the_event_that_says_why_as_nomad_alloc_status_shows_it(
    events: list[dict[str, Any]], failure: str
) -> None:
    view = AllocationView.from_stub({"ID": "a", "TaskStates": {"runner": {"Events": events}}})
    assert view.failure == failure


def test_placement_failure_reads_the_newest_failed_evaluation() -> None:
    metric = {"NodesEvaluated": 3, "NodesExhausted": 3, "DimensionExhausted": {"memory": 3}}
    evaluations = [
        {"ModifyIndex": 5, "FailedTGAllocs": {"runner": {"NodesEvaluated": 1}}},
        {"ModifyIndex": 9, "FailedTGAllocs": {"runner": metric}},
        {"ModifyIndex": 12, "Status": "complete"},
    ]
    assert placement_failure(evaluations) == "no placement: 3 of 3 nodes exhausted (memory 3)"
    assert placement_failure([{"Status": "complete"}]) == ""


# (desired status, client status) of the only allocations that count as live.
LIVE = {("run", "pending"), ("run", "running")}


@pytest.mark.parametrize("desired", ["run", "stop", "evict"])
@pytest.mark.parametrize("client", ["pending", "running", "unknown", "complete", "failed", "lost"])
def test_allocation_live(desired: str, client: str) -> None:
    assert alloc(1, "a", desired=desired, client=client).live is ((desired, client) in LIVE)


# ---- claim variables -----------------------------------------------------------------

ITEMS = {
    "pool": POOL,
    "allocationId": "alloc-1",
    "claimedAt": "2026-11-30T09:00:00Z",
    "expiresAt": "2026-11-30T09:05:00Z",
    "inactivityTimeoutSeconds": "300",
}


def variable(items: dict[str, str], path: str = claim_path(rid(1))) -> dict[str, Any]:
    return {
        "Namespace": "default",
        "Path": path,
        "ModifyIndex": 42,
        "ModifyTime": 1764493200000000000,
        "Items": items,
    }


def test_claim_with_only_required_items() -> None:
    record = ClaimRecord.from_variable(variable(ITEMS))
    assert record.runner_id == rid(1) and record.modify_index == 42
    assert record.state is ClaimState.CLAIMED and not record.is_tombstone
    assert record.request_id is None and record.allocation_restarts is None
    assert record.expires_at == datetime(2026, 11, 30, 9, 5, tzinfo=UTC)
    assert record.modify_time_ns == 1764493200000000000


def test_claim_round_trip_keeps_unknown_items() -> None:
    items = {
        **ITEMS,
        "requestId": "req-1",
        "state": "released",
        "allocationRestarts": "2",
        "futureItem": "kept",
    }
    record = ClaimRecord.from_variable(variable(items))
    assert record.extra == {"futureItem": "kept"}
    assert record.state is ClaimState.RELEASED and record.is_tombstone
    assert record.to_items() == items
    again = ClaimRecord.from_variable(variable(record.to_items()))
    assert again == record


def test_claim_times_accept_fractions_and_offsets() -> None:
    items = {
        **ITEMS,
        "claimedAt": "2026-11-30T09:00:00.123456789Z",
        "expiresAt": "2026-11-30T10:05:00.5+01:00",
    }
    record = ClaimRecord.from_variable(variable(items))
    assert record.claimed_at == datetime(2026, 11, 30, 9, 0, 0, 123456, tzinfo=UTC)
    assert record.expires_at == datetime(2026, 11, 30, 9, 5, 0, 500000, tzinfo=UTC)
    written = record.to_items()
    assert written["claimedAt"] == "2026-11-30T09:00:00.123456Z"
    assert written["expiresAt"] == "2026-11-30T09:05:00.5Z"


def test_with_state_makes_a_tombstone_and_keeps_the_rest() -> None:
    record = ClaimRecord.from_variable(variable(ITEMS))
    tomb = record.with_state(ClaimState.EXPIRED)
    assert tomb.is_tombstone and tomb.to_items()["state"] == "expired"
    assert tomb.modify_index == record.modify_index and tomb.expires_at == record.expires_at


@pytest.mark.parametrize("missing", sorted(ITEMS))
def test_claim_missing_required_item_is_malformed(missing: str) -> None:
    items = {k: v for k, v in ITEMS.items() if k != missing}
    with pytest.raises(MalformedClaim):
        ClaimRecord.from_variable(variable(items))


def test_a_tombstone_may_name_no_allocation_but_a_live_claim_must() -> None:
    # A runner retired before it was ever placed has no allocation to name.
    retired = ClaimRecord.from_variable(variable({**ITEMS, "allocationId": "", "state": "retired"}))
    assert retired.is_tombstone and retired.allocation_id == ""
    assert ClaimRecord.from_variable(variable(retired.to_items())) == retired
    with pytest.raises(MalformedClaim):
        ClaimRecord.from_variable(variable({**ITEMS, "allocationId": ""}))


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("inactivityTimeoutSeconds", "-5"),
        ("inactivityTimeoutSeconds", "5.0"),
        ("inactivityTimeoutSeconds", "abc"),
        ("allocationRestarts", "x"),
        ("expiresAt", "yesterday"),
        ("expiresAt", "2026-11-30T09:05:00"),  # no offset
        ("claimedAt", "2026-11-30 09:00"),
        ("state", "exploded"),
    ],
)
def test_claim_unparseable_item_is_malformed(key: str, value: str) -> None:
    with pytest.raises(MalformedClaim):
        ClaimRecord.from_variable(variable({**ITEMS, key: value}))


@pytest.mark.parametrize(
    "path", ["poolkeeper/requests/x", "poolkeeper/claims/python-XYZ", "other/python-0123456789ab"]
)
def test_claim_at_a_foreign_path_is_malformed(path: str) -> None:
    with pytest.raises(MalformedClaim):
        ClaimRecord.from_variable(variable(ITEMS, path))


def test_new_claim_expires_after_its_timeout() -> None:
    record = ClaimRecord.new(
        runner_id=rid(1),
        namespace="default",
        pool=POOL,
        allocation_id="a",
        now=NOW,
        inactivity_timeout_seconds=60,
        request_id="r",
        allocation_restarts=0,
    )
    assert record.expires_at == NOW + timedelta(seconds=60) and record.modify_index == 0
    assert record.to_items()["expiresAt"] == "2026-11-30T09:01:00Z"
    assert not record.is_expired(NOW) and record.is_expired(NOW + timedelta(seconds=60))


def test_format_time_converts_to_utc_and_refuses_naive() -> None:
    berlin_winter = timezone(timedelta(hours=1))
    assert format_time(datetime(2026, 11, 30, 10, 0, tzinfo=berlin_winter)) == (
        "2026-11-30T09:00:00Z"
    )
    with pytest.raises(ValueError):
        format_time(datetime(2026, 11, 30, 9, 0))
    assert parse_time(format_time(NOW)) == NOW


# ---- ownership -----------------------------------------------------------------------


def test_split_observation_prefix_collision_and_foreign_meta() -> None:
    short = POLICY
    # Only the key, the Nomad namespace and the job prefix decide whose a job is.
    longer = dataclasses.replace(short, key="default/python-312", job_prefix="python-312-")
    mine = job(1)
    theirs = job(2, prefix="python-312-", pool="default/python-312")
    wrong_meta = job(3, pool="default/python-312")  # python- prefix, other pool's Meta
    foreign = JobView(rid(4), "default", "", "", "running", False, 0)  # no Meta
    other_ns = job(5, namespace="elsewhere")
    orphan = job(6, prefix="ruby-", pool="default/ruby")
    not_runner_shaped = JobView("python-XYZ", "default", POOL, "t1", "running", False, 0)
    allocs = [alloc(1, "a1"), alloc(2, "a2", prefix="python-312-"), alloc(3, "a3")]
    claims = [
        claim(1, "a1"),
        claim(2, "a2", prefix="python-312-", pool="default/python-312"),
        claim(9, "gone", state=ClaimState.RELEASED),  # tombstone of a vanished job
        claim(7, "x", pool="default/python-312"),  # python- ID, other pool's item
    ]
    by_pool, orphans = split_observation(
        [short, longer],
        [mine, theirs, wrong_meta, foreign, other_ns, orphan, not_runner_shaped],
        {a.job_id: (a,) for a in allocs},
        {c.runner_id: c for c in claims},
        frozenset({rid(8), rid(8, "python-312-")}),
    )
    assert by_pool[POOL].jobs == (mine,)
    assert by_pool["default/python-312"].jobs == (theirs,)
    assert set(by_pool[POOL].allocations) == {rid(1)}
    assert set(by_pool["default/python-312"].allocations) == {rid(2, "python-312-")}
    assert set(by_pool[POOL].claims) == {rid(1), rid(9)}
    assert set(by_pool["default/python-312"].claims) == {rid(2, "python-312-")}
    assert by_pool[POOL].malformed_claims == {rid(8)}
    assert by_pool["default/python-312"].malformed_claims == {rid(8, "python-312-")}
    assert orphans == [orphan]


def test_split_observation_accepts_flat_lists_and_namespaced_malformed() -> None:
    by_pool, orphans = split_observation(
        [POLICY],
        [job(1)],
        [alloc(1, "a")],
        [claim(1, "a")],
        [("elsewhere", rid(2)), ("default", rid(3))],
    )
    assert by_pool[POOL].allocations == {rid(1): (alloc(1, "a"),)}
    assert by_pool[POOL].malformed_claims == {rid(3)}
    assert orphans == []


def runner_states(runners: Iterable[Runner]) -> dict[str, RunnerState]:
    return {r.id: r.state for r in runners}
