"""Access to the API: scoped tokens, HTTPS, tokens and certificates read again when their
files change, and the answers a client gets before Nomad was ever reached."""

from __future__ import annotations

import argparse
import asyncio
import ssl
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from rich.console import Console

from controller import service, serving, status_command
from controller.api.auth import Scope, TokenFileError, parse_token_lines
from controller.errors import UsageError
from controller.lab.tls import self_signed
from controller.nomad.config import NomadConfig
from controller.standalone import Controller, Settings
from tests.support.documents import pool_doc
from tests.support.waiting import wait_until

from .conftest import Harness, write_pools

ALL, PYTHON, TEAM = "all-pools-token", "python-token", "team-token"
TOKENS = f"""# the operators
{ALL}

{PYTHON} default/python-*
{TEAM} team-a/*,default/java
"""


def test_token_lines_with_scopes_comments_and_blank_lines() -> None:
    tokens = parse_token_lines(TOKENS, "tokens")
    assert [(t.secret.decode(), t.scope) for t in tokens] == [
        (ALL, Scope()),
        (PYTHON, Scope(("default/python-*",))),
        (TEAM, Scope(("team-a/*", "default/java"))),
    ]
    assert Scope(("default/python-*",)).allows("default/python-312")
    assert not Scope(("default/python-*",)).allows("default/java")
    assert Scope().allows("anything/at-all")
    for bad in ("a b c", "token python-*"):
        with pytest.raises(TokenFileError, match="line 1"):
            parse_token_lines(bad, "tokens")


async def scoped(harness: Harness, tmp_path: Path) -> Controller:
    pools = write_pools(
        tmp_path / "p.yaml", pool_doc("python-312", idle=1), pool_doc("java", idle=1)
    )
    controller = await harness.start(pools)
    (tmp_path / "tokens").write_text(TOKENS)
    controller.reload_files()
    await harness.settled(controller)
    return controller


async def test_a_token_acts_only_on_the_pools_of_its_scope(
    harness: Harness, tmp_path: Path
) -> None:
    controller = await scoped(harness, tmp_path)
    status, listing = await harness.api(controller, "GET", "/v1/pools", token=PYTHON)
    assert status == 200 and [p["name"] for p in listing["pools"]] == ["python-312"]
    status, listing = await harness.api(controller, "GET", "/v1/pools", token=ALL)
    assert [p["name"] for p in listing["pools"]] == ["java", "python-312"]

    before = dict(harness.sim.variables("default"))
    for method, path in (
        ("POST", "/v1/pools/default/java/claims"),
        ("GET", "/v1/pools/default/java/claims"),
    ):
        status, body = await harness.api(controller, method, path, {}, token=PYTHON)
        assert (status, body["error"]["code"]) == (403, "Forbidden"), (method, path)
    status, body = await harness.api(
        controller, "POST", "/v1/claims", {"pools": ["default/python-312", "default/java"]},
        token=PYTHON,
    )  # fmt: skip
    assert (status, body["error"]["code"]) == (403, "Forbidden")
    assert harness.sim.variables("default") == before  # nothing changed

    status, java = await harness.api(
        controller, "POST", "/v1/pools/default/java/claims", {}, token=TEAM
    )
    assert status == 201
    runner = f"/v1/runners/{java['runnerId']}"
    for method, path in (
        ("GET", runner),
        ("POST", runner + "/keepalive"),
        ("DELETE", runner),
        ("POST", runner + "/executions"),
        ("PUT", runner + "/files"),
        ("GET", runner + "/files"),
        ("GET", runner + "/files/content?path=x"),
    ):
        status, body = await harness.api(controller, method, path, token=PYTHON)
        assert (status, body["error"]["code"]) == (403, "Forbidden"), (method, path)
    status, _ = await harness.api(controller, "DELETE", runner, token=TEAM)
    assert status == 204
    status, _ = await harness.api(controller, "GET", "/metrics", token=None)
    assert status == 200  # metrics and health stay open


async def test_a_rotated_token_file_is_read_again_without_a_signal(
    harness: Harness, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(serving.FileWatch, "POLL_SECONDS", 0.1)
    controller = await harness.start(write_pools(tmp_path / "p.yaml", pool_doc("py", idle=1)))
    (tmp_path / "tokens").write_text("rotated-token\n")  # as a Secret mount is updated

    async def rotated() -> bool:
        status, _ = await harness.api(controller, "GET", "/v1/pools", token="rotated-token")
        return status == 200

    await wait_until(rotated, what="the new token to be taken")
    status, _ = await harness.api(controller, "GET", "/v1/pools")  # the old token
    assert status == 401


async def test_the_api_over_https_with_a_certificate_read_again_on_change(
    harness: Harness, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(serving.FileWatch, "POLL_SECONDS", 0.1)
    cert, key = self_signed(tmp_path)
    settings = Settings(
        pools_path=write_pools(tmp_path / "p.yaml", pool_doc("py", idle=1)),
        listen=("127.0.0.1", 0),
        insecure_no_auth=True,
        tls_cert=cert,
        tls_key=key,
    )
    controller = Controller(settings, NomadConfig.from_env({"NOMAD_ADDR": harness.server.url}))
    await controller.start()
    try:
        assert controller.url.startswith("https://")

        async def served_by(ca: Path) -> bool:
            context = ssl.create_default_context(cafile=str(ca))
            async with aiohttp.ClientSession() as http:
                try:
                    async with http.get(controller.url + "/healthz", ssl=context) as response:
                        return response.status == 200
                except aiohttp.ClientConnectorCertificateError:
                    return False

        assert await served_by(cert)
        kept = tmp_path / "first-cert.pem"
        kept.write_bytes(cert.read_bytes())
        self_signed(tmp_path)  # a new certificate and key in the same files
        await wait_until(lambda: served_by(cert), what="the new certificate to be served")
        assert not await served_by(kept)
    finally:
        await controller.stop()


async def test_a_claim_before_nomad_was_ever_reached_is_nomad_unavailable(tmp_path: Path) -> None:
    settings = Settings(
        pools_path=write_pools(tmp_path / "p.yaml", pool_doc("py", idle=1)),
        listen=("127.0.0.1", 0),
        insecure_no_auth=True,
    )
    controller = Controller(settings, NomadConfig.from_env({"NOMAD_ADDR": "http://127.0.0.1:1"}))
    await controller.start()
    try:
        async with (
            aiohttp.ClientSession() as http,
            http.post(controller.url + "/v1/pools/default/py/claims", json={}) as r,
        ):
            body = await r.json()
        assert (r.status, body["error"]["code"]) == (503, "NomadUnavailable")
        assert "not read from Nomad yet" in body["error"]["message"]
    finally:
        await controller.stop()


def test_status_watch_keeps_watching_through_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    answers: list[Any] = [status_command.StatusError("http://x/v1/pools: 503 Nomad is down")]
    rounds = 0

    def render(base_url: str, token: str | None) -> Any:
        if answers:
            raise answers.pop()
        return "2 pools, all ready"

    def sleep(_: float) -> None:
        nonlocal rounds
        rounds += 1
        if rounds == 3:
            raise KeyboardInterrupt

    shown: list[str] = []

    class Live:  # records what --watch shows, as a terminal would see each update
        def __init__(self, first: Any, **_: Any) -> None:
            pass

        def __enter__(self) -> Live:
            return self

        def __exit__(self, *_: object) -> None:
            pass

        def update(self, renderable: Any) -> None:
            console = Console(record=True, width=100)
            console.print(renderable)
            shown.append(console.export_text())

    monkeypatch.setattr(status_command, "render", render)
    monkeypatch.setattr(status_command, "Live", Live)
    monkeypatch.setattr(time, "sleep", sleep)
    args = argparse.Namespace(url="http://x", token_file=None, watch=True)
    assert status_command.main(args) == 0  # Ctrl-C ends a watch normally
    assert "503 Nomad is down; retrying" in shown[0]
    assert shown[1:] == ["2 pools, all ready\n", "2 pools, all ready\n"]


def test_tls_flags_go_together() -> None:
    with pytest.raises(UsageError, match="together"):
        serving.tls_files("cert.pem", None)


@pytest.mark.parametrize("ttl", [0.5, 9.9])
def test_lease_ttl_below_nomads_minimum_is_refused(ttl: float) -> None:
    with pytest.raises(UsageError, match="minimum"):
        service.lease_ttl(ttl)


async def test_api_scope_check_happens_before_the_body_is_read(
    harness: Harness, tmp_path: Path
) -> None:
    controller = await scoped(harness, tmp_path)
    await harness.api(controller, "GET", "/healthz", token=None)  # opens the session
    assert harness.http is not None
    headers = {"Authorization": f"Bearer {PYTHON}"}
    async with harness.http.post(
        controller.url + "/v1/pools/default/java/claims", data=b"{not json", headers=headers
    ) as response:
        assert response.status == 403
    await asyncio.sleep(0)
