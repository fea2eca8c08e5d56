"""`poolkeeper chaos`: the chaos soak (docs/reliability.md).

Several pools on the simulator (in-process), a controller as a subprocess (`python -m
controller run`) that is SIGKILLed (or stopped) and restarted at random moments, a second controller
with a different spec for the same pools (`idleRunners` + 1) that is started and
SIGKILLed at random moments, concurrent clients that claim, keep alive, read and release
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
"""

# The parts, each in its own module: schedule (the faults drawn from the seed), world (the
# pools and what Nomad holds of them), processes (the controllers and API replicas),
# clients (claims and their checks), faults (injecting and ending them), monitor (the
# continuous checks), violations (the one list of findings), soak (the rounds, the final
# leak check and the report) and report (docs/reliability.md). The API tier soak
# (`--api-tier`, tier_soak.py: what it checks) adds balancer (HAProxy) and ledger (every
# request through the balancer, and why each that failed failed).

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from controller.lab.chaos.balancer import BalancerMissing, haproxy_binary
from controller.lab.chaos.report import (
    render_markdown,
    render_tier_section,
    tier_section,
    with_tier_section,
)
from controller.lab.chaos.schedule import FAULT_KINDS, Profile, make_schedule
from controller.lab.chaos.soak import soak
from controller.lab.chaos.tier_soak import tier_soak

__all__ = [
    "FAULT_KINDS",
    "Profile",
    "main",
    "make_schedule",
    "render_markdown",
    "run_chaos",
    "run_tier_chaos",
]

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
# Left out of the summary printed: long lists that the JSON report keeps.
DETAIL_KEYS = ("faults", "convergence_by_round", "kills", "failures")


async def run_chaos(seed: int, minutes: float, workdir: Path | None = None) -> dict[str, Any]:
    """One soak; the controller logs stay in `workdir` when one is given."""
    if workdir is not None:
        return await soak(seed, minutes, workdir)
    with tempfile.TemporaryDirectory(prefix="poolkeeper-chaos-") as scratch:
        return await soak(seed, minutes, Path(scratch))


async def run_tier_chaos(seed: int, minutes: float, workdir: Path | None = None) -> dict[str, Any]:
    """One API tier soak; the processes' logs stay in `workdir` when one is given."""
    if workdir is not None:
        return await tier_soak(seed, minutes, workdir)
    with tempfile.TemporaryDirectory(prefix="poolkeeper-chaos-") as scratch:
        return await tier_soak(seed, minutes, Path(scratch))


def main(args: argparse.Namespace) -> int:
    minutes = float(args.minutes)
    seed = int(args.seed)
    api_tier = bool(getattr(args, "api_tier", False))
    if api_tier:
        try:
            haproxy_binary()
        except BalancerMissing as error:
            print(f"poolkeeper chaos: {error}", file=sys.stderr)
            return EXIT_USAGE
    workdir = Path(args.workdir) if getattr(args, "workdir", None) else None
    if workdir is not None:
        workdir.mkdir(parents=True, exist_ok=True)
    run = run_tier_chaos if api_tier else run_chaos
    report = asyncio.run(run(seed, minutes, workdir))
    summary = {k: v for k, v in report.items() if k not in DETAIL_KEYS}
    print(json.dumps(summary, indent=2))
    json_file = getattr(args, "json_file", None)
    if json_file:
        Path(json_file).write_text(json.dumps(report, indent=2) + "\n")
    markdown = getattr(args, "markdown", None)
    if markdown:
        page = Path(markdown)
        old = page.read_text() if page.exists() else ""
        command = (
            f"python -m controller.lab.chaos{' --api-tier' if api_tier else ''} "
            f"--minutes {minutes:g} --seed {seed} --markdown {markdown}"
        )
        # Each soak renders its own part of the page and keeps the other's.
        if api_tier:
            page.write_text(with_tier_section(old, render_tier_section(report, command)))
        else:
            page.write_text(
                with_tier_section(render_markdown([report], command), tier_section(old))
            )
    return EXIT_FAILURE if report["invariant_violations"] else EXIT_OK
