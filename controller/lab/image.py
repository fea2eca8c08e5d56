"""The poolkeeper image built here (``scripts/build-image.sh``, ``make image``), and podman
run the way that script runs it: the project's own image store, overlay storage, cgroupfs,
runc, and no container raising an rlimit (this machine refuses that).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Final

REPO: Final = Path(__file__).resolve().parents[2]
BUILD_SCRIPT: Final = REPO / "scripts" / "build-image.sh"
FETCH_SCRIPT: Final = REPO / "scripts" / "fetch-node.sh"
# The same store and settings as scripts/build-image.sh.
PODMAN: Final = (
    "podman",
    "--root", "/var/lib/poolkeeper/containers",
    "--runroot", "/run/poolkeeper/containers",
    "--storage-driver", "overlay",
    "--cgroup-manager", "cgroupfs",
    "--runtime", "runc",
)  # fmt: skip
# What a container may have: no more than this machine gives (raising is refused).
ULIMITS: Final = ("--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024")


class ImageError(RuntimeError):
    """The image could not be built or handled (the message says why)."""


def unavailable() -> str:
    """Why the image cannot be built here ("" when it can): podman needs root."""
    if os.geteuid() != 0:
        return "building and running images here needs root"
    if shutil.which("podman") is None:
        return "podman is not installed (scripts/fetch-node.sh installs it)"
    return ""


def install_tools() -> bool:
    """scripts/fetch-node.sh: Debian's podman, containerd, runc, CNI plugins, iptables and
    debootstrap where missing; whether they are all here now. Its messages go to stderr."""
    return subprocess.run(["bash", str(FETCH_SCRIPT)], stdin=subprocess.DEVNULL).returncode == 0


def build() -> str:
    """scripts/build-image.sh (a no-op when the image is current); the image's reference.
    Its progress goes to this process's stderr."""
    result = subprocess.run(
        ["bash", str(BUILD_SCRIPT)], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True
    )
    if result.returncode != 0:
        raise ImageError(f"scripts/build-image.sh failed ({result.returncode})")
    return result.stdout.strip().splitlines()[-1]


def podman(
    *args: str, check: bool = True, timeout: float = 300.0
) -> subprocess.CompletedProcess[str]:
    """podman with the project's store and settings; text output."""
    result = subprocess.run(
        [*PODMAN, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        stdin=subprocess.DEVNULL,
    )
    if check and result.returncode != 0:
        raise ImageError(f"podman {' '.join(args)} exited {result.returncode}:\n{result.stderr}")
    return result


def run(
    image: str, *args: str, options: Sequence[str] = (), timeout: float = 120.0
) -> subprocess.CompletedProcess[str]:
    """``podman run --rm`` of ``image`` with ``args``, on the host's network, as the image's
    user, its root filesystem read-only (a tmpfs on /tmp, as the chart mounts an emptyDir)."""
    return podman(
        "run", "--rm", "--network", "host", "--read-only", *ULIMITS, *options, image, *args,
        check=False, timeout=timeout,
    )  # fmt: skip


def size(image: str) -> int:
    """The image's size in bytes, as podman counts it (its layers, uncompressed)."""
    return int(podman("image", "inspect", "--format", "{{.Size}}", image).stdout)


def tag(image: str, new: str) -> None:
    """Another name for the same image."""
    podman("tag", image, new)


def save(image: str, archive: Path) -> Path:
    """The image as an OCI archive (what a container runtime imports)."""
    archive.unlink(missing_ok=True)
    podman("save", "--format", "oci-archive", "-o", str(archive), image)
    return archive
