"""TLS serving (for real certificate verification) and the `poolkeeper sim` argument checks."""

from __future__ import annotations

import argparse
import socket
import ssl
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from controller.cli import build_parser
from controller.lab.simulator import Simulator, start_sim
from controller.lab.simulator.command import _inherited_socket, main
from controller.lab.tls import self_signed


async def test_tls_server_verifies_with_its_ca(tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(cert, key)
    server = await start_sim(Simulator(nodes=["n"]), ssl_context=server_ctx)
    try:
        assert server.url.startswith("https://127.0.0.1:")
        trusting = ssl.create_default_context(cafile=str(cert))
        async with aiohttp.ClientSession() as session:
            async with session.get(server.url + "/v1/status/leader", ssl=trusting) as resp:
                assert resp.status == 200
            with pytest.raises(aiohttp.ClientConnectorCertificateError):
                await session.get(
                    server.url + "/v1/status/leader", ssl=ssl.create_default_context()
                )
    finally:
        await server.stop()


def _args(**overrides: object) -> argparse.Namespace:
    values: dict[str, object] = {
        "listen": "127.0.0.1:0",
        "nodes": None,
        "no_client": False,
        "listen_fd": None,
        "acl_enabled": False,
        "seed": 0,
        "tls_cert": None,
        "tls_key": None,
        "exec_mode": "none",
        "write_latency_ms": 0.0,
    }
    values.update(overrides)
    return argparse.Namespace(**values)


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        ({"listen": "nope"}, "nope"),
        ({"listen": "127.0.0.1:99999"}, "127.0.0.1:99999"),
        ({"tls_cert": "/missing/cert.pem", "tls_key": "/missing/key.pem"}, "/missing/cert.pem"),
        ({"tls_cert": "/only/cert.pem"}, "--tls-key"),
        ({"nodes": ["a", "a"]}, "'a'"),
        ({"nodes": [""]}, "--node"),
        ({"exec_mode": "docker"}, "docker"),
        ({"write_latency_ms": -1.0}, "-1.0"),
        ({"no_client": True, "nodes": ["a"]}, "--no-client"),
        ({"listen_fd": 9999}, "--listen-fd 9999"),
    ],
)
def test_bad_values_exit_2_with_one_line(
    overrides: dict[str, object], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(_args(**overrides)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and named in err


def test_the_sim_command_takes_exec_and_write_latency() -> None:
    args = build_parser().parse_args(["sim", "--exec", "local", "--write-latency-ms", "25"])
    assert (args.exec_mode, args.write_latency_ms) == ("local", 25.0)
    defaults = build_parser().parse_args(["sim"])
    assert (defaults.exec_mode, defaults.write_latency_ms) == ("none", 0.0)


async def test_it_serves_on_a_socket_its_starter_bound() -> None:
    # As the nomad stand-in of tools/nomad-api-tests does: bind, then hand the socket down.
    bound = socket.create_server(("127.0.0.1", 0))
    port = bound.getsockname()[1]
    server = await start_sim(Simulator(nodes=["n"]), listening=_inherited_socket(bound.fileno()))
    try:
        assert server.url == f"http://127.0.0.1:{port}"
        _, nodes = await _get(server.url + "/v1/nodes")
        _, node = await _get(server.url + "/v1/node/" + nodes[0]["ID"])
        assert node["HTTPAddr"] == f"127.0.0.1:{port}"  # where Nomad's Go client dials
    finally:
        await server.stop()


def test_an_inherited_descriptor_must_be_a_listening_socket() -> None:
    unbound = socket.socket()
    with pytest.raises(ValueError, match="not a listening TCP socket"):
        _inherited_socket(unbound.fileno())
    unbound.close()


async def _get(url: str) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as session, session.get(url) as resp:
        return resp.status, await resp.json()


def test_a_server_alone_has_no_client_node() -> None:
    assert build_parser().parse_args(["sim", "--no-client"]).no_client
    assert Simulator(nodes=[]).node_names() == []
    assert len(Simulator().node_names()) == 3
