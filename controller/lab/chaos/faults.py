"""Injecting the scheduled faults into the simulator and the controllers, and ending them."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from controller.lab.chaos.processes import ControllerProcess
from controller.lab.chaos.schedule import FaultEvent
from controller.lab.chaos.world import NAMESPACE, NODES, START_DELAY, World
from controller.lab.simulator import Simulator

T = TypeVar("T")

ALLOCATION_FAULTS = ("reschedule", "oom_restart", "reannounce", "task_exit")
# The fault kind -> the simulator's API fault.
API_FAULTS = {"no_leader": "no_leader", "connection_refused": "refuse", "slow_api": "slow"}
HANDOVER_TIMEOUT_SECONDS = 15.0


@dataclass
class FaultedRunners:
    """The runners faults hit: a claim may end `lost` only for one of them."""

    touched: set[str] = field(default_factory=set)  # allocation stopped or restarted
    removed: set[str] = field(default_factory=set)  # job removed by remove_job_silently


def _pick(items: Sequence[T], share: float) -> T | None:
    """The item at `share` (0 to 1) of the way through `items`."""
    return items[min(len(items) - 1, int(share * len(items)))] if items else None


async def _later(seconds: float, action: Callable[[], Awaitable[None]]) -> None:
    await asyncio.sleep(seconds)
    await action()


@dataclass
class NomadFaults:
    """Injects one scheduled fault of Nomad's (the simulator's) at a time, ends the timed
    ones after their duration, and ends every fault at once when a fault window closes."""

    sim: Simulator
    world: World
    hit: FaultedRunners = field(init=False, default_factory=FaultedRunners)
    injected: Counter[str] = field(init=False, default_factory=Counter)
    log: list[dict[str, Any]] = field(init=False, default_factory=list)
    down_nodes: set[str] = field(init=False, default_factory=set)
    drained_nodes: set[str] = field(init=False, default_factory=set)
    # time.monotonic() until which the API is refused, leaderless or slow: no lease is
    # renewed meanwhile, so a pool may be without a holder.
    api_faulted_until: float = field(init=False, default=0.0)
    # The ends of timed faults and the handover timers, cancelled when the window closes.
    _pending: list[asyncio.Task[None]] = field(init=False, default_factory=list)

    async def inject(self, event: FaultEvent, round_index: int) -> None:
        """Injects `event` and logs what it hit, or that the simulator refused it."""
        try:
            target = await self._strike(event)
        except Exception as error:  # a fault the simulator refused (e.g. alloc not running)
            self.log.append({"round": round_index, **event.to_dict(), "hit": f"refused: {error}"})
            return
        self.injected[event.kind] += 1
        self.log.append({"round": round_index, **event.to_dict(), "hit": target})

    async def end_all(self) -> None:
        """Every fault off and every node back."""
        for task in self._pending:
            task.cancel()
        await asyncio.gather(*self._pending, return_exceptions=True)
        self._pending.clear()
        sim = self.sim
        sim.api_fault("none", 0)
        for kind in ("drop", "duplicate", "delay"):
            sim.event_fault(kind, 0)
        sim.no_capacity(False)
        sim.fail_starts("*", on=False)
        sim.set_start_delay(START_DELAY)
        for node in sorted(self.down_nodes):
            await self._node_up(node)
        for node in sorted(self.drained_nodes):
            await self._undrain(node)
        self.api_faulted_until = min(self.api_faulted_until, time.monotonic())

    def api_faulted(self) -> bool:
        return time.monotonic() < self.api_faulted_until

    async def _strike(self, event: FaultEvent) -> Any:
        """Injects one fault; what it hit, for the fault log."""
        kind = event.kind
        seconds = {"seconds": round(event.duration, 1)}
        if kind in ALLOCATION_FAULTS:
            return await self._hit_allocation(event)
        if kind == "remove_job_silently":
            return await self._remove_job(event)
        if kind in ("node_down", "drain"):
            return await self._hit_node(event)
        if kind.startswith("event_"):
            self.sim.event_fault(
                kind.removeprefix("event_"), event.duration, delay_ms=event.value or 500
            )
            return seconds
        if kind == "stream_disconnect":
            self.sim.disconnect_event_streams()
            return None
        if kind in API_FAULTS:
            self.sim.api_fault(API_FAULTS[kind], event.duration, slow_ms=event.value or 1000)
            ends = time.monotonic() + event.duration
            self.api_faulted_until = max(self.api_faulted_until, ends)
            return seconds
        if kind == "no_capacity":
            self.sim.no_capacity(True)
            self._after(event.duration, self._capacity_back)
            return seconds
        if kind == "fail_starts":
            self.sim.fail_starts("*", on=True)
            self._after(event.duration, self._starts_back)
            return seconds
        if kind == "slow_starts":
            self.sim.set_start_delay(event.value)
            self._after(event.duration, self._start_delay_back)
            return {"start_delay": round(event.value, 2)}
        return None

    def _after(self, seconds: float, action: Callable[[], Awaitable[None]]) -> None:
        self._pending.append(asyncio.create_task(_later(seconds, action)))

    async def _hit_allocation(self, event: FaultEvent) -> Any:
        alloc = _pick(self.world.running_allocations(), event.pick)
        if alloc is None:
            return "no running allocation"
        target = {"alloc": alloc["ID"], "runner": alloc["JobID"]}
        if event.kind != "reannounce":  # a re-announced allocation keeps running
            self.hit.touched.add(str(alloc["JobID"]))
        if event.kind == "reschedule":
            await self.sim.reschedule_allocation(alloc["ID"])
        elif event.kind == "oom_restart":
            await self.sim.oom_restart(alloc["ID"])
        elif event.kind == "reannounce":
            await self.sim.reannounce_allocation(alloc["ID"])
        else:
            await self.sim.finish_allocation(alloc["ID"], failed=event.pick < 0.5)
        return target

    async def _remove_job(self, event: FaultEvent) -> Any:
        job_id = _pick(self.world.runner_job_ids(), event.pick)
        if job_id is not None:
            self.hit.removed.add(job_id)
            self.hit.touched.add(job_id)
            await self.sim.remove_job_silently(job_id, NAMESPACE)
        return {"runner": job_id}

    async def _hit_node(self, event: FaultEvent) -> Any:
        usable = [n for n in NODES if n not in self.down_nodes and n not in self.drained_nodes]
        # Two nodes are always left: the pools must have somewhere to run.
        node = _pick(usable, event.pick) if len(usable) > 2 else None
        if node is None:
            return "no node to spare"
        runners = self.world.runners_on_node(node)
        self.hit.touched.update(runners)
        if event.kind == "node_down":
            self.down_nodes.add(node)
            await self.sim.node_down(node)
            self._after(event.duration, lambda: self._node_up(node))
        else:
            self.drained_nodes.add(node)
            await self.sim.drain_node(node, deadline_seconds=event.value)
            self._after(event.duration, lambda: self._undrain(node))
        return {"node": node, "runners": runners}

    async def _node_up(self, node: str) -> None:
        if node in self.down_nodes:
            self.down_nodes.discard(node)
            await self.sim.node_up(node)

    async def _undrain(self, node: str) -> None:
        if node in self.drained_nodes:
            self.drained_nodes.discard(node)
            await self.sim.drain_node(node, enable=False, mark_eligible=True)

    async def _capacity_back(self) -> None:
        self.sim.no_capacity(False)

    async def _starts_back(self) -> None:
        self.sim.fail_starts("*", on=False)

    async def _start_delay_back(self) -> None:
        self.sim.set_start_delay(START_DELAY)


@dataclass
class Faults(NomadFaults):
    """Nomad's faults, and the controller's: SIGKILL, SIGTERM and a second controller."""

    controller: ControllerProcess
    rival: ControllerProcess
    restarts: int = field(init=False, default=0)
    rival_starts: int = field(init=False, default=0)
    # Seconds from a SIGTERM until the other controller held every lease.
    handovers: list[float] = field(init=False, default_factory=list)

    async def end_all(self) -> None:
        """Every fault off, every node back, the second controller SIGKILLed and the
        controller running."""
        await super().end_all()
        await self.rival.kill()
        await self.controller.ensure_running()

    async def _strike(self, event: FaultEvent) -> Any:
        if event.kind == "sigkill":
            return await self._sigkill(event)
        if event.kind == "sigterm":
            return await self._sigterm(event)
        if event.kind == "second_controller":
            return await self._start_rival(event)
        return await super()._strike(event)

    async def _sigkill(self, event: FaultEvent) -> Any:
        if self.controller.proc is None:
            return "controller already down"
        await self.controller.kill()
        self.restarts += 1
        self._after(event.value, self.controller.ensure_running)
        return {"restart_after": round(event.value, 2)}

    async def _sigterm(self, event: FaultEvent) -> Any:
        if self.controller.proc is None:
            return "controller already down"
        signalled = time.monotonic()
        # The second controller may hold a share of the pools already (leases are spread
        # over the live reconcilers): the controller hands over those it holds.
        if self.rival.proc is not None and self._holds_a_lease(self.controller):
            self._pending.append(asyncio.create_task(self._time_handover(signalled)))
        seconds = await self.controller.terminate()
        self.restarts += 1
        self._after(event.value, self.controller.ensure_running)
        return {"exited_after": round(seconds, 2), "restart_after": round(event.value, 2)}

    async def _start_rival(self, event: FaultEvent) -> Any:
        if self.rival.proc is not None:
            return "second controller already running"
        await self.rival.start()
        self.rival_starts += 1
        self._after(event.duration, self.rival.kill)
        return {"sigkill_after": round(event.duration, 2)}

    def _holds_a_lease(self, process: ControllerProcess) -> bool:
        """Whether the running incarnation of `process` holds the lease of some pool."""
        mine = process.identity()
        return mine is not None and mine in self.world.lease_holders().values()

    def _holds_every_lease(self, process: ControllerProcess) -> bool:
        """Whether the running incarnation of `process` holds the lease of every pool."""
        mine = process.identity()
        holders = self.world.lease_holders()
        return (
            mine is not None
            and len(holders) == len(self.world.pools)
            and all(h == mine for h in holders.values())
        )

    async def _time_handover(self, signalled: float) -> None:
        """Seconds from the holder's SIGTERM until the running second controller holds
        every pool's lease (it released them on the way out)."""
        while time.monotonic() - signalled < HANDOVER_TIMEOUT_SECONDS:
            if self._holds_every_lease(self.rival):
                self.handovers.append(round(time.monotonic() - signalled, 2))
                return
            await asyncio.sleep(0.05)
        # Not a violation: a holder that cannot reach Nomad cannot release its leases.
