"""`poolkeeper status`: a table of a running controller's pools and live claims."""

from __future__ import annotations

import argparse
import json
import os
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from controller.errors import EXIT_FAILURE, EXIT_OK, UsageError

WATCH_SECONDS = 2.0
# Columns for output that is not a terminal's: wider than any table gets (a table takes
# the width its cells need, not this).
UNBOUNDED_WIDTH = 4096


class StatusError(Exception):
    pass


def _token(args: argparse.Namespace) -> str | None:
    if args.token_file:
        try:
            return Path(args.token_file).read_text().strip().splitlines()[0].strip()
        except (OSError, IndexError):
            raise UsageError(f"--token-file {args.token_file}: cannot read a token") from None
    return os.environ.get("POOLKEEPER_TOKEN") or None


def fetch(url: str, token: str | None) -> Any:
    request = urllib.request.Request(url, headers={"Accept": "application/json"})
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as error:
        try:
            message = json.loads(error.read())["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = error.reason
        raise StatusError(f"{url}: {error.code} {message}") from None
    except (urllib.error.URLError, OSError) as error:
        raise StatusError(f"{url}: {getattr(error, 'reason', error)}") from None


def _condition(status: dict[str, Any], kind: str, healthy: str) -> str:
    """The condition's status, with its reason only when it is not the healthy one."""
    for condition in status.get("conditions", []):
        if condition.get("type") == kind:
            value = str(condition.get("status"))
            return value if value == healthy else f"{value} ({condition.get('reason', '')})"
    return "-"


def pools_table(pools: list[dict[str, Any]]) -> Table:
    """A row per pool, from the pool summaries of `GET /v1/pools`."""
    table = Table(title="poolkeeper pools")
    table.add_column("pool", no_wrap=True, min_width=24)
    for column in ("desired", "idle", "starting", "claimed", "outdated", "total", "max"):
        table.add_column(column, justify="right")
    table.add_column("ready")
    table.add_column("degraded")
    for pool in pools:
        status = pool.get("status", {})
        table.add_row(
            f"{pool['namespace']}/{pool['name']}",
            # The idle target once a pass has published it, idleRunners before.
            str(status.get("desiredIdleRunners", pool["spec"]["idleRunners"])),
            *(
                str(status.get(field, "-"))
                for field in (
                    "idleRunners",
                    "startingRunners",
                    "claimedRunners",
                    "outdatedRunners",
                    "totalRunners",
                )
            ),
            str(pool["spec"]["maxRunners"]),
            _condition(status, "Ready", healthy="True"),
            _condition(status, "Degraded", healthy="False"),
        )
    return table


def render(base_url: str, token: str | None) -> Group:
    pools = fetch(f"{base_url}/v1/pools", token)["pools"]
    claims = Table(title="live claims")
    for column in ("runner", "pool", "node", "claimed at", "expires at", "request"):
        claims.add_column(column)
    for pool in pools:
        key = f"{pool['namespace']}/{pool['name']}"
        for claim in fetch(f"{base_url}/v1/pools/{key}/claims", token)["claims"]:
            claims.add_row(
                claim["runnerId"],
                key,
                claim["nodeName"],
                claim["claimedAt"],
                claim["expiresAt"],
                claim.get("requestId") or "",
            )
    return Group(pools_table(pools), claims)


def with_error(last: Group | None, error: StatusError) -> Group:
    """What --watch shows after a failed read: the last table it could read, and why."""
    parts: list[RenderableType] = [last] if last is not None else []
    parts.append(Text(f"{time.strftime('%H:%M:%S')} {error}; retrying", style="red"))
    return Group(*parts)


def main(args: argparse.Namespace) -> int:
    token = _token(args)
    base_url = args.url.rstrip("/")
    console = Console()
    if not console.is_terminal:  # a pipe or a file: no width to fit, every cell whole
        console = Console(width=UNBOUNDED_WIDTH)
    if not args.watch:
        try:
            console.print(render(base_url, token))
        except StatusError as error:
            console.print(f"poolkeeper status: {error}", style="red")
            return EXIT_FAILURE
        return EXIT_OK
    last: Group | None = None
    with Live(Text("reading the controller..."), console=console, refresh_per_second=1) as live:
        try:
            while True:
                try:
                    last = render(base_url, token)
                    live.update(last)
                except StatusError as error:
                    # A controller restarting or a Nomad blip: keep watching, say why.
                    live.update(with_error(last, error))
                time.sleep(WATCH_SECONDS)
        except KeyboardInterrupt:
            return EXIT_OK
