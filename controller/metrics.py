"""Prometheus collectors (every series is listed in docs/reference.md).

Each controller owns its own registry, so several controllers (tests, the demo) can live
in one process without colliding.
"""

from __future__ import annotations

import contextlib

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

RUNNER_STATES = ("idle", "starting", "claimed", "outdated", "terminating")
CONDITION_TYPES = ("Ready", "Progressing", "Degraded", "SpecAccepted")


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.runners = Gauge(
            "poolkeeper_runners", "Runners by pool and state", ["pool", "state"], registry=r
        )
        self.desired_idle = Gauge(
            "poolkeeper_desired_idle_runners",
            "The idle target: idleRunners, a schedule floor or the demand estimate",
            ["pool"],
            registry=r,
        )
        self.reconcile_duration = Histogram(
            "poolkeeper_reconcile_duration_seconds",
            "Duration of one reconcile pass over a Nomad namespace",
            registry=r,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
        )
        self.reconcile_total = Counter(
            "poolkeeper_reconcile", "Reconciles by pool and result", ["pool", "result"], registry=r
        )
        self.claims_total = Counter(
            "poolkeeper_claims", "Claim requests by pool and result", ["pool", "result"], registry=r
        )
        self.claim_conflicts = Counter(
            "poolkeeper_claim_conflicts",
            "Claim check-and-sets lost to another claimer (the runner is dropped, another tried)",
            ["pool"],
            registry=r,
        )
        self.api_replicas = Gauge(
            "poolkeeper_api_replicas",
            "Live API replicas as this one last read their records (they split the offers)",
            registry=r,
        )
        self.claim_duration = Histogram(
            "poolkeeper_claim_duration_seconds",
            "Duration of a claim request",
            registry=r,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5, 30),
        )
        self.runners_created = Counter(
            "poolkeeper_runners_created", "Runner jobs registered", ["pool"], registry=r
        )
        self.runners_destroyed = Counter(
            "poolkeeper_runners_destroyed",
            "Runner jobs destroyed by reason",
            ["pool", "reason"],
            registry=r,
        )
        self.nomad_requests = Counter(
            "poolkeeper_nomad_requests",
            "Nomad API requests by templated endpoint and status code",
            ["endpoint", "code"],
            registry=r,
        )
        self.pool_condition = Gauge(
            "poolkeeper_pool_condition",
            "1 while the pool's status condition of this type is True",
            ["pool", "type"],
            registry=r,
        )
        self.pool_lease_held = Gauge(
            "poolkeeper_pool_lease_held",
            "1 while this process holds the pool's lease (and reconciles it)",
            ["pool"],
            registry=r,
        )
        self.executions_total = Counter(
            "poolkeeper_executions",
            "Executions in claimed runners by pool and how they ended",
            ["pool", "result"],
            registry=r,
        )
        self.execution_duration = Histogram(
            "poolkeeper_execution_duration_seconds",
            "Duration of an execution, from its start to its end",
            registry=r,
            buckets=(0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 3600),
        )
        self.file_requests_total = Counter(
            "poolkeeper_file_requests",
            "File requests on claimed runners by pool, operation and result",
            ["pool", "op", "result"],
            registry=r,
        )
        self.capability = Gauge(
            "poolkeeper_capability",
            "1 while the Nomad token has this optional capability (node_read: drain awareness)",
            ["name"],
            registry=r,
        )
        self.event_stream_up = Gauge(
            "poolkeeper_event_stream_up",
            "1 while the Nomad event stream of a namespace is connected",
            ["namespace"],
            registry=r,
        )
        # Counters every claim counts in, by their label values: looked up once each.
        self._series: dict[tuple[Counter, tuple[str, ...]], Counter] = {}

    def _count(self, counter: Counter, *labels: str) -> None:
        series = self._series.get((counter, labels))
        if series is None:
            series = self._series[(counter, labels)] = counter.labels(*labels)
        series.inc()

    def observe_nomad_request(self, endpoint: str, code: str) -> None:
        self._count(self.nomad_requests, endpoint, code)

    def claim_answered(self, pool: str, result: str, seconds: float) -> None:
        """A claim request ended: its result and its duration."""
        self._count(self.claims_total, pool, result)
        self.claim_duration.observe(seconds)

    def set_runner_counts(self, pool: str, counts: dict[str, int], desired_idle: int) -> None:
        for state in RUNNER_STATES:
            self.runners.labels(pool=pool, state=state).set(counts.get(state, 0))
        self.desired_idle.labels(pool=pool).set(desired_idle)

    def set_conditions(self, pool: str, conditions: dict[str, bool]) -> None:
        for type_, true in conditions.items():
            self.pool_condition.labels(pool=pool, type=type_).set(1 if true else 0)

    def set_lease_held(self, held: dict[str, bool]) -> None:
        for pool, holds in held.items():
            self.pool_lease_held.labels(pool=pool).set(1 if holds else 0)

    def set_capability(self, name: str, present: bool) -> None:
        self.capability.labels(name=name).set(1 if present else 0)

    def forget_pool(self, pool: str, *, lease: bool = True) -> None:
        """Drop a removed pool's series so dashboards stop showing it (but its lease
        series, without `lease`: a reconciler that does not hold a pool says so)."""
        for state in RUNNER_STATES:
            with contextlib.suppress(KeyError):
                self.runners.remove(pool, state)
        for gauge in (self.desired_idle, *((self.pool_lease_held,) if lease else ())):
            with contextlib.suppress(KeyError):
                gauge.remove(pool)
        for type_ in CONDITION_TYPES:
            with contextlib.suppress(KeyError):
                self.pool_condition.remove(pool, type_)

    def forget_event_stream(self, namespace: str) -> None:
        """A watcher stopped on purpose (its process stopping) is not a stream that is down:
        its series goes, so an alert on `poolkeeper_event_stream_up == 0` stays quiet."""
        with contextlib.suppress(KeyError):
            self.event_stream_up.remove(namespace)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
