"""Malformed job bodies never crash the simulator: they answer 400 (or a Nomad 500)."""

from __future__ import annotations

import asyncio
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controller.lab.simulator import Simulator
from controller.lab.simulator.util import ApiError

_scalars = st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.text(max_size=4))
_json: st.SearchStrategy[Any] = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)
_task = st.fixed_dictionaries(
    {"Name": st.one_of(st.just("t"), _json)},
    optional={"Resources": _json, "Config": _json, "Meta": _json, "Driver": _json},
)
_group = st.fixed_dictionaries(
    {"Name": st.one_of(st.just("g"), _json)},
    optional={
        "Count": _json,
        "Tasks": st.one_of(st.lists(_task, max_size=2), _json),
        "Meta": _json,
    },
)
_job = st.fixed_dictionaries(
    {"ID": st.one_of(st.just("j"), _json)},
    optional={
        "Type": st.one_of(st.sampled_from(["service", "batch"]), _json),
        "Priority": _json,
        "Meta": _json,
        "TaskGroups": st.one_of(st.lists(_group, max_size=2), _json),
    },
)


async def _register(job: Any) -> list[dict[str, Any]]:
    """Register, let the scheduler and clients run, return errors the loop caught."""
    errors: list[dict[str, Any]] = []
    asyncio.get_running_loop().set_exception_handler(lambda _loop, ctx: errors.append(ctx))
    sim = Simulator(nodes=["n"], seed=0, start_delay=0.0)
    try:
        sim.register_job(job, "default")
    except ApiError as exc:
        assert exc.status in (400, 500)
        return errors
    for _ in range(5):
        await asyncio.sleep(0)
    stored = sim.get_job(job["ID"])
    assert stored is not None and stored["Version"] == 0
    assert all(isinstance(group["Count"], int) for group in stored["TaskGroups"])
    return errors


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(job=st.one_of(_job, _json))
def test_register_only_raises_api_errors(job: Any) -> None:
    assert asyncio.run(_register(job)) == []
