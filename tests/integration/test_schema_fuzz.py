"""The served OpenAPI document against a schema fuzzer (schemathesis): requests generated
from the document, on both APIs (/v1 and the Poseidon API under /api/v1), are answered as
the document says (status, content type, headers, body), a request the document allows
is not refused as invalid (400), and nothing fails inside the controller.

The simulator runs no processes here (no `--exec local`): generated commands reach
Nomad's exec and fail there (502, Poseidon's 500), never run on this machine.
"""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

import aiohttp
import jsonschema
import pytest
import schemathesis
from hypothesis import given
from hypothesis import strategies as st
from schemathesis.config import SchemathesisConfig
from schemathesis.core.result import Ok
from schemathesis.specs.openapi import checks
from schemathesis.specs.openapi.definitions import OPENAPI_31

from tests.support.documents import as_integers
from tests.support.fuzzing import against_live_service

from .conftest import TOKEN, Harness
from .test_poseidon import READONLY, environment_pool, start

HEADERS = {"Authorization": f"Bearer {TOKEN}", "Poseidon-Token": TOKEN}
# What the pool allows of values the document cannot bound (they come from the pool).
POOL_LIMITS = {
    "inactivityTimeoutSeconds": 3600,
    "inactivityTimeout": 3600,
    "timeLimitSeconds": 3600,
    "timeLimit": 3600,
}
# Statuses that do not say a request was invalid: all but 400.
ACCEPTED = ["2xx", "3xx", "401", "403", "404", "405", "409", "410", "413", "424", "5xx"]


@schemathesis.check
def not_an_internal_error(ctx: Any, response: Any, case: Any) -> bool | None:
    """A 500 is never the controller's own failure (only Poseidon's documented ones)."""
    if response.status_code == 500:
        body = json.loads(response.text) if response.text else {}
        assert body.get("message") != "internal error", response.text
        assert body.get("error", {}).get("code") != "InternalError", response.text
    return None


CHECKS = [
    not_an_internal_error,
    checks.status_code_conformance,
    checks.content_type_conformance,
    checks.response_headers_conformance,
    checks.response_schema_conformance,
    checks.positive_data_acceptance,
]


def within_the_pool(case: Any) -> None:
    """Values the pool bounds brought within them; a claim does not wait for a runner."""
    if not isinstance(case.body, dict):
        return
    case.body = as_integers(case.body)
    for name, limit in POOL_LIMITS.items():
        value = case.body.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value > limit:
            case.body[name] = limit
    if "waitSeconds" in case.body:
        case.body["waitSeconds"] = 0


@pytest.mark.slow
async def test_a_schema_fuzzer_finds_nothing_on_either_api(
    harness: Harness, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    pool = environment_pool("py", 10, idle=4, maxRunners=60)
    controller = await start(harness, tmp_path, pool, poseidon=READONLY)
    status, document = await harness.api(controller, "GET", "/openapi.json", token=None)
    assert status == 200
    jsonschema.Draft202012Validator(OPENAPI_31).validate(document)
    assert any(path.startswith("/api/v1/") for path in document["paths"])

    config = SchemathesisConfig.from_dict(
        {"checks": {"positive_data_acceptance": {"expected-statuses": ACCEPTED}}}
    )
    schema = schemathesis.openapi.from_dict(document, config=config)
    # A claimed runner of each API, so that generated requests reach a runner too.
    _, claim = await harness.api(controller, "POST", "/v1/pools/default/py/claims", {})
    async with aiohttp.ClientSession(headers={"Poseidon-Token": TOKEN}) as http:
        body = {"executionEnvironmentId": 10}
        async with http.post(f"{controller.url}/api/v1/runners", json=body) as response:
            poseidon = (await response.json())["runnerId"]
    strategies = []
    for result in schema.get_all_operations():
        assert isinstance(result, Ok), result  # every operation of the document is read
        operation = result.ok()
        strategies.append(operation.as_strategy())
        # Not DELETE: a release would end the claimed runners at once.
        if "{runnerId}" in operation.path and operation.method.upper() != "DELETE":
            runner = claim["runnerId"] if operation.path.startswith("/v1/") else poseidon
            strategies.append(operation.as_strategy(path_parameters={"runnerId": runner}))
    url = controller.url
    caplog.set_level(logging.ERROR)

    @against_live_service(max_examples=200)
    @given(case=st.one_of(strategies))
    def fuzz(case: Any) -> None:
        within_the_pool(case)
        case.call_and_validate(base_url=url, headers=HEADERS, checks=CHECKS, timeout=40)

    await asyncio.to_thread(fuzz)
    assert not [r for r in caplog.records if r.name.startswith("controller.")]
