"""Claim requests waiting for a pool's idle runners: the demand estimate counts them
(core/demand.py), so a pool that keeps requests waiting grows."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime


@dataclass
class WaitingRequest:
    """One request counted as waiting; `answered` once this pool has answered it."""

    answered: bool = False


@dataclass
class WaitingClaims:
    """The claim requests a process holds waiting for idle runners of a pool: when each
    arrived, once per runner it wants, and how many runners were wanted by requests that
    stopped waiting without this pool answering them (`abandoned`: taken by the next pass,
    `abandoned_total`: ever, for readers in other processes). `on_change` hears of every
    change (the API tier publishes them for the reconcilers)."""

    arrivals: list[datetime] = field(default_factory=list)
    abandoned: int = 0
    abandoned_total: int = 0
    on_change: Callable[[], None] | None = None

    @contextlib.contextmanager
    def counted(self, arrived: datetime, runners: int) -> Iterator[WaitingRequest]:
        """Counted while the block runs: the request waits in it. A request the block
        leaves unanswered (timed out, cancelled, answered by another pool) counts as
        abandoned."""
        request = WaitingRequest()
        added = [arrived] * runners
        self.arrivals.extend(added)
        self._changed()
        try:
            yield request
        finally:
            for moment in added:
                self.arrivals.remove(moment)
            if not request.answered:
                self.abandoned += runners
                self.abandoned_total += runners
            self._changed()

    def take_abandoned(self) -> int:
        """The runners of the requests abandoned since the last call."""
        abandoned, self.abandoned = self.abandoned, 0
        return abandoned

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()
