"""`poolkeeper chaos`: the chaos soak (docs/reliability.md).

Several pools on the simulator (in-process), a controller as a subprocess (`python -m
controller run`) that is SIGKILLed (or stopped) and restarted at random moments, a second controller
with a different spec for the same pools (`idleRunners` + 1) that is started and
SIGKILLed at random moments (with `--operators 1` an operator, `python -m controller
operator`, reading them as RunnerPools from a kube-apiserver on loopback built by `make
kube`), concurrent clients that claim, keep alive, read and release
runners through the HTTP API of either, and a fault schedule drawn up front from
`random.Random(seed)` that injects every fault the simulator offers. Invariants are
checked continuously (from the client side and from what the simulator holds) and at the
end; the report lists every violation.

The run is a sequence of rounds. In a round's fault window the clients work and faults
hit; then every fault is switched off, the clients release what they hold and pause, and
the time until every pool is back at exactly `idleRunners` idle runners is measured (the
convergence time). After the last round the clients release everything, claims whose
answer was lost expire, and the final state must hold no leak at all.

What is checked (exactly):

* double claims: a runner ID answered to two different claims (different requestIds);
  runners are single-use, so any second claim of one runner is a violation;
* a claimed runner's job is only ever purged after its claim variable became a tombstone
  (unless the fault `remove_job_silently` removed it), and the tombstone's reason fits:
  `released` only after the client released it, `expired` only once the deadline the
  client last saw has passed, `lost` only for runners whose allocation a fault touched,
  `retired` never (the soak removes no pool);
* every 410 a client gets carries a reason that fits in the same way; a 404 for a runner
  the client holds is a claim lost without a reason (`claims_lost`);
* total runners (non-dead jobs) of a pool never exceed `maxRunners`; an excess of at most
  the engine's per-pass surge is tolerated for `RESTART_GRACE_SECONDS` after a controller
  start, and any excess is reported;
* after each fault window every pool converges (exactly `idleRunners` idle, nothing
  starting, no tombstoned job left, no live claim without its live allocation) within
  `convergence_bound` seconds, and stays there while no fault and no claim happens;
* at the end no job but the idle ones and no live claim variable is left (tombstones and
  request records are not leaks, but a request record whose claim does not exist is);
* no runner job is registered or purged by a controller that did not hold the pool's
  lease at that instant (the simulator's write audit, `simulator/audit.py`; a released
  runner too is purged by the holder alone);
* no HTTP 5xx other than 503 from the API, no controller exit that the driver did not
  cause, no traceback in either controller's logs.

`--api-tier` runs the API tier soak instead (tier_soak.py says what it does and checks):
two `poolkeeper api` replicas behind HAProxy, one reconciler, API replicas SIGKILLed.

`--reconcilers N` (with `--pools P`, 30 by default) runs the shared reconcilers' soak
instead (shared_soak.py says what it does and checks): N `poolkeeper run` processes on one
pools file of P pools, one at a time SIGKILLed or SIGTERMed and restarted, while Nomad's
faults hit; with `--operators K`, K of the N are `poolkeeper operator` processes reading
the pools from a real kube-apiserver (built by `make kube`).
"""

# The parts, each in its own module: schedule (the faults drawn from the seed), world (the
# pools and what Nomad holds of them), processes (the controllers and API replicas),
# clients (claims and their checks), faults (injecting and ending them), monitor (the
# continuous checks), violations (the one list of findings), soak (the rounds, the final
# leak check and the report) and report (docs/reliability.md). The API tier soak
# (`--api-tier`, tier_soak.py: what it checks) adds balancer (HAProxy) and ledger (every
# request through the balancer, and why each that failed failed). The shared reconcilers'
# soak (`--reconcilers`) is shared_soak.

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import tempfile
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from controller.lab.chaos.balancer import BalancerMissing, haproxy_binary
from controller.lab.chaos.report import (
    SECTIONS,
    SHARED,
    TIER,
    render_markdown,
    render_shared_section,
    render_tier_section,
)
from controller.lab.chaos.schedule import FAULT_KINDS, Profile, make_schedule
from controller.lab.chaos.shared_soak import shared_soak
from controller.lab.chaos.soak import soak
from controller.lab.chaos.tier_soak import tier_soak
from controller.lab.kube import bin_dir, missing_binaries

__all__ = [
    "FAULT_KINDS",
    "Profile",
    "main",
    "make_schedule",
    "render_markdown",
    "run_chaos",
    "run_shared_chaos",
    "run_tier_chaos",
]

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_SIGTERM = 128 + signal.SIGTERM
DEFAULT_SHARED_POOLS = 30
# Left out of the summary printed: long lists that the JSON report keeps.
DETAIL_KEYS = ("faults", "convergence_by_round", "kills", "failures")


async def run_chaos(
    seed: int, minutes: float, workdir: Path | None = None, *, operator_rival: bool = False
) -> dict[str, Any]:
    """One soak; the controller logs stay in `workdir` when one is given. With
    `operator_rival` its second controller is an operator."""
    if workdir is not None:
        return await soak(seed, minutes, workdir, operator_rival=operator_rival)
    with tempfile.TemporaryDirectory(prefix="poolkeeper-chaos-") as scratch:
        return await soak(seed, minutes, Path(scratch), operator_rival=operator_rival)


async def run_tier_chaos(seed: int, minutes: float, workdir: Path | None = None) -> dict[str, Any]:
    """One API tier soak; the processes' logs stay in `workdir` when one is given."""
    if workdir is not None:
        return await tier_soak(seed, minutes, workdir)
    with tempfile.TemporaryDirectory(prefix="poolkeeper-chaos-") as scratch:
        return await tier_soak(seed, minutes, Path(scratch))


async def run_shared_chaos(
    seed: int,
    minutes: float,
    workdir: Path | None = None,
    *,
    reconcilers: int = 3,
    pools: int = DEFAULT_SHARED_POOLS,
    operators: int = 0,
) -> dict[str, Any]:
    """One shared reconcilers' soak; the processes' logs stay in `workdir` when one is given."""
    if workdir is not None:
        return await shared_soak(seed, minutes, workdir, reconcilers, pools, operators)
    with tempfile.TemporaryDirectory(prefix="poolkeeper-chaos-") as scratch:
        return await shared_soak(seed, minutes, Path(scratch), reconcilers, pools, operators)


def _usage_error(args: argparse.Namespace) -> str | None:
    if getattr(args, "report", None) is not None:
        others = ("api_tier", "reconcilers", "pools", "operators", "json_file", "workdir")
        if not getattr(args, "markdown", None) or any(getattr(args, o, None) for o in others):
            return "--report renders a saved report: it goes with --markdown and nothing else"
        return None
    problem = _shape_error(args)
    operators = getattr(args, "operators", None)
    if problem is None and operators and (missing := missing_binaries()):
        return f"--operators needs {', '.join(missing)} in {bin_dir()}: run make kube"
    return problem


def _shape_error(args: argparse.Namespace) -> str | None:
    reconcilers = getattr(args, "reconcilers", None)
    pools = getattr(args, "pools", None)
    operators = getattr(args, "operators", None)
    api_tier = getattr(args, "api_tier", False)
    if reconcilers is None:
        if api_tier and operators is not None:
            return "--operators goes with the chaos soak or --reconcilers, not --api-tier"
        if operators is not None and operators not in (0, 1):
            return f"--operators of the chaos soak is 0 or 1 (its second controller): {operators}"
        return "--pools needs --reconcilers" if pools is not None else None
    if api_tier:
        return "--reconcilers and --api-tier are two different soaks: choose one"
    if reconcilers < 2:
        return f"--reconcilers must be at least 2 (to share the pools), not {reconcilers}"
    if pools is not None and pools < reconcilers:
        return f"--pools must be at least --reconcilers ({reconcilers}), not {pools}"
    if operators is not None and not 0 <= operators <= reconcilers:
        return f"--operators must be between 0 and --reconcilers ({reconcilers}), not {operators}"
    return None


def rendered(old: str, report: dict[str, Any], command: str) -> str:
    """docs/reliability.md (`old`) with the part the report's soak renders: each soak
    renders its own part of the page and keeps the others'."""
    variant = report.get("variant")
    if variant == "api-tier":
        return TIER.put(old, render_tier_section(report, command))
    if variant == "shared-reconcilers":
        return SHARED.put(old, render_shared_section(report, command))
    page = render_markdown([report], command)
    for section in SECTIONS:
        page = section.put(page, section.of(old))
    return page


def render_saved(saved: Path, markdown: Path) -> int:
    """Write `markdown` from a report a soak wrote with --json (it runs no soak)."""
    try:
        report = json.loads(saved.read_text())
        command = report["command"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        print(f"poolkeeper chaos: {saved} is not a soak's report: {error}", file=sys.stderr)
        return EXIT_USAGE
    old = markdown.read_text() if markdown.exists() else ""
    both = f"{command} --json {saved} && poolkeeper chaos --report {saved} --markdown {markdown}"
    markdown.write_text(rendered(old, report, both))
    return EXIT_OK


async def _until_sigterm(soak_run: Coroutine[Any, Any, dict[str, Any]]) -> dict[str, Any]:
    """The soak's report; a SIGTERM cancels it, and it stops every process it started."""
    task = asyncio.ensure_future(soak_run)
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    return await task


def main(args: argparse.Namespace) -> int:
    minutes = float(args.minutes)
    seed = int(args.seed)
    api_tier = bool(getattr(args, "api_tier", False))
    reconcilers: int | None = getattr(args, "reconcilers", None)
    pools = getattr(args, "pools", None) or DEFAULT_SHARED_POOLS
    usage = _usage_error(args)
    if usage is not None:
        print(f"poolkeeper chaos: {usage}", file=sys.stderr)
        return EXIT_USAGE
    if getattr(args, "report", None) is not None:
        return render_saved(Path(args.report), Path(args.markdown))
    if api_tier:
        try:
            haproxy_binary()
        except BalancerMissing as error:
            print(f"poolkeeper chaos: {error}", file=sys.stderr)
            return EXIT_USAGE
    workdir = Path(args.workdir) if getattr(args, "workdir", None) else None
    if workdir is not None:
        workdir.mkdir(parents=True, exist_ok=True)
    if reconcilers is not None:
        operators = getattr(args, "operators", None) or 0
        soak_run = run_shared_chaos(
            seed, minutes, workdir, reconcilers=reconcilers, pools=pools, operators=operators
        )
    elif api_tier:
        soak_run = run_tier_chaos(seed, minutes, workdir)
    else:
        operator_rival = bool(getattr(args, "operators", None))
        soak_run = run_chaos(seed, minutes, workdir, operator_rival=operator_rival)
    try:
        report = asyncio.run(_until_sigterm(soak_run))
    except asyncio.CancelledError:
        print("poolkeeper chaos: stopped by SIGTERM; no report", file=sys.stderr)
        return EXIT_SIGTERM
    summary = {k: v for k, v in report.items() if k not in DETAIL_KEYS}
    print(json.dumps(summary, indent=2))
    json_file = getattr(args, "json_file", None)
    if json_file:
        Path(json_file).write_text(json.dumps(report, indent=2) + "\n")
    markdown = getattr(args, "markdown", None)
    if markdown:
        page = Path(markdown)
        old = page.read_text() if page.exists() else ""
        page.write_text(rendered(old, report, f"{report['command']} --markdown {markdown}"))
    return EXIT_FAILURE if report["invariant_violations"] else EXIT_OK
