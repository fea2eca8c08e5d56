"""Every request the API tier soak's clients send through the balancer, and why each one
that failed failed: the soak knows when it killed which replica, and every answer names
the replica it went to (balancer.py).

A request *failed* when no replica answered it (HAProxy's own 502 or 503, or no answer at
all), or when a replica answered 503 with another code than `PoolEmpty`. Each failure is
put down to one cause:

* `in_flight`: it went to a replica that was killed after it was sent and before it ended
  (or, when the balancer closed the connection without an answer, which names no
  replica, a replica was killed meanwhile);
* `sent_to_dead`: it went to a killed replica after its death and before the balancer had
  put the restarted one back (a refused connection: the balancer retries nothing, and
  takes a replica out at its first refused connection), or, sent after the kill and
  before the balancer took the replica out, it was closed without an answer naming no
  replica (the balancer had sent it on a connection it kept to the dead replica);
* `waiting_for_claimer`: a repeated claim whose requestId an earlier attempt, one that
  failed for one of the causes above, had taken; the repeat waits for that attempt's
  claimer, which died, until the request record's `servedUntil` and then takes it over;
* `unexplained`: anything else (a violation).

The claims' availability counts every claim attempt that no kill failed: those failed
for one of the first three causes are left out.

A failure is *recovered* when a later request of the same subject succeeded: for a claim
the same requestId, for a runner route the same runner.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

CAUSES = ("in_flight", "sent_to_dead", "waiting_for_claimer", "unexplained")
_RUNNER_PATH = re.compile(r"^/v1/runners/(?P<runner>[^/]+)(?P<rest>/.*)?$")
_CLAIMS_PATH = re.compile(r"^/v1/pools/[^/]+/[^/]+/claims$")
WAITING_FOR_CLAIMER = "is still being served elsewhere"


@dataclass
class Kill:
    """One SIGKILL of a replica, and when the balancer took it out and put it back."""

    replica: str  # the balancer's name of it (api-1, ...)
    at: float  # time.monotonic() right before the signal
    out_of_rotation_at: float | None = None
    restarted_at: float | None = None
    back_in_rotation_at: float | None = None

    def in_rotation_dead(self, moment: float) -> bool:
        """Whether at `moment` the replica was dead but the balancer had not taken it out."""
        out = self.out_of_rotation_at
        return self.at <= moment and (out is None or moment <= out)

    def dead_at(self, moment: float) -> bool:
        """Whether a request sent at `moment` could reach this replica dead."""
        back = self.back_in_rotation_at
        return self.at <= moment and (back is None or moment < back)


@dataclass(frozen=True)
class Sent:
    """One request and its answer."""

    kind: str  # claim, keepalive, read, execution, release, other
    subject: str  # the claim's requestId, or the runner's ID
    started: float  # time.monotonic()
    ended: float
    status: int  # 0: no answer at all
    replica: str  # the replica the balancer sent it to ("" when none)
    from_replica: bool  # a replica gave the answer, not HAProxy
    code: str | None  # the API's error code
    message: str

    @property
    def succeeded(self) -> bool:
        return 200 <= self.status < 300 and self.from_replica

    def recovers(self, failed: Sent) -> bool:
        """Whether this later request of the same subject makes up for `failed`: a claim
        handed out, or any answer of a replica to a runner route (a release retried after
        one that went through answers 410 Released)."""
        if self.subject != failed.subject or self.started <= failed.started:
            return False
        return self.succeeded if self.kind == "claim" else not self.failed

    @property
    def failed(self) -> bool:
        if not self.from_replica:
            return True
        return self.status >= 500 and not (self.status == 503 and self.code == "PoolEmpty")


def describe(method: str, path: str, body: Any) -> tuple[str, str]:
    """(kind, subject) of a request."""
    if method == "POST" and _CLAIMS_PATH.match(path):
        request_id = body.get("requestId") if isinstance(body, dict) else None
        return "claim", str(request_id or "")
    match = _RUNNER_PATH.match(path)
    if match is None:
        return "other", ""
    rest = match["rest"] or ""
    kind = {
        ("POST", "/keepalive"): "keepalive",
        ("POST", "/executions"): "execution",
        ("GET", ""): "read",
        ("DELETE", ""): "release",
    }.get((method, rest), "other")
    return kind, match["runner"]


@dataclass
class Ledger:
    origin: float  # time.monotonic() at the soak's start: times are shown from it
    sent: list[Sent] = field(default_factory=list)
    kills: list[Kill] = field(default_factory=list)

    def add(self, sent: Sent) -> None:
        self.sent.append(sent)

    def cause(self, sent: Sent, earlier_failures: set[str]) -> str:
        """Why `sent` failed; `earlier_failures` are the subjects of claims that failed by
        a kill before."""
        for kill in self.kills:
            during = sent.started < kill.at <= sent.ended
            # The balancer closes the client's connection without an answer when a request
            # it sent on a reused connection to the replica fails: no replica is named.
            unnamed = not sent.replica and sent.status == 0
            if during and (kill.replica == sent.replica or unnamed):
                return "in_flight"
            refused = not sent.from_replica and kill.dead_at(sent.started)
            if refused and kill.replica == sent.replica:
                return "sent_to_dead"
            # Sent after the kill on a connection the balancer kept to the dead replica,
            # before it took the replica out: closed without an answer, again unnamed.
            if unnamed and kill.in_rotation_dead(sent.started):
                return "sent_to_dead"
        if (
            sent.kind == "claim"
            and sent.subject in earlier_failures
            and sent.from_replica
            and WAITING_FOR_CLAIMER in sent.message
        ):
            return "waiting_for_claimer"
        return "unexplained"

    def causes(self) -> list[tuple[Sent, str]]:
        """Every failed request with its cause, in the order they were sent."""
        killed_claims: set[str] = set()  # claims that failed by a kill
        found = []
        for sent in sorted(self.sent, key=lambda s: s.started):
            if not sent.failed:
                continue
            cause = self.cause(sent, killed_claims)
            if sent.kind == "claim" and cause in ("in_flight", "sent_to_dead"):
                killed_claims.add(sent.subject)
            found.append((sent, cause))
        return found

    def kills_in_flight(self) -> int:
        """Kills that hit at least one request in flight on their replica."""
        hit = [s for s, cause in self.causes() if cause == "in_flight"]
        return sum(
            1
            for kill in self.kills
            if any(s.replica in (kill.replica, "") and s.started < kill.at <= s.ended for s in hit)
        )

    def summary(self) -> dict[str, Any]:
        """The figures of the report: failures by cause and kind, their recovery, the
        claims' availability and the repeats that took a dead claimer's request over."""
        failures = self.causes()
        causes = Counter(cause for _, cause in failures)
        from_kills = [s for s, cause in failures if cause in ("in_flight", "sent_to_dead")]
        # Only the attempts no kill failed count for the claims' availability.
        excluded = {id(s) for s, cause in failures if cause != "unexplained"}
        claims = sorted((s for s in self.sent if s.kind == "claim"), key=lambda s: s.started)
        counted = [s for s in claims if id(s) not in excluded]
        handed_out = sum(1 for s in counted if s.succeeded)
        return {
            "requests": len(self.sent),
            "requests_by_kind": dict(sorted(Counter(s.kind for s in self.sent).items())),
            "failed_requests": len(failures),
            "failed_by_cause": {cause: causes[cause] for cause in CAUSES},
            "failed_by_kind_from_kills": dict(sorted(Counter(s.kind for s in from_kills).items())),
            "failures": [f"{cause}: {self.line(s)}" for s, cause in failures],
            "failed_unexplained": [self.line(s) for s, cause in failures if cause == "unexplained"],
            "failed_not_recovered": [
                self.line(s)
                for s, cause in failures
                if cause != "waiting_for_claimer" and not self._recovered(s)
            ],
            "replica_kills_hitting_requests": self.kills_in_flight(),
            "claim_attempts": len(claims),
            "claims_failed_by_kills": len({s.subject for s in from_kills if s.kind == "claim"}),
            "claim_attempts_counted": len(counted),
            "claim_attempts_counted_succeeded": handed_out,
            "claim_availability": round(handed_out / len(counted), 5) if counted else None,
            "claim_retries_taking_over": _takeovers(claims),
        }

    def line(self, sent: Sent) -> str:
        source = "replica" if sent.from_replica else "balancer"
        return (
            f"t={sent.started - self.origin:.1f}s {sent.kind} {sent.subject} via "
            f"{sent.replica or 'no replica'}: {sent.status} ({source}) {sent.code or ''} "
            f"{sent.message[:160]}"
        ).rstrip()

    def _recovered(self, failed: Sent) -> bool:
        """Whether a later request of the same subject succeeded."""
        return any(later.recovers(failed) for later in self.sent)


def _takeovers(claims: list[Sent]) -> int:
    """Claims whose repeat waited for a dead claimer and then claimed afresh (201)."""
    waited: set[str] = set()
    taken = 0
    for sent in claims:
        if sent.from_replica and WAITING_FOR_CLAIMER in sent.message:
            waited.add(sent.subject)
        elif sent.status == 201 and sent.subject in waited:
            waited.discard(sent.subject)
            taken += 1
    return taken
