"""The operator's command line and kopf settings."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import signal
import sys
from pathlib import Path

import kopf
import pytest

from controller.cli import build_parser
from controller.cli import main as cli_main
from controller.errors import UsageError
from controller.operator.options import (
    FINALIZER,
    KOPF_OBJECT_LOGGER,
    HandlerSuccessAtDebug,
    OperatorOptions,
    default_connect,
    operator_settings,
    options_from_args,
    quiet_routine_lines,
)
from tests.operator.conftest import Cluster
from tests.support.documents import pool_doc
from tests.support.ports import free_port
from tests.support.waiting import wait_until


def parse(*argv: str) -> OperatorOptions:
    return options_from_args(build_parser().parse_args(["operator", *argv]))


def test_scope_maps_to_kopf_settings_and_kopf_never_peers() -> None:
    assert parse("--namespace", "a", "--namespace", "b").namespaces == ("a", "b")
    assert parse("--all-namespaces").namespaces == ()
    settings = operator_settings(parse())
    assert settings.peering.standalone and not settings.peering.mandatory
    assert settings.scanning.disabled
    assert settings.persistence.finalizer == FINALIZER


@pytest.mark.parametrize("removed", [["--peering", "poolkeeper"], ["--priority", "7"]])
def test_the_peering_options_are_gone(
    removed: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        parse(*removed)
    assert f"unrecognized arguments: {' '.join(removed)}" in capsys.readouterr().err


def test_bad_values_are_usage_errors() -> None:
    with pytest.raises(UsageError, match="--resync-seconds"):
        parse("--resync-seconds", "0")
    with pytest.raises(UsageError, match="--listen"):
        parse("--listen", "nowhere")


def test_missing_kubernetes_credentials_are_a_usage_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "")
    assert cli_main(["operator", "--insecure-no-auth", "--listen", "127.0.0.1:0"]) == 2
    assert "no Kubernetes credentials" in capsys.readouterr().err


async def test_the_command_runs_against_a_cluster_and_stops_on_sigterm(
    cluster: Cluster, tmp_path: Path
) -> None:
    cluster.install_chart()
    config = cluster.kubeconfig(tmp_path / "kubeconfig")
    port = free_port()
    liveness = f"http://127.0.0.1:{free_port()}/healthz"
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "controller",
        "operator",
        "--namespace",
        cluster.namespace,
        "--insecure-no-auth",
        "--listen",
        f"127.0.0.1:{port}",
        "--resync-seconds",
        "0.5",
        "--log-format",
        "json",
        "--liveness",
        liveness,
        env={
            **os.environ,
            "KUBECONFIG": str(config),
            "NOMAD_ADDR": cluster.sim_server.url,
            "HOME": str(tmp_path),
        },
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        await cluster.create_pool(pool_doc("cli", idle=1))
        await wait_until(lambda: len(cluster.jobs("cli")) == 1, what="a runner")

        async def ready() -> bool:
            try:
                async with cluster.http.get(f"http://127.0.0.1:{port}/readyz") as response:
                    return bool(response.status == 200)
            except OSError:
                return False

        await wait_until(ready, what="the operator to be ready")
        for _ in range(3):  # as the kubelet's liveness probe does, every 10 s
            async with cluster.http.get(liveness) as response:
                assert response.status == 200
    finally:
        process.send_signal(signal.SIGTERM)
        _, err = await asyncio.wait_for(process.communicate(), timeout=30)
    assert process.returncode == 0, err.decode()[-2000:]
    assert len(cluster.jobs("cli")) == 1  # stopping never destroys runners
    # kopf's lines take the same format as poolkeeper's, and a handler's routine success
    # (kopf logs one per watch event of every pool) is no INFO line.
    entries = [json.loads(line) for line in err.decode().splitlines()]
    loggers = {e["logger"] for e in entries}
    assert {"controller.operator.controller", "kopf.activities.authentication"} <= loggers
    assert not [e for e in entries if e["message"] == "Handler 'observe' succeeded."]
    # Nor is a probe of kopf's liveness endpoint (the chart's pods on the test node logged
    # one aiohttp access line at INFO per probe, the access log off).
    assert not [e for e in entries if e["logger"] == "aiohttp.access"]


def test_handler_successes_are_debug_lines_and_failures_keep_their_level(
    caplog: pytest.LogCaptureFixture,
) -> None:
    quiet_routine_lines()
    quiet_routine_lines()
    logger = logging.getLogger(KOPF_OBJECT_LOGGER)
    assert sum(isinstance(f, HandlerSuccessAtDebug) for f in logger.filters) == 1
    failed = "Handler 'observe' failed with an exception and will try again in 1 seconds: x"
    with caplog.at_level(logging.INFO):
        logger.info("Handler 'observe' succeeded.")
        logger.info("Deletion is processed: 1 succeeded; 0 failed.")
        logger.error(failed)
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("INFO", "Deletion is processed: 1 succeeded; 0 failed."),
        ("ERROR", failed),
    ]
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger=KOPF_OBJECT_LOGGER):
        logger.info("Handler 'finalize' succeeded.")
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("DEBUG", "Handler 'finalize' succeeded.")
    ]


@pytest.mark.parametrize(
    ("host", "port", "server"),
    [
        ("10.96.0.1", "443", "https://10.96.0.1:443"),
        ("fd00:10:96::1", "6443", "https://[fd00:10:96::1]:6443"),
        (None, None, "https://kubernetes.default.svc"),  # no Service variables: kopf's name
    ],
)
def test_in_a_pod_the_api_server_is_the_address_kubelet_gives(
    monkeypatch: pytest.MonkeyPatch, host: str | None, port: str | None, server: str
) -> None:
    """In a pod, the API server is reached at KUBERNETES_SERVICE_HOST:PORT, as client-go's
    in-cluster configuration does, not at kopf's kubernetes.default.svc: that name needs the
    cluster's DNS, which a cluster may lack or have down (the chart's pods on the test node
    caught it: "Temporary failure in name resolution", the operator never ready)."""
    pod_login = kopf.ConnectionInfo(
        server="https://kubernetes.default.svc", token="t", ca_path="/ca.crt"
    )
    monkeypatch.setattr(kopf, "login_with_service_account", lambda **_: pod_login)
    for name, value in (("KUBERNETES_SERVICE_HOST", host), ("KUBERNETES_SERVICE_PORT", port)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    info = default_connect(operator_settings(parse()))
    assert info == dataclasses.replace(pod_login, server=server)


def test_outside_a_pod_the_kubeconfig_is_used(monkeypatch: pytest.MonkeyPatch) -> None:
    from_kubeconfig = kopf.ConnectionInfo(server="https://127.0.0.1:6443", token="k")
    monkeypatch.setattr(kopf, "login_with_service_account", lambda **_: None)
    monkeypatch.setattr(kopf, "login_with_kubeconfig", lambda **_: from_kubeconfig)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    assert default_connect(operator_settings(parse())) == from_kubeconfig
