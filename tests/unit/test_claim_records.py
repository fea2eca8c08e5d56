"""A claim as written: the record the store answers after a check-and-set is the one
Nomad holds (what a later read parses), and a store keeps claims it wrote only where it
lists them."""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from controller.core.claims import ClaimRecord, ClaimState
from controller.core.times import to_ns
from controller.records.claims import ClaimStore
from tests.unit.test_engine_property import Nomad

KNOWN_ITEMS = {
    "pool",
    "allocationId",
    "claimedAt",
    "expiresAt",
    "inactivityTimeoutSeconds",
    "requestId",
    "state",
    "allocationRestarts",
    "nodeName",
}
words = st.text(st.characters(min_codepoint=33, max_codepoint=0x2FFF), min_size=1, max_size=12)


@st.composite
def claim_records(draw: st.DrawFn) -> ClaimRecord:
    zone = timezone(timedelta(minutes=draw(st.integers(-600, 600))))
    claimed_at = draw(
        st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1))
    ).replace(tzinfo=UTC)
    record = ClaimRecord.new(
        runner_id=draw(st.from_regex(r"[a-z][a-z0-9]{0,10}-[0-9a-f]{12}", fullmatch=True)),
        namespace=draw(words),
        pool=draw(words),
        allocation_id=draw(words),
        now=claimed_at.astimezone(zone),
        inactivity_timeout_seconds=draw(st.integers(0, 10**9)),
        request_id=draw(st.none() | words),
        allocation_restarts=draw(st.none() | st.integers(0, 10**6)),
        node_name=draw(st.just("") | words),
    )
    return dataclasses.replace(
        record,
        state=draw(st.sampled_from(ClaimState)),
        extra=draw(st.dictionaries(words.filter(lambda k: k not in KNOWN_ITEMS), words)),
    )


def as_written(record: ClaimRecord, index: int, time_ns: int) -> dict[str, Any]:
    return {
        "Namespace": record.namespace,
        "Path": record.path,
        "ModifyIndex": index,
        "ModifyTime": time_ns,
        "Items": record.to_items(),
    }


@given(claim_records(), st.integers(1, 2**62), st.integers(0, 2**62))
def test_the_stored_record_is_what_reading_the_written_variable_gives(
    record: ClaimRecord, index: int, time_ns: int
) -> None:
    read = ClaimRecord.from_variable(as_written(record, index, time_ns))
    stored = record.stored(index, time_ns)
    assert stored == read
    assert stored.to_items() == read.to_items()


def test_a_written_claim_is_the_one_nomad_holds_and_a_lost_one_is_none() -> None:
    async def scenario() -> None:
        nomad = Nomad()
        store = ClaimStore(nomad)
        record = ClaimRecord.new(
            runner_id="py-00000000000a",
            namespace="default",
            pool="default/py",
            allocation_id="alloc-1",
            now=datetime(2026, 12, 7, 12, 0, 0, 250000, tzinfo=UTC),
            inactivity_timeout_seconds=60,
            request_id="r-1",
            node_name="node-1",
        )
        written = await store.create(record)
        assert written is not None and written == nomad.vars["py-00000000000a"]
        assert written.modify_index == nomad.index and written.modify_time_ns == to_ns(nomad.now)
        assert await store.create(record) is None  # the runner is taken
        released = await store.update(
            written.with_state(ClaimState.RELEASED), cas=written.modify_index
        )
        assert released is not None and released == nomad.vars["py-00000000000a"]
        assert await store.update(written, cas=written.modify_index) is None  # stale

    asyncio.run(scenario())


class CountingNomad(Nomad):
    """Counts the reads of variables; its list carries ModifyIndex, as Nomad's does."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: list[str] = []

    async def list_variables(self, prefix: str, namespace: str) -> list[dict[str, Any]]:
        return [
            {"Path": f"poolkeeper/claims/{runner_id}", "ModifyIndex": record.modify_index}
            for runner_id, record in self.vars.items()
            if prefix == "poolkeeper/claims/"
        ]

    async def read_variable(self, path: str, namespace: str) -> dict[str, Any] | None:
        self.reads.append(path)
        return await super().read_variable(path, namespace)


def test_only_a_store_that_lists_claims_keeps_the_ones_it_wrote() -> None:
    def claim(runner_id: str) -> ClaimRecord:
        return ClaimRecord.new(
            runner_id=runner_id,
            namespace="default",
            pool="default/py",
            allocation_id="alloc",
            now=datetime(2026, 12, 7, 12, 0, tzinfo=UTC),
            inactivity_timeout_seconds=60,
        )

    async def scenario() -> None:
        nomad = CountingNomad()
        lister = ClaimStore(nomad)  # a reconciler's: its passes list the claims
        await lister.read_all("default")
        await lister.create(claim("py-00000000000a"))
        claims, _ = await lister.read_all("default")
        assert set(claims) == {"py-00000000000a"} and nomad.reads == []

        # An API replica's store claims and never lists: it keeps nothing of what it
        # wrote (its claims would pile up), so a first listing reads them from Nomad.
        replica = ClaimStore(nomad)
        for n in range(1, 4):
            await replica.create(claim(f"py-00000000000{n}"))
        claims, _ = await replica.read_all("default")
        assert set(claims) == {f"py-00000000000{n}" for n in "a123"}
        assert sorted(nomad.reads) == [f"poolkeeper/claims/py-00000000000{n}" for n in "123a"]

    asyncio.run(scenario())
