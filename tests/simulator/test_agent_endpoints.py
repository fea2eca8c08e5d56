"""What agents and tools wait for before they use a Nomad agent: the servers' public
signing key (/.well-known/jwks.json) and the agent's metrics (/v1/metrics)."""

from __future__ import annotations

import base64
import re

import aiohttp

from controller.lab.simulator import Simulator, start_sim
from controller.lab.simulator.keyring import Keyring
from tests.simulator.conftest import Client

UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def _int(b64url: str) -> int:
    return int.from_bytes(base64.urlsafe_b64decode(b64url + "=" * (-len(b64url) % 4)), "big")


async def test_jwks_publishes_one_rs256_key(client: Client) -> None:
    status, body, headers = await client.get("/.well-known/jwks.json")
    assert status == 200
    (key,) = body["keys"]
    assert (key["kty"], key["alg"], key["use"]) == ("RSA", "RS256", "sig")
    assert UUID.match(key["kid"])
    assert _int(key["n"]).bit_length() == 2048
    assert _int(key["e"]) == 65537
    assert re.fullmatch(r"max-age=\d+", headers["Cache-Control"])
    _, again, _ = await client.get("/.well-known/jwks.json")
    assert again == body  # the same key until it rotates


def test_the_key_is_a_product_of_two_primes_and_follows_the_seed() -> None:
    keys = [Keyring(seed).public_keys()["keys"][0] for seed in (1, 1, 2)]
    assert keys[0] == keys[1] != keys[2]
    modulus = _int(keys[0]["n"])
    # Not prime itself (Fermat's test fails for a composite with overwhelming odds).
    assert pow(2, modulus - 1, modulus) != 1


def test_asking_for_the_key_does_not_change_the_ids_of_anything_else() -> None:
    asked, not_asked = Simulator(seed=3), Simulator(seed=3)
    asked.keyring.public_keys()
    assert asked.store.new_id() == not_asked.store.new_id()


async def test_jwks_and_metrics_need_no_token() -> None:
    server = await start_sim(Simulator(acl_enabled=True))
    try:
        async with aiohttp.ClientSession() as session:
            client = Client(session, server.url)
            assert (await client.get("/.well-known/jwks.json"))[0] == 200
            assert (await client.get("/v1/metrics"))[0] == 200
            assert (await client.get("/v1/jobs"))[0] == 403
    finally:
        await server.stop()


async def test_metrics_summary_and_prometheus_not_enabled(client: Client) -> None:
    status, body, _ = await client.get("/v1/metrics")
    assert status == 200
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d0 \+0000 UTC", body["Timestamp"])
    for values in ("Gauges", "Points", "Counters", "Samples"):
        assert body[values] == []
    status, text, _ = await client.get("/v1/metrics", format="prometheus")
    assert (status, text) == (415, "Prometheus is not enabled")
    assert (await client.put("/.well-known/jwks.json"))[0] == 405
