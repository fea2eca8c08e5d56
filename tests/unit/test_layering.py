"""The package layering, checked on the import statements of every module (AST).

- controller/core is pure: it imports only the standard library, controller.core and
  croniter (a cron parser: pure computation, no I/O; docs/architecture.md says why);
- the product never imports the lab (controller.lab: simulator, demo, bench, chaos);
  the CLI names the lab's commands by module path and loads them only when one runs;
- only controller/operator imports kopf, and only its public API (no `kopf._*` module or
  attribute: kopf's internals change without notice, docs/operator.md says why);
- the CRD writer (controller/crd.py, `make crds`) writes the CRD from the model alone: of
  the controller it imports controller.model only, and no module of the product imports
  it (a build step, beside the model it describes, not a part of any front door);
- the engine and the claim protocol know nothing of the front doors (api, poseidon,
  operator, sources, service, standalone);
- the claim path (claims, executions, the pool directory, the API and the Poseidon API,
  what serves them) reads pools through the directory, never the engine; and the API tier
  (`poolkeeper api`) does not even load an engine module, transitively;
- the Poseidon API (controller/poseidon) is thin over the engine, the claims and the pool
  sources: it reaches Nomad only through them (of controller.nomad it may name only the
  errors), and of the other front doors it uses only the API tokens (controller.api.auth)
  and how an app adds its routes (controller.api.routing);
  the poolkeeper API does not import it;
- what processes share through Nomad is read and written in controller/records only: no
  other module calls the Variables or Locks port (the Nomad client implements it, and the
  simulator is Nomad), and records/ builds on core, the Nomad port and its errors alone.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "controller"
# The one third-party package the pure core may use.
CORE_LIBRARIES = frozenset({"croniter"})
FRONT_DOORS = (
    "controller.api",
    "controller.poseidon",
    "controller.operator",
    "controller.sources",
    "controller.service",
    "controller.standalone",
    "controller.cli",
)


# Packages of the claim path: they read pools through controller.directory only.
CLAIM_PATH = (
    "controller.claims",
    "controller.directory",
    "controller.executions",
    "controller.api",
    "controller.poseidon",
    "controller.serving",
    "controller.api_tier",
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


# The Variables and Locks port (controller/nomad/port.py): called only from these.
RECORD_CALLS = frozenset(
    {
        "list_variables",
        "read_variable",
        "put_variable",
        "delete_variable",
        "wait_variables",
        "wait_variable",
        "acquire_lock",
        "renew_lock",
        "release_lock",
        "write_locked",
    }
)
RECORD_CALLERS = ("controller.records", "controller.nomad.client", "controller.lab.simulator")
# What the shared records build on.
RECORDS_USE = ("controller.core", "controller.nomad.port", "controller.nomad.errors")
RECORDS_USE_MODULES = frozenset({"controller.tasks"})


def record_calls(path: Path) -> list[str]:
    """The Variables and Locks port methods a module calls."""
    tree = ast.parse(path.read_text(), filename=str(path))
    return [
        node.func.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in RECORD_CALLS
    ]


def records_violations(module: str, path: Path) -> list[str]:
    found = [
        f"{module} calls the Variables port outside controller.records: {call}"
        for call in sorted(set(record_calls(path)))
        if not within(module, *RECORD_CALLERS)
    ]
    if within(module, "controller.records"):
        found += [
            f"{module} (shared records) imports {imported}"
            for imported in imports(path)
            if within(imported, "controller")
            and not within(imported, "controller.records", *RECORDS_USE)
            and imported not in RECORDS_USE_MODULES
        ]
    return found


def violations(package_root: Path) -> list[str]:
    found: list[str] = []
    for path in sorted(package_root.rglob("*.py")):
        module = module_name(path, package_root)
        found += records_violations(module, path)
        for imported in imports(path):
            top = imported.split(".")[0]
            pure = (
                top in sys.stdlib_module_names
                or top in CORE_LIBRARIES
                or within(imported, "controller.core")
            )
            if within(module, "controller.core") and not pure:
                found.append(f"{module} (pure core) imports {imported}")
            if not within(module, "controller.lab") and within(imported, "controller.lab"):
                found.append(f"{module} (product) imports the lab: {imported}")
            if top == "kopf" and not within(module, "controller.operator"):
                found.append(f"{module} imports kopf outside controller.operator")
            if top == "kopf" and any(part.startswith("_") for part in imported.split(".")):
                found.append(f"{module} imports kopf's internals: {imported}")
            found += crd_writer_violations(module, imported)
            if within(module, "controller.engine", "controller.claims") and within(
                imported, *FRONT_DOORS
            ):
                found.append(f"{module} imports a front door: {imported}")
            if within(module, *CLAIM_PATH) and within(imported, "controller.engine"):
                found.append(f"{module} (claim path) imports the engine: {imported}")
            found += poseidon_violations(module, imported)
        found += [f"{module} uses kopf's internals: kopf.{name}" for name in kopf_internals(path)]
    return found


def kopf_internals(path: Path) -> list[str]:
    """The private names a module reaches through ``kopf.`` (``kopf._core``)."""
    return [
        node.attr
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path)))
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "kopf"
        and node.attr.startswith("_")
    ]


def crd_writer_violations(module: str, imported: str) -> list[str]:
    writer = "controller.crd"
    if within(module, writer) and within(imported, "controller") and imported != "controller.model":
        return [f"{module} (the CRD writer) imports {imported}: the CRD is the model's alone"]
    if within(imported, writer) and not within(module, writer):
        return [f"{module} imports the CRD writer {imported}: it is a build step"]
    return []


# What the Poseidon API may use of the modules it must not reach into.
POSEIDON_MAY_USE = frozenset(
    {"controller.nomad.errors", "controller.api.auth", "controller.api.routing"}
)


def poseidon_violations(module: str, imported: str) -> list[str]:
    if within(module, "controller.api") and within(imported, "controller.poseidon"):
        return [f"{module} (the poolkeeper API) imports the Poseidon API: {imported}"]
    if not within(module, "controller.poseidon") or imported in POSEIDON_MAY_USE:
        return []
    if within(imported, "controller.nomad"):
        return [f"{module} (Poseidon API) reaches Nomad directly: {imported}"]
    others = [
        door for door in FRONT_DOORS if door not in ("controller.poseidon", "controller.sources")
    ]
    if within(imported, *others):
        return [f"{module} (Poseidon API) imports another front door: {imported}"]
    return []


def test_the_layering_holds() -> None:
    assert violations(PACKAGE) == []


def loaded(package_root: Path, module: str) -> set[str]:
    """Every controller module importing `module` loads, transitively (the packages along
    the way and the submodules `from package import module` names included)."""
    files = {module_name(p, package_root): p for p in package_root.rglob("*.py")}
    seen: set[str] = set()
    todo = [module]
    while todo:
        parts = todo.pop().split(".")
        for i in range(2, len(parts) + 1):
            prefix = ".".join(parts[:i])
            if prefix in files and prefix not in seen:
                seen.add(prefix)
                todo += [m for m in submodules(files[prefix]) if m.startswith("controller.")]
    return seen


def submodules(path: Path) -> list[str]:
    """What a module imports, with `from X import Y` also as X.Y (Y may be a module)."""
    names = imports(path)
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names += [f"{node.module}.{alias.name}" for alias in node.names]
    return names


def test_the_api_tier_loads_no_engine_and_no_operator() -> None:
    modules = loaded(PACKAGE, "controller.api_tier")
    assert "controller.claims.service" in modules  # the closure is really followed
    assert [m for m in modules if within(m, "controller.engine", "controller.operator")] == []


def test_the_closure_follows_imports(tmp_path: Path) -> None:
    root = tmp_path / "controller"
    (root / "a").mkdir(parents=True)
    (root / "a" / "__init__.py").write_text("")
    (root / "a" / "top.py").write_text("from controller.b import mid\n")
    (root / "b").mkdir()
    (root / "b" / "mid.py").write_text("import controller.engine.deep\n")
    (root / "engine").mkdir()
    (root / "engine" / "deep.py").write_text("import os\n")
    assert "controller.engine.deep" in loaded(root, "controller.a.top")


@pytest.mark.parametrize(
    ("module", "source", "expected"),
    [
        ("core/bad.py", "import aiohttp\n", "controller.core.bad (pure core) imports aiohttp"),
        (
            "core/bad.py",
            "from dateutil import tz\n",  # croniter's own dependency is not allowed
            "controller.core.bad (pure core) imports dateutil",
        ),
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
            "operator/bad.py",
            "from kopf._core.engines import daemons\n",
            "controller.operator.bad imports kopf's internals: kopf._core.engines",
        ),
        (
            "operator/bad.py",
            "import kopf\nhook = kopf._core\n",
            "controller.operator.bad uses kopf's internals: kopf._core",
        ),
        (
            "claims/bad.py",
            "from controller.api.app import create_app\n",
            "controller.claims.bad imports a front door: controller.api.app",
        ),
        (
            "engine/bad.py",
            "from controller.poseidon.app import Poseidon\n",
            "controller.engine.bad imports a front door: controller.poseidon.app",
        ),
        (
            "poseidon/bad.py",
            "from controller.nomad.client import NomadClient\n",
            "controller.poseidon.bad (Poseidon API) reaches Nomad directly: "
            "controller.nomad.client",
        ),
        (
            "poseidon/bad.py",
            "from controller.api.routes import ROUTES\n",
            "controller.poseidon.bad (Poseidon API) imports another front door: "
            "controller.api.routes",
        ),
        (
            "api/bad.py",
            "import controller.poseidon.app\n",
            "controller.api.bad (the poolkeeper API) imports the Poseidon API: "
            "controller.poseidon.app",
        ),
        (
            "crd.py",
            "from controller.core.status import PoolStatus\n",
            "controller.crd (the CRD writer) imports controller.core.status: the CRD is the "
            "model's alone",
        ),
        (
            "operator/bad.py",
            "from controller.crd import render\n",
            "controller.operator.bad imports the CRD writer controller.crd: it is a build step",
        ),
        (
            "claims/bad.py",
            "from controller.engine.engine import Engine\n",
            "controller.claims.bad (claim path) imports the engine: controller.engine.engine",
        ),
        (
            "engine/bad.py",
            "async def f(port):\n    await port.put_variable('p', {}, 'default', cas=0)\n",
            "controller.engine.bad calls the Variables port outside controller.records: "
            "put_variable",
        ),
        (
            "records/bad.py",
            "from controller.engine.registry import PoolRegistry\n",
            "controller.records.bad (shared records) imports controller.engine.registry",
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
    (root / "core" / "fine.py").write_text(
        "import dataclasses\nfrom croniter import croniter\nfrom controller.core import x\n"
    )
    (root / "poseidon").mkdir(exist_ok=True)
    (root / "poseidon" / "fine.py").write_text(
        "from controller.api.auth import Scope\nfrom controller.nomad.errors import NomadError\n"
        "from controller.claims.service import ClaimService\n"
        "from controller.sources.environments import EnvironmentStore\n"
    )
    assert violations(root) == [expected]
