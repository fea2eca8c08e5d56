"""Self-signed certificates for loopback TLS tests (openssl is on every test machine)."""

from __future__ import annotations

import subprocess
from pathlib import Path


def self_signed(folder: Path, stem: str = "") -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and its key, written into `folder`."""
    cert, key = folder / f"{stem}cert.pem", folder / f"{stem}key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return cert, key
