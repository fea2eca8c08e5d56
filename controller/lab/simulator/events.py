"""The event broker: a bounded buffer of Raft-index items, as nomad/stream does it."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from controller.lab.simulator.util import JSON, bad_request

_ENCODE = json.JSONEncoder(separators=(",", ":")).encode


@dataclass
class Event:
    topic: str
    type: str
    key: str
    namespace: str
    filter_keys: list[str] | None
    payload: JSON
    index: int = 0
    _encoded: bytes | None = field(default=None, repr=False)

    def to_dict(self) -> JSON:
        return {
            "Topic": self.topic,
            "Type": self.type,
            "Key": self.key,
            "Namespace": self.namespace,
            "FilterKeys": self.filter_keys,
            "Index": self.index,
            "Payload": self.payload,
        }

    def encoded(self) -> bytes:
        # Encoded once and shared by every subscriber that receives it.
        if self._encoded is None:
            self._encoded = _ENCODE(self.to_dict()).encode()
        return self._encoded


@dataclass(frozen=True)
class BufferItem:
    seq: int
    index: int
    events: tuple[Event, ...]


class StreamDropped(Exception):
    """The subscriber fell behind the buffer (`event dropped from buffer`)."""


@dataclass
class TopicFilter:
    topics: dict[str, set[str]]
    namespace: str

    def matches(self, event: Event) -> bool:
        keys = self.topics.get(event.topic) or self.topics.get("*")
        if keys is None:
            return False
        if event.namespace and self.namespace != "*" and event.namespace != self.namespace:
            return False
        if "*" in keys or event.key in keys:
            return True
        return any(k in keys for k in event.filter_keys or ())

    def frame(self, item: BufferItem) -> bytes | None:
        chosen = [e.encoded() for e in item.events if self.matches(e)]
        if not chosen:
            return None  # frames whose events are all filtered out are not sent
        return b'{"Index":%d,"Events":[%s]}\n' % (item.index, b",".join(chosen))


class EventBroker:
    def __init__(self, size: int = 100) -> None:
        self.size = size
        self.buffer: deque[BufferItem] = deque(maxlen=size)
        self.next_seq = 0
        self.generation = 0  # bumped to disconnect every stream
        self.closing = False  # the agent shuts down: streams end cleanly
        self._changed = asyncio.Event()
        self.drop_until = 0.0
        self.duplicate_until = 0.0
        self.delay_until = 0.0
        self.delay_seconds = 0.0
        self._delayed: deque[tuple[float, int, tuple[Event, ...]]] = deque()
        self.published = 0
        self.dropped = 0

    # -- publishing ---------------------------------------------------------
    def publish(self, index: int, events: list[Event]) -> None:
        if not events:
            return
        for event in events:
            event.index = index
        now = time.monotonic()
        frozen = tuple(events)
        if now < self.drop_until:
            self.dropped += 1
            return
        if now < self.delay_until or self._delayed:
            # Delayed items keep their order: later items queue behind them.
            release = max(now + self.delay_seconds, self._delayed[-1][0] if self._delayed else 0)
            self._delayed.append((release, index, frozen))
            asyncio.get_running_loop().call_later(release - now, self._release_delayed)
            return
        self._append(index, frozen)
        if now < self.duplicate_until:
            self._append(index, frozen)

    def _release_delayed(self) -> None:
        now = time.monotonic()
        while self._delayed and self._delayed[0][0] <= now + 1e-6:
            _, index, events = self._delayed.popleft()
            self._append(index, events)

    def _append(self, index: int, events: tuple[Event, ...]) -> None:
        self.buffer.append(BufferItem(self.next_seq, index, events))
        self.next_seq += 1
        self.published += 1
        self._wake()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def close(self) -> None:
        """The agent shuts down: every stream ends, as an HTTP response ends (the client
        reads the end of the body, not a cut connection)."""
        self.closing = True
        self._wake()

    # -- faults ----------------------------------------------------------------
    def disconnect_all(self) -> None:
        self.generation += 1
        self._wake()

    def restart(self) -> None:
        """The agent restarted: its buffer is empty and every stream is cut."""
        self.buffer.clear()
        self.disconnect_all()

    def inject_fault(self, kind: str, seconds: float, delay_ms: float = 500.0) -> None:
        """For `seconds`, frames are dropped, sent twice, or held back `delay_ms` in order."""
        until = time.monotonic() + seconds
        if kind == "drop":
            self.drop_until = until
        elif kind == "duplicate":
            self.duplicate_until = until
        elif kind == "delay":
            self.delay_until = until
            self.delay_seconds = delay_ms / 1000
        else:
            raise bad_request(f"unknown event fault {kind!r} (drop, duplicate, delay)")

    # -- subscribing ----------------------------------------------------------
    def start_seq(self, index: int) -> int:
        """Where a subscription from `index` begins: the first item at or after it,
        clamped to the buffer's oldest and newest items, as Nomad's event buffer does."""
        if not self.buffer:
            return self.next_seq
        oldest, newest = self.buffer[0], self.buffer[-1]
        if index <= oldest.index:
            return oldest.seq
        if index > newest.index:
            return newest.seq
        for item in self.buffer:
            if item.index >= index:
                return item.seq
        return newest.seq

    def read(self, seq: int) -> list[BufferItem]:
        """Items from `seq` on; StreamDropped when `seq` has left the buffer."""
        if not self.buffer or seq >= self.next_seq:
            return []
        oldest = self.buffer[0].seq
        if seq < oldest:
            raise StreamDropped("event dropped from buffer")
        # From the newest end: a subscriber reads the few items since its last read, and
        # copying the whole buffer for them made each read cost the buffer's size.
        return list(itertools.islice(reversed(self.buffer), self.next_seq - seq))[::-1]

    async def wait(self, seq: int, seconds: float) -> None:
        if seq < self.next_seq:
            return
        changed = self._changed
        # asyncio.timeout: Python 3.11's wait_for can swallow a cancel (gh-86296).
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await changed.wait()

    def stats(self) -> dict[str, Any]:
        return {"published": self.published, "dropped": self.dropped, "buffered": len(self.buffer)}
