"""`poolkeeper operator`: the controller driven by RunnerPool custom resources (kopf).

The kopf handlers at the bottom are thin: they hand the object to `OperatorController`,
which validates it with the same pydantic models as the pool files and registers,
updates or drains the pool in the engine. The engine does the work and reports status
through `on_status`; this module writes that status to the status subresource (never the
spec) and turns what changed into Kubernetes Events.

Active/passive (kopf peering). kopf 1.45 has no public hook for "this replica was paused
or resumed": its watchers and daemons follow a private `operator_paused` toggle set. We
hand that very toggle set to an `Activity` (by wrapping kopf's `daemon_killer`, the one
root task that receives it) and start the engine only while kopf has this replica active;
a paused replica stops its engine, forgets its pools and answers /readyz with 503. Pools
come back through kopf's re-listing after a resume (the `on.event` handler is level
triggered: every listed object is registered again). See docs/operator-internals.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextvars
import dataclasses
import logging
import os
import random
import socket
import ssl
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Final

import aiohttp
import kopf
from kopf._core.engines import daemons as kopf_daemons
from pydantic import ValidationError

from controller.core.status import Condition, PoolStatus, compute_status
from controller.core.times import format_time, parse_time, utcnow
from controller.core.views import PoolMode, PoolPolicy
from controller.errors import UsageError
from controller.model import (
    API_VERSION,
    KIND,
    DeletionPolicy,
    RunnerPool,
    format_validation_error,
    immutable_changes,
    pool_key,
)
from controller.nomad.config import NomadConfig
from controller.nomad.errors import NomadError
from controller.service import (
    Service,
    ServiceSettings,
    nomad_config_from_env,
    parse_listen,
    start_logging,
)
from controller.standalone import DELETION_MODES

log = logging.getLogger(__name__)

GROUP: Final = "poolkeeper.dev"
VERSION: Final = "v1alpha1"
PLURAL: Final = "runnerpools"
FINALIZER: Final = "poolkeeper.dev/finalizer"
# kopf keeps its handler progress and last-handled spec in annotations with this prefix
# (never in .status, which belongs to poolkeeper, and never in .spec).
ANNOTATION_PREFIX: Final = "poolkeeper.dev"
# A peer not heard from for this long is dead; kopf refreshes its record every
# lifetime - (5..10) s. Failover: at once when the active replica stops gracefully (it
# removes its record), at most this long after it died without saying goodbye.
PEERING_LIFETIME_SECONDS: Final = 15
PRIORITY_RANGE: Final = (1, 2**31 - 1)
COMPONENT: Final = "poolkeeper"
PASSIVE: Final = "(passive replica: another operator replica is active)"

# Operator-owned conditions, written beside the engine's Ready/Progressing/Degraded.
SPEC_ACCEPTED: Final = "SpecAccepted"
TERMINATING: Final = "Terminating"
OPERATOR_CONDITIONS: Final = frozenset({SPEC_ACCEPTED, TERMINATING})

# Destroy reasons (metrics label) reported as Events, with the Event reason.
EVENT_REASONS: Final = {
    "startup_timeout": ("RunnerReplaced", "did not start within startupTimeoutSeconds"),
    "failed": ("RunnerReplaced", "failed to start"),
    "lost": ("AllocationLost", "lost its allocation while claimed"),
}
NOMAD_WARNING_EVERY: Final = 30.0
FINALIZE_WAIT_SECONDS: Final = 3.0

Connect = Callable[[kopf.OperatorSettings], kopf.ConnectionInfo | None]


# ---- options -----------------------------------------------------------------------------


@dataclass(frozen=True)
class OperatorOptions(ServiceSettings):
    listen: tuple[str, int] = ("0.0.0.0", 8080)
    namespaces: tuple[str, ...] = ()  # empty: all namespaces
    peering: str | None = None
    priority: int = 0
    liveness: str | None = None
    peering_lifetime: int = PEERING_LIFETIME_SECONDS
    finalize_retry_seconds: float = 2.0
    api_error_backoffs: tuple[float, ...] | None = None  # None: kopf's own


def options_from_args(args: argparse.Namespace) -> OperatorOptions:
    if args.resync_seconds <= 0:
        raise UsageError(f"--resync-seconds {args.resync_seconds} must be positive")
    priority = args.priority
    if priority is None:
        # kopf pauses every replica when two share a priority: draw from a wide range.
        priority = random.SystemRandom().randint(*PRIORITY_RANGE)
    return OperatorOptions(
        namespaces=tuple(args.namespace or ()) if not args.all_namespaces else (),
        listen=parse_listen(args.listen),
        resync_seconds=args.resync_seconds,
        token_file=Path(args.api_token_file) if args.api_token_file else None,
        insecure_no_auth=args.insecure_no_auth,
        peering=args.peering,
        priority=priority,
        liveness=args.liveness,
    )


def operator_settings(options: OperatorOptions) -> kopf.OperatorSettings:
    settings = kopf.OperatorSettings()
    # No CRD or namespace scanning: the resources are known, and RBAC stays minimal.
    settings.scanning.disabled = True
    settings.peering.lifetime = options.peering_lifetime
    settings.peering.priority = options.priority
    settings.peering.stealth = True
    if options.peering:
        settings.peering.name = options.peering
        settings.peering.mandatory = True
    else:
        settings.peering.standalone = True
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(
        prefix=ANNOTATION_PREFIX
    )
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=ANNOTATION_PREFIX, key="last-handled-configuration"
    )
    # kopf's own per-handler Events only for problems; poolkeeper posts its own.
    settings.posting.level = logging.WARNING
    settings.posting.reporting_component = COMPONENT
    if options.api_error_backoffs is not None:
        settings.networking.error_backoffs = options.api_error_backoffs
    return settings


def default_connect(settings: kopf.OperatorSettings) -> kopf.ConnectionInfo | None:
    """In a pod: the service account; elsewhere: KUBECONFIG or ~/.kube/config."""
    return kopf.login_with_service_account(settings=settings) or kopf.login_with_kubeconfig(
        settings=settings
    )


# ---- a small Kubernetes client for status and Events ---------------------------------------


def _ssl_context(info: kopf.ConnectionInfo, scratch: Path) -> ssl.SSLContext | bool:
    if info.insecure:
        return False
    context = ssl.create_default_context()
    if info.ca_path:
        context.load_verify_locations(cafile=os.fsdecode(info.ca_path))
    if info.ca_data:
        data = info.ca_data.decode() if isinstance(info.ca_data, bytes) else info.ca_data
        context.load_verify_locations(cadata=data)
    cert, key = info.certificate_path, info.private_key_path
    if info.certificate_data:
        cert = scratch / "client.crt"
        cert.write_bytes(_as_bytes(info.certificate_data))
    if info.private_key_data:
        key = scratch / "client.key"
        key.write_bytes(_as_bytes(info.private_key_data))
    if cert:
        context.load_cert_chain(os.fsdecode(cert), os.fsdecode(key) if key else None)
    return context


def _as_bytes(value: str | bytes) -> bytes:
    return value if isinstance(value, bytes) else value.encode()


@dataclass(frozen=True)
class ObjectRef:
    namespace: str
    name: str
    uid: str

    @property
    def key(self) -> str:
        return pool_key(self.namespace, self.name)


class KubeClient:
    """Writes RunnerPool status (the status subresource only) and core/v1 Events, with
    the credentials kopf logged in with."""

    def __init__(self, info: kopf.ConnectionInfo) -> None:
        self.server = info.server.rstrip("/")
        self._scratch = tempfile.TemporaryDirectory(prefix="poolkeeper-kube-")
        self._ssl = _ssl_context(info, Path(self._scratch.name))
        self._headers = {"User-Agent": f"{COMPONENT}-operator"}
        self._auth: aiohttp.BasicAuth | None = None
        if info.token:
            self._headers["Authorization"] = f"{info.scheme or 'Bearer'} {info.token}"
        elif info.username and info.password:
            self._auth = aiohttp.BasicAuth(info.username, info.password)
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                headers=self._headers,
                auth=self._auth,
                timeout=aiohttp.ClientTimeout(total=30),
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
        self._scratch.cleanup()

    async def patch_status(self, ref: ObjectRef, status: Mapping[str, Any]) -> bool:
        """Merge-patch .status through the status subresource; False if the object is gone."""
        url = (
            f"{self.server}/apis/{GROUP}/{VERSION}/namespaces/{ref.namespace}/"
            f"{PLURAL}/{ref.name}/status"
        )
        async with self._client().patch(
            url,
            json={"status": status},
            headers={"Content-Type": "application/merge-patch+json"},
            ssl=self._ssl,
        ) as response:
            if response.status == 404:
                return False
            if response.status >= 400:
                raise aiohttp.ClientResponseError(
                    response.request_info,
                    (),
                    status=response.status,
                    message=(await response.text())[:200],
                )
            return True

    async def post_event(self, ref: ObjectRef, type_: str, reason: str, message: str) -> None:
        now = format_time(utcnow().replace(microsecond=0))
        name = f"{ref.name}.{time.time_ns():x}"[:253]
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": ref.namespace},
            "involvedObject": {
                "apiVersion": API_VERSION,
                "kind": KIND,
                "name": ref.name,
                "namespace": ref.namespace,
                "uid": ref.uid,
            },
            "type": type_,
            "reason": reason,
            "message": message[:1024],
            "source": {"component": COMPONENT},
            "reportingComponent": COMPONENT,
            "reportingInstance": os.environ.get("POD_ID") or socket.gethostname(),
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        url = f"{self.server}/api/v1/namespaces/{ref.namespace}/events"
        async with self._client().post(url, json=body, ssl=self._ssl) as response:
            if response.status >= 400:
                log.warning(
                    "could not post Event %s for %s: HTTP %s", reason, ref.key, response.status
                )


# ---- active/passive ----------------------------------------------------------------------

_ACTIVITY: contextvars.ContextVar[Activity] = contextvars.ContextVar("poolkeeper_activity")


class Activity:
    """Follows kopf's own pause toggles: active exactly while kopf processes events.

    In peering mode kopf starts paused (its peering toggles are created switched on) and
    resumes once it wins; until those toggles exist the set is empty, which must not
    count as active, hence `len(...) >= 2` (kopf's "peering CRD is missing" toggle plus
    at least one peering toggle).
    """

    POLL_SECONDS: Final = 0.1

    def __init__(self, peering: bool, on_change: Callable[[bool], Awaitable[None]]) -> None:
        self.peering = peering
        self.on_change = on_change
        self.active = False
        self._toggles: Any = None
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None

    def attach(self, toggles: Any) -> None:
        self._toggles = toggles
        self._task = asyncio.create_task(self._follow(), name="poolkeeper activity")

    def _is_active(self) -> bool:
        toggles = self._toggles
        if toggles is None:
            return False
        settled = not self.peering or len(toggles) >= 2
        return bool(settled and toggles.is_off())

    async def sync(self) -> bool:
        """Catch up with kopf now (its resumed watchers may deliver events before our
        follower notices the resume); returns whether this replica is active."""
        async with self._lock:
            now_active = self._is_active()
            if now_active != self.active:
                self.active = now_active
                try:
                    await self.on_change(now_active)
                except Exception:
                    log.exception("switching to %s failed", "active" if now_active else "passive")
        return self.active

    async def _follow(self) -> None:
        while True:
            if await self.sync():
                await self._toggles.wait_for(True)
            else:
                await asyncio.sleep(self.POLL_SECONDS)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        async with self._lock:
            if self.active:
                self.active = False
                await self.on_change(False)


_HOOK_LOCK = threading.Lock()


def _install_pause_hook() -> None:
    """Route kopf's private pause toggle set to the Activity of the operator starting it."""
    with _HOOK_LOCK:
        _wrap_daemon_killer()


def _wrap_daemon_killer() -> None:
    original = kopf_daemons.daemon_killer
    if getattr(original, "poolkeeper_hook", False):
        return

    def daemon_killer(*, operator_paused: Any, **kwargs: Any) -> Any:
        activity = _ACTIVITY.get(None)
        if activity is not None:
            activity.attach(operator_paused)
        return original(operator_paused=operator_paused, **kwargs)

    daemon_killer.poolkeeper_hook = True  # type: ignore[attr-defined]
    kopf_daemons.daemon_killer = daemon_killer


# ---- the controller behind the handlers --------------------------------------------------


@dataclass
class Registration:
    """What this replica knows of one RunnerPool object."""

    ref: ObjectRef
    seen_generation: int
    pool: RunnerPool | None = None  # the last valid version (the one that runs)
    pool_generation: int = 0
    invalid: str | None = None  # the current generation's problem
    extra: dict[str, Condition] = field(default_factory=dict)
    engine_status: PoolStatus | None = None
    drain_announced: bool = False
    drain_since: float | None = None  # time.monotonic() when this replica began the drain
    writing: asyncio.Lock = field(default_factory=asyncio.Lock)  # one status write at a time


class OperatorController(Service):
    """Engine, API and event watchers of one operator replica; pools come from kopf."""

    def __init__(self, options: OperatorOptions, nomad: NomadConfig) -> None:
        super().__init__(options, nomad, on_status=self._on_status)
        self.options = options
        self.kube: KubeClient | None = None
        self.active = False
        self.registrations: dict[str, Registration] = {}
        self._destroyed_seen: dict[tuple[str, str], float] = {}
        self._nomad_warned: dict[str, float] = {}
        self._background: set[asyncio.Task[None]] = set()
        self.activity = Activity(options.peering is not None, self.set_active)
        self._stopped = False

    # -- lifecycle --------------------------------------------------------------------

    def unready(self) -> list[str]:
        if not self.active:
            return [PASSIVE]
        return self.engine.ready()

    def connect(
        self, settings: kopf.OperatorSettings, connect: Connect
    ) -> kopf.ConnectionInfo | None:
        """The credentials kopf uses, and ours (None: kopf stops with a LoginError)."""
        info = connect(settings)
        if info is None:
            log.error("no Kubernetes credentials: no service account and no kubeconfig")
        elif self.kube is None:
            self.kube = KubeClient(info)
        return info

    async def set_active(self, active: bool) -> None:
        if active:
            log.info("this replica is active: reconciling")
            self.active = True
            await self.engine.start()
            self._spawn(self.resume_drains(lambda: self.active))
            self.sync_watchers()
        else:
            log.info("this replica is passive: not reconciling")
            self.active = False
            await self.engine.stop()
            await self.stop_watchers()
            # Forget everything: the active replica owns the pools now, and kopf lists
            # them all again when this replica resumes.
            self.engine.forget_pools()
            self.registrations.clear()

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
        await self.activity.stop()
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        if self.active:
            await self.set_active(False)
        await self.close()
        if self.kube is not None:
            await self.kube.close()

    # -- registration (kopf on.event: create, resume and update) ---------------------------

    async def observe(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        """A watch event or a listed object: register what changed. Level triggered."""
        if not await self.activity.sync():
            return  # an event sneaking in while pausing: kopf lists all again on resume
        meta = body.get("metadata", {})
        ref = ObjectRef(meta.get("namespace", "default"), meta.get("name", ""), meta.get("uid", ""))
        known = self.registrations.get(ref.key)
        if event_type == "DELETED":
            # Gone without our finalizer (removed by hand): stop managing, leave Nomad.
            if known is not None and ref.key in self.engine.pools:
                managed = self.engine.pools[ref.key]
                if managed.policy.mode is PoolMode.ACTIVE:
                    self.engine.remove_pool(ref.key, None)
            self.registrations.pop(ref.key, None)
            return
        if meta.get("deletionTimestamp"):
            return  # the finalizer handler takes it from here
        generation = int(meta.get("generation") or 0)
        if known is not None and known.ref.uid == ref.uid and known.seen_generation == generation:
            return  # a status or metadata change
        if known is None or known.ref.uid != ref.uid:
            known = Registration(ref, generation)
            self.registrations[ref.key] = known
            previous = body.get("status")
            restored = PoolStatus.from_dict(previous) if isinstance(previous, Mapping) else None
            if restored is not None:
                # What an earlier replica wrote: the engine's part, and ours beside it.
                ours = [c for c in restored.conditions if c.type in OPERATOR_CONDITIONS]
                known.extra.update({c.type: c for c in ours})
                known.engine_status = dataclasses.replace(
                    restored,
                    conditions=tuple(c for c in restored.conditions if c not in ours),
                )
        known.seen_generation = generation
        try:
            pool = RunnerPool.parse_document(_document(body))
        except ValidationError as error:
            await self._refuse_invalid(known, generation, format_validation_error(error))
            return
        if known.pool is not None:
            changed = immutable_changes(known.pool, pool)
            if changed:
                await self._refuse_immutable(known, changed)
                return
        await self._accept(known, pool, generation)

    async def _accept(self, known: Registration, pool: RunnerPool, generation: int) -> None:
        first = known.pool is None
        known.pool, known.pool_generation, known.invalid = pool, generation, None
        self.engine.upsert_pool(pool, generation)
        managed = self.engine.pools[pool.key]
        if first and managed.status is None and known.engine_status is not None:
            # A restarted operator keeps condition transition times (and writes nothing
            # if nothing changed).
            managed.status = known.engine_status
        self.sync_watchers()
        accepted = self._set_condition(known, SPEC_ACCEPTED, "True", "Accepted", "", generation)
        if accepted and not first:
            await self._write_status(known)

    async def _refuse_invalid(self, known: Registration, generation: int, message: str) -> None:
        known.invalid = message
        if known.pool is not None:
            # The last valid version stays registered (its claims are still answered),
            # but nothing is done in Nomad while the spec is invalid.
            self.engine.upsert_pool(known.pool, generation, problem=("InvalidSpec", message))
        else:
            known.engine_status = _status_without_pool(known, generation, message)
        self._set_condition(known, SPEC_ACCEPTED, "False", "InvalidSpec", message, generation)
        log.warning("RunnerPool %s: invalid spec: %s", known.ref.key, message)
        await self._write_and_tell(known, "Warning", "InvalidSpec", message)

    async def _refuse_immutable(self, known: Registration, changed: list[str]) -> None:
        message = (
            f"{', '.join(changed)} cannot be changed; still running generation "
            f"{known.pool_generation}. Delete and re-create the pool to move it."
        )
        generation = known.seen_generation
        if known.invalid is not None and known.pool is not None:
            self.engine.upsert_pool(known.pool, known.pool_generation)  # back to the old spec
            known.invalid = None
        self._set_condition(
            known, SPEC_ACCEPTED, "False", "ImmutableFieldChanged", message, generation
        )
        log.warning("RunnerPool %s: %s", known.ref.key, message)
        await self._write_and_tell(known, "Warning", "ImmutableFieldChanged", message)

    async def _write_and_tell(
        self, known: Registration, type_: str, reason: str, message: str
    ) -> None:
        await self._write_status(known)
        await self._event(known.ref, type_, reason, message)

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
        if before is None and known.engine_status is not None:
            before = known.engine_status.condition(type_)
        since = (
            before.last_transition_time
            if before is not None and before.status == status
            else utcnow().replace(microsecond=0)
        )
        condition = Condition(type_, status, reason, message, since, generation)
        known.extra[type_] = condition
        return before != condition

    # -- status and Events ----------------------------------------------------------------

    async def _on_status(self, key: str, status: PoolStatus) -> None:
        known = self.registrations.get(key)
        if known is None:
            return  # a drain resumed from Nomad whose object is already gone
        previous, known.engine_status = known.engine_status, status
        await self._write_status(known)
        await self._events_from_status(known, previous, status)

    async def _write_status(self, known: Registration) -> None:
        async with known.writing:  # composed inside: the last write carries the latest
            await self._write_status_now(known)

    async def _write_status_now(self, known: Registration) -> None:
        if self.kube is None or known.engine_status is None:
            return
        document = known.engine_status.to_dict()
        engine_types = {c["type"] for c in document["conditions"]}
        document["conditions"] += [
            c.to_dict() for t, c in sorted(known.extra.items()) if t not in engine_types
        ]
        try:
            await self.kube.patch_status(known.ref, document)
        except (aiohttp.ClientError, TimeoutError) as error:
            log.warning("writing the status of %s failed: %s", known.ref.key, error)

    async def _events_from_status(
        self, known: Registration, previous: PoolStatus | None, status: PoolStatus
    ) -> None:
        before = previous.condition("Degraded") if previous else None
        after = status.condition("Degraded")
        if (
            after is not None
            and after.reason == "CircuitOpen"
            and (before is None or before.reason != "CircuitOpen")
        ):
            await self._event(known.ref, "Warning", "CircuitBreakerOpen", after.message)
        for reason, (event_reason, what) in EVENT_REASONS.items():
            labels = {"pool": known.ref.key, "reason": reason}
            value = self.metrics.registry.get_sample_value(
                "poolkeeper_runners_destroyed_total", labels
            )
            seen = self._destroyed_seen.get((known.ref.key, reason), 0.0)
            if value is not None and value > seen:
                self._destroyed_seen[(known.ref.key, reason)] = value
                count = int(value - seen)
                await self._event(
                    known.ref, "Warning", event_reason, f"{count} runner(s) {what}; replaced"
                )

    async def _event(self, ref: ObjectRef, type_: str, reason: str, message: str) -> None:
        if self.kube is None:
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
        if not await self.activity.sync():
            raise kopf.TemporaryError("this replica is passive", delay=1)
        known = self.registrations.setdefault(
            ref.key, Registration(ref, int(meta.get("generation") or 0))
        )
        pool = _pool_for_deletion(body) or known.pool
        managed = self.engine.pools.get(ref.key)
        if pool is None and managed is None:
            self._forget(ref.key)
            return  # never valid: nothing of it in Nomad
        policy = pool.spec.deletion_policy if pool is not None else DeletionPolicy.DRAIN
        if managed is not None and managed.problem and managed.problem[0] == "PrefixConflict":
            policy = DeletionPolicy.ORPHAN  # the runners under that prefix are another pool's
        if policy is DeletionPolicy.ORPHAN:
            self.engine.remove_pool(ref.key, None)
            await self._event(ref, "Normal", "Orphaned", "deletionPolicy Orphan: Nomad left alone")
            self._forget(ref.key)
            return
        mode = DELETION_MODES[policy]
        assert mode is not None
        if managed is None or managed.problem is not None:
            if pool is None:
                raise kopf.PermanentError("no valid spec to drain")  # unreachable
            self.engine.upsert_pool(pool, known.pool_generation or known.seen_generation)
            managed = self.engine.pools[ref.key]
        if managed.policy.mode is not mode:
            seconds = 0.0
            if mode is PoolMode.DRAIN and pool is not None:
                deleted_at = _deletion_time(meta)
                deadline = deleted_at + timedelta(seconds=pool.spec.drain_timeout_seconds)
                seconds = max(0.0, (deadline - utcnow()).total_seconds())
            self.engine.remove_pool(ref.key, mode, seconds)
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
        if not self.active:
            raise kopf.TemporaryError("this replica was paused", delay=1)
        left = len(self.engine.pools[ref.key].runners) if ref.key in self.engine.pools else 0
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
            if not self.active:
                return False  # paused meanwhile: the pool was forgotten, not drained
            managed = self.engine.pools.get(key)
            if managed is None:
                return True
            observation = managed.observation
            if (
                observation is not None
                and managed.observation_started > since
                and not managed.runners
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
        for reason in EVENT_REASONS:
            self._destroyed_seen.pop((key, reason), None)


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


def _status_without_pool(known: Registration, generation: int, message: str) -> PoolStatus:
    """The status of a pool that was never valid: nothing observed, Ready False."""
    policy = PoolPolicy(
        key=known.ref.key,
        nomad_namespace="",
        job_prefix="",
        desired_idle=0,
        max_runners=0,
        startup_timeout_seconds=1,
        template_hash="",
    )
    return compute_status(
        policy,
        [],
        now=utcnow().replace(microsecond=0),
        previous=known.engine_status,
        observed_generation=generation,
        breaker_open=False,
        problem=("InvalidSpec", message),
    )


# ---- kopf handlers (thin) ------------------------------------------------------------------

REGISTRY: Final = kopf.OperatorRegistry()


@dataclass
class Runtime:
    """What the handlers reach through kopf's memo: one per operator replica."""

    controller: OperatorController
    connect: Connect = default_connect


def _runtime(memo: Any) -> Runtime:
    runtime: Runtime = memo.poolkeeper
    return runtime


@kopf.on.login(registry=REGISTRY)
def login(memo: Any, settings: kopf.OperatorSettings, **_: Any) -> kopf.ConnectionInfo | None:
    runtime = _runtime(memo)
    return runtime.controller.connect(settings, runtime.connect)


@kopf.on.cleanup(registry=REGISTRY)
async def cleanup(memo: Any, **_: Any) -> None:
    # Before kopf reaps the tasks left in the loop: stop ours (engine, API) gracefully.
    await _runtime(memo).controller.stop()


@kopf.on.event(GROUP, VERSION, PLURAL, registry=REGISTRY)
async def observe(event: Mapping[str, Any], body: Mapping[str, Any], memo: Any, **_: Any) -> None:
    await _runtime(memo).controller.observe(event.get("type"), body)


@kopf.on.delete(GROUP, VERSION, PLURAL, registry=REGISTRY)
async def finalize(body: Mapping[str, Any], memo: Any, **_: Any) -> None:
    await _runtime(memo).controller.finalize(body)


# ---- running -----------------------------------------------------------------------------


async def run(
    options: OperatorOptions,
    nomad: NomadConfig,
    *,
    connect: Connect = default_connect,
    stop_flag: asyncio.Event | threading.Event | None = None,
    started: Callable[[OperatorController], None] | None = None,
) -> None:
    """One operator replica until SIGTERM/SIGINT (or `stop_flag`)."""
    _install_pause_hook()
    controller = OperatorController(options, nomad)
    await controller.serve_api(controller.unready)
    if started is not None:
        started(controller)
    token = _ACTIVITY.set(controller.activity)
    try:
        await kopf.operator(
            registry=REGISTRY,
            settings=operator_settings(options),
            clusterwide=not options.namespaces,
            namespaces=list(options.namespaces),
            priority=options.priority,
            peering_name=options.peering,
            standalone=options.peering is None,
            liveness_endpoint=options.liveness,
            memo=kopf.Memo(poolkeeper=Runtime(controller, connect)),
            stop_flag=stop_flag,
        )
    finally:
        _ACTIVITY.reset(token)
        await controller.stop()


def main(args: argparse.Namespace) -> int:
    start_logging()
    options = options_from_args(args)
    nomad = nomad_config_from_env()
    log.info(
        "poolkeeper operator: %s, peering %s (priority %d, lifetime %d s)",
        ", ".join(options.namespaces) or "all namespaces",
        options.peering or "off",
        options.priority,
        options.peering_lifetime,
    )
    no_credentials = UsageError(
        "no Kubernetes credentials: run in a pod with a service account, or set KUBECONFIG"
    )
    if default_connect(operator_settings(options)) is None:
        raise no_credentials
    try:
        asyncio.run(run(options, nomad))
    except kopf.LoginError:
        raise no_credentials from None
    return 0


__all__ = ["OperatorController", "OperatorOptions", "main", "run"]
