"""A pool removed while a pass is creating its runners: the pass ends with the pool
draining, and the runners it just created are drained too, never orphaned."""

from __future__ import annotations

from controller.core.runner_ids import META_POOL
from controller.core.status import PoolStatus
from controller.core.views import PoolMode
from controller.engine.engine import Engine
from controller.lab.simulator import SimServer, Simulator
from controller.metrics import Metrics
from controller.model import RunnerPool
from controller.nomad.client import NomadClient
from controller.nomad.config import NomadConfig
from tests.support.documents import pool_doc
from tests.support.waiting import wait_until

KEY = "default/py"


async def test_runners_created_by_a_pass_during_which_the_pool_was_removed_are_drained(
    sim: Simulator, sim_server: SimServer
) -> None:
    def live_jobs() -> list[str]:
        return [
            job["ID"]
            for job in sim.job_list("default")
            if (job.get("Meta") or {}).get(META_POOL) == KEY
            and job.get("Status") != "dead"
            and not job.get("Stop")
        ]

    async def write_status(key: str, _: PoolStatus) -> None:
        # A front door's status write is awaited inside the pass, after its creations (the
        # operator's is an API request): the pool is removed meanwhile, as a Poseidon DELETE
        # or a deleted RunnerPool does once the runners show in Nomad.
        if live_jobs() and engine.pools[key].policy.mode is PoolMode.ACTIVE:
            engine.remove_pool(key, PoolMode.DRAIN)

    client = NomadClient(NomadConfig.from_env({"NOMAD_ADDR": sim_server.url}))
    engine = Engine(client, Metrics(), on_status=write_status)
    try:
        engine.upsert_pool(RunnerPool.parse_document(pool_doc("py", idle=2)))
        created = await engine.reconcile_namespace("default")
        assert created.created == 2 and len(live_jobs()) == 2
        # That pass observed Nomad before its creations: it cannot tell the drain is done.
        assert engine.pools[KEY].policy.mode is PoolMode.DRAIN

        async def destroyed() -> bool:
            await engine.reconcile_namespace("default")
            return live_jobs() == []

        await wait_until(destroyed, what="the drain to destroy the new runners")
    finally:
        await engine.stop()
        await client.close()
