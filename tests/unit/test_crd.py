"""The RunnerPool CRD is written from the model (controller/crd.py, `make crds`): both
files are what it writes now, the status schema is what the controller writes, and the
writer refuses what it cannot say structurally. That the API server then takes the CRD and
judges documents as the model does: tests/operator/test_crd_agreement.py."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel, Field

from controller import crd
from controller.core.breaker import BreakerState
from controller.core.classify import classify
from controller.core.demand import IdleTarget, TargetReason
from controller.core.leases import LeaseStanding, LeaseState
from controller.core.problems import PoolProblem, Problem
from controller.core.status import compute_status
from controller.model import NOT_BLANK_PATTERN, RunnerPoolStatus
from tests.support.builders import NOW, POLICY, alloc, job, observe

ROOT = Path(__file__).resolve().parents[2]
FILES = [
    ROOT / "crds" / f"{crd.NAME}.yaml",
    ROOT / "charts" / "poolkeeper" / "crds" / f"{crd.NAME}.yaml",
]


@pytest.mark.parametrize("path", FILES, ids=lambda path: str(path.relative_to(ROOT)))
def test_the_crd_files_are_what_the_model_writes(path: Path) -> None:
    assert path.read_text(encoding="utf-8") == crd.render(), "stale: run `make crds`"


def test_check_names_a_stale_file_and_write_mends_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stale = tmp_path / "crd.yaml"
    stale.write_text(crd.render().replace("maximum: 600", "maximum: 601"), encoding="utf-8")
    assert crd.main(["--check", str(stale)]) == 1
    assert f"{stale}: not the CRD of controller/model.py" in capsys.readouterr().err
    assert crd.main([str(stale), str(tmp_path / "new.yaml")]) == 0
    assert crd.main(["--check", str(stale), str(tmp_path / "new.yaml")]) == 0
    assert yaml.safe_load(stale.read_text(encoding="utf-8")) == crd.crd()


def test_not_blank_is_every_character_but_pythons_whitespace() -> None:
    """The image's pattern (RE2) is the model's strip() check: derived here from
    str.isspace() over every code point."""
    spaces = [c for c in range(sys.maxunicode + 1) if chr(c).isspace()]
    runs: list[list[int]] = []
    for code in spaces:
        if runs and runs[-1][1] == code - 1:
            runs[-1][1] = code
        else:
            runs.append([code, code])
    classes = "".join(
        f"\\x{{{low:x}}}" if low == high else f"\\x{{{low:x}}}-\\x{{{high:x}}}"
        for low, high in runs
    )
    assert f"[^{classes}]" == NOT_BLANK_PATTERN


def _field(schema: dict[str, Any], json_path: str) -> dict[str, Any]:
    """The schema of the field a printer column's JSONPath reads (a filter reads items)."""
    node = schema
    for part in re.sub(r"\[[^]]*\]", "[]", json_path).removeprefix(".").split("."):
        name, items, _ = part.partition("[]")
        node = node["properties"][name]
        if items:
            node = node["items"]
    return node


def test_printer_columns_and_scale_read_fields_the_schema_has() -> None:
    (version,) = crd.crd()["spec"]["versions"]
    schema = version["schema"]["openAPIV3Schema"]
    paths = [c["jsonPath"] for c in version["additionalPrinterColumns"]]
    paths += [p for k, p in version["subresources"]["scale"].items() if k.endswith("Path")]
    for path in paths:
        if not path.startswith(".metadata."):
            assert _field(schema, path)["type"], path


def _written(**changes: Any) -> dict[str, Any]:
    """A status as the controller computes it for a pool of two idle runners."""
    runners = classify(POLICY, observe([job(1), job(2)], [alloc(1, "a1"), alloc(2, "a2")]), NOW)
    arguments: dict[str, Any] = {
        "now": NOW,
        "previous": None,
        "observed_generation": 3,
        "breaker": BreakerState(),
    }
    return compute_status(POLICY, runners, **(arguments | changes)).to_dict()


@pytest.mark.parametrize(
    "written",
    [
        _written(),
        _written(breaker=BreakerState(3, None, 1, "Driver Failure: Failed to pull image")),
        _written(blocked=PoolProblem(Problem.PREFIX_CONFLICT, "prefix of pool a/b")),
        _written(lease=LeaseState(LeaseStanding.ELSEWHERE, "operator-1", "spec-b")),
        _written(target=IdleTarget(5, TargetReason.DEMAND, 2, 12.5, 3.25)),
        _written(target=IdleTarget(5, TargetReason.DEMAND, 2, 0.0)),
    ],
    ids=["plain", "breaker-open", "blocked", "lease-elsewhere", "demand", "demand-unmeasured"],
)
def test_the_status_schema_takes_what_the_controller_writes(written: dict[str, Any]) -> None:
    status = RunnerPoolStatus.model_validate(written)
    assert status.model_dump(mode="json", by_alias=True, exclude_none=True) == written


class _Floats(BaseModel):
    ratio: float = Field(gt=0)


class _Either(BaseModel):
    value: int | str


@pytest.mark.parametrize(
    ("model", "problem"),
    [(_Floats, "exclusiveMinimum 0 of a number"), (_Either, "a union of")],
)
def test_what_has_no_structural_form_is_refused(model: type[BaseModel], problem: str) -> None:
    with pytest.raises(crd.SchemaError, match=problem):
        crd.schema_of(model)
