"""The API tier (`poolkeeper api`) beside a reconciling controller, in-process: it serves
claims, keepalives, releases and executions of the reconciler's pools from the catalog in
Nomad, shares nothing with the reconciler or another replica but Nomad, and writes no job.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from controller.api_tier import ApiTier
from controller.core.paths import DOORBELL_PATH, catalog_path, lease_path, replica_path
from controller.lab.simulator import Simulator
from controller.nomad.config import NomadConfig
from tests.support.documents import pool_doc
from tests.support.ports import free_port
from tests.support.waiting import wait_until

from .conftest import Harness, write_pools

CLAIMS = "/v1/pools/default/py/claims"


@pytest.fixture
async def sim() -> AsyncIterator[Simulator]:
    yield Simulator(seed=1, start_delay=0.05, exec_mode="local")


async def reconciler(harness: Harness, tmp_path: Path, idle: int = 3, **spec: Any):
    pools = write_pools(tmp_path / "pools.yaml", pool_doc("py", idle=idle, **spec))
    # A long resync: what the reconciler does at once, the API tier's doorbell made it do.
    controller = await harness.start(pools, resync_seconds=30.0)
    await harness.settled(controller)
    return controller


async def test_a_claim_through_the_api_tier_is_served_everywhere(harness: Harness, tmp_path):
    controller = await reconciler(harness, tmp_path)
    tier = await harness.start_api_tier()
    status, claim = await harness.api(tier, "POST", CLAIMS, {"inactivityTimeoutSeconds": 60})
    assert status == 201, claim
    runner = f"/v1/runners/{claim['runnerId']}"
    assert claim["pool"] == "default/py" and claim["inactivityTimeoutSeconds"] == 60
    # The reconciler and the replica answer for it alike, whoever made it.
    assert await harness.api(controller, "GET", runner) == (200, claim)
    status, kept = await harness.api(controller, "POST", runner + "/keepalive")
    assert status == 200 and kept["expiresAt"] >= claim["expiresAt"]
    status, ran = await harness.api(
        tier, "POST", runner + "/executions", {"command": "echo hello", "wait": True}
    )
    assert (status, ran["exitCode"], ran["stdout"]) == (200, 0, "hello\n"), ran
    status, listed = await harness.api(tier, "GET", CLAIMS)
    assert [c["runnerId"] for c in listed["claims"]] == [claim["runnerId"]]
    # The claim woke the reconciler (its resync is 30 s away): a replacement is registered.
    await harness.settled(controller, within=5.0)
    # Released through the replica: the holder purges the job at once, nobody else does.
    assert (await harness.api(tier, "DELETE", runner))[0] == 204

    def purged() -> bool:
        return claim["runnerId"] not in {j["ID"] for j in harness.sim.job_list("default")}

    await wait_until(purged, within=5.0, what="the released runner's job to be purged")
    status, gone = await harness.api(tier, "GET", runner)
    assert (status, gone["error"]["reason"]) == (410, "Released")
    assert harness.sim.audit.by_non_holders() == []
    writers = {w.writer for w in harness.sim.audit.writes}
    assert writers == {controller.identity()}, writers  # the replica wrote no job


async def test_the_api_tier_holds_no_lease_and_reads_only_the_catalog(harness, tmp_path):
    controller = await reconciler(harness, tmp_path)
    tier = await harness.start_api_tier()
    variables = harness.sim.variables()
    lease = variables[lease_path("default/py")]
    assert lease["Items"]["holder"] == controller.identity()
    record = variables[catalog_path("default/py")]
    assert record["Items"]["holder"] == controller.identity()
    status, pools = await harness.api(tier, "GET", "/v1/pools")
    assert status == 200
    assert pools == (await harness.api(controller, "GET", "/v1/pools"))[1]
    assert "api " in tier.sessions.client._sessions._user_agent  # not a lease identity
    status, ready = await harness.api(tier, "GET", "/readyz", token=None)
    assert (status, ready["serves"], ready["reconciles"]) == (200, ["claims"], [])


async def test_a_catalog_record_read_again_keeps_what_did_not_change(harness, tmp_path):
    """The pool's record changes with each runner claimed or started: the replica takes
    over the pool and the runners it read before, instead of decoding them again."""
    await reconciler(harness, tmp_path)
    tier = await harness.start_api_tier()
    await wait_until(
        lambda: len(tier.directory.pools["default/py"].offer) == 3,
        what="the replica to read every idle runner",
    )
    before = tier.directory.pools["default/py"]
    status, claim = await harness.api(tier, "POST", CLAIMS, {})
    assert status == 201, claim
    await wait_until(
        lambda: claim["runnerId"] not in tier.directory.pools["default/py"].offer.runner_ids,
        what="the replica to read the record without the claimed runner",
    )
    after = tier.directory.pools["default/py"]
    assert after is not before and after.pool is before.pool
    stayed = before.offer.runner_ids - {claim["runnerId"]}
    assert stayed and all(after.offer.by_id[r] is before.offer.by_id[r] for r in stayed)


async def test_a_request_id_retried_on_another_replica_answers_the_same_runner(
    harness: Harness, tmp_path
):
    await reconciler(harness, tmp_path)
    first, second = await harness.start_api_tier(), await harness.start_api_tier()
    body = {"requestId": "retry-1"}
    status, claim = await harness.api(first, "POST", CLAIMS, body)
    assert status == 201, claim
    status, again = await harness.api(second, "POST", CLAIMS, body)
    assert (status, again["runnerId"]) == (200, claim["runnerId"])
    # Concurrent retries on both replicas: one claim.
    body = {"requestId": "retry-2"}
    a, b = await asyncio.gather(
        harness.api(first, "POST", CLAIMS, body), harness.api(second, "POST", CLAIMS, body)
    )
    assert sorted([a[0], b[0]]) == [200, 201] and a[1]["runnerId"] == b[1]["runnerId"]


async def test_200_concurrent_claims_for_50_runners_across_two_replicas(harness, tmp_path):
    controller = await reconciler(harness, tmp_path, idle=50)
    tier = await harness.start_api_tier()
    harness.sim.set_start_delay(60.0)  # no replacement becomes idle during the burst
    results = await asyncio.gather(
        *(harness.api(controller if i % 2 else tier, "POST", CLAIMS, {}) for i in range(200))
    )
    statuses = [status for status, _ in results]
    assert statuses.count(201) == 50 and statuses.count(503) == 150, statuses
    runners = [body["runnerId"] for status, body in results if status == 201]
    assert len(set(runners)) == 50
    assert {body["error"]["code"] for status, body in results if status == 503} == {"PoolEmpty"}


def conflicts(tier: ApiTier) -> float:
    """Check-and-sets of claims the replica lost to another claimer."""
    value = tier.metrics.registry.get_sample_value(
        "poolkeeper_claim_conflicts_total", {"pool": "default/py"}
    )
    return value or 0.0


async def test_two_replicas_claim_from_slices_of_their_own_and_hand_out_each_runner_once(
    harness: Harness, tmp_path
):
    await reconciler(harness, tmp_path, idle=60, maxRunners=200)
    first, second = await harness.start_api_tier(), await harness.start_api_tier()
    await first.replicas.beat()  # it reads the second's record now rather than in 5 s
    for tier in (first, second):
        assert tier.replicas.claimers.replicas == {"test-replica-1/1", "test-replica-2/1"}
    record = harness.sim.variables()[replica_path("test-replica-2-1")]
    assert record["Items"]["identity"] == "test-replica-2/1"
    harness.sim.set_start_delay(60.0)  # no replacement becomes idle during the bursts
    # Fewer claims than either slice holds: neither replica ever tries the other's runners,
    # though neither has seen the other's claims in its offer yet.
    burst = await asyncio.gather(
        *(harness.api(first if i % 2 else second, "POST", CLAIMS, {}) for i in range(30))
    )
    assert [status for status, _ in burst] == [201] * 30, burst
    claimed = [claim["runnerId"] for _, claim in burst]
    assert len(set(claimed)) == 30
    assert conflicts(first) == conflicts(second) == 0
    # Then more than the pool has left: the slices run out, the replicas take from each
    # other's, and still no runner is handed out twice.
    rest = await asyncio.gather(
        *(harness.api(first if i % 2 else second, "POST", CLAIMS, {}) for i in range(100))
    )
    statuses = [status for status, _ in rest]
    assert statuses.count(201) == 30 and statuses.count(503) == 70, statuses
    claimed += [claim["runnerId"] for status, claim in rest if status == 201]
    assert len(set(claimed)) == 60
    # A replica that stops deletes its record; the other counts itself alone again.
    await second.stop()
    harness.tiers.remove(second)
    assert replica_path("test-replica-2-1") not in harness.sim.variables()
    await first.replicas.beat()
    assert first.replicas.claimers.replicas == {"test-replica-1/1"}
    assert first.metrics.registry.get_sample_value("poolkeeper_api_replicas") == 1.0


async def test_claims_beyond_a_capped_offer_take_the_pools_other_idle_runners(
    harness: Harness, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A catalog record offers only what fits of a pool that has more (here 3): once
    a replica took those, a claim waits for the next record rather than answer PoolEmpty
    while the pool has idle runners."""
    monkeypatch.setattr("controller.engine.catalog.OFFER_LIMIT", 3)
    await reconciler(harness, tmp_path, idle=8)
    tier = await harness.start_api_tier()
    results = await asyncio.gather(*(harness.api(tier, "POST", CLAIMS, {}) for _ in range(6)))
    assert [status for status, _ in results] == [201] * 6, results
    assert len({body["runnerId"] for _, body in results}) == 6


async def test_a_replica_that_cannot_reach_nomad_is_unready_and_answers_503(
    harness: Harness, tmp_path
):
    await reconciler(harness, tmp_path)
    tier = await harness.start_api_tier()
    harness.sim.api_fault("refuse", 60)

    async def unready() -> bool:
        return (await harness.api(tier, "GET", "/readyz", token=None))[0] == 503

    await wait_until(unready, within=15.0, what="the replica to notice Nomad is gone")
    for method, path in (("POST", CLAIMS), ("GET", "/v1/pools"), ("GET", CLAIMS)):
        status, body = await harness.api(tier, method, path, {} if method == "POST" else None)
        assert (status, body["error"]["code"]) == (503, "NomadUnavailable"), (path, body)
    harness.sim.api_fault("none", 0)

    async def ready() -> bool:
        return (await harness.api(tier, "GET", "/readyz", token=None))[0] == 200

    await wait_until(ready, within=15.0, what="the replica to read the catalog again")
    assert (await harness.api(tier, "POST", CLAIMS, {}))[0] == 201


async def test_an_api_tier_without_nomad_is_unready(harness: Harness, tmp_path):
    nowhere = NomadConfig.from_env({"NOMAD_ADDR": f"http://127.0.0.1:{free_port()}"})
    tier = await asyncio.wait_for(_unready_tier(harness, nowhere), 30)
    status, unready = await harness.api(tier, "GET", "/readyz", token=None)
    assert (status, unready["serves"]) == (503, []) and unready["reason"], unready
    status, body = await harness.api(tier, "POST", CLAIMS, {})
    assert (status, body["error"]["code"]) == (503, "NomadUnavailable")

    async def says_why() -> bool:
        _, body = await harness.api(tier, "GET", "/v1/pools")
        return "cannot read the catalog" in body["error"]["message"]

    await wait_until(says_why, within=20.0, what="the replica to say why it is unready")


async def _unready_tier(harness: Harness, nomad: NomadConfig):
    from controller.api_tier import ApiTier
    from controller.serving import ServingSettings

    (harness.tmp_path / "tokens").write_text("test-api-token\n")
    tier = ApiTier(
        ServingSettings(listen=("127.0.0.1", 0), token_file=harness.tmp_path / "tokens"), nomad
    )
    await tier.start()
    harness.tiers.append(tier)
    return tier


async def test_a_request_waiting_on_the_api_tier_raises_the_reconcilers_target(
    harness: Harness, tmp_path
):
    controller = await reconciler(
        harness, tmp_path, idle=1, demand={"maxIdleRunners": 20, "coverSeconds": 30}
    )
    tier = await harness.start_api_tier()
    harness.sim.set_start_delay(60.0)  # the pool stays empty once its runner is claimed
    assert (await harness.api(tier, "POST", CLAIMS, {}))[0] == 201
    waiting = asyncio.create_task(harness.api(tier, "POST", CLAIMS, {"waitSeconds": 10}))

    def raised() -> bool:
        managed = controller.engine.pools["default/py"]
        return bool(managed.idle_target.idle_runners > 2)

    await wait_until(raised, within=8.0, what="the waiting request to raise the target")
    assert DOORBELL_PATH in harness.sim.variables()
    waiting.cancel()
    await asyncio.gather(waiting, return_exceptions=True)
