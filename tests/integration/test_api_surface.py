"""Metrics, the OpenAPI document and `poolkeeper status` against a running controller."""

from __future__ import annotations

import argparse
import asyncio

import pytest
from jsonschema import Draft202012Validator
from rich.console import Console
from schemathesis.specs.openapi.definitions import OPENAPI_31

from controller import status_command
from controller.api.openapi import document, extended
from controller.poseidon.context import PoseidonSettings
from controller.poseidon.openapi import openapi_part
from tests.support.documents import pool_doc

from .conftest import TOKEN, Harness, write_pools

PROMISED_METRICS = [
    'poolkeeper_runners{pool="default/py",state="idle"} 2.0',
    'poolkeeper_runners{pool="default/py",state="claimed"} 1.0',
    'poolkeeper_desired_idle_runners{pool="default/py"} 2.0',
    "poolkeeper_reconcile_duration_seconds_count",
    'poolkeeper_reconcile_total{pool="default/py",result="success"}',
    'poolkeeper_claims_total{pool="default/py",result="claimed"} 2.0',
    "poolkeeper_claim_duration_seconds_count 2.0",
    'poolkeeper_runners_created_total{pool="default/py"} 4.0',
    'poolkeeper_runners_destroyed_total{pool="default/py",reason="released"}',
    'poolkeeper_nomad_requests_total{code="200",endpoint="/v1/jobs"}',
    'poolkeeper_nomad_requests_total{code="200",endpoint="/v1/var/:path"}',
    'poolkeeper_event_stream_up{namespace="default"} 1.0',
    'poolkeeper_pool_condition{pool="default/py",type="Ready"} 1.0',
    'poolkeeper_pool_condition{pool="default/py",type="Degraded"} 0.0',
    'poolkeeper_pool_lease_held{pool="default/py"} 1.0',
]


async def test_metrics_carry_the_contract_series(harness: Harness, tmp_path):
    controller = await harness.start(write_pools(tmp_path / "p.yaml", pool_doc("py", idle=2)))
    await harness.settled(controller)
    _, claim = await harness.api(controller, "POST", "/v1/pools/default/py/claims", {})
    _, other = await harness.api(controller, "POST", "/v1/pools/default/py/claims", {})
    await harness.api(controller, "DELETE", f"/v1/runners/{other['runnerId']}")
    await harness.settled(controller)
    status, text = await harness.api(controller, "GET", "/metrics", token=None)
    assert status == 200
    # Two claims, one released: two replacements on top of the initial two runners.
    for series in PROMISED_METRICS:
        assert series in text, series
    assert claim["runnerId"] in [r.id for r in controller.engine.pools["default/py"].runners]


async def test_a_stopped_event_stream_watcher_leaves_no_series(harness: Harness, tmp_path):
    """A process stopping stops its watchers first: no stream of it is down."""
    controller = await harness.start(write_pools(tmp_path / "p.yaml", pool_doc("py", idle=1)))
    await harness.settled(controller)
    _, text = await harness.api(controller, "GET", "/metrics", token=None)
    assert 'poolkeeper_event_stream_up{namespace="default"} 1.0' in text
    await controller.stop_watchers()
    _, text = await harness.api(controller, "GET", "/metrics", token=None)
    assert "poolkeeper_event_stream_up{" not in text


@pytest.mark.parametrize("poseidon", [False, True], ids=["v1", "v1 and poseidon"])
async def test_openapi_document_matches_the_routes(harness: Harness, tmp_path, poseidon):
    settings = PoseidonSettings(enabled=poseidon)
    pools = write_pools(tmp_path / "p.yaml", pool_doc("py", idle=1))
    controller = await harness.start(pools, poseidon=settings)
    status, served = await harness.api(controller, "GET", "/openapi.json", token=None)
    expected = extended(document(), openapi_part()) if poseidon else document()
    assert (status, served) == (200, expected)
    Draft202012Validator(OPENAPI_31).validate(served)
    for schema in served["components"]["schemas"].values():
        Draft202012Validator.check_schema(schema)
    app_routes = set()
    for resource in controller.api._runner.app.router.resources():  # type: ignore[union-attr]
        for route in resource:  # a mounted application's routes too, with its prefix
            if route.method != "HEAD" and route.resource is not None:
                app_routes.add((route.method, route.resource.canonical))
    documented = {
        (method.upper(), path)
        for path, item in served["paths"].items()
        for method in item
        if method != "parameters"
    }
    assert documented == app_routes
    assert any(path.startswith("/api/v1/") for _, path in documented) is poseidon


async def test_status_command_shows_pools_and_claims(harness: Harness, tmp_path):
    controller = await harness.start(write_pools(tmp_path / "p.yaml", pool_doc("py", idle=2)))
    await harness.settled(controller)
    _, claim = await harness.api(
        controller, "POST", "/v1/pools/default/py/claims", {"requestId": "status-demo"}
    )
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    console = Console(record=True, width=200)
    group = await asyncio.to_thread(status_command.render, controller.url, TOKEN)
    console.print(group)
    text = console.export_text()
    assert "default/py" in text and claim["runnerId"] in text and "status-demo" in text
    args = argparse.Namespace(url=controller.url, token_file=str(token_file), watch=False)
    assert await asyncio.to_thread(status_command.main, args) == 0
    bad = argparse.Namespace(url=controller.url, token_file=None, watch=False)
    assert await asyncio.to_thread(status_command.main, bad) == 1


async def test_status_through_a_pipe_is_not_cut_to_80_columns(
    harness: Harness, tmp_path, capsys: pytest.CaptureFixture[str], monkeypatch
):
    """Through a pipe (here pytest's capture) nothing tells the width: every cell is
    printed whole, as a script reading it needs."""
    name = "a-pool-with-a-rather-long-name-for-the-status-table"
    controller = await harness.start(write_pools(tmp_path / "p.yaml", pool_doc(name, idle=1)))
    await harness.settled(controller)
    _, claim = await harness.api(
        controller, "POST", f"/v1/pools/default/{name}/claims", {"requestId": "r" * 40}
    )
    args = argparse.Namespace(url=controller.url, token_file=None, watch=False)
    monkeypatch.setenv("POOLKEEPER_TOKEN", TOKEN)
    monkeypatch.delenv("COLUMNS", raising=False)
    assert await asyncio.to_thread(status_command.main, args) == 0
    out = capsys.readouterr().out
    assert f"default/{name}" in out and claim["runnerId"] in out and "r" * 40 in out, out
    assert "…" not in out, out
