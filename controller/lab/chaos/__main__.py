"""`python -m controller.lab.chaos`: the soak without the `poolkeeper` command."""

from __future__ import annotations

import argparse
import contextlib
import sys

from controller.lab import chaos


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m controller.lab.chaos", description=chaos.__doc__
    )
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", dest="json_file")
    parser.add_argument("--markdown", help="write docs/reliability.md from the report")
    parser.add_argument("--workdir", help="keep the controller logs in this folder")
    parser.add_argument("--report", help="write --markdown from a saved --json report")
    parser.add_argument("--api-tier", action="store_true", help="the API tier soak")
    parser.add_argument("--reconcilers", type=int, help="the shared reconcilers' soak")
    parser.add_argument("--pools", type=int, help="with --reconcilers: the pools (30)")
    parser.add_argument("--operators", type=int, help="operators among the reconcilers")
    return parser


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(chaos.main(_parser().parse_args()))
