"""What docs/reference.md shows of an answer against the answer itself."""

from __future__ import annotations

import json
import re
from pathlib import Path

import aiohttp

from controller.api_tier import ApiTier
from controller.nomad.config import NomadConfig
from controller.serving import ServingSettings
from tests.support.ports import free_port
from tests.support.waiting import wait_until

REFERENCE = Path(__file__).resolve().parents[2] / "docs" / "reference.md"


def documented_unready_body() -> dict[str, object]:
    """The body the reference gives for an API replica that cannot read the catalog."""
    text = REFERENCE.read_text()
    bullet = text.split("- `GET /readyz` answers 503 until the catalog", 1)[1].split("\n- ")[0]
    example = re.search(r"`(\{.*?\})`", " ".join(bullet.split()))
    assert example is not None, bullet
    body: dict[str, object] = json.loads(example.group(1))
    return body


async def test_an_api_replica_that_cannot_read_the_catalog_answers_as_documented() -> None:
    nomad = NomadConfig.from_env({"NOMAD_ADDR": f"http://127.0.0.1:{free_port()}"})
    tier = ApiTier(ServingSettings(listen=("127.0.0.1", 0), insecure_no_auth=True), nomad)
    await tier.start()
    answers: list[tuple[int, dict[str, object]]] = []
    try:
        async with aiohttp.ClientSession() as http:

            async def failed_once() -> bool:
                async with http.get(tier.url + "/readyz") as response:
                    answers.append((response.status, await response.json()))
                return str(answers[-1][1].get("reason", "")).startswith("cannot read")

            await wait_until(failed_once, within=20, what="the catalog's read to fail")
    finally:
        await tier.stop()
    status, body = answers[-1]
    documented = documented_unready_body()
    assert status == 503
    assert set(body) == set(documented), (body, documented)
    assert {k: v for k, v in body.items() if k != "reason"} == {
        k: v for k, v in documented.items() if k != "reason"
    }
    assert str(body["reason"]).startswith(str(documented["reason"]).rstrip("…").rstrip())
