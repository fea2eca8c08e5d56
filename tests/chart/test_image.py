"""The image built here (scripts/build-image.sh) run by podman as the chart runs it: as
10001:10001, its root filesystem read-only. (Its pods on a real node: test_chart_on_node.py.)
"""

from __future__ import annotations

import json
import signal
import time
import urllib.request
from importlib.metadata import version
from typing import Final

import pytest

from controller.lab import image as images
from tests.support.ports import free_port

pytestmark = pytest.mark.slow

AS_THE_CHART: Final = ("--user", "10001:10001")


def test_version(poolkeeper_image: str) -> None:
    ran = images.run(poolkeeper_image, "--version", options=AS_THE_CHART)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout == f"poolkeeper {version('poolkeeper')}\n"


def test_its_user_is_10001_and_its_root_filesystem_stays_read_only(poolkeeper_image: str) -> None:
    """The image's own USER is the chart's, so it runs so without a security context too."""
    ran = images.run(poolkeeper_image, options=("--entrypoint", "id"))
    assert ran.stdout.startswith("uid=10001(poolkeeper) gid=10001(poolkeeper) "), ran
    script = "import pathlib; pathlib.Path('/opt/poolkeeper/x').write_text('')"
    ran = images.run(poolkeeper_image, "-c", script, options=("--entrypoint", "python3"))
    assert ran.returncode != 0 and "Read-only file system" in ran.stderr, ran


def test_sim_serves_and_stops_on_sigterm(poolkeeper_image: str) -> None:
    address = f"127.0.0.1:{free_port()}"
    name = f"poolkeeper-sim-{free_port()}"
    started = images.podman(
        "run", "--detach", "--name", name, "--network", "host", "--read-only",
        *images.ULIMITS, *AS_THE_CHART, poolkeeper_image, "sim", "--listen", address,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://{address}/v1/nodes", timeout=2) as answer:
                    nodes = json.loads(answer.read())
                break
            except OSError:
                assert time.monotonic() < deadline, images.podman("logs", name).stderr
                time.sleep(0.2)
        assert sorted(node["Name"] for node in nodes) == ["sim-node-1", "sim-node-2", "sim-node-3"]
        images.podman("kill", "--signal", signal.SIGTERM.name, name)
        exited = images.podman("wait", name).stdout.strip()
        assert exited == "0", images.podman("logs", name).stderr
    finally:
        images.podman("rm", "--force", name, check=False)
    assert started.stdout.strip()
