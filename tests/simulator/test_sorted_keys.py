"""The simulator's listings cost what they find (keys.py, the event buffer's reads) and
answer what a scan of everything answered."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controller.lab.simulator.events import Event, EventBroker, StreamDropped
from controller.lab.simulator.keys import SortedKeys

NAMESPACES = st.sampled_from(["default", "dev", "dev-2", "poolkeeper"])
NAMES = st.text(alphabet="ab/-~", max_size=5)


@given(
    st.lists(st.tuples(st.booleans(), NAMESPACES, NAMES), max_size=60),
    st.sampled_from(["default", "dev", "poolkeeper", "*", "absent"]),
    NAMES,
)
def test_a_listing_is_what_a_scan_of_every_key_finds(
    operations: list[tuple[bool, str, str]], namespace: str, prefix: str
) -> None:
    keys, model = SortedKeys(), set[tuple[str, str]]()
    for add, ns, name in operations:
        key = (ns, name)
        if add and key not in model:
            keys.add(key)
            model.add(key)
        elif not add and key in model:
            keys.remove(key)
            model.discard(key)
    expected = sorted(k for k in model if namespace in ("*", k[0]) and k[1].startswith(prefix))
    assert keys.listed(namespace, prefix) == expected
    assert keys.listed("*") == sorted(model)


def test_removing_an_absent_key_is_an_error() -> None:
    keys = SortedKeys()
    keys.add(("default", "a"))
    with pytest.raises(KeyError):
        keys.remove(("default", "b"))
    assert keys.listed("default") == [("default", "a")]


@given(st.integers(min_value=0, max_value=40), st.integers(min_value=0, max_value=45))
def test_a_read_from_the_buffer_is_its_items_from_that_sequence_on(
    published: int, seq: int
) -> None:
    broker = EventBroker(size=16)
    for index in range(1, published + 1):
        broker.publish(index, [Event("Job", "JobRegistered", f"job-{index}", "default", [], {})])
    items = list(broker.buffer)
    assert len(items) == min(published, 16)
    if items and seq < items[0].seq:
        with pytest.raises(StreamDropped):
            broker.read(seq)
        return
    expected = items[seq - items[0].seq :] if items else []
    assert broker.read(seq) == expected
