"""`poolkeeper sim`: serve the simulator until interrupted."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import socket
import ssl
import sys

from controller.lab.simulator.cluster import DEFAULT_NODES, Simulator
from controller.lab.simulator.server import start_sim


def _parse_listen(value: str) -> tuple[str, int]:
    host, sep, port_text = value.rpartition(":")
    if not sep or not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ValueError(f"invalid --listen {value!r}: expected HOST:PORT")
    return host.strip("[]") or "127.0.0.1", int(port_text)


def _ssl_context(cert: str | None, key: str | None) -> ssl.SSLContext | None:
    if not cert and not key:
        return None
    if not cert or not key:
        raise ValueError("--tls-cert and --tls-key must be given together")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(f"invalid --tls-cert/--tls-key {cert!r}/{key!r}: {exc}") from None
    return context


def _inherited_socket(fd: int | None) -> socket.socket | None:
    """The listening TCP socket a starter bound and handed down as file descriptor `fd`."""
    if fd is None:
        return None
    try:
        sock = socket.socket(fileno=fd)
    except OSError as exc:
        raise ValueError(f"invalid --listen-fd {fd}: {exc}") from None
    if sock.type != socket.SOCK_STREAM or not sock.getsockopt(
        socket.SOL_SOCKET, socket.SO_ACCEPTCONN
    ):
        sock.detach()
        raise ValueError(f"invalid --listen-fd {fd}: not a listening TCP socket")
    return sock


async def _serve(
    sim: Simulator,
    host: str,
    port: int,
    context: ssl.SSLContext | None,
    listening: socket.socket | None,
) -> None:
    server = await start_sim(sim, host, port, context, listening)
    print(f"nomad simulator listening on {server.url}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        # Event loops without signal handlers (Windows) stop on KeyboardInterrupt instead.
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await server.stop()


def main(args: argparse.Namespace) -> int:
    try:
        host, port = _parse_listen(args.listen)
        context = _ssl_context(args.tls_cert, args.tls_key)
        listening = _inherited_socket(args.listen_fd)
        if args.no_client and args.nodes:
            raise ValueError("--no-client and --node exclude each other")
        nodes = [] if args.no_client else args.nodes or list(DEFAULT_NODES)
        for name in nodes:
            if not name or not name.strip():
                raise ValueError(f"invalid --node {name!r}")
        if len(set(nodes)) != len(nodes):
            raise ValueError(f"duplicate --node in {nodes!r}")
        sim = Simulator(
            nodes=nodes,
            seed=args.seed,
            acl_enabled=args.acl_enabled,
            exec_mode=args.exec_mode,
            write_latency_ms=args.write_latency_ms,
        )
    except ValueError as exc:
        print(f"poolkeeper sim: {exc}", file=sys.stderr)
        return 2
    try:
        asyncio.run(_serve(sim, host, port, context, listening))
    except OSError as exc:
        print(f"poolkeeper sim: cannot listen on {args.listen!r}: {exc}", file=sys.stderr)
        return 2
    return 0
