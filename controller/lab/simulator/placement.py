"""Node capacity: which node an allocation fits on, and what each node holds."""

from __future__ import annotations

from collections.abc import Callable

from controller.lab.simulator.store import Store
from controller.lab.simulator.util import JSON

# What an allocation holds: (node ID, CPU, memory MB).
Held = tuple[str, int, int]


class Placement:
    def __init__(self, store: Store, algorithm: str, capacity_freed: Callable[[], None]) -> None:
        if algorithm not in ("binpack", "spread"):
            raise ValueError(f"unknown placement algorithm {algorithm!r}")
        self.store = store
        self.algorithm = algorithm
        self.no_capacity_on = False
        self._capacity_freed = capacity_freed  # blocked evals may place now
        self._node_used: dict[str, list[int]] = {}
        self._held: dict[str, Held] = {}

    def add_node(self, node_id: str) -> None:
        self._node_used[node_id] = [0, 0]

    def lose_state(self) -> None:
        """Store.lose_state: no allocation holds anything."""
        self._held.clear()
        for node_id in self._node_used:
            self.add_node(node_id)

    def pick_node(self, cpu: int, mem: int, replacing: str | None = None) -> JSON | None:
        """The best node with room, or None; `replacing` frees that alloc's share first.

        Stops in a plan free their resources for the placements of that plan: the share
        of the alloc being replaced is released, and taken back if no node fits.
        """
        held = self._held.pop(replacing, None) if replacing is not None else None
        if held is not None:
            self._adjust(held, -1)
        node = self._best_fit(cpu, mem)
        if node is None and held is not None and replacing is not None:
            self._held[replacing] = held
            self._adjust(held, 1)
        return node

    def _best_fit(self, cpu: int, mem: int) -> JSON | None:
        if self.no_capacity_on:
            return None
        fits = []
        for node in self.store.nodes.values():
            if not _usable(node):
                continue
            used = self._node_used[node["ID"]]
            res = node["NodeResources"]
            free_cpu = res["Cpu"]["CpuShares"] - used[0] - cpu
            free_mem = res["Memory"]["MemoryMB"] - used[1] - mem
            if free_cpu >= 0 and free_mem >= 0:
                fill = (
                    1
                    - (
                        free_cpu / max(res["Cpu"]["CpuShares"], 1)
                        + free_mem / max(res["Memory"]["MemoryMB"], 1)
                    )
                    / 2
                )
                fits.append((fill, node))
        if not fits:
            return None
        # Seeded shuffle first, so ties between equal nodes are broken reproducibly.
        self.store.rng.shuffle(fits)
        best = max if self.algorithm == "binpack" else min
        return best(fits, key=lambda pair: pair[0])[1]

    def count_fitting(self, count: int, cpu: int, mem: int) -> int:
        """How many of `count` allocations of this size would find room now (a plan's
        dry run: nothing is held, the RNG is not used)."""
        if self.no_capacity_on or count <= 0:
            return 0
        placed = 0
        for node in self.store.nodes.values():
            if not _usable(node):
                continue
            used = self._node_used[node["ID"]]
            res = node["NodeResources"]
            free_cpu = res["Cpu"]["CpuShares"] - used[0]
            free_mem = res["Memory"]["MemoryMB"] - used[1]
            room = min(
                free_cpu // cpu if cpu > 0 else count,
                free_mem // mem if mem > 0 else count,
            )
            placed += max(room, 0)
            if placed >= count:
                return count
        return placed

    def hold(self, alloc: JSON, cpu: int, mem: int) -> None:
        self._held[alloc["ID"]] = (alloc["NodeID"], cpu, mem)
        used = self._node_used[alloc["NodeID"]]
        used[0] += cpu
        used[1] += mem

    def release(self, alloc_id: str) -> None:
        held = self._held.pop(alloc_id, None)
        if held is None:
            return
        self._adjust(held, -1)
        self._capacity_freed()

    def _adjust(self, held: Held, sign: int) -> None:
        used = self._node_used[held[0]]
        used[0] += sign * held[1]
        used[1] += sign * held[2]

    # ------------------------------------------------------------------ fault
    def no_capacity(self, on: bool) -> None:
        self.no_capacity_on = on
        if not on:
            self._capacity_freed()


def _usable(node: JSON) -> bool:
    return (
        node["Status"] == "ready"
        and node["SchedulingEligibility"] == "eligible"
        and not node["Drain"]
    )
