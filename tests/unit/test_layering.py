"""The package layering, checked on the import statements of every module (AST).

- controller/core is pure: it imports only the standard library and controller.core;
- the product never imports the lab (controller.lab: simulator, demo, bench, chaos);
  the CLI names the lab's commands by module path and loads them only when one runs;
- only controller/operator imports kopf;
- the engine and the claim protocol know nothing of the front doors (api, operator,
  sources, service, standalone).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "controller"
FRONT_DOORS = (
    "controller.api",
    "controller.operator",
    "controller.sources",
    "controller.service",
    "controller.standalone",
    "controller.cli",
)


def module_name(path: Path, package_root: Path) -> str:
    parts = path.relative_to(package_root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
    return names


def within(name: str, *packages: str) -> bool:
    return any(name == p or name.startswith(p + ".") for p in packages)


def violations(package_root: Path) -> list[str]:
    found: list[str] = []
    for path in sorted(package_root.rglob("*.py")):
        module = module_name(path, package_root)
        for imported in imports(path):
            top = imported.split(".")[0]
            if (
                within(module, "controller.core")
                and top not in sys.stdlib_module_names
                and not within(imported, "controller.core")
            ):
                found.append(f"{module} (pure core) imports {imported}")
            if not within(module, "controller.lab") and within(imported, "controller.lab"):
                found.append(f"{module} (product) imports the lab: {imported}")
            if top == "kopf" and not within(module, "controller.operator"):
                found.append(f"{module} imports kopf outside controller.operator")
            if within(module, "controller.engine", "controller.claims") and within(
                imported, *FRONT_DOORS
            ):
                found.append(f"{module} imports a front door: {imported}")
    return found


def test_the_layering_holds() -> None:
    assert violations(PACKAGE) == []


@pytest.mark.parametrize(
    ("module", "source", "expected"),
    [
        ("core/bad.py", "import aiohttp\n", "controller.core.bad (pure core) imports aiohttp"),
        (
            "core/bad.py",
            "from controller.nomad.client import NomadClient\n",
            "controller.core.bad (pure core) imports controller.nomad.client",
        ),
        (
            "engine/bad.py",
            "from controller.lab.simulator import Simulator\n",
            "controller.engine.bad (product) imports the lab: controller.lab.simulator",
        ),
        (
            "api/bad.py",
            "import kopf\n",
            "controller.api.bad imports kopf outside controller.operator",
        ),
        (
            "claims/bad.py",
            "from controller.api.app import create_app\n",
            "controller.claims.bad imports a front door: controller.api.app",
        ),
    ],
)
def test_the_check_catches_a_broken_layer(
    tmp_path: Path, module: str, source: str, expected: str
) -> None:
    root = tmp_path / "controller"
    (root / module).parent.mkdir(parents=True)
    (root / module).write_text(source)
    (root / "core").mkdir(exist_ok=True)
    (root / "core" / "fine.py").write_text("import dataclasses\nfrom controller.core import x\n")
    assert violations(root) == [expected]
