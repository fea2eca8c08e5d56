"""The API tier soak (`poolkeeper chaos --api-tier`): its ledger's verdicts, its kills and
its part of docs/reliability.md, HAProxy's configuration, and a short run of it (the long
one: `poolkeeper chaos --api-tier --minutes 10`)."""

from __future__ import annotations

import itertools
import os
import random
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import aiohttp
import pytest

from controller.lab.chaos import run_tier_chaos
from controller.lab.chaos.balancer import BalancerMissing, config, haproxy_binary
from controller.lab.chaos.clients import Clients, Habits, HeldClaim
from controller.lab.chaos.faults import FaultedRunners
from controller.lab.chaos.ledger import Kill, Ledger, Sent
from controller.lab.chaos.report import SHARED, TIER, render_tier_section
from controller.lab.chaos.tier_soak import REPLICAS, TierProfile, kill_schedule
from controller.lab.chaos.violations import Violations
from controller.lab.chaos.world import POOLS

# Set by .ci/run: there a missing HAProxy fails the soak's tests instead of skipping them.
REQUIRE_HAPROXY: Final = "POOLKEEPER_REQUIRE_HAPROXY"
SEED = 3
MINUTES = 1.5  # three or four kills: about 80 s on a shared 2-core machine
UNAVAILABLE = "NomadUnavailable"
WAITING = "request r1 is still being served elsewhere; retry"


def haproxy() -> Path:
    """HAProxy; without one the test is skipped (failed where CI asks for it)."""
    try:
        return haproxy_binary()
    except BalancerMissing as error:
        if os.environ.get(REQUIRE_HAPROXY):
            pytest.fail(str(error), pytrace=False)
        pytest.skip(str(error))


def sent(
    kind: str,
    subject: str,
    started: float,
    ended: float,
    status: int,
    replica: str = "api-1",
    *,
    from_replica: bool = True,
    code: str | None = None,
    message: str = "",
) -> Sent:
    return Sent(kind, subject, started, ended, status, replica, from_replica, code, message)


def test_each_failure_is_put_down_to_the_kill_it_met_or_is_unexplained() -> None:
    ledger = Ledger(origin=0.0)
    ledger.kills.append(Kill("api-1", at=10.0, back_in_rotation_at=13.0))
    in_flight = sent("claim", "r1", 9.9, 10.1, 502, from_replica=False)
    unnamed = sent("keepalive", "x", 9.95, 10.05, 0, "", from_replica=False)
    refused = sent("execution", "x", 10.2, 10.2, 503, from_replica=False)
    waiting = sent("claim", "r1", 10.5, 12.5, 503, "api-2", code=UNAVAILABLE, message=WAITING)
    other_replica = sent("read", "y", 9.9, 10.1, 502, "api-2", from_replica=False)
    after_it_was_back = sent("release", "y", 13.5, 13.5, 503, from_replica=False)
    unavailable = sent("claim", "r2", 11.0, 11.1, 503, "api-2", code=UNAVAILABLE)
    for request in (
        in_flight,
        unnamed,
        refused,
        waiting,
        other_replica,
        after_it_was_back,
        unavailable,
        sent("claim", "r1", 22.5, 22.6, 201, "api-2"),
        sent("claim", "r3", 12.0, 12.1, 503, "api-2", code="PoolEmpty"),
        sent("keepalive", "x", 11.0, 11.1, 200, "api-2"),
    ):
        ledger.add(request)
    assert [(s, cause) for s, cause in ledger.causes()] == [
        (in_flight, "in_flight"),
        (other_replica, "unexplained"),
        (unnamed, "in_flight"),
        (refused, "sent_to_dead"),
        (waiting, "waiting_for_claimer"),
        (unavailable, "unexplained"),
        (after_it_was_back, "unexplained"),
    ]
    summary = ledger.summary()
    assert summary["failed_by_cause"] == {
        "in_flight": 2,
        "sent_to_dead": 1,
        "waiting_for_claimer": 1,
        "unexplained": 3,
    }
    assert summary["replica_kills_hitting_requests"] == 1
    # r1 was taken over (503 while waiting, then 201); y and r2 never succeeded again.
    assert summary["claim_retries_taking_over"] == 1
    assert [line.split(" via ")[0] for line in summary["failed_not_recovered"]] == [
        "t=9.9s read y",
        "t=11.0s claim r2",
        "t=13.5s release y",
    ]
    # Claims: r1 x3 (two the kill's), r2's 503 and r3's PoolEmpty count, and fail.
    assert summary["claim_attempts"] == 5
    assert summary["claim_attempts_counted"] == 3
    assert summary["claim_availability"] == pytest.approx(1 / 3, abs=1e-5)
    assert summary["claims_failed_by_kills"] == 1


def test_a_request_the_balancer_sent_to_a_replica_just_killed_is_the_kills() -> None:
    # Sent right after the kill, on a connection the balancer kept to the replica: the
    # balancer closes the client's connection without an answer and names no replica.
    # Once the balancer has taken the replica out, such a failure is no kill's.
    ledger = Ledger(origin=0.0)
    ledger.kills.append(Kill("api-1", at=10.0, out_of_rotation_at=10.3, back_in_rotation_at=13.0))
    just_after = sent("execution", "x", 10.01, 10.02, 0, "", from_replica=False)
    taken_out = sent("execution", "y", 10.4, 10.41, 0, "", from_replica=False)
    ledger.add(just_after)
    ledger.add(taken_out)
    assert ledger.causes() == [(just_after, "sent_to_dead"), (taken_out, "unexplained")]


def test_a_waiting_repeat_is_the_kills_only_after_a_claim_the_kill_failed() -> None:
    ledger = Ledger(origin=0.0)
    ledger.kills.append(Kill("api-1", at=10.0, back_in_rotation_at=13.0))
    waiting = sent("claim", "r1", 1.0, 3.0, 503, "api-2", code=UNAVAILABLE, message=WAITING)
    ledger.add(waiting)
    assert ledger.causes() == [(waiting, "unexplained")]


def test_a_release_retried_after_one_that_went_through_is_recovered_by_its_410() -> None:
    ledger = Ledger(origin=0.0)
    ledger.kills.append(Kill("api-1", at=10.0))
    ledger.add(sent("release", "x", 9.9, 10.1, 502, from_replica=False))
    ledger.add(sent("release", "x", 10.5, 10.6, 410, "api-2", code="RunnerGone"))
    assert ledger.summary()["failed_not_recovered"] == []


def test_the_kills_come_from_the_seed_alone_one_replica_at_a_time() -> None:
    for minutes in (MINUTES, 10):
        profile = TierProfile.for_minutes(minutes)
        kills = kill_schedule(SEED, minutes, profile)
        assert kills == kill_schedule(SEED, minutes, profile)
        assert kills != kill_schedule(SEED + 1, minutes, profile)
        gaps = [kills[0].at] + [b.at - a.at for a, b in itertools.pairwise(kills)]
        low, high = profile.kill_every
        assert all(low <= gap <= high for gap in gaps)
        assert kills[-1].at >= minutes * 60
        assert {k.replica for k in kills} == set(range(REPLICAS))
    assert TierProfile.for_minutes(10).kill_every == (20.0, 60.0)


def test_each_soak_writes_its_own_part_of_the_page_and_keeps_the_others() -> None:
    classic = "# Reliability\n\nthe chaos soak's figures\n"
    section = f"{TIER.begin}\n\n## The API tier\n\nfirst\n\n{TIER.end}\n"
    page = TIER.put(classic, section)
    assert page == classic + "\n" + section
    assert TIER.of(page) == section
    again = TIER.put(page, section.replace("first", "second"))
    assert again == classic + "\n" + section.replace("first", "second")
    # The chaos soak renders its page anew and keeps the API tier's section.
    assert TIER.put("# Reliability\n\nnew figures\n", TIER.of(again)).endswith(
        "second\n\n" + TIER.end + "\n"
    )
    assert TIER.put(classic, "") == classic
    # The shared reconcilers' section is another, kept by the API tier's.
    shared = f"{SHARED.begin}\n\n## Shared\n\n{SHARED.end}\n"
    both = SHARED.put(again, shared)
    assert SHARED.of(both) == shared
    assert TIER.of(both) == TIER.of(again)
    assert SHARED.of(TIER.put(both, section)) == shared


def test_haproxy_accepts_the_configuration(tmp_path: Path) -> None:
    binary = haproxy()
    path = tmp_path / "haproxy.cfg"
    path.write_text(config(18080, [18081, 18082], tmp_path / "haproxy.sock"))
    checked = subprocess.run(
        [str(binary), "-c", "-f", str(path)], capture_output=True, text=True, check=False
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


@pytest.mark.slow
async def test_short_api_tier_soak_holds_every_goal(tmp_path: Path) -> None:
    haproxy()
    report = await run_tier_chaos(SEED, MINUTES, tmp_path)
    assert report["invariant_violations"] == [], report["invariant_violations"]
    assert report["replica_kills"] >= 2, report["kills"]
    assert all(kill["back_in_rotation_after"] is not None for kill in report["kills"])
    assert report["failed_by_cause"]["unexplained"] == 0
    assert report["failed_not_recovered"] == []
    assert report["claim_availability"] >= 0.999
    assert report["double_claims"] == 0
    assert report["claims_lost"] == 0
    assert report["claims_never_answered"] == 0
    assert report["runners_leaked"] == 0
    assert report["records_leaked"] == 0
    assert report["records_left"]["catalog records"] == 3
    # The clients did all of it through the balancer, and the API tier wrote no job.
    assert report["claims_served"] >= 20
    assert report["executions"] >= 10
    assert report["keepalives"] >= 20
    assert report["claims_ended"].get("Released", 0) >= 20
    assert report["runner_writes"] > 0
    assert report["runner_writes_by_api_tier"] == 0
    assert report["runner_writes_by_non_holders"] == 0
    # The page renders from it.
    section = render_tier_section(report, "poolkeeper chaos --api-tier")
    assert section.startswith(TIER.begin) and section.rstrip().endswith(TIER.end)


class _Scripted(random.Random):
    """The low end of every range; `random()` from a script, then 0.5 (a keepalive)."""

    def __init__(self, draws: list[float]) -> None:
        super().__init__(0)
        self.draws = iter(draws)

    def uniform(self, a: float, b: float) -> float:
        return a

    def random(self) -> float:
        return next(self.draws, 0.5)


@dataclass
class _FlakyApi:
    """Answers a claim repeat first with no answer (a kill), then as the API does."""

    runner_id: str
    sent: list[tuple[str, str, int]] = field(default_factory=list)
    repeats_failed: int = 0

    async def request(
        self, http: aiohttp.ClientSession, method: str, path: str, body: Any = None
    ) -> tuple[int, Any]:
        answer = {"runnerId": self.runner_id, "expiresAt": "2999-01-01T00:00:00Z"}
        if path.endswith("/claims") and not self.repeats_failed:
            self.repeats_failed += 1
            status, payload = 0, None
        elif method == "DELETE":
            status, payload = 204, None
        else:
            status, payload = 200, answer
        self.sent.append((method, path, status))
        return status, payload


async def test_a_claim_repeat_that_went_unanswered_is_retried_until_answered() -> None:
    api = _FlakyApi("chaos-py-0123456789ab")
    violations = Violations(0.0)
    clients = Clients(1, Habits((10, 30)), api, FaultedRunners(), violations, POOLS)
    clients.resume()
    held = HeldClaim(api.runner_id, "default/chaos-py", "r1", expires_at=0.0)
    async with aiohttp.ClientSession() as http:
        # The first step is a repeat of the claim (random() < 0.1), then keepalives.
        await clients.hold(http, held, _Scripted([0.05]))
    repeats = [status for method, path, status in api.sent if path.endswith("/claims")]
    assert repeats == [0, 200]  # retried at once, not left for the ledger as unrecovered
    assert api.sent[-1] == ("DELETE", f"/v1/runners/{api.runner_id}", 204)
    assert violations.messages == []
