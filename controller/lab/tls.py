"""Self-signed certificates for loopback TLS tests (openssl is on every test machine)."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path


def self_signed(
    folder: Path,
    stem: str = "",
    addresses: Sequence[str] = ("127.0.0.1",),
    names: Sequence[str] = (),
) -> tuple[Path, Path]:
    """A certificate for `addresses` (IPs) and `names` (DNS) and its key, written into
    `folder`; its subject is the first address."""
    cert, key = folder / f"{stem}cert.pem", folder / f"{stem}key.pem"
    alt_names = ",".join([*(f"IP:{a}" for a in addresses), *(f"DNS:{n}" for n in names)])
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-keyout", str(key), "-out", str(cert), "-subj", f"/CN={addresses[0]}",
         "-addext", f"subjectAltName={alt_names}"],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return cert, key
