"""The invariant violations of a soak: the one list every check adds to."""

from __future__ import annotations

import time


class Violations:
    """Violation messages, each stamped with the seconds since the soak started."""

    def __init__(self, started: float) -> None:
        self.started = started
        self.messages: list[str] = []
        self._keys: set[str] = set()

    def add(self, message: str) -> None:
        stamp = round(time.monotonic() - self.started, 1)
        self.messages.append(f"t={stamp}s {message}")

    def add_once(self, key: str, message: str) -> None:
        """A condition that a check sees on every sample is one violation, not one a sample."""
        if key not in self._keys:
            self._keys.add(key)
            self.add(message)
