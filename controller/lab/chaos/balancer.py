"""The API tier soak's load balancer: HAProxy on loopback in front of the API replicas.

Round robin, no sticky sessions, a health check on `/readyz`, and no retries: a request
that fails on a replica fails at the client, which must retry it (with its `requestId`).
A replica is taken out of the rotation at its first refused connection (`on-error
mark-down`) or its second failed check, and put back at its first passed one. Every
answer names the replica it went to (`X-Chaos-Replica`, empty when none was chosen), and
one that a replica gave, rather than HAProxy, says so (`X-Chaos-From: replica`): HAProxy's
own 502 and 503 carry no such header.

The binary: $POOLKEEPER_HAPROXY, else `.cache/haproxy/haproxy` (scripts/fetch-haproxy.sh,
`make haproxy`), else `haproxy` on the PATH or in /usr/sbin.
"""

from __future__ import annotations

import asyncio
import contextlib
import csv
import io
import os
import shutil
import signal
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

REPLICA_HEADER: Final = "X-Chaos-Replica"
ORIGIN_HEADER: Final = "X-Chaos-From"
ENVIRONMENT_VARIABLE: Final = "POOLKEEPER_HAPROXY"
CACHED: Final = Path(__file__).resolve().parents[3] / ".cache" / "haproxy" / "haproxy"
CHECK_INTERVAL_MS: Final = 500
# Longer than any request of the soak takes (a claim's wait, an execution).
SERVER_TIMEOUT_SECONDS: Final = 30


class BalancerMissing(RuntimeError):
    """No HAProxy binary to run."""


def haproxy_binary() -> Path:
    """The HAProxy to run, or BalancerMissing saying how to get one."""
    named = os.environ.get(ENVIRONMENT_VARIABLE)
    if named:
        if not os.access(named, os.X_OK):
            raise BalancerMissing(f"${ENVIRONMENT_VARIABLE} names {named}, not an executable")
        return Path(named)
    if os.access(CACHED, os.X_OK):
        return CACHED
    found = shutil.which("haproxy") or shutil.which("haproxy", path="/usr/sbin")
    if found:
        return Path(found)
    raise BalancerMissing(
        "HAProxy is needed for the API tier soak: `make haproxy` (scripts/fetch-haproxy.sh) "
        f"puts Debian's at {CACHED}, or set ${ENVIRONMENT_VARIABLE}"
    )


def server_name(index: int) -> str:
    return f"api-{index + 1}"


def config(port: int, replica_ports: Sequence[int], stats_socket: Path) -> str:
    """HAProxy's configuration: one frontend on `port`, one server per replica port."""
    server_options = (
        f"check inter {CHECK_INTERVAL_MS}ms fall 2 rise 1 "
        "observe layer4 error-limit 1 on-error mark-down"
    )
    servers = "\n".join(
        f"    server {server_name(i)} 127.0.0.1:{p} {server_options}"
        for i, p in enumerate(replica_ports)
    )
    return f"""\
global
    maxconn 512
    stats socket {stats_socket} mode 600 level admin
    log stdout format raw local0

defaults
    mode http
    log global
    option httplog
    timeout connect 2s
    timeout client {SERVER_TIMEOUT_SECONDS}s
    timeout server {SERVER_TIMEOUT_SECONDS}s
    timeout check 2s
    # A failed connection to a replica is the client's failure, not retried elsewhere.
    retries 0

frontend api
    bind 127.0.0.1:{port}
    default_backend replicas

backend replicas
    balance roundrobin
    option httpchk GET /readyz
    http-check expect status 200
    http-response set-header {ORIGIN_HEADER} replica
    http-after-response set-header {REPLICA_HEADER} %[srv_name]
{servers}
"""


@dataclass(frozen=True)
class ServerState:
    name: str
    up: bool
    sessions: int  # requests on it now


class Balancer:
    """HAProxy as a subprocess, its log in `workdir`, its state read on its stats socket."""

    def __init__(self, workdir: Path, port: int, replica_ports: Sequence[int]) -> None:
        self.binary = haproxy_binary()
        self.port = port
        self.config_file = workdir / "haproxy.cfg"
        self.stats_socket = workdir / "haproxy.sock"
        self.log_file = workdir / "haproxy.log"
        self.config_file.write_text(config(port, replica_ports, self.stats_socket))
        self.proc: asyncio.subprocess.Process | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        """Started in the foreground (-db), its configuration checked first."""
        with self.log_file.open("wb") as log:
            self.proc = await asyncio.create_subprocess_exec(
                str(self.binary),
                "-db",
                "-f",
                str(self.config_file),
                stdout=log,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,
            )

    def exited(self) -> int | None:
        """Its exit code once it has exited by itself."""
        return None if self.proc is None else self.proc.returncode

    async def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), 10)
            except TimeoutError:
                proc.send_signal(signal.SIGKILL)
                await proc.wait()

    async def servers(self) -> list[ServerState]:
        """The replicas as HAProxy sees them now (`show stat`); empty before it listens."""
        try:
            reader, writer = await asyncio.open_unix_connection(str(self.stats_socket))
        except OSError:
            return []
        try:
            writer.write(b"show stat\n")
            await writer.drain()
            text = (await reader.read()).decode(errors="replace")
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
        rows = csv.DictReader(io.StringIO(text.removeprefix("# ")))
        return [
            ServerState(row["svname"], row["status"].startswith("UP"), int(row["scur"] or 0))
            for row in rows
            if row.get("pxname") == "replicas" and row.get("svname") not in ("BACKEND", None)
        ]

    def log_text(self) -> str:
        return self.log_file.read_text(errors="replace") if self.log_file.exists() else ""
