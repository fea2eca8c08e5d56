"""Claims against the simulator: exactly-once hand-out, idempotency, keepalive, expiry,
release, loss, restarts and the runner routes' ownership rules."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from controller.core.paths import claim_path
from controller.core.views import RunnerState
from controller.standalone import Controller
from tests.support.documents import pool_doc
from tests.support.waiting import wait_until

from .conftest import TOKEN, FakeClock, Harness, write_pools

CLAIMS = "/v1/pools/default/py/claims"


async def filled(harness: Harness, tmp_path, idle: int = 3, clock=None, **spec):
    pools = write_pools(
        tmp_path / "pools.yaml", pool_doc("py", idle=idle, maxRunners=idle * 10, **spec)
    )
    controller = await (harness.start(pools, clock=clock) if clock else harness.start(pools))
    await harness.settled(controller)
    return controller, pools


async def claimed_on_a_fake_clock(
    harness: Harness, tmp_path: Path, timeout_seconds: int
) -> tuple[Controller, FakeClock, str]:
    """A filled pool whose controller runs on a fake clock, and the runner of one claim
    with an inactivity timeout of `timeout_seconds`."""
    clock = FakeClock()
    controller, _ = await filled(harness, tmp_path, clock=clock)
    body = {"inactivityTimeoutSeconds": timeout_seconds}
    _, claim = await harness.api(controller, "POST", CLAIMS, body)
    return controller, clock, claim["runnerId"]


async def test_claim_hands_out_an_idle_runner_and_refills(harness: Harness, tmp_path):
    controller, _ = await filled(harness, tmp_path)
    status, claim = await harness.api(controller, "POST", CLAIMS, {"inactivityTimeoutSeconds": 60})
    assert status == 201, claim
    assert claim["pool"] == "default/py"
    assert claim["inactivityTimeoutSeconds"] == 60
    assert claim["runnerId"].startswith("py-")
    assert claim["nodeName"] and claim["allocationId"]
    expires = datetime.fromisoformat(claim["expiresAt"].replace("Z", "+00:00"))
    claimed = datetime.fromisoformat(claim["claimedAt"].replace("Z", "+00:00"))
    assert expires - claimed == timedelta(seconds=60)
    # The claim woke the engine: a replacement keeps 3 runners idle, 4 in all.
    await harness.settled(controller)
    managed = controller.engine.pools["default/py"]
    assert [r.id for r in managed.runners if r.state is RunnerState.CLAIMED] == [claim["runnerId"]]
    status, same = await harness.api(controller, "GET", f"/v1/runners/{claim['runnerId']}")
    assert (status, same) == (200, claim)
    status, listing = await harness.api(controller, "GET", CLAIMS)
    assert listing == {"claims": [claim]}


async def test_a_request_id_whose_claimer_died_before_claiming_is_taken_over(
    harness: Harness, tmp_path
):
    """A replica killed between writing the request record and the claim leaves the record
    empty: a repeat past the claimer's time to answer claims afresh, one before it waits
    and answers 503 to retry."""
    controller, _ = await filled(harness, tmp_path, idle=2)
    now = datetime.now(UTC)
    for request_id, served_until in (
        ("died", now - timedelta(seconds=1)),
        ("slow", now + timedelta(seconds=60)),
    ):
        harness.sim.put_variable(
            "default",
            f"poolkeeper/requests/{request_id}",
            {"pool": "default/py", "servedUntil": served_until.strftime("%Y-%m-%dT%H:%M:%SZ")},
            0,
        )
    status, claim = await harness.api(controller, "POST", CLAIMS, {"requestId": "died"})
    assert status == 201, claim
    record = harness.sim.variables()["poolkeeper/requests/died"]["Items"]

    async def completed() -> bool:
        record = harness.sim.variables()["poolkeeper/requests/died"]["Items"]
        return bool(record.get("runnerId") == claim["runnerId"])

    await wait_until(completed, what="the taken-over record to name the runner")
    assert record["pool"] == "default/py"
    status, again = await harness.api(controller, "POST", CLAIMS, {"requestId": "died"})
    assert (status, again["runnerId"]) == (200, claim["runnerId"])
    status, busy = await harness.api(controller, "POST", CLAIMS, {"requestId": "slow"})
    assert (status, busy["error"]["code"]) == (503, "NomadUnavailable"), busy


async def test_request_id_makes_a_claim_idempotent(harness: Harness, tmp_path):
    controller, pools = await filled(harness, tmp_path, idle=3)
    replica = await harness.start_api_tier()
    body = {"requestId": "req-1"}
    first, second = await asyncio.gather(
        harness.api(controller, "POST", CLAIMS, body), harness.api(replica, "POST", CLAIMS, body)
    )
    assert sorted([first[0], second[0]]) == [200, 201]
    assert first[1]["runnerId"] == second[1]["runnerId"]
    status, again = await harness.api(controller, "POST", CLAIMS, body)
    assert (status, again["runnerId"]) == (200, first[1]["runnerId"])
    write_pools(pools, pool_doc("py", idle=3, maxRunners=30), pool_doc("other", idle=1))
    await controller.load_pools()
    status, conflict = await harness.api(controller, "POST", "/v1/pools/default/other/claims", body)
    assert (status, conflict["error"]["code"]) == (409, "RequestIdConflict")
    # After a release the request ID answers with the reason, not with a new runner.
    await harness.api(controller, "DELETE", f"/v1/runners/{first[1]['runnerId']}")
    status, gone = await harness.api(controller, "POST", CLAIMS, body)
    assert (status, gone["error"]["reason"]) == (410, "Released")


async def test_keepalive_moves_the_deadline_and_release_destroys(harness: Harness, tmp_path):
    controller, clock, runner = await claimed_on_a_fake_clock(harness, tmp_path, 30)
    clock.advance(20)
    status, kept = await harness.api(controller, "POST", f"/v1/runners/{runner}/keepalive")
    assert status == 200
    assert parse(kept["expiresAt"]) == clock.now + timedelta(seconds=30)
    status, _ = await harness.api(controller, "DELETE", f"/v1/runners/{runner}")
    assert status == 204
    status, again = await harness.api(controller, "DELETE", f"/v1/runners/{runner}")
    assert (status, again["error"]["code"], again["error"]["reason"]) == (
        410,
        "RunnerGone",
        "Released",
    )
    status, after = await harness.api(controller, "POST", f"/v1/runners/{runner}/keepalive")
    assert (status, after["error"]["reason"]) == (410, "Released")
    await harness.settled(controller)
    assert runner not in {j["ID"] for j in await harness.jobs(controller)}


def parse(stamp: str) -> datetime:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00"))


async def test_an_expired_claim_is_destroyed_and_answers_expired(harness: Harness, tmp_path):
    controller, clock, runner = await claimed_on_a_fake_clock(harness, tmp_path, 60)
    clock.advance(59)
    await controller.engine.reconcile_namespace("default")
    assert runner in {j["ID"] for j in await harness.jobs(controller)}
    clock.advance(1)  # exactly at the deadline
    await controller.engine.reconcile_namespace("default")
    assert runner not in {j["ID"] for j in await harness.jobs(controller)}
    status, body = await harness.api(controller, "POST", f"/v1/runners/{runner}/keepalive")
    assert (status, body["error"]["reason"]) == (410, "Expired")
    await harness.settled(controller)


async def test_a_keepalive_after_the_deadline_wins_nothing(harness: Harness, tmp_path):
    controller, clock, runner = await claimed_on_a_fake_clock(harness, tmp_path, 60)
    clock.advance(61)  # the engine has not run yet: the keepalive itself ends the claim
    status, body = await harness.api(controller, "POST", f"/v1/runners/{runner}/keepalive")
    assert (status, body["error"]["reason"]) == (410, "Expired")
    await controller.engine.reconcile_namespace("default")
    assert runner not in {j["ID"] for j in await harness.jobs(controller)}


async def test_claim_without_keepalive_expires_at_its_deadline(harness: Harness, tmp_path):
    """Liveness with the real clock: the engine wakes at the deadline by itself."""
    controller, _ = await filled(harness, tmp_path, claims={"defaultInactivityTimeoutSeconds": 1})
    _, claim = await harness.api(controller, "POST", CLAIMS, {})
    runner = claim["runnerId"]

    async def destroyed() -> bool:
        return runner not in {j["ID"] for j in await harness.jobs(controller)}

    # Well within two resync periods (1 s each) after the deadline.
    await wait_until(destroyed, within=6, what="the expired runner to be destroyed")
    status, body = await harness.api(controller, "POST", f"/v1/runners/{runner}/keepalive")
    assert (status, body["error"]["reason"]) == (410, "Expired")
    await harness.settled(controller)


async def test_a_kept_alive_claim_is_never_destroyed(harness: Harness, tmp_path):
    clock = FakeClock()
    controller, _ = await filled(
        harness, tmp_path, clock=clock, claims={"defaultInactivityTimeoutSeconds": 2}
    )
    _, claim = await harness.api(controller, "POST", CLAIMS, {})
    for _ in range(10):
        clock.advance(1.5)
        status, _ = await harness.api(
            controller, "POST", f"/v1/runners/{claim['runnerId']}/keepalive"
        )
        assert status == 200
        await controller.engine.reconcile_namespace("default")
    assert claim["runnerId"] in {j["ID"] for j in await harness.jobs(controller)}


async def test_claims_and_deadlines_survive_a_restart(harness: Harness, tmp_path):
    controller, pools = await filled(harness, tmp_path)
    _, claim = await harness.api(controller, "POST", CLAIMS, {"inactivityTimeoutSeconds": 600})
    await harness.settled(controller)
    await harness.stop(controller)
    restarted = await harness.start(pools)
    await harness.settled(restarted)
    status, same = await harness.api(restarted, "GET", f"/v1/runners/{claim['runnerId']}")
    assert (status, same) == (200, claim)
    status, listing = await harness.api(restarted, "GET", CLAIMS)
    assert listing["claims"] == [claim]


@pytest.mark.parametrize("fault", ["reschedule", "node_down", "oom_restart"])
async def test_a_claimed_runner_whose_allocation_is_lost_is_reported_and_destroyed(
    harness: Harness, tmp_path, fault
):
    controller, _ = await filled(harness, tmp_path)
    _, claim = await harness.api(controller, "POST", CLAIMS, {})
    if fault == "reschedule":
        await harness.sim.reschedule_allocation(claim["allocationId"])
    elif fault == "node_down":
        await harness.sim.node_down(claim["nodeName"])
    else:
        await harness.sim.oom_restart(claim["allocationId"])

    async def lost() -> bool:
        status, body = await harness.api(controller, "GET", f"/v1/runners/{claim['runnerId']}")
        return status == 410 and body["error"]["reason"] == "AllocationLost"

    await wait_until(lost, what="the claim to be reported lost")
    await harness.settled(controller)
    assert claim["runnerId"] not in {j["ID"] for j in await harness.jobs(controller)}


async def test_a_reannounced_allocation_never_makes_a_claimed_runner_idle(
    harness: Harness, tmp_path
):
    controller, _ = await filled(harness, tmp_path)
    _, claim = await harness.api(controller, "POST", CLAIMS, {})
    await harness.sim.reannounce_allocation(claim["allocationId"])
    await controller.engine.reconcile_namespace("default")
    states = {r.id: r.state for r in controller.engine.pools["default/py"].runners}
    assert states[claim["runnerId"]] is RunnerState.CLAIMED
    status, _ = await harness.api(controller, "GET", f"/v1/runners/{claim['runnerId']}")
    assert status == 200


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "code"),
    [
        ("POST", CLAIMS, {"inactivityTimeoutSeconds": -1}, 400, "InvalidRequest"),
        ("POST", CLAIMS, {"inactivityTimeoutSeconds": 10**9}, 400, "InvalidRequest"),
        ("POST", CLAIMS, {"inactivityTimeoutSeconds": "60"}, 400, "InvalidRequest"),
        ("POST", CLAIMS, {"waitSeconds": 31}, 400, "InvalidRequest"),
        ("POST", CLAIMS, {"requestId": "has space"}, 400, "InvalidRequest"),
        ("POST", CLAIMS, {"requestId": "x" * 65}, 400, "InvalidRequest"),
        ("POST", CLAIMS, {"surprise": 1}, 400, "InvalidRequest"),
        ("POST", CLAIMS, [], 400, "InvalidRequest"),
        ("POST", "/v1/pools/default/nope/claims", {}, 404, "PoolNotFound"),
        ("GET", "/v1/pools/default/nope/claims", None, 404, "PoolNotFound"),
        ("GET", "/v1/runners/py-000000000000", None, 404, "RunnerNotFound"),
        ("GET", "/v1/runners/..%2F..%2Fetc", None, 404, "RunnerNotFound"),
        ("GET", "/v1/runners/PY-ZZZ", None, 404, "RunnerNotFound"),
        ("POST", "/v1/runners/py-000000000000/keepalive", None, 404, "RunnerNotFound"),
        ("DELETE", "/v1/runners/py-000000000000", None, 404, "RunnerNotFound"),
        ("GET", "/v1/nothing", None, 404, "NotFound"),
        ("PUT", "/v1/pools", None, 405, "MethodNotAllowed"),
    ],
)
async def test_bad_input_gets_the_documented_error_and_changes_nothing(
    harness: Harness, tmp_path, method, path, body, status, code
):
    controller, _ = await filled(harness, tmp_path)
    before = sorted(j["ID"] for j in await harness.jobs(controller))
    got_status, got = await harness.api(controller, method, path, body)
    assert (got_status, got["error"]["code"]) == (status, code), got
    assert sorted(j["ID"] for j in await harness.jobs(controller)) == before
    assert not [v for v in harness.sim.variables("default") if v.startswith("poolkeeper/claims/")]


async def test_idle_and_foreign_runners_are_not_reachable(harness: Harness, tmp_path):
    controller, _ = await filled(harness, tmp_path)
    idle = controller.engine.pools["default/py"].runners[0].id
    for method, suffix in (("GET", ""), ("POST", "/keepalive"), ("DELETE", "")):
        status, body = await harness.api(controller, method, f"/v1/runners/{idle}{suffix}")
        assert (status, body["error"]["code"]) == (404, "RunnerNotFound")
    await harness.settled(controller)


async def test_every_v1_route_needs_a_token(harness: Harness, tmp_path):
    controller, _ = await filled(harness, tmp_path)
    routes = [
        ("GET", "/v1/pools"),
        ("POST", CLAIMS),
        ("GET", CLAIMS),
        ("GET", "/v1/runners/py-000000000000"),
        ("POST", "/v1/runners/py-000000000000/keepalive"),
        ("DELETE", "/v1/runners/py-000000000000"),
    ]
    for method, path in routes:
        for token in (None, "wrong", TOKEN + "x"):
            status, body = await harness.api(controller, method, path, {}, token=token)
            assert (status, body["error"]["code"]) == (401, "Unauthorized"), (method, path, token)
    for path in ("/healthz", "/readyz", "/metrics", "/openapi.json"):
        status, _ = await harness.api(controller, "GET", path, token=None)
        assert status == 200, path


async def test_oversized_and_malformed_bodies(harness: Harness, tmp_path):
    controller, _ = await filled(harness, tmp_path)
    await harness.api(controller, "GET", "/healthz", token=None)  # opens the HTTP session
    assert harness.http is not None
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    async with harness.http.post(controller.url + CLAIMS, data=b"{" * 100, headers=headers) as r:
        assert r.status == 400
        assert (await r.json())["error"]["code"] == "InvalidRequest"
    big = b'{"requestId": "' + b"a" * 200_000 + b'"}'
    async with harness.http.post(controller.url + CLAIMS, data=big, headers=headers) as r:
        assert r.status == 413
        assert (await r.json())["error"]["code"] == "PayloadTooLarge"
    written = ("poolkeeper/claims/", "poolkeeper/requests/")
    assert not [v for v in harness.sim.variables("default") if v.startswith(written)]


async def test_a_claim_without_options_is_the_same_whatever_says_so(harness: Harness, tmp_path):
    """No body, a blank one, `{}` and `{}` sent in chunks (the body arrives after the
    headers) are all a claim with the pool's defaults."""
    controller, _ = await filled(harness, tmp_path, idle=5)
    await harness.api(controller, "GET", "/healthz", token=None)  # opens the HTTP session
    assert harness.http is not None
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}

    async def chunks() -> AsyncIterator[bytes]:
        yield b"{"
        await asyncio.sleep(0.05)
        yield b"}"

    answers = []
    for body in (None, b" \n", b"{}", chunks()):
        async with harness.http.post(controller.url + CLAIMS, data=body, headers=headers) as r:
            answers.append((r.status, await r.json()))
    assert [status for status, _ in answers] == [201] * 4, answers
    assert len({claim["runnerId"] for _, claim in answers}) == 4
    assert {claim["inactivityTimeoutSeconds"] for _, claim in answers} == {300}  # default
    assert {(tuple(sorted(claim)), claim.get("requestId")) for _, claim in answers} == {
        (tuple(sorted(answers[0][1])), None)
    }


async def test_wait_seconds_waits_for_a_replacement(harness: Harness, tmp_path):
    controller, _ = await filled(harness, tmp_path, idle=1)
    harness.sim.set_start_delay(0.5)
    status, first = await harness.api(controller, "POST", CLAIMS, {})
    assert status == 201
    status, empty = await harness.api(controller, "POST", CLAIMS, {})
    assert (status, empty["error"]["code"]) == (503, "PoolEmpty")
    status, second = await harness.api(controller, "POST", CLAIMS, {"waitSeconds": 10})
    assert status == 201, second
    assert second["runnerId"] != first["runnerId"]


async def test_claim_variables_live_outside_nomad_jobs(harness: Harness, tmp_path):
    controller, _ = await filled(harness, tmp_path)
    _, claim = await harness.api(controller, "POST", CLAIMS, {})
    assert claim_path(claim["runnerId"]) in harness.sim.variables("default")
    assert not any(v.startswith("nomad/jobs") for v in harness.sim.variables("default"))
    now = datetime.now(UTC)
    assert (
        abs(
            (
                datetime.fromisoformat(claim["claimedAt"].replace("Z", "+00:00")) - now
            ).total_seconds()
        )
        < 60
    )


async def test_concurrent_claims_of_one_process_take_distinct_runners(harness: Harness, tmp_path):
    controller, _ = await filled(harness, tmp_path, idle=20)
    harness.sim.set_start_delay(60.0)  # no replacement becomes idle during the burst
    claims = [harness.api(controller, "POST", CLAIMS, {}) for _ in range(20)]
    results = await asyncio.gather(*claims)
    assert [status for status, _ in results] == [201] * 20, results
    assert len({claim["runnerId"] for _, claim in results}) == 20
    # One place handed them out: no claim tried a runner another claim of it had taken.
    conflicts = controller.metrics.registry.get_sample_value(
        "poolkeeper_claim_conflicts_total", {"pool": "default/py"}
    )
    assert conflicts in (None, 0.0)
    status, empty = await harness.api(controller, "POST", CLAIMS, {})
    assert (status, empty["error"]["code"]) == (503, "PoolEmpty")
