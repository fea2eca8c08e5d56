"""Hypothesis settings of the fuzz tests that drive a live controller over HTTP."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, settings


def against_live_service(max_examples: int) -> Callable[[Any], Any]:
    """Settings for a fuzz test sharing one live controller across its examples: requests
    have no deadline (the machine is shared), and the fixture is meant to be reused."""
    return settings(
        max_examples=max_examples,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
