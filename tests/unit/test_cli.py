import argparse
import re
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

from controller.cli import build_parser, main
from controller.errors import EXIT_USAGE


def test_unknown_command_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["frobnicate"])
    assert exit_info.value.code == EXIT_USAGE
    assert "frobnicate" in capsys.readouterr().err


def test_runs_as_a_module():
    result = subprocess.run(
        [sys.executable, "-m", "controller", "--help"], capture_output=True, text=True
    )
    assert result.returncode == 0
    assert "poolkeeper" in result.stdout


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--poseidon-environments", "managed"], "the --poseidon-* options need --poseidon-api"),
        (
            ["--poseidon-api", "--poseidon-depleting-threshold", "1.5"],
            "--poseidon-depleting-threshold 1.5 is not between 0 and 1",
        ),
        (
            ["--poseidon-api", "--poseidon-environment-template", "t.yaml"],
            "--poseidon-environment-template needs --poseidon-environments managed",
        ),
        (
            [
                "--poseidon-api", "--poseidon-environments", "managed",
                "--poseidon-environment-template", "{template}",
            ],
            "--poseidon-environment-template {template}: spec.idleRunners is set by each "
            "environment; leave it out",
        ),
    ],
)  # fmt: skip
def test_poseidon_options_that_do_not_fit_are_usage_errors(tmp_path, capsys, options, message):
    pools = tmp_path / "pools.yaml"
    pools.write_text("")
    template = tmp_path / "template.yaml"
    template.write_text("spec: {idleRunners: 3}\n")
    argv = [o.format(template=template) for o in options]
    code = main(["run", "--pools", str(pools), "--insecure-no-auth", *argv])
    assert code == EXIT_USAGE
    assert capsys.readouterr().err == f"poolkeeper run: {message.format(template=template)}\n"


@pytest.mark.parametrize("command", ["run", "operator"])
def test_log_format_and_access_log_are_options_of_both_controllers(command, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--help"])
    assert exit_info.value.code == 0
    usage = capsys.readouterr().out
    assert "--log-format {text,json}" in usage and "--access-log" in usage
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--pools", "x", "--log-format", "xml"])
    assert exit_info.value.code == EXIT_USAGE
    assert "invalid choice: 'xml'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--max-removed-share", "1.5"], "--max-removed-share 1.5 is not between 0 and 1"),
        (
            ["--max-pools", "1"],
            "{pools}: more than 1 pool documents, over the limit of 1 (--max-pools)",
        ),
    ],
)
def test_pool_file_guards_that_do_not_fit_are_usage_errors(tmp_path, capsys, options, message):
    pools = tmp_path / "pools.yaml"
    pools.write_text("metadata: {name: a}\n---\nmetadata: {name: b}\n")
    code = main(["run", "--pools", str(pools), "--insecure-no-auth", *options])
    assert code == EXIT_USAGE
    assert capsys.readouterr().err == f"poolkeeper run: {message.format(pools=pools)}\n"


@pytest.mark.parametrize("command", ["run", "validate", "operator", "sim", "status"])
def test_the_reference_documents_every_flag(command):
    reference = (Path(__file__).resolve().parents[2] / "docs" / "reference.md").read_text()
    section = reference.split(f"### `poolkeeper {command}`\n")[1].split("\n### ")[0]
    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    parser = commands.choices[command]
    flags = {f for action in parser._actions for f in action.option_strings if f.startswith("--")}
    missing = [f for f in flags - {"--help"} if not re.search(rf"{f}(?![\w-])", section)]
    assert sorted(missing) == []


def test_run_needs_pools_unless_it_serves_as_the_api_tier(capsys):
    assert main(["run", "--insecure-no-auth"]) == 2
    assert "--pools PATH is required" in capsys.readouterr().err


def test_version_prints_the_installed_release(capsys):
    """`poolkeeper --version`: what an image's user asks first (the chart's pods run it)."""
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out == f"poolkeeper {version('poolkeeper')}\n"
