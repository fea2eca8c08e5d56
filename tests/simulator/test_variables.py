"""Variables (reference section 8): CAS, 409 bodies, path rules, metadata-only lists."""

from __future__ import annotations

import asyncio
from typing import Any

from tests.simulator.conftest import Client


async def test_create_read_update_with_cas(client: Client) -> None:
    status, var, headers = await client.put(
        "/v1/var/poolkeeper/claims/a", {"Items": {"owner": "x"}}, cas=0
    )
    assert status == 200
    assert var["Path"] == "poolkeeper/claims/a" and var["Namespace"] == "default"
    assert var["Items"] == {"owner": "x"} and var["CreateIndex"] == var["ModifyIndex"]
    assert int(headers["X-Nomad-Index"]) == var["ModifyIndex"]
    status, read, _ = await client.get("/v1/var/poolkeeper/claims/a")
    assert status == 200 and read == var
    status, updated, _ = await client.put(
        "/v1/var/poolkeeper/claims/a", {"Items": {"owner": "y"}}, cas=var["ModifyIndex"]
    )
    assert status == 200 and updated["ModifyIndex"] > var["ModifyIndex"]
    assert updated["CreateIndex"] == var["CreateIndex"]


async def test_cas_conflicts_return_current_variable(client: Client) -> None:
    _, var, _ = await client.put("/v1/var/c/one", {"Items": {"k": "v"}})
    status, body, _ = await client.put("/v1/var/c/one", {"Items": {"k": "w"}}, cas=0)
    assert status == 409 and body == var  # the current variable, unchanged
    status, body, _ = await client.put(
        "/v1/var/c/one", {"Items": {"k": "w"}}, cas=var["ModifyIndex"] + 7
    )
    assert status == 409 and body["ModifyIndex"] == var["ModifyIndex"]
    status, body, _ = await client.put("/v1/var/c/absent", {"Items": {"k": "w"}}, cas=3)
    assert status == 409 and body["ModifyIndex"] == 0 and body["Path"] == "c/absent"
    status, body, _ = await client.delete("/v1/var/c/one", cas=var["ModifyIndex"] + 1)
    assert status == 409 and body == var
    status, body, _ = await client.delete("/v1/var/c/one", cas=var["ModifyIndex"])
    assert status == 200 and body == ""
    assert (await client.get("/v1/var/c/one"))[:2] == (404, "variable not found")


async def test_concurrent_cas_writers_cannot_both_win(client: Client) -> None:
    _, var, _ = await client.put("/v1/var/race", {"Items": {"n": "0"}})
    results = await asyncio.gather(
        *(
            client.put("/v1/var/race", {"Items": {"n": str(i)}}, cas=var["ModifyIndex"])
            for i in range(5)
        )
    )
    assert sorted(r[0] for r in results) == [200, 409, 409, 409, 409]


async def test_validation(client: Client) -> None:
    bad: list[tuple[str, dict[str, Any]]] = [
        ("/v1/var/ok", {"Items": {}}),
        ("/v1/var/ok", {"Items": {"n": 1}}),
        ("/v1/var/ok", {}),
        ("/v1/var/has%20space", {"Items": {"a": "b"}}),
        ("/v1/var/nomad/other", {"Items": {"a": "b"}}),
        ("/v1/var/" + "x" * 129, {"Items": {"a": "b"}}),
    ]
    for path, body in bad:
        status, text, _ = await client.put(path, body)
        assert status == 400, (path, text)
    status, _, _ = await client.put("/v1/var/nomad/jobs/web", {"Items": {"a": "b"}})
    assert status == 200
    assert (await client.put("/v1/var/ok", {"Items": {"a": "b"}}, cas="x"))[0] == 400


async def test_list_is_metadata_only_with_prefix_and_pages(client: Client) -> None:
    for name in ("p/a", "p/b", "p/c", "q/a"):
        await client.put(f"/v1/var/{name}", {"Items": {"secret": "s"}})
    status, listed, headers = await client.get("/v1/vars", prefix="p/")
    assert status == 200 and [v["Path"] for v in listed] == ["p/a", "p/b", "p/c"]
    assert all("Items" not in v for v in listed)
    index = int(headers["X-Nomad-Index"])
    _, page, headers = await client.get("/v1/vars", prefix="p/", per_page=2)
    assert [v["Path"] for v in page] == ["p/a", "p/b"] and headers["X-Nomad-NextToken"] == "p/c"
    waiter = asyncio.create_task(client.get("/v1/vars", index=index, wait="5s"))
    await asyncio.sleep(0.05)
    assert not waiter.done()
    await client.put("/v1/var/p/d", {"Items": {"secret": "s"}})
    _, listed, headers = await asyncio.wait_for(waiter, 3)
    assert int(headers["X-Nomad-Index"]) > index and len(listed) == 5


async def test_a_missing_variable_is_404_with_the_index_to_block_from(client: Client) -> None:
    # Nomad answers a read of a missing variable with the variables table's index (at
    # least 1): a blocking read goes on from it, and wakes when any variable changes.
    status, text, headers = await client.get("/v1/var/none")
    assert (status, text, headers["X-Nomad-Index"]) == (404, "variable not found", "1")
    await client.put("/v1/var/other", {"Items": {"a": "b"}})
    _, _, after = await client.get("/v1/var/none")
    index = int(after["X-Nomad-Index"])
    assert index > 1
    waiter = asyncio.create_task(client.get("/v1/var/none", index=index, wait="10s"))
    await asyncio.sleep(0.05)
    assert not waiter.done()
    await client.put("/v1/var/none", {"Items": {"x": "y"}})
    status, var, _ = await asyncio.wait_for(waiter, 3)
    assert status == 200 and var["Items"] == {"x": "y"}
    assert (await client.put("/v1/var/ok", {}))[:2] == (
        400,
        "variable missing required Items object",
    )
