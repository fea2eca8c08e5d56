"""The demo, as an installed poolkeeper runs it: from the built wheel, in a folder that
is not the repository, so it can only use what the package ships (its example pools)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel of this checkout, unpacked: a site-packages holding only poolkeeper. It is
    built from a copy, since a build writes into its source tree."""
    source = tmp_path_factory.mktemp("source")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(ROOT / "controller", source / "controller", ignore=ignore)
    wheels = tmp_path_factory.mktemp("wheels")
    build = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
    subprocess.run([*build, "-w", str(wheels), str(source)], check=True, cwd=wheels)
    (wheel,) = wheels.glob("poolkeeper-*.whl")
    site = tmp_path_factory.mktemp("site")
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)
    return site


def test_the_wheel_ships_the_demo_pools(installed: Path) -> None:
    shipped = installed / "controller" / "lab" / "examples" / "pools.yaml"
    assert shipped.read_text() == (ROOT / "examples" / "pools.yaml").read_text()


@pytest.mark.slow
def test_the_installed_demo_holds_every_invariant_from_any_folder(
    installed: Path, tmp_path: Path
) -> None:
    # The wheel comes first on the path, ahead of this checkout's editable install.
    env = {**os.environ, "PYTHONPATH": str(installed), "COLUMNS": "120"}
    result = subprocess.run(
        [sys.executable, "-m", "controller", "demo"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "every invariant held" in result.stdout
    steps = ("instant reschedule", "goes down", "claim", "upload", "main.py ran", "time limit")
    for step in (*steps, "release", "scale", "image changes"):
        assert step in result.stdout
    imported = subprocess.run(
        [sys.executable, "-c", "import controller; print(controller.__file__)"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert imported.stdout.strip().startswith(str(installed))
