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
