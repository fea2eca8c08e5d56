"""The served OpenAPI document against a schema fuzzer (schemathesis): requests generated
from the document, on both APIs (/v1 and the Poseidon API under /api/v1), in its
positive phase (requests the document allows) and its negative one (requests it does
not), are answered as the document says (status, content type, headers, body); an
allowed request is not refused as invalid (400), a request the document does not allow
is refused, and nothing fails inside the controller.

Documented behaviour the checks make room for: Poseidon's API reads numbers as Go does,
so `49.0` is no integer there (docs/poseidon.md: the fuzzer's integral floats are sent
as integers under /api/v1 only); its `execute` answers 400 once 32 stored executions of
the runner wait for their sockets; a request for an unknown runner is refused for that
(404, 410) before its invalid body is read. The tokens are the test's (their checks are
test_hostile_input.py's and test_poseidon.py's), and unknown query parameters, which
both APIs ignore, are not generated.

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
from schemathesis import GenerationMode
from schemathesis.config import SchemathesisConfig
from schemathesis.core.result import Ok
from schemathesis.specs.openapi import checks
from schemathesis.specs.openapi.definitions import OPENAPI_31

from controller.executions.manager import MAX_WAITING_PER_RUNNER
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
# Statuses that refuse a request: 400, or what was found wrong before the invalid part
# was read (an unknown runner is 404 under /v1, 410 under Poseidon, before its body).
REJECTED = ["400", "401", "403", "404", "405", "406", "409", "410", "413", "415", "422", "424"]


@schemathesis.check
def not_an_internal_error(ctx: Any, response: Any, case: Any) -> bool | None:
    """A 500 is never the controller's own failure (only Poseidon's documented ones)."""
    if response.status_code == 500:
        body = json.loads(response.text) if response.text else {}
        assert body.get("message") != "internal error", response.text
        assert body.get("error", {}).get("code") != "InternalError", response.text
    return None


@schemathesis.check
def valid_requests_are_taken(ctx: Any, response: Any, case: Any) -> bool | None:
    """positive_data_acceptance, but for the one 400 documented for a valid request:
    Poseidon's `execute` when 32 stored executions of the runner wait for their sockets
    (docs/poseidon.md); the fuzzer stores many and opens none."""
    if response.status_code == 400 and WAITING in response.text:
        return None
    result: bool | None = checks.positive_data_acceptance(ctx, response, case)
    return result


WAITING = f"has {MAX_WAITING_PER_RUNNER} executions waiting to be connected"

CHECKS = [
    not_an_internal_error,
    checks.status_code_conformance,
    checks.content_type_conformance,
    checks.response_headers_conformance,
    checks.response_schema_conformance,
    valid_requests_are_taken,
    checks.negative_data_rejection,
]


def within_the_pool(case: Any) -> None:
    """Values the pool bounds brought within them; a claim does not wait for a runner."""
    if not isinstance(case.body, dict):
        return
    if case.operation.path.startswith("/api/v1/"):
        case.body = as_integers(case.body)
    for name, limit in POOL_LIMITS.items():
        value = case.body.get(name)
        if isinstance(value, int | float) and not isinstance(value, bool) and value > limit:
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
        {
            "checks": {
                "positive_data_acceptance": {"expected-statuses": ACCEPTED},
                "negative_data_rejection": {"expected-statuses": REJECTED},
            },
            "generation": {
                "with-security-parameters": False,
                "allow-extra-parameters": False,
            },
        }
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
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            strategies.append(operation.as_strategy(mode))
            # Not DELETE: a release would end the claimed runners at once.
            if "{runnerId}" in operation.path and operation.method.upper() != "DELETE":
                runner = claim["runnerId"] if operation.path.startswith("/v1/") else poseidon
                parameters = {"runnerId": runner}
                strategies.append(operation.as_strategy(mode, path_parameters=parameters))
    url = controller.url
    caplog.set_level(logging.ERROR)

    @against_live_service(max_examples=400)
    @given(case=st.one_of(strategies))
    def fuzz(case: Any) -> None:
        within_the_pool(case)
        case.call_and_validate(base_url=url, headers=HEADERS, checks=CHECKS, timeout=40)

    await asyncio.to_thread(fuzz)
    assert not [r for r in caplog.records if r.name.startswith("controller.")]


async def test_where_the_document_and_the_server_disagreed(
    harness: Harness, tmp_path: Path
) -> None:
    """Issue 34's cases, each decided one way (docs/reference.md, docs/poseidon.md)."""
    controller = await start(harness, tmp_path, environment_pool("py", 10), poseidon=READONLY)
    _, document = await harness.api(controller, "GET", "/openapi.json", token=None)
    paths = document["paths"]
    # /v1: 49.0 is an integer, as in the document's JSON Schema: the server takes it.
    status, claim = await harness.api(
        controller, "POST", "/v1/pools/default/py/claims", {"inactivityTimeoutSeconds": 49.0}
    )
    assert status == 201, claim
    assert claim["inactivityTimeoutSeconds"] == 49
    runner = f"/v1/runners/{claim['runnerId']}"
    body = {"command": "true", "timeLimitSeconds": 5.0, "wait": True}
    status, answer = await harness.api(controller, "POST", runner + "/executions", body)
    assert status == 502, answer  # past validation: to Nomad's exec (none here)
    # /v1: an empty `path` is refused, as the document's pattern says, with any body.
    empty_paths: list[tuple[str, str, dict[str, Any] | None]] = [
        ("GET", "/files?path=", None),
        ("PUT", "/files?path=", {}),
    ]
    for method, suffix, content in empty_paths:
        status, answer = await harness.api(controller, method, runner + suffix, content)
        assert (status, answer["error"]["code"]) == (400, "InvalidRequest"), (suffix, answer)
        assert answer["error"]["message"] == "path: must not be empty"
    # Poseidon: 401 has no body, and the document says so.
    environment = paths["/api/v1/execution-environments/{id}"]
    for operation in environment.values():
        assert "content" not in operation["responses"]["401"]
    async with (
        aiohttp.ClientSession() as http,
        http.get(controller.url + "/api/v1/execution-environments") as response,
    ):
        assert (response.status, await response.read()) == (401, b"")
    # Poseidon: an environment ID that is not digits is no route (404, no body), as in
    # Poseidon's router; the document says so for PUT too.
    assert "404" in environment["put"]["responses"]
    headers = {"Poseidon-Token": TOKEN}
    url = controller.url + "/api/v1/execution-environments/-1"
    async with (
        aiohttp.ClientSession() as http,
        http.put(url, json={}, headers=headers) as response,
    ):
        assert (response.status, await response.read()) == (404, b"")
    # Poseidon: `{}` is no environment (image, cpuLimit, memoryLimit are required); null,
    # as a body or a field's value, is Go's zero value, as the document says.
    request = environment["put"]["requestBody"]["content"]["application/json"]["schema"]
    assert set(request["required"]) >= {"image", "cpuLimit", "memoryLimit"}
    runners = paths["/api/v1/runners"]["post"]["requestBody"]["content"]["application/json"]
    assert runners["schema"]["type"] == ["object", "null"]
    execute = paths["/api/v1/runners/{runnerId}/execute"]["post"]["requestBody"]["content"]
    assert "null" in execute["application/json"]["schema"]["properties"]["command"]["type"]
