"""`poolkeeper validate`: the problems `run` would report, one line each, and exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from controller.cli import main

ROOT = Path(__file__).resolve().parents[2]


def pool(name: str, **spec: object) -> dict[str, object]:
    return {
        "apiVersion": "poolkeeper.dev/v1alpha1",
        "kind": "RunnerPool",
        "metadata": {"name": name},
        "spec": {"idleRunners": 1, "runner": {"image": "python:3.12-slim"}, **spec},
    }


def test_the_examples_are_valid(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", "--pools", str(ROOT / "examples" / "pools.yaml")]) == 0
    out, err = capsys.readouterr()
    assert out == "" and err == "3 valid pools, 0 problems\n"


def test_every_problem_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "a.yaml").write_text(
        yaml.safe_dump_all(
            [
                pool("first", nomad={"jobPrefix": "shared-"}),
                pool("bad", idleRunners=-1),
                pool("template", nomad={"jobTemplate": {"TaskGroups": [{"Count": 3}]}}),
            ]
        )
    )
    (tmp_path / "b.yaml").write_text(yaml.safe_dump(pool("second", nomad={"jobPrefix": "shared-"})))
    (tmp_path / "c.yaml").write_text("spec: [unclosed\n")
    assert main(["validate", "--pools", str(tmp_path)]) == 2
    out, err = capsys.readouterr()
    a, b, c = (tmp_path / name for name in ("a.yaml", "b.yaml", "c.yaml"))
    assert out.splitlines() == [
        f"{a}:1: spec.idleRunners: input should be greater than or equal to 0",
        f"{a}:2: spec.nomad.jobTemplate.TaskGroups[0].Count: is set by poolkeeper",
        f"{b}:0: spec.nomad.jobPrefix: job prefix 'shared-' in Nomad namespace 'default' is "
        "already used by pool default/first",
        f"{c}:0: YAML syntax error: expected ',' or ']', but got '<stream end>' (line 2, "
        "column 1); no pool of this file was loaded",
    ]
    assert err == "1 valid pools, 4 problems\n"


def test_a_missing_path_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", "--pools", "/nonexistent/pools"]) == 2
    assert capsys.readouterr().err == (
        "poolkeeper validate: --pools /nonexistent/pools: no such file or folder\n"
    )
