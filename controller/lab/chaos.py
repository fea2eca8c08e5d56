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
  lease at that instant (the simulator's write audit, `simulator/audit.py`; purging a
  runner its client released is allowed to anyone);
* no HTTP 5xx other than 503 from the API, no controller exit that the driver did not
  cause, no traceback in either controller's logs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import random
import re
import signal
import socket
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from controller.lab.simulator import SimServer, Simulator, start_sim

EXIT_OK = 0
EXIT_FAILURE = 1

TOKEN = "chaos-token"
NAMESPACE = "default"
CLAIMS_PREFIX = "poolkeeper/claims/"
REQUESTS_PREFIX = "poolkeeper/requests/"
LEASES_PREFIX = "poolkeeper/leases/"
META_POOL = "poolkeeper_pool"
SURGE = 20  # the engine's per-pass creation surge (Engine(surge=20))
RESTART_GRACE_SECONDS = 10.0
RESYNC_SECONDS = 2.0
START_DELAY = 0.2
NODES = ["sim-node-1", "sim-node-2", "sim-node-3", "sim-node-4"]
MONITOR_INTERVAL = 0.2

# Every fault class the simulator offers, plus the controller SIGKILL.
FAULT_KINDS: tuple[str, ...] = (
    "reschedule",
    "node_down",
    "drain",
    "oom_restart",
    "reannounce",
    "task_exit",
    "remove_job_silently",
    "event_drop",
    "event_duplicate",
    "event_delay",
    "stream_disconnect",
    "no_leader",
    "connection_refused",
    "slow_api",
    "no_capacity",
    "fail_starts",
    "slow_starts",
    "sigkill",
    "sigterm",
    "second_controller",
)
# Faults with a duration: switched off after it (and at the end of the window anyway).
TIMED = {
    "node_down",
    "drain",
    "event_drop",
    "event_duplicate",
    "event_delay",
    "no_leader",
    "connection_refused",
    "slow_api",
    "no_capacity",
    "fail_starts",
    "slow_starts",
    "sigkill",
    "sigterm",
    "second_controller",
}
WEIGHTS: dict[str, int] = {
    "reschedule": 4,
    "node_down": 2,
    "drain": 2,
    "oom_restart": 3,
    "reannounce": 3,
    "task_exit": 2,
    "remove_job_silently": 3,
    "event_drop": 2,
    "event_duplicate": 2,
    "event_delay": 2,
    "stream_disconnect": 2,
    "no_leader": 2,
    "connection_refused": 2,
    "slow_api": 2,
    "no_capacity": 1,
    "fail_starts": 1,
    "slow_starts": 1,
    "sigkill": 2,
    "sigterm": 1,
    "second_controller": 2,
}
# The second controller reconciles the same pools with this many more idle runners: were
# it ever to write a pool it does not hold, the pools would not converge.
RIVAL_EXTRA_IDLE = 1


# Faults of the closing burst of a window.
CLOSING = (
    "sigkill",
    "node_down",
    "remove_job_silently",
    "reschedule",
    "oom_restart",
    "task_exit",
    "no_leader",
)


@dataclass(frozen=True)
class PoolSpec:
    name: str
    idle: int
    max_runners: int

    @property
    def key(self) -> str:
        return f"{NAMESPACE}/{self.name}"

    @property
    def prefix(self) -> str:
        return f"{self.name}-"


POOLS = (PoolSpec("chaos-py", 3, 8), PoolSpec("chaos-node", 2, 6), PoolSpec("chaos-go", 4, 10))


@dataclass(frozen=True)
class Profile:
    window_seconds: float
    faults_per_window: tuple[int, int]
    quiet_seconds: float  # minimum pause after convergence before the next round
    convergence_bound: float
    inactivity: tuple[int, int]  # claim inactivity timeouts drawn from this range
    clients: int
    expected_round_seconds: float
    final_reserve_seconds: float  # left at the end for the final leak check

    @staticmethod
    def for_minutes(minutes: float) -> Profile:
        if minutes < 3:
            return Profile(12.0, (7, 9), 1.0, 60.0, (4, 8), 4, 20.0, 15.0)
        return Profile(40.0, (10, 16), 12.0, 120.0, (8, 25), 6, 58.0, 30.0)


@dataclass(frozen=True)
class FaultEvent:
    at: float  # seconds into the fault window
    kind: str
    pick: float  # chooses the target among the candidates present at injection time
    duration: float
    value: float  # kind-specific: drain deadline, delay ms, slow ms, start delay

    def to_dict(self) -> dict[str, Any]:
        return {
            "at": round(self.at, 2),
            "kind": self.kind,
            "pick": round(self.pick, 4),
            "duration": round(self.duration, 2),
            "value": round(self.value, 2),
        }


@dataclass(frozen=True)
class Round:
    index: int
    events: tuple[FaultEvent, ...]


def make_schedule(seed: int, minutes: float, profile: Profile) -> list[Round]:
    """The whole fault schedule, from the seed alone."""
    rng = random.Random(seed)
    # More rounds than the minutes need: the run plays them until its time is up, so a
    # slow machine plays a shorter prefix of the same schedule.
    rounds = max(2, 2 * math.ceil(minutes * 60 / profile.expected_round_seconds))
    kinds = list(WEIGHTS)
    weights = [WEIGHTS[k] for k in kinds]
    window = profile.window_seconds
    schedule: list[Round] = []
    for index in range(rounds):
        count = rng.randint(*profile.faults_per_window)
        chosen = rng.choices(kinds, weights, k=count)
        # Every run restarts the controller and starts the second one at least once.
        for required in ("sigkill", "second_controller") if index == 0 else ():
            if required not in chosen:
                chosen.append(required)
        events = []
        for kind in chosen:
            at = rng.uniform(0.5, window * 0.85)
            duration = rng.uniform(1.0, min(12.0, window - at)) if kind in TIMED else 0.0
            value = {
                "drain": rng.uniform(0.5, 4.0),
                "event_delay": rng.uniform(200, 2000),
                "slow_api": rng.uniform(300, 2500),
                "slow_starts": rng.uniform(0.5, 3.0),
                "sigkill": rng.uniform(0.1, 3.0),
                "sigterm": rng.uniform(0.1, 3.0),
            }.get(kind, 0.0)
            events.append(FaultEvent(at, kind, rng.random(), duration, value))
        # A closing burst right before the faults stop, so that the convergence time
        # measures a recovery (a restart, lost nodes and runners), not a settled pool.
        for kind in rng.sample(CLOSING, k=rng.randint(1, 3)):
            at = rng.uniform(window - 2.0, window - 0.2)
            value = rng.uniform(0.1, 3.0) if kind == "sigkill" else 0.0
            events.append(FaultEvent(at, kind, rng.random(), window - at, value))
        events.sort(key=lambda e: e.at)
        schedule.append(Round(index, tuple(events)))
    return schedule


# ---- the run -------------------------------------------------------------------------


@dataclass
class HeldClaim:
    runner_id: str
    pool: str
    request_id: str
    expires_at: float  # unix seconds, as last answered
    releasing: bool = False
    done: bool = False


@dataclass
class Stats:
    claims_served: int = 0
    claims_repeated: int = 0
    pool_empty: int = 0
    unavailable: int = 0
    keepalives: int = 0
    repeats: int = 0
    releases: int = 0
    ended: Counter[str] = field(default_factory=Counter)
    double_claims: int = 0
    claims_lost: int = 0
    server_errors: int = 0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _pools_file(folder: Path, extra_idle: int) -> Path:
    path = folder / "pools.yaml"
    documents = [
        {
            "apiVersion": "poolkeeper.dev/v1alpha1",
            "kind": "RunnerPool",
            "metadata": {"name": p.name, "namespace": NAMESPACE},
            "spec": {
                "idleRunners": p.idle + extra_idle,
                "maxRunners": p.max_runners,
                "startupTimeoutSeconds": 10,
                "claims": {"defaultInactivityTimeoutSeconds": 30},
                "runner": {"image": f"{p.name}:latest"},
            },
        }
        for p in POOLS
    ]
    path.write_text(yaml.safe_dump_all(documents))
    return path


def _parse_time(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _percentile(values: Sequence[float], share: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    rank = max(0, math.ceil(share * len(ordered)) - 1)
    return round(ordered[rank], 2)


class ControllerProcess:
    """`python -m controller run` against the simulator; SIGKILLed, stopped, restarted."""

    def __init__(self, workdir: Path, sim_url: str, port: int, pools_file: Path) -> None:
        self.workdir = workdir
        self.sim_url = sim_url
        self.port = port
        self.pools_file = pools_file
        self.token_file = workdir / "tokens"
        self.token_file.write_text(TOKEN + "\n")
        self.proc: asyncio.subprocess.Process | None = None
        self.incarnation = 0
        self.started_at = 0.0
        self.logs: list[Path] = []
        self.pids: list[int] = []
        self.unexpected_exits: list[str] = []
        self.stopping = False
        self._watch: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        self.incarnation += 1
        log_path = self.workdir / f"controller-{self.incarnation}.log"
        self.logs.append(log_path)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("NOMAD_", "POOLKEEPER_"))}
        env["NOMAD_ADDR"] = self.sim_url
        env["PYTHONUNBUFFERED"] = "1"
        with log_path.open("wb") as log:
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "controller",
                "run",
                "--pools",
                str(self.pools_file),
                "--listen",
                f"127.0.0.1:{self.port}",
                "--resync-seconds",
                str(RESYNC_SECONDS),
                "--api-token-file",
                str(self.token_file),
                stdout=log,
                stderr=asyncio.subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        self.pids.append(self.proc.pid)
        self.started_at = time.monotonic()
        self._watch = asyncio.create_task(self._watch_exit(self.proc, self.incarnation))

    async def _watch_exit(self, proc: asyncio.subprocess.Process, incarnation: int) -> None:
        code = await proc.wait()
        if self.proc is not proc:
            return  # the driver killed or stopped it
        self.unexpected_exits.append(
            f"controller incarnation {incarnation} exited by itself with code {code}"
        )
        # As a supervisor (systemd, Kubernetes) would: start it again after a second.
        await asyncio.sleep(1.0)
        if not self.stopping and self.proc is proc:
            await self.start()

    async def kill(self) -> None:
        """SIGKILL: no chance to clean up, as after a node crash."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.returncode is None:
            proc.send_signal(signal.SIGKILL)
            await proc.wait()

    async def terminate(self) -> float:
        """SIGTERM, as a rolling restart does; the seconds until the process exited."""
        proc, self.proc = self.proc, None
        started = time.monotonic()
        if proc is not None and proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), 15)
            except TimeoutError:
                self.unexpected_exits.append("controller did not exit within 15 s of SIGTERM")
                proc.send_signal(signal.SIGKILL)
                await proc.wait()
        return time.monotonic() - started

    async def ensure_running(self) -> None:
        if self.proc is None or self.proc.returncode is not None:
            await self.start()

    async def stop(self) -> None:
        self.stopping = True
        await self.terminate()
        if self._watch is not None:
            await asyncio.gather(self._watch, return_exceptions=True)

    def tracebacks(self) -> list[str]:
        found = []
        for path in self.logs:
            lines = path.read_text(errors="replace").splitlines() if path.exists() else []
            for number, line in enumerate(lines):
                if "Traceback (most recent call last)" in line:
                    tail = next(
                        (x for x in lines[number + 1 : number + 60] if not x.startswith(" ")),
                        "",
                    )
                    found.append(f"{path.name}:{number + 1}: traceback: {tail.strip()[:300]}")
        return found

    def error_lines(self) -> list[str]:
        found = []
        for path in self.logs:
            if path.exists():
                for line in path.read_text(errors="replace").splitlines():
                    if " ERROR " in line:
                        found.append(f"{path.name}: {line[:300]}")
        return found


class Chaos:
    def __init__(self, seed: int, minutes: float, workdir: Path) -> None:
        self.seed = seed
        self.minutes = minutes
        self.workdir = workdir
        self.profile = Profile.for_minutes(minutes)
        self.schedule = make_schedule(seed, minutes, self.profile)
        self.client_rng = random.Random(seed ^ 0x5EED)
        self.sim = Simulator(nodes=list(NODES), seed=seed, start_delay=START_DELAY)
        self.server: SimServer | None = None
        self.controller: ControllerProcess | None = None
        # A second controller with a different spec for the same pools, started and
        # SIGKILLed by the fault `second_controller`; it must never write a pool it does
        # not hold the lease of, and serves some of the clients' requests while it runs.
        self.rival: ControllerProcess | None = None
        self.route_rng = random.Random(seed ^ 0xB1A5)
        self.rival_starts = 0
        self.handovers: list[float] = []  # seconds from a SIGTERM to the other's leases
        self.stats = Stats()
        self.violations: list[str] = []
        self.faults_injected: Counter[str] = Counter()
        self.fault_log: list[dict[str, Any]] = []
        self.touched: set[str] = set()  # runners whose allocation a fault stopped or restarted
        self.removed: set[str] = set()  # runners removed by remove_job_silently
        self.claimed_by: dict[str, str] = {}  # runner ID -> requestId of its claim
        self.held: dict[str, HeldClaim] = {}
        self.flagged: set[str] = set()
        self.claiming = asyncio.Event()
        self.inflight_claims = 0
        self.convergence: list[float] = []
        self.convergence_rounds: list[dict[str, Any]] = []
        self.max_excess: dict[str, int] = {p.key: 0 for p in POOLS}
        self.down_nodes: set[str] = set()
        self.drained_nodes: set[str] = set()
        self.restarts = 0
        self.rounds_played = 0
        self.started = time.monotonic()
        self.initial_fill_seconds = 0.0
        self.leaked_runners = 0
        self.leaked_records = 0

    def violate(self, message: str) -> None:
        stamp = round(time.monotonic() - self.started, 1)
        self.violations.append(f"t={stamp}s {message}")

    # ---- what Nomad holds --------------------------------------------------------------

    def _pool_jobs(self, pool: PoolSpec) -> list[dict[str, Any]]:
        pattern = re.compile(re.escape(pool.prefix) + "[0-9a-f]{12}")
        return [
            job
            for job in self.sim.job_list(NAMESPACE)
            if pattern.fullmatch(job["ID"]) and (job.get("Meta") or {}).get(META_POOL) == pool.key
        ]

    def _claims(self) -> dict[str, dict[str, str]]:
        return {
            path.removeprefix(CLAIMS_PREFIX): dict(var.get("Items") or {})
            | {"_modify_time": str(var.get("ModifyTime", 0))}
            for path, var in self.sim.variables(NAMESPACE).items()
            if path.startswith(CLAIMS_PREFIX)
        }

    def _live_allocs(self, job_id: str) -> list[dict[str, Any]]:
        return [
            a
            for a in self.sim.allocations(job_id, NAMESPACE)
            if a["DesiredStatus"] == "run" and a["ClientStatus"] in ("pending", "running")
        ]

    def pool_state(self, pool: PoolSpec, claims: dict[str, dict[str, str]]) -> dict[str, int]:
        """The pool as Nomad holds it, classified independently of the controller."""
        idle = starting = claimed = terminating = broken = 0
        total = 0
        job_ids = set()
        for job in self._pool_jobs(pool):
            job_ids.add(job["ID"])
            if job.get("Status") != "dead":
                total += 1
            claim = claims.get(job["ID"])
            live = self._live_allocs(job["ID"])
            if claim is not None and claim.get("state", "claimed") != "claimed":
                terminating += 1
            elif claim is not None:
                if any(a["ID"] == claim.get("allocationId") for a in live):
                    claimed += 1
                else:
                    broken += 1  # its allocation is gone: must become a `lost` tombstone
            elif job.get("Stop"):
                broken += 1
            elif any(a["ClientStatus"] == "running" for a in live):
                idle += 1
            else:
                starting += 1
        dangling = sum(
            1
            for runner_id, items in claims.items()
            if items.get("pool") == pool.key
            and items.get("state", "claimed") == "claimed"
            and runner_id not in job_ids
        )
        return {
            "idle": idle,
            "starting": starting,
            "claimed": claimed,
            "terminating": terminating,
            "broken": broken,
            "dangling_claims": dangling,
            "total": total,
        }

    @staticmethod
    def converged(pool: PoolSpec, state: dict[str, int]) -> bool:
        return bool(
            state["idle"] == pool.idle
            and state["starting"] == 0
            and state["terminating"] == 0
            and state["broken"] == 0
            and state["dangling_claims"] == 0
            and state["total"] <= pool.max_runners
        )

    # ---- continuous checks -------------------------------------------------------------

    async def monitor(self) -> None:
        while True:
            self.check_once()
            await asyncio.sleep(MONITOR_INTERVAL)

    def check_once(self) -> None:
        claims = self._claims()
        now_mono = time.monotonic()
        controller = self.controller
        grace = controller is not None and now_mono - controller.started_at < RESTART_GRACE_SECONDS
        for pool in POOLS:
            total = sum(1 for job in self._pool_jobs(pool) if job.get("Status") != "dead")
            excess = total - pool.max_runners
            if excess > 0:
                self.max_excess[pool.key] = max(self.max_excess[pool.key], excess)
                if not grace or excess > SURGE:
                    self.flag(
                        f"max:{pool.key}:{total}",
                        f"pool {pool.key} has {total} runners, more than maxRunners "
                        f"{pool.max_runners}",
                    )
        alive = {job["ID"] for job in self.sim.job_list(NAMESPACE) if not job.get("Stop")}
        for held in list(self.held.values()):
            if held.done or held.runner_id in alive:
                continue
            claim = claims.get(held.runner_id)
            state = None if claim is None else claim.get("state", "claimed")
            if state in (None, "claimed"):
                if held.runner_id not in self.removed:
                    self.flag(
                        f"purged:{held.runner_id}",
                        f"claimed runner {held.runner_id} was destroyed while its claim "
                        f"variable was {'absent' if claim is None else 'live'}",
                    )
                continue
            assert claim is not None
            modified = int(claim["_modify_time"]) / 1e9
            self.check_reason(held, str(state), modified, source="tombstone")

    def check_reason(self, held: HeldClaim, state: str, when: float, *, source: str) -> None:
        """Does the reason a claim ended (tombstone state or 410 reason) fit what happened?"""
        state = state.lower()
        runner = held.runner_id
        if state in ("released",):
            if not held.releasing:
                self.flag(
                    f"reason:{runner}",
                    f"{source}: runner {runner} ended `released` but its client never released it",
                )
        elif state in ("expired",):
            if when < held.expires_at - 1.0:
                self.flag(
                    f"reason:{runner}",
                    f"{source}: runner {runner} ended `expired` {held.expires_at - when:.1f} s "
                    "before the deadline its client was given",
                )
        elif state in ("lost", "allocationlost"):
            if runner not in self.touched and runner not in self.removed:
                self.flag(
                    f"reason:{runner}",
                    f"{source}: runner {runner} ended `lost` but no fault touched its allocation",
                )
        else:
            self.flag(
                f"reason:{runner}",
                f"{source}: claimed runner {runner} ended `{state}` (no pool was removed)",
            )

    def flag(self, key: str, message: str) -> None:
        if key not in self.flagged:
            self.flagged.add(key)
            self.violate(message)

    # ---- clients -----------------------------------------------------------------------

    async def request(
        self, http: aiohttp.ClientSession, method: str, path: str, body: Any = None
    ) -> tuple[int, Any]:
        """(status, JSON body); status 0 when the controller did not answer."""
        assert self.controller is not None
        target = self.controller
        if self.rival is not None and self.rival.proc is not None and self.route_rng.random() < 0.3:
            target = self.rival
        try:
            async with http.request(
                method,
                target.url + path,
                json=body,
                headers={"Authorization": f"Bearer {TOKEN}"},
                timeout=aiohttp.ClientTimeout(total=15),
            ) as response:
                text = await response.text()
                status = response.status
        except (aiohttp.ClientError, TimeoutError, ConnectionError):
            return 0, None
        try:
            payload = json.loads(text) if text else None
        except ValueError:
            payload = text
        if status >= 500 and status != 503:
            self.stats.server_errors += 1
            self.flag(f"5xx:{method}:{path}:{status}", f"{method} {path} answered {status}")
        if "Traceback" in text:
            self.flag(f"traceback:{path}", f"{method} {path} answered a traceback")
        return status, payload

    async def client(self, number: int, http: aiohttp.ClientSession) -> None:
        rng = random.Random(self.client_rng.random())
        serial = 0
        while True:
            await self.claiming.wait()
            serial += 1
            pool = rng.choice(POOLS)
            request_id = f"s{self.seed}-c{number}-{serial}"
            held = await self.claim(http, pool, request_id, rng)
            if held is None:
                await asyncio.sleep(rng.uniform(0.1, 0.6))
                continue
            await self.hold(http, held, rng)

    async def claim(
        self, http: aiohttp.ClientSession, pool: PoolSpec, request_id: str, rng: random.Random
    ) -> HeldClaim | None:
        body = {
            "requestId": request_id,
            "inactivityTimeoutSeconds": rng.randint(*self.profile.inactivity),
            "waitSeconds": 1,
        }
        path = f"/v1/pools/{NAMESPACE}/{pool.name}/claims"
        for _ in range(10):
            if not self.claiming.is_set():
                return None  # paused: a claim whose answer was lost expires by itself
            self.inflight_claims += 1
            try:
                status, payload = await self.request(http, "POST", path, body)
            finally:
                self.inflight_claims -= 1
            if status in (200, 201):
                return self.register_claim(payload, request_id, created=status == 201)
            code = payload.get("error", {}).get("code") if isinstance(payload, dict) else None
            if status == 503 and code == "PoolEmpty":
                self.stats.pool_empty += 1
                return None
            if status in (0, 503):
                self.stats.unavailable += 1
                await asyncio.sleep(rng.uniform(0.2, 0.8))
                continue  # the same requestId: a claim that was made is answered again
            if status == 410:
                return None  # the claim made by an unanswered attempt has ended already
            self.flag(f"claim:{status}:{code}", f"claim answered {status} {code}")
            return None
        return None

    def register_claim(self, payload: Any, request_id: str, *, created: bool) -> HeldClaim | None:
        runner_id = str(payload["runnerId"])
        previous = self.claimed_by.get(runner_id)
        if previous is not None and previous != request_id:
            self.stats.double_claims += 1
            self.violate(
                f"double claim: runner {runner_id} answered to request {request_id} after "
                f"request {previous}"
            )
            return None
        if previous is None:
            self.stats.claims_served += 1
        else:
            self.stats.claims_repeated += 1
        self.claimed_by[runner_id] = request_id
        held = HeldClaim(
            runner_id, str(payload["pool"]), request_id, _parse_time(payload["expiresAt"])
        )
        if runner_id in self.held and not self.held[runner_id].done:
            return None  # answered again to our own retry while we already hold it
        self.held[runner_id] = held
        del created
        return held

    async def hold(self, http: aiohttp.ClientSession, held: HeldClaim, rng: random.Random) -> None:
        until = time.monotonic() + rng.uniform(1.0, 8.0)
        try:
            while time.monotonic() < until and self.claiming.is_set():
                await asyncio.sleep(rng.uniform(0.3, 1.2))
                verb = rng.random()
                if verb < 0.1:
                    # The same requestId again (a client retrying): the same claim or a 410.
                    status, payload = await self.request(
                        http,
                        "POST",
                        f"/v1/pools/{held.pool}/claims",
                        {"requestId": held.request_id},
                    )
                    self.stats.repeats += 1
                    if status == 200 and payload["runnerId"] != held.runner_id:
                        self.stats.double_claims += 1
                        self.violate(
                            f"request {held.request_id} answered again with runner "
                            f"{payload['runnerId']}, first with {held.runner_id}"
                        )
                    if status in (200, 201):
                        continue
                    if status == 410 and self.ended(held, status, payload):
                        return  # the claim ended, for a reason that must fit
                elif verb < 0.8:
                    status, payload = await self.request(
                        http, "POST", f"/v1/runners/{held.runner_id}/keepalive"
                    )
                    self.stats.keepalives += 1
                else:
                    status, payload = await self.request(
                        http, "GET", f"/v1/runners/{held.runner_id}"
                    )
                if status == 200:
                    held.expires_at = max(held.expires_at, _parse_time(payload["expiresAt"]))
                elif self.ended(held, status, payload):
                    return
            await self.release(http, held, rng)
        finally:
            held.done = True

    async def release(
        self, http: aiohttp.ClientSession, held: HeldClaim, rng: random.Random
    ) -> None:
        for _ in range(20):
            held.releasing = True
            status, payload = await self.request(http, "DELETE", f"/v1/runners/{held.runner_id}")
            if status == 204:
                self.stats.releases += 1
                self.stats.ended["Released"] += 1
                return
            if self.ended(held, status, payload):
                return
            await asyncio.sleep(rng.uniform(0.2, 0.8))
        # Never answered: the claim expires by itself.

    def ended(self, held: HeldClaim, status: int, payload: Any) -> bool:
        """True when the answer ends the claim (410 or 404); checks why it ended."""
        error = payload.get("error", {}) if isinstance(payload, dict) else {}
        if status == 410:
            reason = str(error.get("reason") or "")
            self.stats.ended[reason or "(none)"] += 1
            if not reason:
                self.stats.claims_lost += 1
                self.violate(f"runner {held.runner_id}: 410 without a reason")
            else:
                self.check_reason(held, reason, time.time(), source="410")
            return True
        if status == 404:
            self.stats.claims_lost += 1
            self.violate(
                f"claim of runner {held.runner_id} vanished: 404 {error.get('code')} while "
                "its client held it"
            )
            return True
        if status not in (0, 503):
            self.flag(f"runner:{status}", f"runner route answered {status} {error.get('code')}")
        return False

    # ---- faults ------------------------------------------------------------------------

    def _running_allocs(self) -> list[dict[str, Any]]:
        ids = {job["ID"] for pool in POOLS for job in self._pool_jobs(pool)}
        allocs = [
            a
            for job_id in sorted(ids)
            for a in self.sim.allocations(job_id, NAMESPACE)
            if a["DesiredStatus"] == "run" and a["ClientStatus"] == "running"
        ]
        return sorted(allocs, key=lambda a: str(a["ID"]))

    def _usable_nodes(self) -> list[str]:
        return [n for n in NODES if n not in self.down_nodes and n not in self.drained_nodes]

    def _touch_node(self, node: str) -> list[str]:
        runners = sorted(
            {
                str(a["JobID"])
                for a in self.sim.allocations(None, NAMESPACE)
                if a.get("NodeName") == node or a.get("NodeID") == self.sim.node_id(node)
            }
        )
        self.touched.update(runners)
        return runners

    async def inject(
        self, event: FaultEvent, round_index: int, pending: list[asyncio.Task[None]]
    ) -> None:
        sim = self.sim
        target: Any = None
        kind = event.kind

        def pick(items: Sequence[Any]) -> Any:
            return items[min(len(items) - 1, int(event.pick * len(items)))] if items else None

        if kind in ("reschedule", "oom_restart", "reannounce", "task_exit"):
            alloc = pick(self._running_allocs())
            if alloc is None:
                target = "no running allocation"
            else:
                target = {"alloc": alloc["ID"], "runner": alloc["JobID"]}
                if kind != "reannounce":
                    self.touched.add(str(alloc["JobID"]))
                if kind == "reschedule":
                    await sim.reschedule_allocation(alloc["ID"])
                elif kind == "oom_restart":
                    await sim.oom_restart(alloc["ID"])
                elif kind == "reannounce":
                    await sim.reannounce_allocation(alloc["ID"])
                else:
                    await sim.finish_allocation(alloc["ID"], failed=event.pick < 0.5)
        elif kind == "remove_job_silently":
            jobs = sorted(job["ID"] for pool in POOLS for job in self._pool_jobs(pool))
            job_id = pick(jobs)
            if job_id is not None:
                self.removed.add(job_id)
                self.touched.add(job_id)
                await sim.remove_job_silently(job_id, NAMESPACE)
            target = {"runner": job_id}
        elif kind in ("node_down", "drain"):
            usable = self._usable_nodes()
            node = pick(usable) if len(usable) > 2 else None
            if node is None:
                target = "no node to spare"
            else:
                runners = self._touch_node(node)
                target = {"node": node, "runners": runners}
                if kind == "node_down":
                    self.down_nodes.add(node)
                    await sim.node_down(node)
                    pending.append(
                        asyncio.create_task(self._later(event.duration, self.node_up(node)))
                    )
                else:
                    self.drained_nodes.add(node)
                    await sim.drain_node(node, deadline_seconds=event.value)
                    pending.append(
                        asyncio.create_task(self._later(event.duration, self.undrain(node)))
                    )
        elif kind.startswith("event_"):
            sim.event_fault(
                kind.removeprefix("event_"), event.duration, delay_ms=event.value or 500
            )
            target = {"seconds": round(event.duration, 1)}
        elif kind == "stream_disconnect":
            sim.disconnect_event_streams()
        elif kind in ("no_leader", "connection_refused", "slow_api"):
            api_kind = {
                "no_leader": "no_leader",
                "connection_refused": "refuse",
                "slow_api": "slow",
            }[kind]
            sim.api_fault(api_kind, event.duration, slow_ms=event.value or 1000)
            target = {"seconds": round(event.duration, 1)}
        elif kind == "no_capacity":
            sim.no_capacity(True)
            pending.append(asyncio.create_task(self._later(event.duration, self._capacity_back())))
            target = {"seconds": round(event.duration, 1)}
        elif kind == "fail_starts":
            sim.fail_starts("*", on=True)
            pending.append(asyncio.create_task(self._later(event.duration, self._starts_back())))
            target = {"seconds": round(event.duration, 1)}
        elif kind == "slow_starts":
            sim.set_start_delay(event.value)
            pending.append(
                asyncio.create_task(self._later(event.duration, self._start_delay_back()))
            )
            target = {"start_delay": round(event.value, 2)}
        elif kind == "sigkill":
            assert self.controller is not None
            if self.controller.proc is None:
                target = "controller already down"
            else:
                await self.controller.kill()
                self.restarts += 1
                pending.append(asyncio.create_task(self._later(event.value, self._restart())))
                target = {"restart_after": round(event.value, 2)}
        elif kind == "sigterm":
            assert self.controller is not None
            if self.controller.proc is None:
                target = "controller already down"
            else:
                signalled = time.monotonic()
                rival_up = self.rival is not None and self.rival.proc is not None
                if rival_up and self.holds_every_lease(self.controller):
                    pending.append(asyncio.create_task(self.time_handover(signalled)))
                seconds = await self.controller.terminate()
                self.restarts += 1
                pending.append(asyncio.create_task(self._later(event.value, self._restart())))
                target = {"exited_after": round(seconds, 2), "restart_after": round(event.value, 2)}
        elif kind == "second_controller":
            assert self.rival is not None
            if self.rival.proc is not None:
                target = "second controller already running"
            else:
                await self.rival.start()
                self.rival_starts += 1
                pending.append(asyncio.create_task(self._later(event.duration, self.rival.kill())))
                target = {"sigkill_after": round(event.duration, 2)}
        self.faults_injected[kind] += 1
        self.fault_log.append({"round": round_index, **event.to_dict(), "hit": target})

    def holds_every_lease(self, process: ControllerProcess) -> bool:
        """Whether the running incarnation of `process` holds the lease of every pool."""
        if process.proc is None:
            return False
        holders = [
            str((var.get("Items") or {}).get("holder", ""))
            for path, var in self.sim.variables(NAMESPACE).items()
            if path.startswith(LEASES_PREFIX) and var.get("Lock")
        ]
        mine = f"/{process.proc.pid}"
        return len(holders) == len(POOLS) and all(h.endswith(mine) for h in holders)

    async def time_handover(self, signalled: float) -> None:
        """Seconds from the holder's SIGTERM until the running second controller holds
        every pool's lease (it released them on the way out)."""
        assert self.rival is not None
        while time.monotonic() - signalled < 15:
            if self.holds_every_lease(self.rival):
                self.handovers.append(round(time.monotonic() - signalled, 2))
                return
            await asyncio.sleep(0.05)
        # Not a violation: a holder that cannot reach Nomad cannot release its leases.

    @staticmethod
    async def _later(seconds: float, action: Any) -> None:
        try:
            await asyncio.sleep(seconds)
        except asyncio.CancelledError:
            action.close()
            raise
        await action

    async def node_up(self, node: str) -> None:
        if node in self.down_nodes:
            self.down_nodes.discard(node)
            await self.sim.node_up(node)

    async def undrain(self, node: str) -> None:
        if node in self.drained_nodes:
            self.drained_nodes.discard(node)
            await self.sim.drain_node(node, enable=False, mark_eligible=True)

    async def _capacity_back(self) -> None:
        self.sim.no_capacity(False)

    async def _starts_back(self) -> None:
        self.sim.fail_starts("*", on=False)

    async def _start_delay_back(self) -> None:
        self.sim.set_start_delay(START_DELAY)

    async def _restart(self) -> None:
        assert self.controller is not None
        await self.controller.ensure_running()

    async def end_faults(self, pending: list[asyncio.Task[None]]) -> None:
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        pending.clear()
        sim = self.sim
        sim.api_fault("none", 0)
        for kind in ("drop", "duplicate", "delay"):
            sim.event_fault(kind, 0)
        sim.no_capacity(False)
        sim.fail_starts("*", on=False)
        sim.set_start_delay(START_DELAY)
        for node in sorted(self.down_nodes):
            await self.node_up(node)
        for node in sorted(self.drained_nodes):
            await self.undrain(node)
        assert self.controller is not None and self.rival is not None
        await self.rival.kill()
        await self.controller.ensure_running()

    # ---- rounds ------------------------------------------------------------------------

    async def wait_converged(self, what: str, bound: float) -> dict[str, float] | None:
        """Seconds until each pool converged, or None (a violation) after `bound`."""
        started = time.monotonic()
        times: dict[str, float] = {}
        while True:
            claims = self._claims()
            for pool in POOLS:
                if pool.key not in times and self.converged(pool, self.pool_state(pool, claims)):
                    times[pool.key] = round(time.monotonic() - started, 2)
            if len(times) == len(POOLS):
                return times
            if time.monotonic() - started > bound:
                states = {p.key: self.pool_state(p, claims) for p in POOLS if p.key not in times}
                self.violate(f"{what}: pools did not converge within {bound:.0f} s: {states}")
                return None
            await asyncio.sleep(0.1)

    async def hold_converged(self, seconds: float, what: str) -> None:
        """Without faults and claims a converged pool stays converged."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            claims = self._claims()
            for pool in POOLS:
                state = self.pool_state(pool, claims)
                if (
                    state["idle"] != pool.idle
                    or state["starting"]
                    or state["total"] > pool.max_runners
                ):
                    self.flag(
                        f"unstable:{what}:{pool.key}",
                        f"{what}: pool {pool.key} left convergence without a fault: {state}",
                    )
            await asyncio.sleep(0.2)

    async def play_round(self, round_: Round, http: aiohttp.ClientSession) -> None:
        pending: list[asyncio.Task[None]] = []
        window_start = time.monotonic()
        self.claiming.set()
        for event in round_.events:
            delay = window_start + event.at - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            try:
                await self.inject(event, round_.index, pending)
            except Exception as error:  # a fault the simulator refused (e.g. alloc not running)
                self.fault_log.append(
                    {"round": round_.index, **event.to_dict(), "hit": f"refused: {error}"}
                )
        remaining = window_start + self.profile.window_seconds - time.monotonic()
        if remaining > 0:
            await asyncio.sleep(remaining)
        await self.end_faults(pending)
        self.claiming.clear()  # clients release what they hold and pause
        for _ in range(800):  # the claims in flight end within their 15 s client timeout
            if not self.inflight_claims:
                break
            await asyncio.sleep(0.05)
        times = await self.wait_converged(f"round {round_.index}", self.profile.convergence_bound)
        if times is not None:
            self.convergence.extend(times.values())
            await self.hold_converged(self.profile.quiet_seconds, f"round {round_.index}")
        self.convergence_rounds.append({"round": round_.index, "seconds": times})

    async def finish(self, http: aiohttp.ClientSession) -> None:
        """Everything released, unanswered claims expired: nothing may be left."""
        # Unanswered claims expire (inactivity), abandoned request records are collected
        # once a minute old, on a pass every 30 s (engine/requests_gc.py).
        bound = self.profile.inactivity[1] + 6 * RESYNC_SECONDS + 120
        started = time.monotonic()
        while True:
            claims = self._claims()
            live = [r for r, items in claims.items() if items.get("state", "claimed") == "claimed"]
            states = {p.key: self.pool_state(p, claims) for p in POOLS}
            leaks: list[str] = [f"live claim variable of runner {r}" for r in sorted(live)]
            leaked_runners = len(live)
            for pool in POOLS:
                state = states[pool.key]
                extra = state["total"] - state["idle"] + max(0, state["idle"] - pool.idle)
                leaked_runners += max(0, extra)
                if extra > 0 or state["idle"] != pool.idle:
                    leaks.append(f"pool {pool.key}: {state}")
            # A request record lives as long as its claim or its tombstone.
            carried = {items.get("requestId") for items in claims.values()}
            records = [
                f"request record {path} without a claim: {dict(var.get('Items') or {})}"
                for path, var in sorted(self.sim.variables(NAMESPACE).items())
                if path.startswith(REQUESTS_PREFIX)
                and path.removeprefix(REQUESTS_PREFIX) not in carried
            ]
            if not leaks and not records:
                break
            if time.monotonic() - started > bound:
                self.leaked_runners, self.leaked_records = leaked_runners, len(records)
                for leak in leaks + records:
                    self.violate(f"final state, {bound:.0f} s after the last fault: {leak}")
                break
            await asyncio.sleep(0.25)
        # The controller must agree with Nomad.
        status, payload = await self.request(http, "GET", "/v1/pools")
        if status != 200:
            self.violate(f"GET /v1/pools answered {status} at the end")
            return
        for entry in payload["pools"]:
            known = next((p for p in POOLS if p.name == entry["name"]), None)
            if known is not None and entry["status"].get("idleRunners") != known.idle:
                self.violate(
                    f"controller reports {entry['status'].get('idleRunners')} idle runners "
                    f"for {known.key}, Nomad holds {known.idle}"
                )

    async def run(self) -> dict[str, Any]:
        self.server = await start_sim(self.sim, host="127.0.0.1", port=0)
        self.controller = ControllerProcess(
            self.workdir, self.server.url, _free_port(), _pools_file(self.workdir, 0)
        )
        rival_dir = self.workdir / "second-controller"
        rival_dir.mkdir(exist_ok=True)
        self.rival = ControllerProcess(
            rival_dir, self.server.url, _free_port(), _pools_file(rival_dir, RIVAL_EXTRA_IDLE)
        )
        monitor = asyncio.create_task(self.monitor())
        clients: list[asyncio.Task[None]] = []
        try:
            await self.controller.start()
            times = await self.wait_converged("initial fill", 60.0)
            self.initial_fill_seconds = max(times.values()) if times else -1.0
            async with aiohttp.ClientSession() as http:
                clients = [
                    asyncio.create_task(self.client(n, http)) for n in range(self.profile.clients)
                ]
                budget = self.minutes * 60 - self.profile.final_reserve_seconds
                for round_ in self.schedule:
                    await self.play_round(round_, http)
                    self.rounds_played += 1
                    if time.monotonic() - self.started >= budget:
                        break
                await self.finish(http)
                for task in clients:
                    task.cancel()
                await asyncio.gather(*clients, return_exceptions=True)
        finally:
            monitor.cancel()
            await asyncio.gather(monitor, return_exceptions=True)
            for task in clients:
                task.cancel()
            await self.rival.stop()
            await self.controller.stop()
            await self.server.stop()
        for process in (self.controller, self.rival):
            for exit_ in process.unexpected_exits:
                self.violate(exit_)
            for traceback in process.tracebacks():
                self.violate(f"controller log: {traceback}")
        for write in self.sim.audit.by_non_holders():
            self.violate(
                f"{write.kind} of runner {write.job_id} by {write.writer} while "
                f"{write.holder or 'nobody'} held the lease of {write.pool}"
            )
        return self.report()

    def writes_as_holder(self, process: ControllerProcess) -> int:
        """Runner jobs written by any incarnation of `process` (its identity ends in its pid)
        while it held the pool's lease."""
        pids = {str(pid) for pid in process.pids}
        return sum(
            1
            for write in self.sim.audit.writes
            if write.writer == write.holder and write.writer.rpartition("/")[2] in pids
        )

    def report(self) -> dict[str, Any]:
        assert self.controller is not None and self.rival is not None
        stats = self.stats
        return {
            "seed": self.seed,
            "minutes": self.minutes,
            "command": f"poolkeeper chaos --minutes {self.minutes:g} --seed {self.seed}",
            "duration_seconds": round(time.monotonic() - self.started, 1),
            "rounds": self.rounds_played,
            "rounds_scheduled": len(self.schedule),
            "pools": [
                {"pool": p.key, "idleRunners": p.idle, "maxRunners": p.max_runners} for p in POOLS
            ],
            "faults_injected": dict(sorted(self.faults_injected.items())),
            "claims_served": stats.claims_served,
            "claims_answered_again": stats.claims_repeated,
            "request_ids_repeated": stats.repeats,
            "claims_ended": dict(sorted(stats.ended.items())),
            "keepalives": stats.keepalives,
            "pool_empty_answers": stats.pool_empty,
            "unavailable_answers": stats.unavailable,
            "controller_restarts": self.restarts,
            "second_controller_starts": self.rival_starts,
            "sigterm_handover_seconds": self.handovers,
            "runner_writes": len(self.sim.audit.writes),
            "runner_writes_by_second_controller_as_holder": self.writes_as_holder(self.rival),
            "runner_writes_by_non_holders": len(self.sim.audit.by_non_holders()),
            "initial_fill_seconds": self.initial_fill_seconds,
            "convergence_samples": len(self.convergence),
            "convergence_p50_seconds": _percentile(self.convergence, 0.5),
            "convergence_p99_seconds": _percentile(self.convergence, 0.99),
            "convergence_max_seconds": max(self.convergence, default=None),
            "runners_leaked": self.leaked_runners,
            "request_records_leaked": self.leaked_records,
            "double_claims": stats.double_claims,
            "claims_lost": stats.claims_lost,
            "max_runners_excess": self.max_excess,
            "job_registrations": self.sim.registrations(),
            "controller_error_log_lines": len(self.controller.error_lines())
            + len(self.rival.error_lines()),
            "invariant_violations": self.violations,
            "convergence_by_round": self.convergence_rounds,
            "faults": self.fault_log,
        }


def render_markdown(reports: Sequence[dict[str, Any]], command: str) -> str:
    """docs/reliability.md from one or more soak reports (regenerated, never hand-edited)."""
    lines = [
        "# Reliability",
        "",
        f"<!-- generated by `{command}`; do not edit by hand -->",
        "",
        "The chaos soak (`poolkeeper chaos`, `controller/lab/chaos.py`) runs three pools on",
        "the simulator, a controller subprocess that is SIGKILLed (or stopped with SIGTERM)",
        "and restarted at random",
        "moments, a second controller with a different spec for the same pools",
        "(`idleRunners` + 1) that is started and SIGKILLed at random moments, concurrent",
        "clients that claim, keep alive and release runners through either, and a fault",
        "schedule drawn from the seed that injects every fault the simulator offers. The",
        "module docstring of `controller/lab/chaos.py` states exactly what is checked; among",
        "it, from the simulator's write audit, that no runner job was ever registered or",
        "purged by a controller that did not hold its pool's lease. The fault matrix",
        "(`tests/integration/test_fault_matrix.py`) tests each fault class on its own, and",
        "`tests/integration/test_hostile_input.py` fuzzes the HTTP API.",
        "",
        f"Regenerate this page with `{command}`.",
        "",
        "What each round does: for a fault window the clients claim (with `requestId`s,",
        "sometimes repeated), keep alive, read and release runners while the scheduled",
        "faults hit, ending with a burst of destructive ones; then every fault stops, the",
        "clients release what they hold and pause, and the *convergence time* is measured:",
        "until every pool holds exactly `idleRunners` idle runners, nothing starting, no",
        "tombstoned job left and no live claim without its live allocation, as read from",
        "Nomad (not from the controller). At the end everything is released, unanswered",
        "claims expire, and nothing but the idle runners may be left (`runners leaked`).",
        "A double claim is one runner ID answered to two different claims; a claim lost",
        "without a reason is a 404 for a runner its client still held. `maxRunners` is",
        "checked on every sample (an excess up to the per-pass surge is tolerated for",
        f"{RESTART_GRACE_SECONDS:g} s after a controller start and reported below).",
        "",
        "| figure | " + " | ".join(f"seed {r['seed']}" for r in reports) + " |",
        "|---|" + "---|" * len(reports),
    ]
    rows = [
        ("minutes", "minutes"),
        ("duration (s)", "duration_seconds"),
        ("rounds of faults", "rounds"),
        ("faults injected", "faults_total"),
        ("claims served", "claims_served"),
        ("controller restarts survived (SIGKILL, SIGTERM)", "controller_restarts"),
        ("second controller started (then SIGKILLed)", "second_controller_starts"),
        ("leases handed over on SIGTERM to the second controller", "handovers"),
        ("... seconds until handed over, max", "handover_max"),
        ("runner job writes", "runner_writes"),
        (
            "... by the second controller, holding the lease",
            "runner_writes_by_second_controller_as_holder",
        ),
        ("runner job writes by a non-holder (goal 0)", "runner_writes_by_non_holders"),
        ("convergence after faults, p50 (s)", "convergence_p50_seconds"),
        ("convergence after faults, p99 (s)", "convergence_p99_seconds"),
        ("convergence after faults, max (s)", "convergence_max_seconds"),
        ("runners leaked (goal 0)", "runners_leaked"),
        ("request records leaked (goal 0)", "request_records_leaked"),
        ("double claims (goal 0)", "double_claims"),
        ("claims lost without a reason (goal 0)", "claims_lost"),
        ("max runners above maxRunners", "max_runners_excess_total"),
        ("job registrations", "job_registrations"),
        ("invariant violations (goal 0)", "invariant_violations"),
    ]
    for label, key in rows:
        cells = []
        for report in reports:
            derived = {
                "faults_total": sum(report["faults_injected"].values()),
                "max_runners_excess_total": max(report["max_runners_excess"].values(), default=0),
                "handovers": len(report["sigterm_handover_seconds"]),
                "handover_max": max(report["sigterm_handover_seconds"], default=None),
            }
            value = derived.get(key, report.get(key))
            cells.append(str(len(value)) if isinstance(value, list) else str(value))
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    kinds = sorted({k for r in reports for k in r["faults_injected"]})
    lines += ["", "## Faults injected per class", ""]
    lines.append("| fault | " + " | ".join(f"seed {r['seed']}" for r in reports) + " |")
    lines.append("|---|" + "---|" * len(reports))
    for kind in kinds:
        lines.append(
            f"| {kind} | "
            + " | ".join(str(r["faults_injected"].get(kind, 0)) for r in reports)
            + " |"
        )
    lines += ["", "## How claims ended", ""]
    for report in reports:
        ended = ", ".join(f"{k}: {v}" for k, v in report["claims_ended"].items())
        lines.append(f"- seed {report['seed']}: {ended}")
    lines += ["", "## Invariant violations", ""]
    for report in reports:
        violations = report["invariant_violations"]
        if not violations:
            lines.append(f"- seed {report['seed']}: none")
        for violation in violations:
            lines.append(f"- seed {report['seed']}: {violation}")
    lines.append("")
    return "\n".join(lines)


async def run_chaos(seed: int, minutes: float, workdir: Path | None = None) -> dict[str, Any]:
    """One soak; the controller logs stay in `workdir` when one is given."""
    if workdir is not None:
        return await Chaos(seed, minutes, workdir).run()
    with tempfile.TemporaryDirectory(prefix="poolkeeper-chaos-") as scratch:
        return await Chaos(seed, minutes, Path(scratch)).run()


def main(args: argparse.Namespace) -> int:
    minutes = float(args.minutes)
    seeds = [int(args.seed)]
    reports = []
    for seed in seeds:
        workdir = Path(args.workdir) if getattr(args, "workdir", None) else None
        if workdir is not None:
            workdir.mkdir(parents=True, exist_ok=True)
        report = asyncio.run(run_chaos(seed, minutes, workdir))
        reports.append(report)
        summary = {k: v for k, v in report.items() if k not in ("faults", "convergence_by_round")}
        print(json.dumps(summary, indent=2))
    json_file = getattr(args, "json_file", None)
    if json_file:
        Path(json_file).write_text(json.dumps(reports[0], indent=2) + "\n")
    markdown = getattr(args, "markdown", None)
    if markdown:
        command = (
            f"python -m controller.lab.chaos --minutes {minutes:g} --seed {seeds[0]} "
            f"--markdown {markdown}"
        )
        Path(markdown).write_text(render_markdown(reports, command))
    failed = any(r["invariant_violations"] for r in reports)
    return EXIT_FAILURE if failed else EXIT_OK


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m controller.lab.chaos", description=__doc__)
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", dest="json_file")
    parser.add_argument("--markdown", help="write docs/reliability.md from the report")
    parser.add_argument("--workdir", help="keep the controller logs in this folder")
    return parser


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main(_parser().parse_args()))
