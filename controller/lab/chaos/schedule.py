"""The fault schedule of a soak: which fault hits when, drawn up front from the seed alone."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any

# Every fault class the simulator offers, the controller's SIGKILL and SIGTERM and the
# second controller, with how often each is drawn.
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
FAULT_KINDS: tuple[str, ...] = tuple(WEIGHTS)
# The faults done to the controllers rather than to Nomad.
PROCESS_FAULTS = frozenset({"sigkill", "sigterm", "second_controller"})
# The SIGTERMed holder of the rehearsal comes back only once the handover has happened.
REHEARSAL_RESTART_SECONDS = 3.0
REHEARSED = frozenset({"second_controller", "sigterm"})
# Faults that happen at an instant. Every other one has a duration: it is switched off
# after it (and at the end of the window anyway).
INSTANT = frozenset(
    {
        "reschedule",
        "oom_restart",
        "reannounce",
        "task_exit",
        "remove_job_silently",
        "stream_disconnect",
    }
)
TIMED = frozenset(FAULT_KINDS) - INSTANT
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
        # Every run restarts the controller at least once, and rehearses a handover (the
        # rehearsal is the first round's only second controller and SIGTERM).
        events = []
        if index == 0:
            chosen = [k for k in chosen if k not in REHEARSED]
            chosen += [] if "sigkill" in chosen else ["sigkill"]
            events = _handover_rehearsal(rng, window)
        events += [draw_event(rng, kind, window) for kind in chosen]
        # A closing burst right before the faults stop, so that the convergence time
        # measures a recovery (a restart, lost nodes and runners), not a settled pool.
        for kind in rng.sample(CLOSING, k=rng.randint(1, 3)):
            at = rng.uniform(window - 2.0, window - 0.2)
            value = rng.uniform(0.1, 3.0) if kind == "sigkill" else 0.0
            events.append(FaultEvent(at, kind, rng.random(), window - at, value))
        events.sort(key=lambda e: e.at)
        schedule.append(Round(index, tuple(events)))
    return schedule


def draw_event(rng: random.Random, kind: str, window: float) -> FaultEvent:
    """One fault of `kind` somewhere in a window of `window` seconds."""
    at = rng.uniform(0.5, window * 0.85)
    # The second controller may outlive a takeover (2 x TTL + delay after the holder's
    # SIGKILL), so that it sometimes wins the lease and writes the pools.
    longest = window - at if kind == "second_controller" else min(12.0, window - at)
    duration = rng.uniform(1.0, longest) if kind in TIMED else 0.0
    # Every event draws all six values and keeps its kind's one: the schedule of a seed
    # depends on these draws, so they stay even where a kind needs none.
    value = {
        "drain": rng.uniform(0.5, 4.0),
        "event_delay": rng.uniform(200, 2000),
        "slow_api": rng.uniform(300, 2500),
        "slow_starts": rng.uniform(0.5, 3.0),
        "sigkill": rng.uniform(0.1, 3.0),
        "sigterm": rng.uniform(0.1, 3.0),
    }.get(kind, 0.0)
    return FaultEvent(at, kind, rng.random(), duration, value)


def nomad_faults(rng: random.Random, count: int, window: float) -> tuple[FaultEvent, ...]:
    """`count` of Nomad's faults (no controller's) in a window, drawn by WEIGHTS."""
    kinds = [kind for kind in WEIGHTS if kind not in PROCESS_FAULTS]
    chosen = rng.choices(kinds, [WEIGHTS[kind] for kind in kinds], k=count)
    return tuple(sorted((draw_event(rng, kind, window) for kind in chosen), key=lambda e: e.at))


def _handover_rehearsal(rng: random.Random, window: float) -> list[FaultEvent]:
    """The first round starts the second controller early, for the rest of the window,
    and SIGTERMs the holder a few seconds later. The second one must take every pool's
    lease at once (the handover is timed), write the pools as their holder while the first
    one, restarted, waits, and give them back when it is SIGKILLed at the window's end.
    Left to chance, the two rarely overlap with a SIGTERM."""
    start = rng.uniform(0.5, 2.0)
    return [
        FaultEvent(start, "second_controller", rng.random(), window - start, 0.0),
        FaultEvent(start + 3.0, "sigterm", rng.random(), 0.0, REHEARSAL_RESTART_SECONDS),
    ]
