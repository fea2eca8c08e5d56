"""What README.md and docs/ say against what the code is: the commands, the pages, the
metrics, the flags a first user is told about."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from controller.cli import build_parser
from controller.core.runner_ids import META_POOL, META_TEMPLATE
from tests.chart.alert_rules import exported_series

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
PAGES = sorted((ROOT / "docs").glob("*.md"))


def commands() -> list[str]:
    found = [
        action
        for action in build_parser()._actions
        if isinstance(action, argparse._SubParsersAction)
    ]
    return sorted(found[0].choices)


def command_table() -> str:
    return README.split("## Commands", 1)[1].split("\n## ", 1)[0]


def test_the_readme_names_every_command() -> None:
    table = command_table()
    missing = [name for name in commands() if f"`poolkeeper {name}" not in table]
    assert not missing, missing


def test_the_readme_links_every_page_of_the_docs() -> None:
    missing = [page.name for page in PAGES if f"(docs/{page.name})" not in README]
    assert not missing, missing


def test_every_metric_the_docs_name_is_one_a_controller_serves() -> None:
    exported = set(exported_series())
    not_metrics = {META_POOL, META_TEMPLATE}  # a runner job's Meta keys

    def served(name: str) -> bool:
        return name in exported or any(series.startswith(name + "_") for series in exported)

    unknown = sorted(
        (page.name, name)
        for page in [ROOT / "README.md", *PAGES]
        for name in set(re.findall(r"poolkeeper_[a-z0-9_]*[a-z0-9]", page.read_text()))
        if name not in not_metrics and not served(name)
    )
    assert not unknown, unknown


def test_run_no_reconcile_starts_without_pools_as_the_readme_says() -> None:
    args = build_parser().parse_args(["run", "--no-reconcile", "--insecure-no-auth"])
    assert args.no_reconcile and args.pools is None
    row = next(line for line in command_table().splitlines() if "--no-reconcile" in line)
    assert "--pools" not in row, row
