"""The go-bexpr subset used by filter= on list endpoints."""

from __future__ import annotations

import pytest

from controller.lab.simulator.bexpr import FilterError, compile_filter

DOC = {
    "ID": "abc-123",
    "ClientStatus": "running",
    "Count": 3,
    "Stop": False,
    "Meta": {"pool": "py", "tier": "gold"},
    "Tags": ["a", "b"],
    "Empty": "",
    "TaskStates": {"main": {"State": "running", "Restarts": 2}},
}


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ('ClientStatus == "running"', True),
        ("ClientStatus == running", True),
        ('ClientStatus != "running"', False),
        ("Count == 3", True),
        ("Stop == false", True),
        ('Meta.pool == "py"', True),
        ('Meta.missing == "x"', False),
        ('Meta.missing != "x"', True),
        ('ID matches "^abc-[0-9]+$"', True),
        ('ID not matches "^x"', True),
        ('ID contains "c-1"', True),
        ('Tags contains "b"', True),
        ('Meta contains "tier"', True),
        ('"a" in Tags', True),
        ('"z" not in Tags', True),
        ("Empty is empty", True),
        ("Meta is not empty", True),
        ('TaskStates.main.State == "running" and TaskStates.main.Restarts == 2', True),
        ('not (Meta.pool == "py") or Count == 4', False),
        ("(Count == 4 or Count == 3) and not Stop == true", True),
    ],
)
def test_expressions(expr: str, expected: bool) -> None:
    assert compile_filter(expr)(DOC) is expected


@pytest.mark.parametrize(
    "expr",
    ["", "ClientStatus ===", "(Count == 3", "Count == 3 and", "== 3", 'ID matches "["', "a b c"],
)
def test_bad_expressions(expr: str) -> None:
    with pytest.raises(FilterError):
        compile_filter(expr)
