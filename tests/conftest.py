"""One real etcd and kube-apiserver for the session (controller/lab/kube.py), for
every test folder that needs a Kubernetes API (tests/kube, tests/operator); and, on demand,
a cluster with a real node (controller/lab/node.py) and the image built here
(scripts/build-image.sh) for the tests that run the chart's pods.

The binaries come from scripts/build-kube.sh, run here first: a no-op when current, minutes
on a fresh machine (its progress is shown). With $KUBE_BIN_DIR set, the binaries there are
used as they are. Without Go and without binaries the tests are skipped, or failed where
$POOLKEEPER_REQUIRE_KUBE is set. The node and the image need root and Debian's podman,
containerd, runc, CNI plugins and iptables (scripts/fetch-node.sh installs them); without
them their tests are skipped, or failed where $POOLKEEPER_REQUIRE_NODE is set.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import pytest

from controller.lab import image as images
from controller.lab import kube as kube_cluster
from controller.lab import node as kube_node_lab
from controller.lab.kube import KubeCluster
from controller.lab.node import KubeNode

REQUIRE_KUBE: Final = "POOLKEEPER_REQUIRE_KUBE"
REQUIRE_NODE: Final = "POOLKEEPER_REQUIRE_NODE"
# What service accounts ask of the server is logged (kube.audit_events()): the operator's
# tests check which requests it made and that none was refused. A watch is logged when it
# starts (ResponseStarted) and when it ends; any other request when it completes.
AUDIT_POLICY: Final = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [
        {"level": "Metadata", "userGroups": ["system:serviceaccounts"]},
        {"level": "None"},
    ],
}

_started: list[KubeCluster] = []
_nodes: list[KubeNode] = []
_images: list[tuple[str, float]] = []  # (reference, seconds to build or find it)


def _unavailable(message: str, required_by: str = REQUIRE_KUBE) -> None:
    if os.environ.get(required_by):
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


@contextlib.contextmanager
def _uncaptured(pytestconfig: pytest.Config) -> Iterator[None]:
    """Let a build's progress through to the terminal."""
    capture = pytestconfig.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
        yield


@pytest.fixture(scope="session")
def kube_bin_dir(pytestconfig: pytest.Config) -> Path:
    """The folder with etcd, kube-apiserver and kubectl, built first if need be."""
    folder = kube_cluster.bin_dir()
    can_build = kube_cluster.BUILD_SCRIPT.is_file() and shutil.which("go") is not None
    if "KUBE_BIN_DIR" not in os.environ and can_build:
        with _uncaptured(pytestconfig):
            try:
                kube_cluster.build_binaries()
            except subprocess.CalledProcessError as error:
                pytest.fail(f"scripts/build-kube.sh failed ({error.returncode})", pytrace=False)
    missing = kube_cluster.missing_binaries(folder)
    if missing:
        why = (
            "(KUBE_BIN_DIR)"
            if "KUBE_BIN_DIR" in os.environ
            else "and no Go or no scripts/build-kube.sh to build them with"
        )
        _unavailable(f"{', '.join(missing)} missing in {folder} {why}")
    return folder


@pytest.fixture(scope="session")
def kube(kube_bin_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeCluster]:
    """A running cluster, shared by the session: make a namespace per test
    (``kube.create_namespace()``) rather than sharing objects."""
    workdir = tmp_path_factory.mktemp("kube")
    with kube_cluster.kube_cluster(
        workdir=workdir, binaries=kube_bin_dir, audit_policy=AUDIT_POLICY
    ) as cluster:
        _started.append(cluster)
        yield cluster


@pytest.fixture(scope="session")
def poolkeeper_image(pytestconfig: pytest.Config) -> str:
    """The poolkeeper image built from this checkout (scripts/build-image.sh: a no-op when
    current), with the tools it needs installed first (scripts/fetch-node.sh)."""
    reason = images.unavailable()
    if reason:
        _unavailable(reason, REQUIRE_NODE)
    started = time.monotonic()
    with _uncaptured(pytestconfig):
        if not images.install_tools():
            _unavailable("scripts/fetch-node.sh could not install the node's tools", REQUIRE_NODE)
        try:
            reference = images.build()
        except images.ImageError as error:
            pytest.fail(str(error), pytrace=False)
    _images.append((reference, time.monotonic() - started))
    return reference


@pytest.fixture(scope="module")
def kube_node(
    kube_bin_dir: Path, poolkeeper_image: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[KubeNode]:
    """A cluster of its own with one real node (kubelet, containerd, kube-proxy, the
    controllers) that has the poolkeeper image; its API server listens on the node's
    address, which the host's servers may use too (``node.address``). A module's own: it
    stops (one node at a time on a machine) once the module's tests are done."""
    reason = kube_node_lab.unavailable()
    if reason:
        _unavailable(reason, REQUIRE_NODE)
    with kube_node_lab.node_cluster(workdir=tmp_path_factory.mktemp("node")) as node:
        _nodes.append(node)
        node.load_image(poolkeeper_image)
        node.forget_other_images()
        yield node
    # The machine is shared: the node's stop leaves nothing of it behind.
    assert node.leftovers() == []


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for reference, seconds in _images:
        terminalreporter.write_line(
            f"image {reference}: {images.size(reference) / 1e6:.0f} MB, built or found in"
            f" {seconds:.1f} s"
        )
    for node in _nodes:
        n = node.timings
        terminalreporter.write_line(
            f"kube node {kube_cluster.release()}: API server {n.cluster:.1f} s, containerd"
            f" {n.containerd:.1f} s, pause image {n.images:.1f} s, kubelet Ready with the"
            f" controllers and kube-proxy {n.node:.1f} s, {n.total:.1f} s in all; images"
            f" loaded in {n.loads:.1f} s (logs in {node.workdir})"
        )
    for cluster in _started:
        t = cluster.timings
        terminalreporter.write_line(
            f"kube cluster {kube_cluster.release()}: etcd healthy in {t.etcd:.2f} s, "
            f"kube-apiserver ready in {t.apiserver:.2f} s, {t.total:.2f} s in all "
            f"(logs in {cluster.workdir})"
        )
