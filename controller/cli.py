"""poolkeeper: warm runner pools on HashiCorp Nomad (docs/reference.md lists every command).

Exit codes: 0 success, 2 usage or configuration error (one line naming the bad value),
1 anything else.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence

from controller.errors import EXIT_FAILURE, EXIT_USAGE, UsageError


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        # argparse prints usage and exits 2 already; keep the message to one line.
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def _command(module: str) -> Callable[[argparse.Namespace], int]:
    """Import a command's module only when it runs, so `--help` stays fast."""

    def run(args: argparse.Namespace) -> int:
        handler: Callable[[argparse.Namespace], int] = importlib.import_module(module).main
        return handler(args)

    return run


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="poolkeeper", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    run = commands.add_parser("run", help="standalone controller reading pools from YAML")
    run.add_argument("--pools", required=True, help="a RunnerPool YAML file or a folder")
    run.add_argument("--listen", default="127.0.0.1:8080", help="HOST:PORT of the HTTP API")
    run.add_argument("--resync-seconds", type=float, default=10.0)
    auth = run.add_mutually_exclusive_group()
    auth.add_argument("--api-token-file")
    auth.add_argument("--insecure-no-auth", action="store_true")
    run.add_argument("--no-reconcile", action="store_true", help="serve the API only")
    run.add_argument("--prune", action="store_true", help="drain orphaned runner jobs")
    run.set_defaults(handler=_command("controller.standalone"))

    operator = commands.add_parser("operator", help="the controller as a Kubernetes operator")
    scope = operator.add_mutually_exclusive_group()
    scope.add_argument("--namespace", action="append", help="watch this namespace (repeatable)")
    scope.add_argument("--all-namespaces", action="store_true")
    operator.add_argument("--listen", default="0.0.0.0:8080", help="HOST:PORT of the HTTP API")
    operator.add_argument("--resync-seconds", type=float, default=10.0)
    operator_auth = operator.add_mutually_exclusive_group()
    operator_auth.add_argument("--api-token-file")
    operator_auth.add_argument("--insecure-no-auth", action="store_true")
    operator.add_argument("--peering", help="kopf peering object for active/passive HA")
    operator.add_argument(
        "--priority", type=int, help="peering priority (default: random, distinct per replica)"
    )
    operator.add_argument(
        "--liveness", help="kopf liveness endpoint, e.g. http://0.0.0.0:8081/healthz"
    )
    operator.set_defaults(handler=_command("controller.operator.handlers"))

    sim = commands.add_parser("sim", help="a Nomad HTTP API simulator")
    sim.add_argument("--listen", default="127.0.0.1:4646")
    sim.add_argument("--node", action="append", dest="nodes", metavar="NAME")
    sim.add_argument("--acl-enabled", action="store_true")
    sim.add_argument("--seed", type=int, default=0)
    sim.add_argument("--tls-cert")
    sim.add_argument("--tls-key")
    sim.set_defaults(handler=_command("controller.lab.simulator.command"))

    demo = commands.add_parser("demo", help="a scripted story on the simulator")
    demo.set_defaults(handler=_command("controller.lab.demo"))

    bench = commands.add_parser("bench", help="the benchmarks")
    bench.add_argument("--quick", action="store_true")
    bench.add_argument("--json", dest="json_file")
    bench.set_defaults(handler=_command("controller.lab.bench"))

    chaos = commands.add_parser("chaos", help="the chaos soak")
    chaos.add_argument("--minutes", type=float, default=5.0)
    chaos.add_argument("--seed", type=int, default=1)
    chaos.add_argument("--json", dest="json_file")
    chaos.add_argument("--markdown", help="write docs/reliability.md from the report")
    chaos.add_argument("--workdir", help="keep the controller logs in this folder")
    chaos.set_defaults(handler=_command("controller.lab.chaos"))

    status = commands.add_parser("status", help="a live table of a controller's pools")
    status.add_argument("--url", default="http://127.0.0.1:8080")
    status.add_argument("--token-file")
    status.add_argument("--watch", action="store_true")
    status.set_defaults(handler=_command("controller.status_command"))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    handler: Callable[[argparse.Namespace], int] = args.handler
    try:
        return handler(args)
    except UsageError as error:
        print(f"poolkeeper {args.command}: {error}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return EXIT_FAILURE
