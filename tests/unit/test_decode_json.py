"""decode_json: the event-loop-friendly decoder of large Nomad lists agrees with json.loads."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controller.nomad import client
from controller.nomad.client import decode_json

scalars = st.none() | st.booleans() | st.integers() | st.text(max_size=8)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=10,
)


@pytest.fixture
def small_threshold(monkeypatch: pytest.MonkeyPatch) -> None:
    # Every body takes the element-by-element path, not only megabyte lists.
    monkeypatch.setattr(client, "_LARGE_BODY", 0)


def decode(raw: bytes) -> Any:
    return asyncio.run(decode_json(raw))


@pytest.mark.slow
@settings(max_examples=300)
@given(st.lists(values, max_size=20), st.sampled_from([None, 0, 2]), st.sampled_from(["", " \n"]))
@pytest.mark.usefixtures("small_threshold")
def test_agrees_with_json_loads(items: list[Any], indent: int | None, around: str) -> None:
    raw = f"{around}{json.dumps(items, indent=indent)}{around}".encode()
    assert decode(raw) == json.loads(raw)


@given(st.binary(max_size=40) | st.text(alphabet='[]{},:" 01tfn', max_size=20).map(str.encode))
@pytest.mark.usefixtures("small_threshold")
def test_rejects_exactly_what_json_loads_rejects(raw: bytes) -> None:
    try:
        expected = json.loads(raw)
    except ValueError:
        with pytest.raises(ValueError):
            decode(raw)
    else:
        assert decode(raw) == expected


@pytest.mark.parametrize(
    "raw", [b"[1 2]", b"[1,]", b"[1,2", b"[1] x", b"[", b"[,1]", b"[1]]", b"[{]"]
)
@pytest.mark.usefixtures("small_threshold")
def test_malformed_arrays_are_value_errors(raw: bytes) -> None:
    with pytest.raises(ValueError):
        decode(raw)


def test_the_loop_runs_while_a_large_list_is_decoded() -> None:
    raw = json.dumps([{"ID": str(i), "Tasks": {"t": [i, i]}} for i in range(20_000)]).encode()
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    async def run() -> tuple[Any, int]:
        task = asyncio.create_task(ticker())
        await asyncio.sleep(0)
        before = ticks
        try:
            return await decode_json(raw), ticks - before
        finally:
            task.cancel()

    switch = sys.getswitchinterval()
    sys.setswitchinterval(0.0001)
    try:
        decoded, ticked = asyncio.run(run())
    finally:
        sys.setswitchinterval(switch)
    assert decoded == json.loads(raw)
    # One json.loads call would have held the GIL (and so the loop) from start to end.
    assert ticked > 10
