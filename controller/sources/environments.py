"""Poseidon execution environments as pools, and the third pool source: environments kept
in Nomad (`--poseidon-environments managed`), beside pool files and RunnerPool resources.

Environment N is the variable `poolkeeper/environments/N` in the controller's own Nomad
namespace; its items are the environment's fields as Poseidon names them (strings). Its
pool is the environment template (a RunnerPool document without the fields an
environment sets) with those fields filled in, named `environment-N`, labelled
`poolkeeper.dev/poseidon-environment: "N"`. Every process reads the variables again on
each resync (`refresh`, called by the service) and a reconciling process registers their
pools with its engine as it does file pools, so leases, rollouts and drains work the same;
an environment removed from Nomad is drained. The API tier keeps environments in Nomad
the same way and registers nothing: the reconcilers take them from there.
"""

from __future__ import annotations

import asyncio
import copy
import logging
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Final, Protocol

import yaml
from pydantic import ValidationError

from controller.core.environments import Environment
from controller.core.paths import ENVIRONMENTS_PREFIX, environment_path
from controller.core.views import PoolMode
from controller.model import (
    API_VERSION,
    KIND,
    POSEIDON_ENVIRONMENT_LABEL,
    NetworkMode,
    RunnerPool,
    is_environment_id,
    validation_errors,
)
from controller.records.environments import EnvironmentRecords
from controller.records.reading import Known
from controller.sources.registration import removal

log = logging.getLogger(__name__)

DEFAULT_NAMESPACE: Final = "poseidon"

# What each environment sets, so an environment template may not (document paths).
ENVIRONMENT_FIELDS: Final = (
    "metadata.name",
    "spec.idleRunners",
    "spec.runner.image",
    "spec.runner.cpu",
    "spec.runner.memoryMaxMB",
    "spec.runner.network",
    "spec.runner.ports",
    "spec.nomad.jobPrefix",  # each environment has its own: environment-N-
    "spec.deletionPolicy",  # deleting an environment drains it
)
# A pool field's name in Poseidon's words, for the errors of a PUT.
_POSEIDON_NAMES: Final = {
    "spec.idleRunners": "prewarmingPoolSize",
    "spec.runner.image": "image",
    "spec.runner.cpu": "cpuLimit",
    "spec.runner.memoryMB": "memoryLimit",
    "spec.runner.memoryMaxMB": "memoryLimit",
    "spec.runner.ports": "exposedPorts",
}


# What the API tier says when no reconciler registers the managed environments' pools.
UNKEPT: Final = (
    "managed Poseidon environments are kept in Nomad, but no reconciler runs them: start "
    "poolkeeper run or operator with --poseidon-api --poseidon-environments managed"
)


class EnvironmentInvalid(ValueError):
    """An environment that makes no valid pool; the message names the field."""


class EnvironmentTaken(ValueError):
    """An environment whose pool key a pool of another source (files, resources) holds."""


def environment_of(pool: RunnerPool) -> Environment | None:
    """The environment a pool serves, as Poseidon would describe it (None: unlabelled).
    `memoryLimit` is the hard limit: `memoryMaxMB` when set, else `memoryMB`."""
    env_id = pool.poseidon_environment
    if env_id is None:
        return None
    runner = pool.spec.runner
    return Environment(
        id=env_id,
        prewarming_pool_size=pool.spec.idle_runners,
        cpu_limit=runner.cpu,
        memory_limit=runner.memory_max_mb or runner.memory_mb,
        image=runner.image,
        network_access=runner.network is NetworkMode.BRIDGE,
        exposed_ports=tuple(runner.ports),
    )


class EnvironmentTemplate:
    """What every managed environment's pool has beside the environment's own fields: a
    RunnerPool document (its metadata.namespace, its spec) without ENVIRONMENT_FIELDS."""

    def __init__(
        self, document: Mapping[str, Any], source: str = "the environment template"
    ) -> None:
        self._document = copy.deepcopy(dict(document))
        for path in ENVIRONMENT_FIELDS:
            if _lookup(self._document, path) is not None:
                raise EnvironmentInvalid(
                    f"{source}: {path} is set by each environment; leave it out"
                )
        labels = _lookup(self._document, "metadata.labels")
        if isinstance(labels, Mapping) and POSEIDON_ENVIRONMENT_LABEL in labels:
            raise EnvironmentInvalid(
                f"{source}: metadata.labels.{POSEIDON_ENVIRONMENT_LABEL} is set by each environment"
            )
        # The rest must make a valid pool: checked once here, on a sample environment.
        reservation = _lookup(self._document, "spec.runner.memoryMB")
        sample_memory = max(reservation, 128) if isinstance(reservation, int) else 128
        try:
            self.pool_for(Environment(0, 0, 100, sample_memory, "image", False))
        except EnvironmentInvalid as error:
            raise EnvironmentInvalid(f"{source}: {error}") from None

    @classmethod
    def read(cls, path: Path) -> EnvironmentTemplate:
        """The template in a YAML file; EnvironmentInvalid names what is wrong."""
        try:
            document = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as error:
            raise EnvironmentInvalid(f"{path}: {error}") from None
        if not isinstance(document, Mapping):
            raise EnvironmentInvalid(f"{path}: must be a RunnerPool document (a mapping)")
        return cls(document, str(path))

    @property
    def namespace(self) -> str:
        namespace = _lookup(self._document, "metadata.namespace")
        return namespace if isinstance(namespace, str) else DEFAULT_NAMESPACE

    def key(self, env_id: int) -> str:
        return f"{self.namespace}/{pool_name(env_id)}"

    def pool_for(self, environment: Environment) -> RunnerPool:
        """The environment's pool; EnvironmentInvalid names the field (in Poseidon's
        words when it is the environment's) that makes it invalid."""
        document = copy.deepcopy(self._document)
        document.update(apiVersion=API_VERSION, kind=KIND)
        metadata = dict(document.get("metadata") or {})
        labels = dict(metadata.get("labels") or {})
        labels[POSEIDON_ENVIRONMENT_LABEL] = str(environment.id)
        metadata.update(name=pool_name(environment.id), namespace=self.namespace, labels=labels)
        spec = dict(document.get("spec") or {})
        runner = dict(spec.get("runner") or {})
        runner.update(
            image=environment.image,
            cpu=environment.cpu_limit,
            network=(NetworkMode.BRIDGE if environment.network_access else NetworkMode.NONE).value,
            ports=list(environment.ports),
        )
        # Poseidon's memoryLimit is the hard limit; a smaller memoryMB of the template is
        # what Nomad reserves (oversubscription).
        reservation = runner.get("memoryMB")
        if isinstance(reservation, int) and reservation < environment.memory_limit:
            runner["memoryMaxMB"] = environment.memory_limit
        else:
            runner["memoryMB"] = environment.memory_limit
        spec.update(idleRunners=environment.prewarming_pool_size, runner=runner)
        document.update(metadata=metadata, spec=spec)
        try:
            return RunnerPool.parse_document(document)
        except ValidationError as error:
            problems = (
                f"{_poseidon_path(problem.path)}: {problem.message}"
                for problem in validation_errors(error)
            )
            raise EnvironmentInvalid("; ".join(problems)) from None


def _poseidon_path(path: str) -> str:
    """A pool field's path in Poseidon's words where an environment sets it."""
    field, bracket, index = path.partition("[")
    name = _POSEIDON_NAMES.get(field)
    return name + bracket + index if name is not None else path


def _environment_id(path: str) -> int:
    return int(path.removeprefix(ENVIRONMENTS_PREFIX))


def pool_name(env_id: int) -> str:
    return f"environment-{env_id}"


def _lookup(document: Mapping[str, Any], path: str) -> Any:
    value: Any = document
    for part in path.split("."):
        if not isinstance(value, Mapping):
            return None
        value = value.get(part)
    return value


class Registrar(Protocol):
    """What the store needs of a reconciling process's engine."""

    @property
    def pools(self) -> Mapping[str, RegisteredPool]: ...

    def upsert_pool(self, pool: RunnerPool) -> None: ...

    def remove_pool(self, key: str, mode: PoolMode | None, deadline: datetime | None) -> None: ...

    clock: Callable[[], datetime]


class RegisteredPool(Protocol):
    @property
    def pool(self) -> RunnerPool | None: ...

    @property
    def active(self) -> bool: ...


@dataclass(frozen=True)
class _Stored:
    """One environment variable as last read: its index, and the pool that runs for it
    (the last valid one; None if it never made a valid pool)."""

    modify_index: int
    environment: Environment | None
    pool: RunnerPool | None


class EnvironmentStore:
    """The managed environments: kept in Nomad, registered with the engine as pools (in a
    reconciling process: `engine`; the API tier gives none and registers nothing).

    `on_written` hears of every put and delete (the API tier tells the reconcilers to read
    the environments again).
    """

    def __init__(
        self,
        records: EnvironmentRecords,
        template: EnvironmentTemplate,
        engine: Registrar | None,
        *,
        on_written: Callable[[], None] = lambda: None,
    ) -> None:
        self._records = records
        self.template = template
        self._engine = engine
        self._on_written = on_written
        self._stored: dict[int, _Stored] = {}
        self._lock = asyncio.Lock()  # a refresh never applies a read older than a write
        self._warned: set[tuple[str, int]] = set()
        self._registered: set[str] = set()  # keys this store gave the engine
        # Pools of environments deleted (here, or seen gone) that a directory may still
        # list until their reconciler drains them: served no more.
        self._gone: set[str] = set()
        # Without an engine (the API tier): the reconcilers that register the
        # environments' pools, as their member records last said (None: not read yet).
        self._keepers: frozenset[str] | None = None

    @property
    def keys(self) -> frozenset[str]:
        """The keys of the pools that run for managed environments."""
        return frozenset(s.pool.key for s in self._stored.values() if s.pool is not None)

    def serves(self, env_id: int) -> bool:
        """Whether the environment is stored with a valid pool (served once its pool
        runs)."""
        stored = self._stored.get(env_id)
        return stored is not None and stored.pool is not None

    def stored(self) -> dict[int, Environment]:
        """The environments stored with a valid pool, as this process last read or wrote
        them (what it wrote, at once)."""
        return {
            env_id: s.environment
            for env_id, s in self._stored.items()
            if s.pool is not None and s.environment is not None
        }

    def gone(self, key: str) -> bool:
        """Whether the pool is of an environment deleted since: not to be served, though
        a directory may list it until its reconciler drains it."""
        return key in self._gone

    def forget_gone(self, listed: Collection[str]) -> None:
        """Pools a directory no longer lists need no hiding."""
        self._gone &= set(listed)

    @property
    def kept(self) -> bool:
        """Whether a reconciler registers the environments' pools (as far as known)."""
        return self._engine is not None or self._keepers is None or bool(self._keepers)

    def note_keepers(self, keepers: Collection[str]) -> None:
        """The reconcilers that register the environments' pools now (the API tier reads
        them from their member records): say when none does while environments wait."""
        kept = frozenset(keepers)
        if not kept and self._stored and self._keepers != kept:
            log.warning("%s", UNKEPT)
        elif kept and self._keepers is not None and not self._keepers:
            log.info("a reconciler runs the managed environments again: %s", ", ".join(kept))
        self._keepers = kept

    # ---- reading ---------------------------------------------------------------------

    async def refresh(self) -> None:
        """Read the environments from Nomad (only changed variables are read again) and
        make the engine hold their pools. A failed read changes nothing."""
        async with self._lock:
            known = {environment_path(i): Known(s.modify_index, s) for i, s in self._stored.items()}
            read = await self._records.read(known, self._decode, self._valid)
            found = {_environment_id(path): hit.value for path, hit in read.items()}
            for env_id in self._stored.keys() - found.keys():
                self._remove(self._stored[env_id])
            self._stored = found
            self._register()

    def _valid(self, path: str) -> bool:
        if is_environment_id(path.removeprefix(ENVIRONMENTS_PREFIX)):
            return True
        self._warn_once(path, 0, "not an environment ID; ignored")
        return False

    def _decode(self, path: str, variable: Mapping[str, Any]) -> _Stored:
        env_id = _environment_id(path)
        return self._read(env_id, path, variable, self._stored.get(env_id))

    def _read(
        self, env_id: int, path: str, variable: Mapping[str, Any], known: _Stored | None
    ) -> _Stored:
        index = int(variable.get("ModifyIndex", 0))
        try:
            environment = Environment.from_items(env_id, variable.get("Items") or {})
            pool = self.template.pool_for(environment)
        except ValueError as error:  # EnvironmentInvalid too
            kept = known.pool if known is not None else None
            what = "keeping its last valid pool" if kept is not None else "not served"
            self._warn_once(path, index, f"{error}; {what}")
            return _Stored(index, known.environment if known is not None else None, kept)
        return _Stored(index, environment, pool)

    def _warn_once(self, path: str, index: int, message: str) -> None:
        if (path, index) not in self._warned:
            self._warned.add((path, index))
            log.warning("Poseidon environment %s: %s", path, message)

    # ---- writing -----------------------------------------------------------------------

    async def put(self, environment: Environment) -> bool:
        """Create or replace an environment; True when it was created. Raises
        EnvironmentInvalid (nothing written) when it makes no valid pool."""
        pool = self.template.pool_for(environment)
        if self._held_elsewhere(pool.key):
            raise EnvironmentTaken(f"pool {pool.key} is defined by the pool files or a resource")
        async with self._lock:
            index, created = await self._records.put(environment.id, environment.items())
            self._stored[environment.id] = _Stored(index, environment, pool)
            self._gone.discard(pool.key)
            if not self.kept:
                log.warning("Poseidon environment %d written: %s", environment.id, UNKEPT)
            self._register()
            self._on_written()
            return created

    async def delete(self, env_id: int) -> bool:
        """Remove an environment (its pool drains); False when there is none."""
        async with self._lock:
            removed = await self._records.delete(env_id)
            gone = self._stored.pop(env_id, None)
            if gone is not None:
                self._remove(gone)
            self._gone.add(self.template.key(env_id))
            if removed:
                self._on_written()
            return removed

    # ---- the engine --------------------------------------------------------------------

    def _register(self) -> None:
        """Make the engine hold each environment's pool as it is now."""
        if self._engine is None:
            return
        for stored in self._stored.values():
            pool = stored.pool
            if pool is None:
                continue
            if self._held_elsewhere(pool.key):
                self._warn_once(pool.key, stored.modify_index, "its pool is defined elsewhere")
                continue
            view = self._engine.pools.get(pool.key)
            if view is None or view.pool != pool or not view.active:
                self._engine.upsert_pool(pool)
                self._registered.add(pool.key)

    def _held_elsewhere(self, key: str) -> bool:
        if self._engine is None:
            return False  # the API route checked the pools it serves
        view = self._engine.pools.get(key)
        return view is not None and view.active and key not in self._registered

    def _remove(self, stored: _Stored) -> None:
        pool = stored.pool
        if pool is not None:
            self._gone.add(pool.key)
        if self._engine is not None and pool is not None and pool.key in self._registered:
            log.info("Poseidon environment removed: draining pool %s", pool.key)
            self._engine.remove_pool(pool.key, *removal(pool, self._engine.clock()))
            self._registered.discard(pool.key)
