"""The controller behind the kopf handlers: RunnerPool objects in, engine registrations,
status and Events out.

Objects are registered by the rule both front doors share (sources/registration.py): an
invalid or immutable-violating update keeps the last valid version running, reported in
`SpecAccepted`. The engine reports status through `on_status`, which this module writes to
the status subresource (never the spec), and what happens to a pool through `on_event`,
which becomes a Kubernetes Event (and a log line). Every replica registers every pool;
only the holder of a pool's lease writes its status and posts its Events (Engine.speaks_for),
so replicas that share the pools never write one resource twice.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final

import aiohttp
import kopf
from pydantic import ValidationError

from controller.core.breaker import BreakerState
from controller.core.events import PoolEvent
from controller.core.problems import PoolProblem
from controller.core.readiness import Readiness
from controller.core.status import Condition, PoolStatus, compute_status
from controller.core.times import parse_time, utcnow
from controller.core.views import PoolMode, PoolPolicy
from controller.model import DeletionPolicy, RunnerPool, format_validation_error
from controller.nomad.config import NomadConfig
from controller.nomad.errors import NomadError
from controller.operator.kube import KubeClient, ObjectRef
from controller.operator.options import Connect, OperatorOptions
from controller.service import Service, log_event
from controller.sources.registration import register, removal

log = logging.getLogger(__name__)

# Operator-owned condition, written beside the engine's.
TERMINATING: Final = "Terminating"
NOMAD_WARNING_EVERY: Final = 30.0
FINALIZE_WAIT_SECONDS: Final = 3.0
# How often the RunnerPools are listed again while some listed one was not observed yet
# (one deleted before kopf saw it never will be), or after the listing failed.
LIST_AGAIN_SECONDS: Final = 1.0
LOGIN_POLL_SECONDS: Final = 0.05
# The operator has no --prune: a pool that names the orphans' pool takes them over.
ORPHAN_ADVICE: Final = (
    "a RunnerPool of that namespace, name and job prefix adopts them, and deleting it drains them"
)


@dataclass
class Registration:
    """What this replica knows of one RunnerPool object."""

    ref: ObjectRef
    seen_generation: int
    seen_labels: Mapping[str, Any] | None = None  # labels count: a pool may serve Poseidon
    pool: RunnerPool | None = None  # the last valid version (the one that runs)
    refusal: PoolProblem | None = None  # why the newest generation does not run
    extra: dict[str, Condition] = field(default_factory=dict)
    engine_status: PoolStatus | None = None
    drain_announced: bool = False
    drain_since: float | None = None  # time.monotonic() when this replica began the drain
    writing: asyncio.Lock = field(default_factory=asyncio.Lock)  # one status write at a time


class OperatorController(Service):
    """Engine, API and event watchers of one operator replica; pools come from kopf."""

    def __init__(self, options: OperatorOptions, nomad: NomadConfig) -> None:
        self.options = options  # before the Service asks for the identity
        super().__init__(
            options,
            nomad,
            on_status=self._on_status,
            on_event=self._on_event,
            orphan_advice=ORPHAN_ADVICE,
        )
        self.kube: KubeClient | None = None
        self.registrations: dict[str, Registration] = {}
        self._nomad_warned: dict[str, float] = {}
        self._background: set[asyncio.Task[None]] = set()
        self._stopped = False
        # The RunnerPools listed at the start and not observed yet (None: not listed yet):
        # until none is left, an unknown pool may be one of them.
        self._unread: set[str] | None = None

    # -- lifecycle --------------------------------------------------------------------

    def identity(self) -> str:
        return self.options.identity

    def readiness(self) -> Readiness:
        ready = super().readiness()
        if self._unread is None:
            return dataclasses.replace(ready, waiting="the RunnerPools to be listed")
        unread = tuple(sorted(self._unread - set(ready.unobserved)))
        return dataclasses.replace(ready, unobserved=ready.unobserved + unread)

    def pools_unread(self) -> str | None:
        if self._unread is None:
            return "the RunnerPools have not been listed yet"
        if self._unread:
            return f"{len(self._unread)} RunnerPools listed but not read yet"
        return None

    async def _list_pools(self) -> None:
        """List the RunnerPools, and again while some listed one is not observed yet."""
        while True:
            if self.kube is None:  # the replica starts before kopf logs in
                await asyncio.sleep(LOGIN_POLL_SECONDS)
                continue
            try:
                listed = await self.kube.list_pools(self.options.namespaces)
            except (aiohttp.ClientError, TimeoutError) as error:
                log.warning("listing the RunnerPools: %s", error)
            else:
                self._unread = listed - set(self.registrations)
                if not self._unread:
                    return
            await asyncio.sleep(LIST_AGAIN_SECONDS)

    def connect(
        self, settings: kopf.OperatorSettings, connect: Connect
    ) -> kopf.ConnectionInfo | None:
        """The credentials kopf uses, and ours (None: kopf stops with a LoginError)."""
        info = connect(settings)
        if info is None:
            log.error("no Kubernetes credentials: no service account and no kubeconfig")
        elif self.kube is None:
            self.kube = KubeClient(info, self.identity())
        return info

    async def start(self) -> None:
        """Reconcile from now on, before kopf hands over the first RunnerPool: the engine
        (for the pools whose leases this replica holds), the drains recorded in Nomad,
        the managed Poseidon environments, the event-stream watchers."""
        log.info("replica %s: reconciling the pools whose leases it holds", self.identity())
        await self.engine.start()
        self._spawn(self._list_pools())
        self._spawn(self.resume_drains())
        await self.start_environments()
        self.sync_watchers()

    def _spawn(self, coro: Awaitable[None]) -> None:
        async def run() -> None:
            await coro

        task = asyncio.create_task(run())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def stop(self) -> None:
        """Graceful stop: never destroys runners. Idempotent (kopf's cleanup, then `run`)."""
        if self._stopped:
            return
        self._stopped = True
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        await self.close()
        if self.kube is not None:
            await self.kube.close()

    # -- registration (kopf on.event: create, resume and update) ---------------------------

    async def observe(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        """A watch event or a listed object: register what changed. Level triggered."""
        meta = body.get("metadata", {})
        ref = ObjectRef(meta.get("namespace", "default"), meta.get("name", ""), meta.get("uid", ""))
        if self._unread is not None:
            self._unread.discard(ref.key)
        known = self.registrations.get(ref.key)
        if event_type == "DELETED":
            # Gone without our finalizer (removed by hand): stop managing, leave Nomad.
            view = self.engine.pools.get(ref.key)
            if known is not None and view is not None and view.policy.mode is PoolMode.ACTIVE:
                self.engine.remove_pool(ref.key, None)
            self.registrations.pop(ref.key, None)
            return
        if meta.get("deletionTimestamp"):
            return  # the finalizer handler takes it from here
        generation = int(meta.get("generation") or 0)
        labels = meta.get("labels") or {}
        if (
            known is not None
            and known.ref.uid == ref.uid
            and known.seen_generation == generation
            and known.seen_labels == labels
        ):
            return  # a status change, or metadata the model does not read
        if known is None or known.ref.uid != ref.uid:
            known = self._restore(ref, generation, body.get("status"))
        known.seen_generation, known.seen_labels = generation, dict(labels)
        try:
            new: RunnerPool | str = RunnerPool.parse_document(_document(body))
        except ValidationError as error:
            new = format_validation_error(error)
        await self._register(known, new, generation)

    def _restore(self, ref: ObjectRef, generation: int, previous: Any) -> Registration:
        """A new object, or one first seen by this replica: keep what an earlier replica
        wrote to its status (condition transition times), its part and ours."""
        known = Registration(ref, generation)
        self.registrations[ref.key] = known
        restored = PoolStatus.from_dict(previous) if isinstance(previous, Mapping) else None
        if restored is not None:
            ours = [c for c in restored.conditions if c.type == TERMINATING]
            known.extra.update({c.type: c for c in ours})
            known.engine_status = dataclasses.replace(
                restored, conditions=tuple(c for c in restored.conditions if c not in ours)
            )
        return known

    async def _register(self, known: Registration, new: RunnerPool | str, generation: int) -> None:
        registration = register(known.pool, new)
        refusal, first = registration.refusal, known.pool is None
        newly_refused = refusal is not None and refusal != known.refusal
        known.pool, known.refusal = registration.pool, refusal
        if registration.pool is None:
            assert refusal is not None  # never valid
            known.engine_status = _status_without_pool(known, generation, refusal)
            await self._write_status(known)
        else:
            self.engine.upsert_pool(registration.pool, generation, refusal, known.ref.uid)
            view = self.engine.pools[registration.pool.key]
            if first and view.status is None and known.engine_status is not None:
                # A restarted operator keeps condition transition times (and writes
                # nothing if nothing changed).
                self.engine.restore_status(view.key, known.engine_status)
            self.sync_watchers()
        if newly_refused:
            assert refusal is not None
            log.warning("RunnerPool %s: %s: %s", known.ref.key, refusal.kind, refusal.message)
            await self._event(known.ref, "Warning", refusal.kind, refusal.message)

    # -- status and Events ----------------------------------------------------------------

    def _set_condition(
        self,
        known: Registration,
        type_: str,
        status: str,
        reason: str,
        message: str,
        generation: int,
    ) -> bool:
        """Set an operator-owned condition; True when it changed."""
        before = known.extra.get(type_)
        since = (
            before.last_transition_time
            if before is not None and before.status == status
            else utcnow().replace(microsecond=0)
        )
        condition = Condition(type_, status, reason, message, since, generation)
        known.extra[type_] = condition
        return before != condition

    async def _on_status(self, key: str, status: PoolStatus) -> None:
        known = self.registrations.get(key)
        if known is None or not self.engine.speaks_for(key):
            return  # a drain resumed from Nomad whose object is gone, or another's pool
        known.engine_status = status
        await self._write_status(known)

    def _on_event(self, event: PoolEvent) -> None:
        log_event(event)
        known = self.registrations.get(event.pool)
        if known is not None and self.engine.speaks_for(event.pool):
            type_ = "Warning" if event.warning else "Normal"
            self._spawn(self._event(known.ref, type_, event.reason, event.message))

    async def _write_status(self, known: Registration) -> None:
        async with known.writing:  # composed inside: the last write carries the latest
            await self._write_status_now(known)

    async def _write_status_now(self, known: Registration) -> None:
        if self.kube is None or known.engine_status is None:
            return
        if not self.engine.speaks_for(known.ref.key):
            return  # another replica holds the pool's lease and writes its status
        document = known.engine_status.to_dict()
        engine_types = {c["type"] for c in document["conditions"]}
        document["conditions"] += [
            c.to_dict() for t, c in sorted(known.extra.items()) if t not in engine_types
        ]
        try:
            await self.kube.patch_status(known.ref, document)
        except (aiohttp.ClientError, TimeoutError) as error:
            log.warning("writing the status of %s failed: %s", known.ref.key, error)

    async def _event(self, ref: ObjectRef, type_: str, reason: str, message: str) -> None:
        if self.kube is None or not self.engine.speaks_for(ref.key):
            return
        try:
            await self.kube.post_event(ref, type_, reason, message)
        except (aiohttp.ClientError, TimeoutError) as error:
            log.warning("posting Event %s for %s failed: %s", reason, ref.key, error)

    # -- deletion (kopf on.delete, behind the finalizer) ----------------------------------

    async def finalize(self, body: Mapping[str, Any]) -> None:
        """Honour deletionPolicy; returns only once Nomad holds nothing of the pool that
        the policy says to destroy. Raises kopf.TemporaryError to be called again."""
        meta = body.get("metadata", {})
        ref = ObjectRef(meta.get("namespace", "default"), meta.get("name", ""), meta.get("uid", ""))
        known = self.registrations.setdefault(
            ref.key, Registration(ref, int(meta.get("generation") or 0))
        )
        pool = _pool_for_deletion(body) or known.pool
        view = self.engine.pools.get(ref.key)
        if pool is None and view is None:
            self._forget(ref.key)
            return  # never valid: nothing of it in Nomad
        policy = pool.spec.deletion_policy if pool is not None else DeletionPolicy.DRAIN
        if view is not None and view.conflict is not None:
            policy = DeletionPolicy.ORPHAN  # the runners under that prefix are another pool's
        if policy is DeletionPolicy.ORPHAN:
            self.engine.remove_pool(ref.key, None)
            await self._event(ref, "Normal", "Orphaned", "deletionPolicy Orphan: Nomad left alone")
            self._forget(ref.key)
            return
        if view is None:
            assert pool is not None  # no view and no pool returned above
            self.engine.upsert_pool(pool, known.seen_generation, resource=known.ref.uid)
            view = self.engine.pools[ref.key]
        mode, deadline = (
            removal(pool, _deletion_time(meta)) if pool is not None else (PoolMode.DRAIN, None)
        )
        assert mode is not None  # Orphan returned above
        if view.policy.mode is not mode:
            self.engine.remove_pool(ref.key, mode, deadline)
            known.drain_announced = False
            known.drain_since = time.monotonic()
        if known.drain_since is None:  # a drain resumed from Nomad, or another replica's
            known.drain_since = time.monotonic()
        self.sync_watchers()
        if not known.drain_announced:
            known.drain_announced = True
            reason = "Draining" if mode is PoolMode.DRAIN else "Deleting"
            await self._event(ref, "Normal", reason, f"{reason.lower()} the pool's runners")
        reachable = await self._nomad_reachable()
        if reachable and await self._wait_drained(ref.key, known.drain_since):
            await self._event(ref, "Normal", "Finalized", "no runners left in Nomad")
            self._forget(ref.key)
            return
        left = len(view.runners) if ref.key in self.engine.pools else 0
        waiting = f"{policy.value}: {left} runner jobs left"
        if not reachable:
            waiting = (
                f"{policy.value}: waiting for Nomad, which is unreachable "
                "(set deletionPolicy: Orphan to let go without touching Nomad)"
            )
            await self._warn_nomad(ref, waiting)
        generation = known.seen_generation
        if self._set_condition(known, TERMINATING, "True", policy.value, waiting, generation):
            await self._write_status(known)
        raise kopf.TemporaryError(waiting, delay=self.options.finalize_retry_seconds)

    async def _wait_drained(self, key: str, since: float) -> bool:
        """Whether a pass that began after the drain started saw no runner job and no live
        claim left (waiting a little for it). The engine may keep the pool a while longer,
        until its tombstones expire; the Kubernetes object need not wait for that."""
        deadline = time.monotonic() + FINALIZE_WAIT_SECONDS
        while True:
            view = self.engine.pools.get(key)
            if view is None:
                return True
            observation = view.observation
            if (
                observation is not None
                and view.observation_started > since
                and not view.runners
                and all(claim.is_tombstone for claim in observation.claims.values())
            ):
                return True
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.05)

    async def _nomad_reachable(self) -> bool:
        try:
            await self.client.leader()
        except NomadError:
            return False
        return True

    async def _warn_nomad(self, ref: ObjectRef, message: str) -> None:
        now = time.monotonic()
        if now - self._nomad_warned.get(ref.key, -NOMAD_WARNING_EVERY) >= NOMAD_WARNING_EVERY:
            self._nomad_warned[ref.key] = now
            await self._event(ref, "Warning", "NomadUnavailable", message)

    def _forget(self, key: str) -> None:
        self.registrations.pop(key, None)
        self._nomad_warned.pop(key, None)


def _document(body: Mapping[str, Any]) -> dict[str, Any]:
    """The parts of a custom resource the model reads (status is output, never input)."""
    document = {k: body[k] for k in ("apiVersion", "kind", "metadata", "spec") if k in body}
    if "metadata" in document:
        document["metadata"] = dict(document["metadata"])
    return document


def _pool_for_deletion(body: Mapping[str, Any]) -> RunnerPool | None:
    """The pool to delete: the object as it is, or, when only its jobTemplate is invalid,
    without it (destroying runners needs their namespace and prefix, not the template)."""
    document = _document(body)
    try:
        return RunnerPool.parse_document(document)
    except ValidationError:
        pass
    spec = document.get("spec")
    if not isinstance(spec, Mapping):
        return None
    nomad = spec.get("nomad")
    if not isinstance(nomad, Mapping) or "jobTemplate" not in nomad:
        return None
    stripped = dict(spec, nomad={k: v for k, v in nomad.items() if k != "jobTemplate"})
    try:
        return RunnerPool.parse_document(dict(document, spec=stripped))
    except ValidationError:
        return None


def _deletion_time(meta: Mapping[str, Any]) -> datetime:
    text = meta.get("deletionTimestamp")
    try:
        return parse_time(str(text)) if text else utcnow()
    except ValueError:
        return utcnow()


def _status_without_pool(known: Registration, generation: int, refusal: PoolProblem) -> PoolStatus:
    """The status of a pool that was never valid: nothing observed, Ready False."""
    return compute_status(
        PoolPolicy.without_spec(known.ref.key),
        [],
        now=utcnow().replace(microsecond=0),
        previous=known.engine_status,
        observed_generation=generation,
        breaker=BreakerState(),
        blocked=refusal,
        refusal=refusal,
    )
