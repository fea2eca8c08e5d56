"""A managed Poseidon environment as its record in Nomad holds it (records/environments.py
keeps them; sources/environments.py makes each a pool). Pure.

Its items are the environment's fields in Poseidon's names, as strings.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Environment:
    """An execution environment as Poseidon describes it."""

    id: int
    prewarming_pool_size: int
    cpu_limit: int
    memory_limit: int
    image: str
    network_access: bool
    exposed_ports: tuple[int, ...] = ()

    @property
    def ports(self) -> tuple[int, ...]:
        """The ports that are exposed: sorted, once each, and only with network access
        (Poseidon ignores them without)."""
        return tuple(sorted(set(self.exposed_ports))) if self.network_access else ()

    def differences(self, other: Environment) -> list[str]:
        """How `other` differs from this one, field by field in Poseidon's names."""
        fields = (
            ("image", self.image, other.image),
            ("cpuLimit", self.cpu_limit, other.cpu_limit),
            ("memoryLimit", self.memory_limit, other.memory_limit),
            ("networkAccess", self.network_access, other.network_access),
            ("exposedPorts", list(self.ports), list(other.ports)),
            ("prewarmingPoolSize", self.prewarming_pool_size, other.prewarming_pool_size),
        )
        return [
            f"{name} is {json.dumps(ours)}, not {json.dumps(theirs)}"
            for name, ours, theirs in fields
            if ours != theirs
        ]

    def items(self) -> dict[str, str]:
        """The environment as the items of its Nomad variable."""
        return {
            "image": self.image,
            "prewarmingPoolSize": str(self.prewarming_pool_size),
            "cpuLimit": str(self.cpu_limit),
            "memoryLimit": str(self.memory_limit),
            "networkAccess": "true" if self.network_access else "false",
            "exposedPorts": ",".join(str(port) for port in self.exposed_ports),
        }

    @classmethod
    def from_items(cls, env_id: int, items: Mapping[str, Any]) -> Environment:
        """The environment a variable holds; ValueError when an item is missing or bad."""

        def number(name: str) -> int:
            text = items.get(name)
            if not isinstance(text, str) or not text.isdigit():
                raise ValueError(f"item {name} must be a decimal number, not {text!r}")
            return int(text)

        image, network, ports = (
            items.get("image"),
            items.get("networkAccess"),
            items.get("exposedPorts", ""),
        )
        if not isinstance(image, str):
            raise ValueError("item image is missing")
        if network not in ("true", "false"):
            raise ValueError(f"item networkAccess must be true or false, not {network!r}")
        if not isinstance(ports, str) or not all(p.isdigit() for p in ports.split(",") if ports):
            raise ValueError(
                f"item exposedPorts must be decimal ports separated by commas, not {ports!r}"
            )
        return cls(
            id=env_id,
            prewarming_pool_size=number("prewarmingPoolSize"),
            cpu_limit=number("cpuLimit"),
            memory_limit=number("memoryLimit"),
            image=image,
            network_access=network == "true",
            exposed_ports=tuple(int(p) for p in ports.split(",")) if ports else (),
        )
