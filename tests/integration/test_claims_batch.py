"""Claims from a list of pools (`POST /v1/claims`) and batch claims (`count`)."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

from controller.core.claims import ClaimState
from controller.standalone import Controller
from tests.integration.conftest import Harness, write_pools
from tests.support.documents import pool_doc


def live_claims(harness: Harness) -> dict[str, dict[str, str]]:
    """Runner ID -> items of every live claim variable in the simulator."""
    return {
        path.removeprefix("poolkeeper/claims/"): var["Items"]
        for path, var in harness.sim.variables("default").items()
        if path.startswith("poolkeeper/claims/") and var["Items"].get("state") == ClaimState.CLAIMED
    }


async def claim(
    harness: Harness, controller: Controller, body: dict[str, Any], pool: str | None = None
) -> tuple[int, Any]:
    path = f"/v1/pools/default/{pool}/claims" if pool else "/v1/claims"
    return await harness.api(controller, "POST", path, body)


async def test_the_first_listed_pool_with_an_idle_runner_answers(harness: Harness, tmp_path):
    pools = write_pools(
        tmp_path / "p.yaml",
        pool_doc("first", idle=0, maxRunners=5),
        pool_doc("second", idle=1, maxRunners=5),
        pool_doc("third", idle=2, maxRunners=5),
    )
    controller = await harness.start(pools)
    await harness.settled(controller)
    order = ["default/first", "default/second", "default/third"]
    status, body = await claim(harness, controller, {"pools": order})
    assert isinstance(body, dict)
    assert status == 201 and body["pool"] == "default/second"
    assert body["nodeDraining"] is False and body["drainDeadline"] is None
    # the second pool's only runner is taken now (its replacement may not run yet): the
    # next claim goes on down the list, never back to an empty pool
    status, body = await claim(harness, controller, {"pools": order[::-1]})
    assert status == 201 and body["pool"] == "default/third"
    status, body = await claim(harness, controller, {"pools": ["default/first"]})
    assert status == 503 and body["error"]["code"] == "PoolEmpty"


async def test_a_claim_from_a_list_waits_on_every_pool(harness: Harness, tmp_path):
    # "a" cannot refill (maxRunners 1, its runner claimed); "b" refills.
    pools = write_pools(
        tmp_path / "p.yaml",
        pool_doc("a", idle=1, maxRunners=1),
        pool_doc("b", idle=1, maxRunners=3),
    )
    controller = await harness.start(pools)
    await harness.settled(controller)
    assert (await claim(harness, controller, {}, "a"))[0] == 201
    # Claim b's runner and wait for its replacement through the list: the wait covers b.
    harness.sim.set_start_delay(1.0)
    assert (await claim(harness, controller, {}, "b"))[0] == 201
    status, body = await claim(
        harness, controller, {"pools": ["default/a", "default/b"], "waitSeconds": 15}
    )
    assert status == 201 and body["pool"] == "default/b"


async def test_list_validation_and_unknown_pools(harness: Harness, tmp_path):
    controller = await harness.start(write_pools(tmp_path / "p.yaml", pool_doc("a", idle=1)))
    await harness.settled(controller)
    bodies: list[dict[str, Any]] = [
        {"pools": []},
        {"pools": ["default/a", "default/a"]},
        {"pools": [f"default/p{i}" for i in range(11)]},
        {"pools": ["no-slash"]},
        {"pools": ["default/a"], "count": 0},
        {"pools": ["default/a"], "count": 101},
        {},
    ]
    for body in bodies:
        status, answer = await claim(harness, controller, body)
        assert status == 400 and answer["error"]["code"] == "InvalidRequest", body
    status, answer = await claim(harness, controller, {"pools": ["default/a", "default/nope"]})
    assert status == 404 and answer["error"]["code"] == "PoolNotFound"


async def test_a_request_id_is_idempotent_across_the_list(harness: Harness, tmp_path):
    pools = write_pools(
        tmp_path / "p.yaml", pool_doc("a", idle=0, maxRunners=2), pool_doc("b", idle=1)
    )
    controller = await harness.start(pools)
    await harness.settled(controller)
    body = {"pools": ["default/a", "default/b"], "requestId": "lesson-7"}
    status, first = await claim(harness, controller, body)
    assert status == 201 and first["pool"] == "default/b"
    await controller.claims.drain()
    status, again = await claim(harness, controller, body)
    assert status == 200 and again == first
    # the same requestId for another list, or one pool alone, is another request
    status, answer = await claim(harness, controller, {**body, "pools": ["default/b"]})
    assert status == 409 and answer["error"]["code"] == "RequestIdConflict"
    status, answer = await claim(harness, controller, {"requestId": "lesson-7"}, "b")
    assert status == 409


async def test_a_batch_is_all_or_nothing(harness: Harness, tmp_path):
    controller = await harness.start(write_pools(tmp_path / "p.yaml", pool_doc("py", idle=2)))
    await harness.settled(controller)
    status, body = await claim(harness, controller, {"count": 3}, "py")
    assert status == 503 and body["error"]["code"] == "PoolEmpty"
    assert live_claims(harness) == {}  # none taken
    status, body = await claim(harness, controller, {"count": 2}, "py")
    assert status == 201
    ids = [c["runnerId"] for c in body["claims"]]
    assert len(set(ids)) == 2 and set(ids) == set(live_claims(harness))
    # a batch from a list comes from one pool
    await harness.settled(controller)
    status, body = await claim(harness, controller, {"pools": ["default/py"], "count": 1})
    assert status == 201 and len(body["claims"]) == 1


async def test_concurrent_batches_never_share_a_runner(harness: Harness, tmp_path):
    # maxRunners 20: no replacement can be created while the batches run, so exactly the
    # 20 runners there are to hand out.
    document = pool_doc("py", idle=20, maxRunners=20)
    controller = await harness.start(write_pools(tmp_path / "p.yaml", document))
    await harness.settled(controller, within=30)
    answers = await asyncio.gather(
        *(claim(harness, controller, {"count": 3}, "py") for _ in range(200))
    )
    batches = []
    for status, body in answers:
        if status == 201:
            runners = [c["runnerId"] for c in body["claims"]]
            assert len(set(runners)) == 3, body
            batches.append(runners)
        else:
            assert status == 503 and body["error"]["code"] == "PoolEmpty", body
    seen = Counter(runner for batch in batches for runner in batch)
    assert all(n == 1 for n in seen.values()), "a runner was in two batches"
    # At most 20 // 3 batches fit; concurrent batches that fail hold runners for a moment
    # (released at once), so fewer may succeed, but never none.
    assert 1 <= len(batches) <= 6
    # Nomad holds exactly the claims that were handed out: none from a failed batch.
    assert set(live_claims(harness)) == set(seen)


async def test_a_batch_with_a_request_id_is_idempotent(harness: Harness, tmp_path):
    controller = await harness.start(write_pools(tmp_path / "p.yaml", pool_doc("py", idle=4)))
    await harness.settled(controller)
    body = {"count": 3, "requestId": "class-9a"}
    status, first = await claim(harness, controller, body, "py")
    assert status == 201 and len(first["claims"]) == 3
    status, again = await claim(harness, controller, body, "py")
    assert status == 200 and again == first
    record = harness.sim.variables("default")["poolkeeper/requests/class-9a"]["Items"]
    assert record["count"] == "3"
    assert sorted(record["runnerIds"].split(",")) == sorted(c["runnerId"] for c in first["claims"])
    assert all(c["requestId"] == "class-9a" for c in first["claims"])
    # another count is another request
    status, answer = await claim(harness, controller, {**body, "count": 2}, "py")
    assert status == 409 and answer["error"]["code"] == "RequestIdConflict"
    # once one runner of the batch is released, the repeat says it is gone
    runner = first["claims"][0]["runnerId"]
    assert (await harness.api(controller, "DELETE", f"/v1/runners/{runner}"))[0] == 204
    status, answer = await claim(harness, controller, body, "py")
    assert status == 410 and answer["error"]["reason"] == "Released"


async def test_a_failed_batch_frees_its_request_id(harness: Harness, tmp_path):
    controller = await harness.start(write_pools(tmp_path / "p.yaml", pool_doc("py", idle=2)))
    await harness.settled(controller)
    body = {"count": 3, "requestId": "too-many"}
    assert (await claim(harness, controller, body, "py"))[0] == 503
    assert "poolkeeper/requests/too-many" not in harness.sim.variables("default")
    # the requestId is free again: the same ID for a batch that fits claims afresh
    status, answer = await claim(harness, controller, {**body, "count": 2}, "py")
    assert status == 201 and len(answer["claims"]) == 2
