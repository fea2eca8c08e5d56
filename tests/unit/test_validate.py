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


@pytest.mark.parametrize("where", ["empty.yaml", "only-comments.yaml", "folder"])
def test_files_that_define_no_pool_fail(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], where: str
) -> None:
    (tmp_path / "empty.yaml").write_text("")
    (tmp_path / "only-comments.yaml").write_text("# the pools moved\n---\n")
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "README.md").write_text("no pools here\n")
    path = tmp_path / where
    assert main(["validate", "--pools", str(path)]) == 2
    assert capsys.readouterr() == (f"{path}: defines no pool\n", "0 valid pools, 1 problems\n")


def test_the_limits_of_run_apply(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    file = tmp_path / "p.yaml"
    file.write_text(yaml.safe_dump_all([pool("a"), pool("b")]))
    assert main(["validate", "--pools", str(file), "--max-pools", "2"]) == 0
    capsys.readouterr()
    assert main(["validate", "--pools", str(file), "--max-pools", "1"]) == 2
    assert capsys.readouterr() == (
        "",
        f"poolkeeper validate: {file}: more than 1 pool documents, over the limit of 1 "
        "(--max-pools)\n",
    )
    file.write_text("a: &a [x, x, x]\nb: &b [*a, *a, *a]\nc: [*b, *b, *b]\n")
    assert main(["validate", "--pools", str(file), "--max-pools-nodes", "20"]) == 2
    assert capsys.readouterr().err == (
        f"poolkeeper validate: {file}:0: 33 YAML nodes by line 3, column 5 (an alias counts "
        "as the nodes it expands to), over the limit of 20 (--max-pools-nodes)\n"
    )
    with pytest.raises(SystemExit) as exit_info:
        main(["validate", "--pools", str(file), "--max-pools-bytes", "0"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == (
        "poolkeeper validate: error: argument --max-pools-bytes: '0' is not a positive whole "
        "number\n"
    )
