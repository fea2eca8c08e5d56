"""Activity keeps a claim alive: the claim of a runner that executions and file requests
use, and the runners with executions running in this process.

- Every execution start and file request moves the claim's deadline (a check-and-set
  keepalive through the claim service), at most one write per runner per second:
  requests within a second of the last write share it.
- A runner with running executions is *busy*: while it is, its claim is renewed when half
  its inactivity timeout is left, so no process expires it, and where this process
  reconciles, it renews rather than expires it if a renewal came late
  (PoolDirectory.keep_claims_in_use). When
  its last execution ends the claim is moved once more. Executions of the Poseidon API
  do not keep the claim alive (Poseidon's inactivity timer runs on during them): they
  are only stopped when it ends.
- A busy runner's executions are stopped with an `error` frame when its claim ends: a
  release or expiry found by this process (at once), or a tombstone any other process
  wrote (a release through another replica, a lost allocation, an expiry), seen by a
  blocking read of the claim variable that returns as soon as it changes. Nothing here
  reads a pool's observation, so an API replica that reconciles nothing does the same.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from controller.claims.runners import RunnerClaims
from controller.core.claims import GONE_REASONS, ClaimRecord, ClaimState
from controller.core.views import AllocationView
from controller.directory.view import PoolDirectory, PoolEntry
from controller.errors import ErrorCode, ServiceError
from controller.model import ExecutionsSpec
from controller.nomad.client import NomadClient
from controller.nomad.errors import NomadError
from controller.nomad.exec import ExecError
from controller.nomad.jobs import TASK_NAME

log = logging.getLogger(__name__)

COALESCE_SECONDS = 1.0
PRUNE_SECONDS = 60.0
# A container killed for its memory ends the exec before Nomad's server hears of it:
# the claim and the allocation are looked at again after these pauses (seconds).
LOSS_CHECK_PAUSES = (0.0, 0.3, 0.7)
# A renewal that failed (Nomad unavailable) is tried again this soon.
RETRY_SECONDS = 1.0
# The longest blocking read of a busy runner's claim (the Nomad client's read timeout is
# longer; Nomad adds up to a sixteenth).
WATCH_SECONDS = 8.0

LOST = "runner lost: "
ENDED_MESSAGES = {
    ClaimState.RELEASED: "runner released",
    ClaimState.EXPIRED: "runner expired",
    ClaimState.LOST: LOST + "its allocation was lost, replaced or restarted",
    ClaimState.RETIRED: "runner retired",
}
OOM_KILLED = LOST + "the allocation was OOM killed"
_MESSAGE_OF_REASON = {GONE_REASONS[state]: text for state, text in ENDED_MESSAGES.items()}


class Stoppable(Protocol):
    def stop(self, message: str) -> None:
        """End with an `error` of this message."""


@dataclass(frozen=True, slots=True)
class Target:
    """A claimed runner that a request acts on, as its claim was just read."""

    view: PoolEntry
    record: ClaimRecord

    @property
    def spec(self) -> ExecutionsSpec:
        pool = self.view.pool  # None only for a pool being drained: its last spec is gone
        return pool.spec.executions if pool is not None else ExecutionsSpec()


@dataclass
class _Recent:
    """What this process last knew of a runner's claim, when it knew it."""

    target: Target
    seen: float  # time.monotonic() when a read or a write last showed it live
    written: float | None = None  # ... when this process last moved its deadline


@dataclass(eq=False)
class _Busy:
    target: Target
    record: ClaimRecord
    executions: set[Stoppable] = field(default_factory=set)
    holding: set[Stoppable] = field(default_factory=set)  # those that keep the claim alive
    held: bool = False  # whether any did: then the claim is moved once more at the end
    keeper: asyncio.Task[None] | None = None


def ended_message(error: ServiceError) -> str:
    """The `error` frame's message for a claim the claim service found gone."""
    return _MESSAGE_OF_REASON.get(error.reason or "", error.message)


class Activity:
    def __init__(self, claims: RunnerClaims, directory: PoolDirectory, nomad: NomadClient) -> None:
        self.claims = claims
        self.directory = directory
        self.nomad = nomad
        self._recent: dict[str, _Recent] = {}
        self._pruned = time.monotonic()
        self._writing: dict[str, asyncio.Future[ClaimRecord]] = {}
        self._busy: dict[str, _Busy] = {}
        self._background: set[asyncio.Task[None]] = set()
        claims.claim_ended.append(self._claim_ended)
        directory.keep_claims_in_use(self.in_use)

    def spec(self, runner_id: str) -> ExecutionsSpec:
        """The executions settings of the runner's pool, known from its ID alone (no
        Nomad read): requests are checked against them before anything is written."""
        view = self.directory.pool_for_runner(runner_id)
        if view is None or view.pool is None:
            return ExecutionsSpec()  # reading its claim answers 404 next
        return view.pool.spec.executions

    async def live(self, runner_id: str) -> Target:
        """The runner's live claim (404/410 as the runner routes answer): as Nomad holds
        it, or as this process saw it live within the last second and still before its
        deadline (a claim this process ends is forgotten at once)."""
        now = time.monotonic()
        recent = self._recent.get(runner_id)
        if (
            recent is not None
            and now - recent.seen < COALESCE_SECONDS
            and not recent.target.record.is_expired(self.directory.clock())
        ):
            return recent.target
        record = await self.claims.live(runner_id)
        view = self.directory.pools.get(record.pool)
        if view is None:  # the pool went between the read and now
            raise ServiceError(ErrorCode.RUNNER_NOT_FOUND, f"runner {runner_id} is not claimed")
        target = Target(view, record)
        self._remember(target, written=recent.written if recent is not None else None)
        return target

    async def claimed(self, runner_id: str) -> Target:
        """`live`, with the claim's deadline moved: the request is activity."""
        target = await self.live(runner_id)
        return Target(target.view, await self.touch(target))

    async def touch(self, target: Target) -> ClaimRecord:
        """Move the claim's deadline, unless this process did so within the last
        second (or is doing so now: then its write is shared)."""
        runner_id = target.record.runner_id
        writing = self._writing.get(runner_id)
        if writing is not None:
            return await asyncio.shield(writing)
        recent = self._recent.get(runner_id)
        written = recent.written if recent is not None else None
        if (
            recent is not None
            and written is not None
            and time.monotonic() - written < COALESCE_SECONDS
        ):
            return recent.target.record
        future: asyncio.Future[ClaimRecord] = asyncio.get_running_loop().create_future()
        self._writing[runner_id] = future
        try:
            stored = await self.claims.renew(target.record)
        except BaseException as error:
            future.set_exception(error)
            future.exception()  # retrieved: a touch nobody shared is no unhandled error
            raise
        finally:
            del self._writing[runner_id]
        self._remember(Target(target.view, stored), written=time.monotonic())
        future.set_result(stored)
        busy = self._busy.get(runner_id)
        if busy is not None:
            busy.record = stored
        return stored

    def _remember(self, target: Target, written: float | None) -> None:
        now = time.monotonic()
        self._recent[target.record.runner_id] = _Recent(target, now, written)
        if now - self._pruned > PRUNE_SECONDS:  # forget runners not seen for a while
            self._pruned = now
            for runner_id, recent in list(self._recent.items()):
                if now - max(recent.seen, recent.written or 0) > COALESCE_SECONDS:
                    del self._recent[runner_id]

    # ---- busy runners ---------------------------------------------------------------------

    def in_use(self, runner_id: str) -> bool:
        busy = self._busy.get(runner_id)
        return busy is not None and bool(busy.holding)

    def running(self, runner_id: str) -> int:
        busy = self._busy.get(runner_id)
        return 0 if busy is None else len(busy.executions)

    def hold(self, target: Target, execution: Stoppable, *, keep_alive: bool = True) -> None:
        """An execution runs on the runner: stop it when the claim ends, and (with
        `keep_alive`) keep the claim alive until `let_go`."""
        runner_id = target.record.runner_id
        busy = self._busy.get(runner_id)
        if busy is None:
            busy = self._busy[runner_id] = _Busy(target, target.record)
            busy.keeper = asyncio.get_running_loop().create_task(self._keep(busy))
        busy.executions.add(execution)
        if keep_alive:
            busy.holding.add(execution)
            busy.held = True

    def let_go(self, runner_id: str, execution: Stoppable) -> None:
        """The execution ended; the last one to end moves the deadline once more."""
        busy = self._busy.get(runner_id)
        if busy is None:
            return
        busy.executions.discard(execution)
        busy.holding.discard(execution)
        if busy.executions:
            return
        del self._busy[runner_id]
        if busy.keeper is not None:
            busy.keeper.cancel()
        if busy.held:
            self._in_background(self._last_touch(Target(busy.target.view, busy.record)))

    def stop_all(self, runner_id: str, message: str) -> None:
        busy = self._busy.get(runner_id)
        for execution in list(busy.executions if busy is not None else ()):
            execution.stop(message)

    async def explain_failure(self, target: Target, error: ExecError) -> str:
        """An exec Nomad refused or broke: a lost runner says why, else Nomad's words."""
        return await self.why_lost(target) or f"exec failed: {error}"

    async def why_lost(self, target: Target) -> str | None:
        """Why the runner cannot run executions any more (its claim ended, its
        allocation stopped or restarted), or None when nothing says so."""
        for pause in LOSS_CHECK_PAUSES:
            await asyncio.sleep(pause)
            reason = await self._loss(target.record)
            if reason is not None:
                self.directory.runners_taken(target.view)  # its reconciler looks at once
                return reason
        return None

    async def _loss(self, record: ClaimRecord) -> str | None:
        try:
            await self.claims.live(record.runner_id)
        except ServiceError as error:
            if error.code is not ErrorCode.RUNNER_GONE:
                return None
            if error.reason == GONE_REASONS[ClaimState.LOST]:
                return await self._lost_message(record)
            return ended_message(error)
        return await self._allocation_loss(record)

    async def _lost_message(self, record: ClaimRecord) -> str:
        """Why a runner whose claim became a `lost` tombstone was lost: the allocation says
        more (OOM killed, stopped) whether the engine's tombstone or the exec's end was
        seen first."""
        return await self._allocation_loss(record) or ENDED_MESSAGES[ClaimState.LOST]

    async def _allocation_loss(self, record: ClaimRecord) -> str | None:
        """What the claimed allocation says of the runner's loss (None: nothing)."""
        try:
            allocation = await self.nomad.read_allocation(record.allocation_id, record.namespace)
        except NomadError:
            return None
        return loss_reason(allocation, record)

    async def close(self) -> None:
        for busy in list(self._busy.values()):
            if busy.keeper is not None:
                busy.keeper.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)

    def _claim_ended(self, runner_id: str, state: ClaimState) -> None:
        self._recent.pop(runner_id, None)
        self.stop_all(runner_id, ENDED_MESSAGES[state])

    async def _keep(self, busy: _Busy) -> None:
        """Renew the claim while half its timeout is left (while an execution holds it),
        and stop the executions as soon as the claim variable shows the claim ended."""
        runner_id = busy.record.runner_id
        while True:
            timeout = busy.record.inactivity_timeout_seconds
            left = (busy.record.expires_at - self.directory.clock()).total_seconds()
            within = left - timeout / 2 if busy.holding else max(left, RETRY_SECONDS)
            try:
                seen = await self.claims.watch(busy.record, min(max(within, 0.0), WATCH_SECONDS))
            except NomadError as error:
                log.debug("watching the claim of busy runner %s: %s", runner_id, error)
                await asyncio.sleep(RETRY_SECONDS)
                continue
            if seen is None or seen.is_tombstone:
                state = seen.state if seen is not None else ClaimState.LOST
                if state is ClaimState.LOST:
                    self.stop_all(runner_id, await self._lost_message(busy.record))
                else:
                    self.stop_all(runner_id, ENDED_MESSAGES[state])
                return
            if seen.modify_index > busy.record.modify_index:
                busy.record = seen  # renewed elsewhere (a request through another replica)
            if not busy.holding:
                continue
            left = (busy.record.expires_at - self.directory.clock()).total_seconds()
            if left > timeout / 2:
                continue
            try:
                busy.record = await self.claims.renew(busy.record, past_deadline=True)
            except ServiceError as error:
                if error.code is ErrorCode.RUNNER_GONE:
                    self.stop_all(runner_id, ended_message(error))
                    return
                log.warning("could not renew the claim of busy runner %s: %s", runner_id, error)
                await asyncio.sleep(RETRY_SECONDS)
            else:
                self._remember(Target(busy.target.view, busy.record), written=time.monotonic())

    async def _last_touch(self, target: Target) -> None:
        try:
            await self.touch(target)
        except ServiceError as error:
            log.info(
                "claim of %s not moved after its executions: %s", target.record.runner_id, error
            )

    def _in_background(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)


def loss_reason(allocation: Mapping[str, Any] | None, claim: ClaimRecord) -> str | None:
    """Why the claimed allocation cannot run the runner's executions any more, from the
    allocation as Nomad holds it; None while it runs as claimed."""
    if allocation is None:
        return f"{LOST}allocation {claim.allocation_id} is gone"
    view = AllocationView.from_stub(allocation)
    if not view.live:
        return f"{LOST}allocation {claim.allocation_id} is {view.client_status}"
    if claim.allocation_restarts is None or view.restarts <= claim.allocation_restarts:
        return None
    if _oom_killed(allocation):
        return OOM_KILLED
    return f"{LOST}allocation {claim.allocation_id} restarted its task"


def _oom_killed(allocation: Mapping[str, Any]) -> bool:
    states = allocation.get("TaskStates") or {}
    task = states.get(TASK_NAME) if isinstance(states, Mapping) else None
    events = task.get("Events") if isinstance(task, Mapping) else None
    terminated = [
        e for e in events or [] if isinstance(e, Mapping) and e.get("Type") == "Terminated"
    ]
    details = terminated[-1].get("Details") if terminated else None
    return isinstance(details, Mapping) and details.get("oom_killed") == "true"
