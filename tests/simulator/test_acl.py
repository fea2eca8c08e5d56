"""ACLs: bootstrap, tokens, X-Nomad-Token and Bearer, 403 `Permission denied`."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest

from controller.lab.simulator import Simulator, start_sim
from tests.simulator.conftest import Client, service_job


@pytest.fixture
async def acl_client() -> AsyncIterator[Client]:
    sim = Simulator(nodes=["n1"], seed=1, acl_enabled=True, start_delay=0.01)
    server = await start_sim(sim)
    async with aiohttp.ClientSession() as session:
        yield Client(session, server.url)
    await server.stop()


async def _as(
    client: Client, headers: dict[str, str], method: str, path: str, body: object = None
) -> int:
    async with client.session.request(
        method, client.url + path, json=body, headers=headers
    ) as resp:
        return resp.status


async def test_tokens_and_permissions(acl_client: Client) -> None:
    c = acl_client
    assert (await c.get("/v1/jobs"))[:2] == (403, "Permission denied")
    assert (await c.get("/v1/status/leader"))[0] == 200  # status needs no token
    status, boot, _ = await c.post("/v1/acl/bootstrap")
    assert status == 200 and boot["Type"] == "management" and boot["Name"] == "Bootstrap Token"
    status, text, _ = await c.post("/v1/acl/bootstrap")
    assert status == 400 and text.startswith("ACL bootstrap already done")
    secret = boot["SecretID"]
    assert await _as(c, {"X-Nomad-Token": secret}, "GET", "/v1/jobs") == 200
    assert await _as(c, {"Authorization": f"Bearer {secret}"}, "GET", "/v1/jobs") == 200
    assert await _as(c, {"X-Nomad-Token": "not-a-token"}, "GET", "/v1/jobs") == 403
    mgmt = {"X-Nomad-Token": secret}
    readonly = {"Rules": 'namespace "*" { policy = "read" }'}
    assert await _as(c, mgmt, "PUT", "/v1/acl/policy/readonly", readonly) == 200
    async with c.session.get(c.url + "/v1/acl/token/self", headers=mgmt) as resp:
        assert (await resp.json())["AccessorID"] == boot["AccessorID"]
    async with c.session.post(
        c.url + "/v1/acl/token",
        json={"Name": "ro", "Type": "client", "Policies": ["readonly"]},
        headers=mgmt,
    ) as resp:
        reader = await resp.json()
    ro = {"X-Nomad-Token": reader["SecretID"]}
    assert await _as(c, ro, "GET", "/v1/allocations") == 200
    assert await _as(c, ro, "PUT", "/v1/jobs", {"Job": service_job("x")}) == 403
    assert await _as(c, ro, "GET", "/v1/acl/tokens") == 403
    assert await _as(c, ro, "PUT", "/v1/system/gc") == 403  # management only, as in Nomad
    assert await _as(c, mgmt, "PUT", "/v1/system/gc") == 200
    assert await _as(c, ro, "GET", "/v1/event/stream") == 403  # `*` topics need management
    async with c.session.get(c.url + "/v1/acl/tokens", headers=mgmt) as resp:
        listed = await resp.json()
    assert {t["Name"] for t in listed} == {"Bootstrap Token", "ro"}
    assert all("SecretID" not in t for t in listed)
    assert await _as(c, mgmt, "DELETE", f"/v1/acl/token/{reader['AccessorID']}") == 200
    assert await _as(c, ro, "GET", "/v1/allocations") == 403


async def test_bootstrap_without_acls_is_400(client: Client) -> None:
    assert (await client.post("/v1/acl/bootstrap"))[:2] == (400, "ACL support disabled")
    assert (await client.get("/v1/jobs"))[0] == 200  # everything allowed without ACLs
