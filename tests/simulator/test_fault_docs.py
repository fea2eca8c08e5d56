"""docs/simulator.md's fault table names each fault as the route takes it: the method's
own parameter names and defaults, since a route's JSON body holds its keyword arguments."""

from __future__ import annotations

import ast
import inspect
import json
import re
from pathlib import Path
from typing import Any

from controller.lab.simulator import Simulator
from controller.lab.simulator.api import SIM_FAULTS

DOCS = Path(__file__).resolve().parents[2] / "docs" / "simulator.md"
ROW = re.compile(r"^\| `(?:await )?(\w+)\(([^)]*)\)(?: -> \w+)?` \|", re.MULTILINE)
EXAMPLE = re.compile(r"^curl -X POST \$S/_sim/(\w+)(?: -d '(.*)')?$", re.MULTILINE)


def documented() -> dict[str, dict[str, Any]]:
    """Each documented fault: its parameters, with the default the table gives or None."""
    faults = {}
    for name, params in ROW.findall(DOCS.read_text(encoding="utf-8")):
        parameters: dict[str, Any] = {}
        for param in filter(None, (p.strip() for p in params.split(","))):
            key, _, default = param.partition("=")
            parameters[key] = ast.literal_eval(default) if default else None
        faults[name] = parameters
    return faults


def test_every_fault_is_documented_with_the_parameters_its_route_takes() -> None:
    faults = documented()
    assert set(faults) == set(SIM_FAULTS)
    for name, parameters in faults.items():
        signature = inspect.signature(getattr(Simulator, name))
        actual = {k: v for k, v in signature.parameters.items() if k != "self"}
        assert list(parameters) == list(actual), name
        for key, default in parameters.items():
            if default is not None:
                assert default == actual[key].default, f"{name}({key}=...)"


def test_the_curl_examples_send_parameters_the_routes_take() -> None:
    faults = documented()
    examples = EXAMPLE.findall(DOCS.read_text(encoding="utf-8"))
    assert examples
    for name, body in examples:
        assert name in faults, name
        assert set(json.loads(body or "{}")) <= set(faults[name]), name
