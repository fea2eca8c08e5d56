"""One real etcd and kube-apiserver for the session (controller/lab/kube.py), for
every test folder that needs a Kubernetes API (tests/kube, tests/operator).

The binaries come from scripts/build-kube.sh, run here first: a no-op when current, minutes
on a fresh machine (its progress is shown). With $KUBE_BIN_DIR set, the binaries there are
used as they are. Without Go and without binaries the tests are skipped, or failed where
$POOLKEEPER_REQUIRE_KUBE is set.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import pytest

from controller.lab import kube as kube_cluster
from controller.lab.kube import KubeCluster

REQUIRE_KUBE: Final = "POOLKEEPER_REQUIRE_KUBE"
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


def _unavailable(message: str) -> None:
    if os.environ.get(REQUIRE_KUBE):
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


@pytest.fixture(scope="session")
def kube_bin_dir(pytestconfig: pytest.Config) -> Path:
    """The folder with etcd, kube-apiserver and kubectl, built first if need be."""
    folder = kube_cluster.bin_dir()
    can_build = kube_cluster.BUILD_SCRIPT.is_file() and shutil.which("go") is not None
    if "KUBE_BIN_DIR" not in os.environ and can_build:
        capture = pytestconfig.pluginmanager.getplugin("capturemanager")
        with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
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


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for cluster in _started:
        t = cluster.timings
        terminalreporter.write_line(
            f"kube cluster {kube_cluster.release()}: etcd healthy in {t.etcd:.2f} s, "
            f"kube-apiserver ready in {t.apiserver:.2f} s, {t.total:.2f} s in all "
            f"(logs in {cluster.workdir})"
        )
