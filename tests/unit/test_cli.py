import subprocess
import sys

import pytest

from controller.cli import main
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
