"""The operator's scheduler configuration (/v1/operator/scheduler/configuration): the
placement algorithm the simulator uses, and whether its eval broker is paused (evals then
wait, pending, and may be deleted). The other settings are kept and shown, not applied.
"""

from __future__ import annotations

from typing import Any

from controller.lab.simulator.scheduler import Scheduler
from controller.lab.simulator.store import Store
from controller.lab.simulator.util import JSON, ApiError, bad_request

_PREEMPTION = ("SystemSchedulerEnabled", "SysBatchSchedulerEnabled", "BatchSchedulerEnabled",
               "ServiceSchedulerEnabled")  # fmt: skip
_FLAGS = ("MemoryOversubscriptionEnabled", "RejectJobRegistration", "PauseEvalBroker")


class SchedulerConfig:
    def __init__(self, store: Store, scheduler: Scheduler, index: int) -> None:
        self.store = store
        self.scheduler = scheduler
        self.config: JSON = {
            "SchedulerAlgorithm": scheduler.placement.algorithm,
            "PreemptionConfig": {
                "SystemSchedulerEnabled": True,
                "SysBatchSchedulerEnabled": False,
                "BatchSchedulerEnabled": False,
                "ServiceSchedulerEnabled": False,
            },
            "MemoryOversubscriptionEnabled": False,
            "RejectJobRegistration": False,
            "PauseEvalBroker": False,
            "NodeLimitForFeasibilityChecks": 0,
            "CreateIndex": index,
            "ModifyIndex": index,
        }

    def set(self, body: Any, cas: int | None) -> JSON:
        """Nomad's SchedulerSetConfiguration: with `cas`, only if it is the ModifyIndex."""
        if not isinstance(body, dict):
            raise bad_request("Error parsing scheduler config: expected a JSON object")
        algorithm = body.get("SchedulerAlgorithm") or "binpack"
        if algorithm not in ("binpack", "spread"):
            raise bad_request(f"invalid scheduler algorithm: {algorithm}")
        preemption = body.get("PreemptionConfig") or {}
        if not isinstance(preemption, dict):
            raise bad_request("Error parsing scheduler config: PreemptionConfig")
        txn = self.store.txn("SchedulerConfigUpdated")
        txn.tables.add("scheduler_config")
        updated = cas is None or cas == self.config["ModifyIndex"]
        node_limit = int(body.get("NodeLimitForFeasibilityChecks") or 0)
        if updated:
            self.config = {
                "SchedulerAlgorithm": algorithm,
                "PreemptionConfig": {k: bool(preemption.get(k)) for k in _PREEMPTION},
                **{k: bool(body.get(k)) for k in _FLAGS},
                "NodeLimitForFeasibilityChecks": node_limit,
                "CreateIndex": self.config["CreateIndex"],
                "ModifyIndex": txn.index,
            }
        self.store.commit(txn)
        if updated:
            self.scheduler.placement.algorithm = algorithm
            if self.config["PauseEvalBroker"]:
                self.scheduler.broker_paused = True
            elif self.scheduler.broker_paused:
                self.scheduler.resume_broker()
        return {"Updated": updated, "Index": txn.index}

    def require_paused_broker(self) -> None:
        if not self.scheduler.broker_paused:
            raise ApiError(
                500, "eval broker is enabled; eval broker must be paused to delete evals"
            )
