"""The soak's clients: they claim, keep alive, read and release runners through the HTTP
API of either controller, and check every answer, and why each of their claims ended."""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

import aiohttp

from controller.lab.chaos.balancer import ORIGIN_HEADER, REPLICA_HEADER
from controller.lab.chaos.faults import FaultedRunners
from controller.lab.chaos.ledger import Ledger, Sent, describe
from controller.lab.chaos.processes import TOKEN, ControllerProcess
from controller.lab.chaos.violations import Violations
from controller.lab.chaos.world import NAMESPACE, PoolSpec

# The share of requests the second controller serves while it runs.
RIVAL_SHARE = 0.3


@dataclass
class HeldClaim:
    runner_id: str
    pool: str
    request_id: str
    expires_at: float  # unix seconds, as last answered
    releasing: bool = False
    done: bool = False


@dataclass(frozen=True)
class Habits:
    """How the clients work; the defaults are the chaos soak's."""

    inactivity: tuple[int, int]  # claims' inactivity timeouts are drawn from this range
    claim_attempts: int = 10  # tries of one requestId while the API does not answer
    wait_seconds: int = 1  # a claim's wait for an idle runner
    # The share of the steps while holding a runner that are a waited execution (`echo`).
    execution_share: float = 0.0


@dataclass
class Stats:
    claims_served: int = 0
    claims_repeated: int = 0
    pool_empty: int = 0
    unavailable: int = 0
    keepalives: int = 0
    repeats: int = 0
    ended: Counter[str] = field(default_factory=Counter)
    double_claims: int = 0
    claims_lost: int = 0
    claims_given_up: int = 0  # every try of a requestId unanswered
    claims_ended_unanswered: int = 0  # a retried requestId's claim had ended already
    executions: int = 0  # waited executions that answered with their output

    def figures(self) -> dict[str, Any]:
        """What every soak's report says of its clients' claims."""
        return {
            "claims_served": self.claims_served,
            "claims_answered_again": self.claims_repeated,
            "request_ids_repeated": self.repeats,
            "claims_ended": dict(sorted(self.ended.items())),
            "keepalives": self.keepalives,
            "pool_empty_answers": self.pool_empty,
            "double_claims": self.double_claims,
            "claims_lost": self.claims_lost,
        }


def _parse_time(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


class Api(Protocol):
    async def request(
        self, http: aiohttp.ClientSession, method: str, path: str, body: Any = None
    ) -> tuple[int, Any]:
        """(status, JSON body); status 0 when the API did not answer."""


async def _send(
    http: aiohttp.ClientSession, method: str, url: str, body: Any
) -> tuple[int, str, Mapping[str, str]]:
    """(status, text, headers); status 0 when nothing answered, with why as the text."""
    try:
        async with http.request(
            method,
            url,
            json=body,
            headers={"Authorization": f"Bearer {TOKEN}"},
            timeout=aiohttp.ClientTimeout(total=15),
        ) as response:
            return response.status, await response.text(), response.headers
    except (aiohttp.ClientError, TimeoutError, ConnectionError) as error:
        return 0, f"{type(error).__name__}: {error}", {}


def _decoded(violations: Violations, method: str, path: str, status: int, text: str) -> Any:
    """The answer's JSON body; an answer no API may give (a 5xx but 503, a traceback) is
    a violation."""
    try:
        payload = json.loads(text) if text else None
    except ValueError:
        payload = text
    if status >= 500 and status != 503:
        violations.add_once(f"5xx:{method}:{path}:{status}", f"{method} {path} answered {status}")
    if "Traceback" in text:
        violations.add_once(f"traceback:{path}", f"{method} {path} answered a traceback")
    return payload


async def _ask(
    http: aiohttp.ClientSession,
    process: ControllerProcess,
    method: str,
    path: str,
    body: Any,
    violations: Violations,
) -> tuple[int, Any]:
    """One request to `process`: its status and decoded answer, (0, None) for no answer."""
    status, text, _ = await _send(http, method, process.url + path, body)
    if status == 0:
        return 0, None
    return status, _decoded(violations, method, path, status, text)


@dataclass
class ControllerApi:
    """Requests to the controller, or to the second controller while it runs."""

    controller: ControllerProcess
    rival: ControllerProcess
    violations: Violations
    routing: random.Random  # draws which controller a request goes to

    async def request(
        self, http: aiohttp.ClientSession, method: str, path: str, body: Any = None
    ) -> tuple[int, Any]:
        target = self.controller
        if self.rival.proc is not None and self.routing.random() < RIVAL_SHARE:
            target = self.rival
        return await _ask(http, target, method, path, body, self.violations)


@dataclass
class AnyApi:
    """Requests to one of the running processes, drawn at random for each request."""

    processes: Sequence[ControllerProcess]
    violations: Violations
    routing: random.Random  # draws which process a request goes to

    async def request(
        self, http: aiohttp.ClientSession, method: str, path: str, body: Any = None
    ) -> tuple[int, Any]:
        running = [p for p in self.processes if p.proc is not None] or list(self.processes)
        return await _ask(http, self.routing.choice(running), method, path, body, self.violations)


@dataclass
class BalancedApi:
    """Requests through the load balancer, each written down in the ledger. An answer
    HAProxy gave (no replica answered) reaches the client as no answer (status 0)."""

    url: str
    violations: Violations
    ledger: Ledger

    async def request(
        self, http: aiohttp.ClientSession, method: str, path: str, body: Any = None
    ) -> tuple[int, Any]:
        kind, subject = describe(method, path, body)
        started = time.monotonic()
        status, text, headers = await _send(http, method, self.url + path, body)
        from_replica = headers.get(ORIGIN_HEADER) == "replica"
        payload = _decoded(self.violations, method, path, status, text) if from_replica else None
        error = payload.get("error") if isinstance(payload, dict) else None
        error = error if isinstance(error, dict) else {"message": text[:200]}
        self.ledger.add(
            Sent(
                kind,
                subject,
                started,
                time.monotonic(),
                status,
                headers.get(REPLICA_HEADER, ""),
                from_replica,
                error.get("code"),
                str(error.get("message") or ""),
            )
        )
        return (status, payload) if from_replica else (0, None)


class Clients:
    """Concurrent clients, each a loop: claim a runner of a random pool, hold it a while
    (keepalives, reads, a repeated requestId), release it; paused between fault windows."""

    def __init__(
        self,
        seed: int,
        habits: Habits,
        api: Api,
        faulted: FaultedRunners,
        violations: Violations,
        pools: Sequence[PoolSpec],
    ) -> None:
        self.seed = seed
        self.pools = pools
        self.habits = habits
        self.api = api
        self.faulted = faulted
        self.violations = violations
        self.seeds = random.Random(seed ^ 0x5EED)  # each client's own random seed
        self.stats = Stats()
        self.claimed_by: dict[str, str] = {}  # runner ID -> requestId of its claim
        self.held: dict[str, HeldClaim] = {}
        self.claiming = asyncio.Event()
        self.inflight_claims = 0

    def resume(self) -> None:
        self.claiming.set()

    async def pause(self) -> None:
        """Clients release what they hold and claim nothing more; returns once no claim
        request is in flight."""
        self.claiming.clear()
        for _ in range(800):  # the claims in flight end within their 15 s client timeout
            if not self.inflight_claims:
                break
            await asyncio.sleep(0.05)

    async def work(self, number: int, http: aiohttp.ClientSession) -> None:
        """One client, until cancelled."""
        rng = random.Random(self.seeds.random())
        serial = 0
        while True:
            await self.claiming.wait()
            serial += 1
            pool = rng.choice(self.pools)
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
            "inactivityTimeoutSeconds": rng.randint(*self.habits.inactivity),
            "waitSeconds": self.habits.wait_seconds,
        }
        path = f"/v1/pools/{NAMESPACE}/{pool.name}/claims"
        for _ in range(self.habits.claim_attempts):
            if not self.claiming.is_set():
                return None  # paused: a claim whose answer was lost expires by itself
            self.inflight_claims += 1
            try:
                status, payload = await self.api.request(http, "POST", path, body)
            finally:
                self.inflight_claims -= 1
            if status in (200, 201):
                return self.register_claim(payload, request_id)
            code = payload.get("error", {}).get("code") if isinstance(payload, dict) else None
            if status == 503 and code == "PoolEmpty":
                self.stats.pool_empty += 1
                return None
            if status in (0, 503):
                self.stats.unavailable += 1
                await asyncio.sleep(rng.uniform(0.2, 0.8))
                continue  # the same requestId: a claim that was made is answered again
            if status == 410:
                self.stats.claims_ended_unanswered += 1
                return None  # the claim made by an unanswered attempt has ended already
            self.violations.add_once(f"claim:{status}:{code}", f"claim answered {status} {code}")
            return None
        self.stats.claims_given_up += 1
        return None

    def register_claim(self, payload: Any, request_id: str) -> HeldClaim | None:
        """The claim answered to `request_id`, unless its runner was claimed by another one
        (a double claim) or is held already (our own retry answered again)."""
        runner_id = str(payload["runnerId"])
        previous = self.claimed_by.get(runner_id)
        if previous is not None and previous != request_id:
            self.stats.double_claims += 1
            self.violations.add(
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
            return None
        self.held[runner_id] = held
        return held

    async def hold(self, http: aiohttp.ClientSession, held: HeldClaim, rng: random.Random) -> None:
        until = time.monotonic() + rng.uniform(1.0, 8.0)
        try:
            while time.monotonic() < until and self.claiming.is_set():
                await asyncio.sleep(rng.uniform(0.3, 1.2))
                share = self.habits.execution_share
                if share and rng.random() < share:
                    if not await self.execute(http, held, rng):
                        return
                    continue
                verb = rng.random()
                if verb < 0.1:
                    status, payload = await self.repeat(http, held, rng)
                    if status in (200, 201):
                        continue
                    if status == 410 and self.ended(held, status, payload):
                        return  # the claim ended, for a reason that must fit
                elif verb < 0.8:
                    status, payload = await self.api.request(
                        http, "POST", f"/v1/runners/{held.runner_id}/keepalive"
                    )
                    self.stats.keepalives += 1
                else:
                    status, payload = await self.api.request(
                        http, "GET", f"/v1/runners/{held.runner_id}"
                    )
                if status == 200:
                    held.expires_at = max(held.expires_at, _parse_time(payload["expiresAt"]))
                elif self.ended(held, status, payload):
                    return
            await self.release(http, held, rng)
        finally:
            held.done = True

    async def repeat(
        self, http: aiohttp.ClientSession, held: HeldClaim, rng: random.Random
    ) -> tuple[int, Any]:
        """The same requestId again (a client retrying): the same claim or a 410. Tried
        again while unanswered, as a client does whose retry went unanswered."""
        for _ in range(self.habits.claim_attempts):
            status, payload = await self.api.request(
                http, "POST", f"/v1/pools/{held.pool}/claims", {"requestId": held.request_id}
            )
            self.stats.repeats += 1
            if status == 200 and payload["runnerId"] != held.runner_id:
                self.stats.double_claims += 1
                self.violations.add(
                    f"request {held.request_id} answered again with runner "
                    f"{payload['runnerId']}, first with {held.runner_id}"
                )
            if status not in (0, 503):
                break
            await asyncio.sleep(rng.uniform(0.2, 0.8))
        return status, payload

    async def execute(
        self, http: aiohttp.ClientSession, held: HeldClaim, rng: random.Random
    ) -> bool:
        """A waited `echo` in the runner, tried again while unanswered (it may run twice);
        False when the claim ended."""
        text = f"{held.request_id}-{rng.randrange(10**6)}"
        body = {"command": ["echo", text], "wait": True}
        for _ in range(self.habits.claim_attempts):
            status, payload = await self.api.request(
                http, "POST", f"/v1/runners/{held.runner_id}/executions", body
            )
            if status == 200:
                self.stats.executions += 1
                if (payload.get("exitCode"), payload.get("stdout")) != (0, text + "\n"):
                    self.violations.add(f"execution in {held.runner_id} answered {payload}")
                return True
            if self.ended(held, status, payload):
                return False
            if status not in (0, 503):
                return True  # a violation already
            await asyncio.sleep(rng.uniform(0.2, 0.8))
        return True

    async def release(
        self, http: aiohttp.ClientSession, held: HeldClaim, rng: random.Random
    ) -> None:
        for _ in range(20):
            held.releasing = True
            status, payload = await self.api.request(
                http, "DELETE", f"/v1/runners/{held.runner_id}"
            )
            if status == 204:
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
                self.violations.add(f"runner {held.runner_id}: 410 without a reason")
            else:
                self.check_reason(held, reason, time.time(), source="410")
            return True
        if status == 404:
            self.stats.claims_lost += 1
            self.violations.add(
                f"claim of runner {held.runner_id} vanished: 404 {error.get('code')} while "
                "its client held it"
            )
            return True
        if status not in (0, 503):
            self.violations.add_once(
                f"runner:{status}", f"runner route answered {status} {error.get('code')}"
            )
        return False

    def check_reason(self, held: HeldClaim, state: str, when: float, *, source: str) -> None:
        """Does the reason a claim ended (tombstone state or 410 reason) fit what happened?"""
        state = state.lower()
        runner = held.runner_id
        key = f"reason:{runner}"
        if state == "released":
            if not held.releasing:
                self.violations.add_once(
                    key,
                    f"{source}: runner {runner} ended `released` but its client never released it",
                )
        elif state == "expired":
            if when < held.expires_at - 1.0:
                self.violations.add_once(
                    key,
                    f"{source}: runner {runner} ended `expired` {held.expires_at - when:.1f} s "
                    "before the deadline its client was given",
                )
        elif state in ("lost", "allocationlost"):
            if runner not in self.faulted.touched and runner not in self.faulted.removed:
                self.violations.add_once(
                    key,
                    f"{source}: runner {runner} ended `lost` but no fault touched its allocation",
                )
        else:
            self.violations.add_once(
                key, f"{source}: claimed runner {runner} ended `{state}` (no pool was removed)"
            )
