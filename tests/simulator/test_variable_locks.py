"""Variable locks: acquire, renew, release, conflicts, expiry after 2 x TTL, lock delay."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from controller.lab.simulator import Simulator, start_sim
from tests.simulator.conftest import Client, Stream
from tests.support.waiting import wait_until

# One lock second is 20 ms: Nomad's smallest TTL (10 s) runs out in 0.2 s.
SCALE = 0.02
LEASE = "/v1/var/poolkeeper/leases/default~pool"
KEY = ("default", "poolkeeper/leases/default~pool")
ACQUIRE = {"lock-acquire": ""}
RENEW = {"lock-renew": ""}
RELEASE = {"lock-release": ""}


@pytest.fixture
def lock_sim() -> Simulator:
    return Simulator(nodes=["n1"], seed=3, lock_time_scale=SCALE)


@pytest.fixture
async def lock_client(lock_sim: Simulator) -> AsyncIterator[Client]:
    server = await start_sim(lock_sim)
    async with aiohttp.ClientSession() as session:
        yield Client(session, server.url)
    await server.stop()


async def _acquire(client: Client, holder: str = "a", **lock: str) -> dict[str, Any]:
    spec = lock or {"TTL": "10s", "LockDelay": "5s"}
    status, var, _ = await client.put(LEASE, {"Items": {"holder": holder}, "Lock": spec}, **ACQUIRE)
    assert status == 200, var
    assert isinstance(var, dict)
    return var


async def test_acquire_renew_release(lock_client: Client, lock_sim: Simulator) -> None:
    c = lock_client
    status, var, headers = await c.put(
        LEASE, {"Items": {"holder": "a"}, "Lock": {"TTL": "10s", "LockDelay": "5s"}}, **ACQUIRE
    )
    assert status == 200 and var["Items"] == {"holder": "a"}
    lock = var["Lock"]
    assert lock["TTL"] == "10s" and lock["LockDelay"] == "5s" and len(lock["ID"]) == 36
    assert int(headers["X-Nomad-Index"]) == var["ModifyIndex"]
    assert (await c.get(LEASE))[1] == var  # without ACLs every reader sees the lock

    index = lock_sim.index
    status, meta, headers = await c.put(LEASE, {"Lock": {"ID": lock["ID"]}}, **RENEW)
    assert status == 200 and "Items" not in meta and meta["Lock"] == lock
    assert meta["ModifyIndex"] == var["ModifyIndex"] and lock_sim.index == index  # no write
    assert int(headers["X-Nomad-Index"]) == var["ModifyIndex"]

    status, released, _ = await c.put(LEASE, {"Lock": {"ID": lock["ID"]}}, **RELEASE)
    assert status == 200 and "Lock" not in released and "Items" not in released
    assert released["ModifyIndex"] > var["ModifyIndex"]
    assert released["CreateIndex"] == var["CreateIndex"]
    _, stored, _ = await c.get(LEASE)
    assert "Lock" not in stored and stored["Items"] == {"holder": "a"}  # items are kept
    await _acquire(c, "b")  # a released lock is free at once, without the lock delay


async def test_acquire_defaults_bounds_and_items(lock_client: Client) -> None:
    c = lock_client
    status, var, _ = await c.put("/v1/var/l/new", {}, **ACQUIRE)
    assert status == 200 and var["Items"] == {}  # a lock may create a variable without items
    assert var["Lock"]["TTL"] == "15s" and var["Lock"]["LockDelay"] == "15s"
    await c.put("/v1/var/l/new", {"Lock": {"ID": var["Lock"]["ID"]}}, **RELEASE)
    status, kept, _ = await c.put("/v1/var/l/new", {"Items": {"k": "v"}}, **ACQUIRE)
    assert status == 200 and kept["Items"] == {"k": "v"}  # items given replace the old ones
    for spec, message in (
        ({"TTL": "9s"}, "TTL must be between 10 seconds and 24 hours"),
        ({"TTL": "25h"}, "TTL must be between 10 seconds and 24 hours"),
        ({"TTL": "10s", "LockDelay": "-1s"}, "Lock delay and TTL must be positive"),
    ):
        assert (await c.put("/v1/var/l/bad", {"Lock": spec}, **ACQUIRE))[:2] == (500, message)
    status, var, _ = await c.put("/v1/var/l/ns", {"Lock": {"TTL": 12_000_000_000}}, **ACQUIRE)
    assert status == 200 and var["Lock"]["TTL"] == "12s"  # nanoseconds are taken too
    both = {"lock-acquire": "", "lock-release": ""}
    assert (await c.put("/v1/var/l/x", {}, **both))[:2] == (400, "multiple lock operations")


async def test_every_conflict_answer(lock_client: Client) -> None:
    c = lock_client
    var = await _acquire(c)
    # Nothing of the variable but where it is (the docs' sample conflict body).
    zero: dict[str, Any] = dict.fromkeys(
        ("CreateIndex", "CreateTime", "ModifyIndex", "ModifyTime"), 0
    )
    zero |= {"Namespace": KEY[0], "Path": KEY[1], "Items": None, "Lock": None}
    wrong = {"Lock": {"ID": "not-the-lock"}}
    assert (await c.put(LEASE, {"Items": {"holder": "b"}}, **ACQUIRE))[:2] == (409, zero)
    assert (await c.put(LEASE, wrong, **RENEW))[:2] == (
        409,
        "attempting to modify locked variable",
    )
    assert (await c.put(LEASE, {}, **RENEW))[:2] == (400, "missing lock ID")
    assert (await c.put(LEASE, wrong, **RELEASE))[:2] == (409, zero)
    assert (await c.put(LEASE, {}, **RELEASE))[:2] == (400, "missing lock information")
    with_items = {"Items": {"a": "b"}, "Lock": {"ID": var["Lock"]["ID"]}}
    assert (await c.put(LEASE, with_items, **RELEASE))[:2] == (
        400,
        "lock release operation doesn't take variable items",
    )
    await c.put("/v1/var/plain", {"Items": {"a": "b"}})
    assert (await c.put("/v1/var/plain", wrong, **RENEW))[:2] == (
        409,
        "variable doesn't hold a lock",
    )
    assert (await c.put("/v1/var/plain", wrong, **RELEASE))[:2] == (
        409,
        "variable doesn't hold a lock",
    )
    assert (await c.put("/v1/var/absent", wrong, **RENEW))[:2] == (404, "variable doesn't exist")
    assert (await c.put("/v1/var/absent", wrong, **RELEASE))[:2] == (404, "variable doesn't exist")
    assert (await c.get(LEASE))[1] == var  # nothing above changed the variable


async def test_plain_writes_and_deletes_of_a_locked_variable(lock_client: Client) -> None:
    c = lock_client
    var = await _acquire(c)
    lock_id = var["Lock"]["ID"]
    status, body, _ = await c.put(LEASE, {"Items": {"holder": "b"}})
    assert status == 409 and body["ModifyIndex"] == 0 and body["Items"] is None
    status, body, _ = await c.put(LEASE, {"Items": {"holder": "b"}}, cas=var["ModifyIndex"])
    assert status == 409 and body["ModifyIndex"] == 0  # the lock is checked before the cas
    stale = {"Items": {"holder": "b"}, "Lock": {"ID": lock_id}}
    status, body, _ = await c.put(LEASE, stale, cas=var["ModifyIndex"] + 5)
    assert status == 409 and body == var  # the holder gets a normal cas conflict
    status, written, _ = await c.put(LEASE, stale, cas=var["ModifyIndex"])
    assert status == 200 and written["Items"] == {"holder": "b"}
    assert written["Lock"] == var["Lock"] and written["ModifyIndex"] > var["ModifyIndex"]
    status, body, _ = await c.delete(LEASE)
    assert status == 409 and body["Path"] == var["Path"] and body["Lock"] is None
    assert (await c.delete(LEASE, cas=written["ModifyIndex"]))[0] == 409
    assert (await c.get(LEASE))[0] == 200
    new_with_lock = {"Items": {"a": "b"}, "Lock": {"ID": lock_id}}
    assert (await c.put("/v1/var/other", new_with_lock))[:2] == (
        400,
        "variable should not contain lock definition",
    )
    await c.put(LEASE, {"Lock": {"ID": lock_id}}, **RELEASE)
    assert (await c.delete(LEASE))[0] == 200


async def test_unrenewed_lock_expires_after_twice_its_ttl_then_the_lock_delay(
    lock_client: Client, lock_sim: Simulator
) -> None:
    c = lock_client
    loop = asyncio.get_running_loop()
    ttl, delay = 10 * SCALE, 5 * SCALE
    var = await _acquire(c)
    lock_id = var["Lock"]["ID"]
    started = loop.time()
    for _ in range(7):  # renewed every TTL/3 the lock outlives 2 x TTL
        await asyncio.sleep(ttl / 3)
        assert (await c.put(LEASE, {"Lock": {"ID": lock_id}}, **RENEW))[0] == 200
    assert loop.time() - started > 2 * ttl and lock_sim.vars[KEY]["Lock"]["ID"] == lock_id

    renewed = loop.time()
    await asyncio.sleep(ttl * 1.2)  # past one TTL: Nomad still holds the lock
    assert lock_sim.vars[KEY]["Lock"]["ID"] == lock_id
    await wait_until(lambda: lock_sim.variable_registry.locks[KEY].ttl_timer is None)
    assert loop.time() - renewed >= 2 * ttl
    # The TTL ran out: the lock can no longer be renewed, and during the lock delay
    # nobody may acquire it (the variable still shows the lock).
    renew = await c.put(LEASE, {"Lock": {"ID": lock_id}}, **RENEW)
    assert renew[:2] == (409, "attempting to modify locked variable")
    assert (await c.put(LEASE, {"Items": {"holder": "b"}}, **ACQUIRE))[0] == 409
    assert (await c.get(LEASE))[1]["Lock"]["ID"] == lock_id

    index = lock_sim.index
    await wait_until(lambda: "Lock" not in lock_sim.vars[KEY])
    assert loop.time() - renewed >= 2 * ttl + delay
    freed = lock_sim.vars[KEY]
    assert freed["ModifyIndex"] == index + 1 and freed["Items"] == {"holder": "a"}
    taken = await _acquire(c, "b")
    assert taken["Lock"]["ID"] != lock_id


async def test_holder_may_release_during_the_lock_delay(
    lock_client: Client, lock_sim: Simulator
) -> None:
    c = lock_client
    var = await _acquire(c)
    await wait_until(lambda: lock_sim.variable_registry.locks[KEY].ttl_timer is None)
    release = await c.put(LEASE, {"Lock": {"ID": var["Lock"]["ID"]}}, **RELEASE)
    assert release[0] == 200
    taken = await _acquire(c, "b")
    await asyncio.sleep(6 * SCALE)  # the first lock's delay would have ended by now
    assert lock_sim.vars[KEY]["Lock"] == taken["Lock"]  # and it did not free the new lock


async def test_lock_writes_are_events(lock_client: Client) -> None:
    c = lock_client
    async with c.session.get(c.url + "/v1/event/stream", params={"topic": "Variables"}) as resp:
        stream = Stream(resp)
        await stream.next(heartbeats=True)
        var = await _acquire(c)
        await c.put(LEASE, {"Lock": {"ID": var["Lock"]["ID"]}}, **RENEW)  # writes nothing
        await c.put(LEASE, {"Lock": {"ID": var["Lock"]["ID"]}}, **RELEASE)
        events = await stream.events(2)
    assert [e["Type"] for e in events] == ["VariableUpserted", "VariableUpserted"]
    assert events[0]["Payload"]["Variable"]["Lock"] == var["Lock"]
    assert "Lock" not in events[1]["Payload"]["Variable"]
    assert all("Items" not in e["Payload"]["Variable"] for e in events)


async def test_a_renewal_fault_fails_only_the_renewals(
    lock_client: Client, lock_sim: Simulator
) -> None:
    c = lock_client
    lock = (await _acquire(c))["Lock"]
    lock_sim.api_fault("renew_error", seconds=60)
    status, text, _ = await c.put(LEASE, {"Lock": {"ID": lock["ID"]}}, **RENEW)
    assert (status, text) == (500, "rpc error: timed out enqueuing operation")
    # Everything else is answered as usual: reads, plain writes, the release.
    assert (await c.get(LEASE))[0] == 200
    assert (await c.put("/v1/var/other", {"Items": {"a": "b"}}))[0] == 200
    status, var, _ = await c.put(LEASE, {"Lock": {"ID": lock["ID"]}}, **RELEASE)
    assert status == 200 and "Lock" not in var
    lock_sim.api_fault("none", seconds=0)
    lock = (await _acquire(c))["Lock"]
    assert (await c.put(LEASE, {"Lock": {"ID": lock["ID"]}}, **RENEW))[0] == 200
