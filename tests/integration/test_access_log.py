"""`--access-log`: one line per request with the route template, never a token or a body."""

from __future__ import annotations

import logging

import pytest

from tests.support.documents import pool_doc

from .conftest import TOKEN, Harness, write_pools

LOGGER = "controller.api.access_log"


async def test_one_line_per_request_with_the_route_template(
    harness: Harness, tmp_path, caplog: pytest.LogCaptureFixture
) -> None:
    pools = write_pools(tmp_path / "pools.yaml", pool_doc("py", idle=1))
    controller = await harness.start(pools, access_log=True)
    await harness.settled(controller)
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    runner_id = "py-0123456789ab"
    claim_body = {"requestId": "secret-request-7f3a"}
    answers = [
        await harness.api(controller, "POST", "/v1/pools/default/py/claims", claim_body),
        await harness.api(controller, "GET", f"/v1/runners/{runner_id}"),
        await harness.api(controller, "GET", "/v1/pools", token="wrong-token-5e1d"),
        await harness.api(controller, "GET", f"/{TOKEN}"),
        await harness.api(controller, "PUT", "/v1/pools"),
        await harness.api(controller, "GET", "/healthz", token=None),
    ]
    lines = [r for r in caplog.records if r.name == LOGGER]
    fields = [vars(r) for r in lines]
    seen = [(f["levelno"], f["method"], f["route"], f["status"]) for f in fields]
    assert [status for status, _ in answers] == [201, 404, 401, 404, 405, 200]
    assert seen == [
        (logging.INFO, "POST", "/v1/pools/{namespace}/{name}/claims", 201),
        (logging.INFO, "GET", "/v1/runners/{runnerId}", 404),
        (logging.INFO, "GET", "/v1/pools", 401),
        (logging.INFO, "GET", "(unmatched)", 404),
        (logging.INFO, "PUT", "(unmatched)", 405),
        (logging.DEBUG, "GET", "/healthz", 200),  # probes poll it every few seconds
    ]
    first = lines[0]
    assert first.getMessage().startswith("POST /v1/pools/{namespace}/{name}/claims 201 ")
    assert first.getMessage().endswith(" ms")
    assert isinstance(fields[0]["durationMs"], float)
    logged = "\n".join(f"{r.getMessage()} {vars(r)}" for r in lines)
    for secret in (TOKEN, "wrong-token-5e1d", runner_id, "secret-request-7f3a"):
        assert secret not in logged


async def test_without_the_flag_nothing_is_logged_per_request(
    harness: Harness, tmp_path, caplog: pytest.LogCaptureFixture
) -> None:
    controller = await harness.start(write_pools(tmp_path / "pools.yaml", pool_doc("py", idle=1)))
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    assert (await harness.api(controller, "GET", "/v1/pools"))[0] == 200
    assert [r for r in caplog.records if r.name == LOGGER] == []
