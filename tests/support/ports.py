"""Loopback ports for servers a test starts itself."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A loopback port nothing listens on right now (for a process that must be told its
    port, or for an address where a connection is refused)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
