"""Publishing the catalog (core/catalog.py, records/catalog.py): after each pass, the
holder of a pool's lease writes what the API tier needs of the pool, when it changed or
REPUBLISH_SECONDS after it last did; a pool that goes from this process takes its record
along. A failed write never fails the pass: the next one tries again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime

from controller.core.catalog import (
    OFFER_LIMIT,
    REPUBLISH_SECONDS,
    CatalogRecord,
    without_job_template,
)
from controller.core.offers import EMPTY
from controller.core.views import NodeView
from controller.engine.registry import ManagedPool
from controller.records.catalog import CatalogRecords


class CatalogPublisher:
    def __init__(
        self, records: CatalogRecords, identity: str, clock: Callable[[], datetime]
    ) -> None:
        self.records = records
        self._identity = identity
        self._clock = clock

    async def publish(self, pools: Iterable[ManagedPool], nodes: Mapping[str, NodeView]) -> None:
        """Write the records of these pools (written by this process) that changed."""
        now = self._clock()
        draining = {n.name: n.drain_deadline for n in nodes.values() if n.draining}
        due = []
        for managed in pools:
            record = self._record(managed, draining, now)
            last = self.records.written.get(managed.key)
            fresh = last is not None and (
                (now - last[0].published_at).total_seconds() < REPUBLISH_SECONDS
            )
            if not (fresh and last is not None and record.same_content(last[0])):
                due.append(self.records.write(record))
        await asyncio.gather(*due)

    def _record(
        self, managed: ManagedPool, draining: dict[str, datetime | None], now: datetime
    ) -> CatalogRecord:
        pool = managed.pool
        takes_claims = managed.active and managed.conflict is None
        # Without the runners whose job changed since the pass observed them (the API
        # tier hears of no event); capped before it is compared with what was written:
        # the record's size cuts it further when it is written (core/catalog.py).
        offered = managed.offer.without(managed.unsettled)
        offer = offered.capped(OFFER_LIMIT) if takes_claims else EMPTY
        on = {o.node_name for o in (*offer.current, *offer.rest)} | {
            r.allocation.node_name for r in managed.runners if r.allocation is not None
        }
        return CatalogRecord(
            key=managed.key,
            document=without_job_template(pool.model_dump(mode="json", by_alias=True))
            if pool is not None
            else {},
            active=managed.active,
            status=managed.status.to_dict() if managed.status is not None else {},
            offer=offer,
            draining_nodes={name: d for name, d in draining.items() if name in on},
            holder=self._identity,
            published_at=now,
            conflict=managed.conflict.message if managed.conflict is not None else None,
        )
