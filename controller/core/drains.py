"""A drain record (records/drains.py keeps them in Nomad): a pool removed with
deletionPolicy Drain or Delete, so that a restarted controller resumes its removal. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from controller.core.times import format_time, parse_time
from controller.core.views import PoolMode


@dataclass(frozen=True)
class DrainRecord:
    key: str
    namespace: str  # the pool's Nomad namespace
    job_prefix: str
    mode: PoolMode
    deadline: datetime  # claimed runners of a drain are destroyed then

    def to_items(self) -> dict[str, str]:
        return {
            "pool": self.key,
            "namespace": self.namespace,
            "jobPrefix": self.job_prefix,
            "mode": self.mode.value,
            "deadline": format_time(self.deadline),
        }

    @classmethod
    def from_items(cls, items: Mapping[str, Any]) -> DrainRecord:
        """ValueError (or KeyError) names what is missing or bad."""
        return cls(
            items["pool"],
            items["namespace"],
            items["jobPrefix"],
            PoolMode(items["mode"]),
            parse_time(items["deadline"]),
        )
