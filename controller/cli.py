"""poolkeeper: warm runner pools on HashiCorp Nomad (docs/reference.md lists every command).

Exit codes: 0 success, 2 usage or configuration error (one line naming the bad value),
1 anything else.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import sys
from collections.abc import Callable, Sequence

from controller.errors import EXIT_FAILURE, EXIT_USAGE, UsageError
from controller.logs import LOG_FORMATS


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


NOMAD_ENVIRONMENT = """Nomad is reached as the nomad CLI reaches it:
  NOMAD_ADDR         address (default http://127.0.0.1:4646)
  NOMAD_TOKEN        ACL token (never logged)
  NOMAD_NAMESPACE    the controllers' own namespace (drain records, the catalog); default "default"
  NOMAD_REGION       region
  NOMAD_CACERT       CA certificate file or folder for https
  NOMAD_CLIENT_CERT  client certificate for mutual TLS
  NOMAD_CLIENT_KEY   its key
  NOMAD_SKIP_VERIFY  true to skip TLS verification (not for production)
API tokens: --api-token-file, and POOLKEEPER_API_TOKENS (one per line)."""


def _count(text: str) -> int:
    if not text.isdigit() or int(text) == 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive whole number")
    return int(text)


def _pool_file_limits(command: argparse.ArgumentParser) -> None:
    """What one load of the pool files may hold, all files together; over a limit, nothing
    is loaded (`run` and `validate` share them)."""
    limits = command.add_argument_group("limits of the pool files (over one, nothing is loaded)")
    limits.add_argument("--max-pools-bytes", type=_count, metavar="N", help="bytes (1048576)")
    limits.add_argument(
        "--max-pools-nodes",
        type=_count,
        metavar="N",
        help="YAML nodes, an alias counted as the nodes it expands to (200000)",
    )
    limits.add_argument("--max-pools", type=_count, metavar="N", help="pool documents (1000)")


def _controller_options(command: argparse.ArgumentParser, listen: str) -> None:
    """The options `run` and `operator` share."""
    _serving_options(
        command, listen, "a pass over every pool at least this often, events or not (10)"
    )
    command.add_argument(
        "--lease-ttl-seconds",
        type=float,
        default=10.0,
        help="TTL of the pools' leases in Nomad (>= 10, Nomad's minimum); a dead holder's "
        "pools are taken over within about 2 x TTL + 8 s (10)",
    )


def _serving_options(command: argparse.ArgumentParser, listen: str, resync: str) -> None:
    """The options of every command that serves the API (`run`, `operator`, `api`)."""
    command.add_argument(
        "--listen", default=listen, help=f"HOST:PORT of the HTTP API, health and metrics ({listen})"
    )
    command.add_argument("--resync-seconds", type=float, default=10.0, help=resync)
    command.add_argument(
        "--tls-cert", metavar="FILE", help="serve the API over HTTPS with this certificate (PEM)"
    )
    command.add_argument(
        "--tls-key",
        metavar="FILE",
        help="the certificate's private key; both are read again on SIGHUP and when they change",
    )
    poseidon = command.add_argument_group("Poseidon API (docs/poseidon.md)")
    poseidon.add_argument(
        "--poseidon-api",
        action="store_true",
        help="also serve openHPI Poseidon's REST API v1 under /api/v1/ (for CodeOcean)",
    )
    poseidon.add_argument(
        "--poseidon-environments",
        choices=("readonly", "managed"),
        default="readonly",
        help="readonly: execution environments are the pools labelled "
        "poolkeeper.dev/poseidon-environment, PUT only checks them; managed: PUT and DELETE "
        "keep environments in Nomad, a pool each (readonly)",
    )
    poseidon.add_argument(
        "--poseidon-environment-template",
        metavar="FILE",
        help="managed: a RunnerPool document every environment's pool starts from",
    )
    poseidon.add_argument(
        "--poseidon-depleting-threshold",
        type=float,
        default=0.0,
        metavar="SHARE",
        help="/api/v1/health answers 503 when an environment has fewer idle runners than "
        "this share of its prewarming pool size; 0 never (0)",
    )
    auth = command.add_mutually_exclusive_group()
    auth.add_argument(
        "--api-token-file",
        metavar="FILE",
        help="API bearer tokens, one per line (reread on SIGHUP)",
    )
    auth.add_argument(
        "--insecure-no-auth",
        action="store_true",
        help="serve the /v1 API without any token (development only)",
    )
    command.add_argument(
        "--log-format",
        choices=tuple(LOG_FORMATS),
        default="text",
        help="text lines, or one JSON object per line for log collectors (text)",
    )
    command.add_argument(
        "--access-log",
        action="store_true",
        help="log one line per API request: method, route, status and duration "
        "(never a token or a body)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="poolkeeper", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--version",
        action="version",
        version=f"%(prog)s {importlib.metadata.version('poolkeeper')}",
    )
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    keep_layout = argparse.RawDescriptionHelpFormatter

    run = commands.add_parser(
        "run",
        help="standalone controller reading pools from YAML",
        epilog=NOMAD_ENVIRONMENT,
        formatter_class=keep_layout,
    )
    run.add_argument(
        "--pools",
        metavar="PATH",
        help="a RunnerPool YAML file or a folder of them (required, but with --no-reconcile)",
    )
    _controller_options(run, "127.0.0.1:8080")
    run.add_argument(
        "--no-reconcile",
        action="store_true",
        help="serve the API only: the same as `poolkeeper api` (--pools is then not read)",
    )
    run.add_argument(
        "--prune", action="store_true", help="drain runner jobs of pools defined nowhere"
    )
    run.add_argument(
        "--allow-empty",
        action="store_true",
        help="let a reload that defines no pool remove every pool (refused otherwise)",
    )
    run.add_argument(
        "--allow-shrink",
        action="store_true",
        help="let a reload that defines pools remove more than --max-removed-share of them",
    )
    run.add_argument(
        "--max-removed-share",
        type=float,
        default=0.5,
        metavar="SHARE",
        help="0 ... 1: a reload removing more than this share of the pools is refused (0.5)",
    )
    _pool_file_limits(run)
    run.set_defaults(handler=_command("controller.standalone"))

    api = commands.add_parser(
        "api",
        help="the API tier: serves claims, executions and the Poseidon API, reconciles nothing",
        epilog=NOMAD_ENVIRONMENT,
        formatter_class=keep_layout,
    )
    _serving_options(
        api, "127.0.0.1:8080", "read the managed Poseidon environments at least this often (10)"
    )
    api.set_defaults(handler=_command("controller.api_tier"))

    validate = commands.add_parser(
        "validate", help="check pool files as run loads them, without Nomad"
    )
    validate.add_argument(
        "--pools", required=True, metavar="PATH", help="a RunnerPool YAML file or a folder of them"
    )
    _pool_file_limits(validate)
    validate.set_defaults(handler=_command("controller.validate_command"))

    operator = commands.add_parser(
        "operator",
        help="the controller as a Kubernetes operator",
        epilog=NOMAD_ENVIRONMENT,
        formatter_class=keep_layout,
    )
    scope = operator.add_mutually_exclusive_group()
    scope.add_argument("--namespace", action="append", help="watch this namespace (repeatable)")
    scope.add_argument(
        "--all-namespaces", action="store_true", help="watch every namespace (the default)"
    )
    _controller_options(operator, "0.0.0.0:8080")
    operator.add_argument(
        "--liveness", help="kopf liveness endpoint, e.g. http://0.0.0.0:8081/healthz"
    )
    operator.set_defaults(handler=_command("controller.operator.handlers"))

    sim = commands.add_parser("sim", help="a Nomad HTTP API simulator")
    sim.add_argument(
        "--listen",
        default="127.0.0.1:4646",
        metavar="HOST:PORT",
        help="where the simulated Nomad API listens (127.0.0.1:4646)",
    )
    sim.add_argument(
        "--node",
        action="append",
        dest="nodes",
        metavar="NAME",
        help="a client node; repeatable (sim-node-1, sim-node-2, sim-node-3)",
    )
    sim.add_argument(
        "--listen-fd",
        type=int,
        metavar="N",
        help="serve on the listening TCP socket inherited as file descriptor N, which the "
        "process starting the simulator bound (then --listen is not used)",
    )
    sim.add_argument(
        "--no-client",
        action="store_true",
        help="a server alone: no client node (nothing can be placed)",
    )
    sim.add_argument(
        "--acl-enabled", action="store_true", help="enforce ACL tokens (POST /v1/acl/bootstrap)"
    )
    sim.add_argument(
        "--seed", type=int, default=0, metavar="N", help="the same seed, the same IDs (0)"
    )
    sim.add_argument("--tls-cert", metavar="FILE", help="serve HTTPS with this certificate")
    sim.add_argument("--tls-key", metavar="FILE", help="the certificate's private key")
    sim.add_argument(
        "--exec",
        dest="exec_mode",
        choices=("none", "local"),
        default="none",
        help="none: an exec fails (simulated tasks run no process); local: run allocation "
        "execs as real local processes (isolates nothing) (none)",
    )
    sim.add_argument(
        "--write-latency-ms",
        type=float,
        default=0.0,
        metavar="N",
        help="answer every write N ms after it arrives, as a Raft commit would (0)",
    )
    sim.set_defaults(handler=_command("controller.lab.simulator.command"))

    demo = commands.add_parser("demo", help="a scripted story on the simulator")
    demo.set_defaults(handler=_command("controller.lab.demo"))

    bench = commands.add_parser("bench", help="the benchmarks (docs/performance.md)")
    bench.add_argument("--quick", action="store_true", help="small sizes, under a minute")
    bench.add_argument("--json", dest="json_file", metavar="FILE", help="write the results here")
    bench.add_argument(
        "--section",
        dest="sections",
        action="append",
        metavar="NAME",
        help="run only this section (repeatable): scale, claims, refill, churn, node-loss, "
        "demand, exec",
    )
    bench.set_defaults(handler=_command("controller.lab.bench"))

    chaos = commands.add_parser("chaos", help="the chaos soak (docs/reliability.md)")
    chaos.add_argument("--minutes", type=float, default=5.0, help="how long to soak (5)")
    chaos.add_argument("--seed", type=int, default=1, help="the faults' random seed (1)")
    chaos.add_argument("--json", dest="json_file", metavar="FILE", help="write the report here")
    chaos.add_argument("--markdown", help="write docs/reliability.md from the report")
    chaos.add_argument("--workdir", help="keep the controller logs in this folder")
    chaos.add_argument(
        "--report",
        metavar="FILE",
        help="run no soak: write --markdown from a report a soak wrote with --json",
    )
    chaos.add_argument(
        "--api-tier",
        action="store_true",
        help="the API tier soak: two `poolkeeper api` replicas behind HAProxy, one SIGKILLed "
        "at random every 20-60 s (needs haproxy: make haproxy)",
    )
    chaos.add_argument(
        "--reconcilers",
        type=int,
        metavar="N",
        help="the shared reconcilers' soak: N `poolkeeper run` processes on one pools file, "
        "one at a time SIGKILLed or SIGTERMed and restarted, while Nomad's faults hit",
    )
    chaos.add_argument(
        "--pools", type=int, metavar="P", help="with --reconcilers: how many pools they share (30)"
    )
    chaos.add_argument(
        "--operators",
        type=int,
        metavar="K",
        help="with --reconcilers: K of them `poolkeeper operator` processes reading the pools "
        "as RunnerPools from a real kube-apiserver on loopback; in the chaos soak, 1: its "
        "second controller is one (needs make kube)",
    )
    chaos.set_defaults(handler=_command("controller.lab.chaos"))

    status = commands.add_parser("status", help="a live table of a controller's pools")
    status.add_argument(
        "--url", default="http://127.0.0.1:8080", help="the controller (http://127.0.0.1:8080)"
    )
    status.add_argument(
        "--token-file", metavar="FILE", help="its API token (else POOLKEEPER_TOKEN)"
    )
    status.add_argument(
        "--watch", action="store_true", help="refresh every 2 s; errors are shown, not fatal"
    )
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
