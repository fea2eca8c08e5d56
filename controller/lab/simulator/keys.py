"""Keys `(namespace, name)` kept sorted, so that a namespace's or a prefix's listing costs
what it finds, as Nomad's state store answers them from its radix-tree indexes (a scan of
every key made the simulator slower with each claim a bench left behind)."""

from __future__ import annotations

import bisect

Key = tuple[str, str]


class SortedKeys:
    def __init__(self) -> None:
        self._keys: list[Key] = []

    def add(self, key: Key) -> None:
        bisect.insort(self._keys, key)

    def remove(self, key: Key) -> None:
        at = bisect.bisect_left(self._keys, key)
        if at == len(self._keys) or self._keys[at] != key:
            raise KeyError(key)
        del self._keys[at]

    def clear(self) -> None:
        self._keys.clear()

    def listed(self, namespace: str, prefix: str = "") -> list[Key]:
        """The keys of `namespace` (`*`: every namespace) whose name starts with `prefix`,
        in order."""
        if namespace == "*":
            return [key for key in self._keys if key[1].startswith(prefix)]
        keys = self._keys
        end = at = bisect.bisect_left(keys, (namespace, prefix))
        while end < len(keys) and keys[end][0] == namespace and keys[end][1].startswith(prefix):
            end += 1
        return keys[at:end]
