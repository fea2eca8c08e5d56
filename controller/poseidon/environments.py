"""Execution environments read from the pools: which pool serves environment N, and how
Poseidon shows environments, their statistics and a depleting prewarming pool."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from controller.api.auth import EVERY_POOL, Scope
from controller.core.environments import Environment
from controller.directory.view import PoolDirectory, PoolEntry
from controller.model import RunnerPool
from controller.sources.environments import environment_of


def environment_pools(
    directory: PoolDirectory, managed: Collection[str] = (), visible: Scope = EVERY_POOL
) -> dict[int, PoolEntry]:
    """Environment ID -> the pool serving it, among the active pools `visible` covers.

    When two pools carry one environment's label, a pool of the files or a resource wins
    over a managed one (`managed`: their keys), then the first key in sorted order."""
    serving: dict[int, PoolEntry] = {}
    for view in sorted(directory.pools.values(), key=lambda v: (v.key in managed, v.key)):
        pool = view.pool
        if not view.active or view.conflict is not None or pool is None:
            continue
        env_id = pool.poseidon_environment
        if env_id is not None and env_id not in serving and visible.allows(view.key):
            serving[env_id] = view
    return serving


def described(view: PoolEntry) -> Environment:
    """The environment a serving pool describes."""
    pool = _spec(view)
    environment = environment_of(pool)
    assert environment is not None  # serving pools carry the label
    return environment


def environment_body(environment: Environment) -> dict[str, Any]:
    """Poseidon's ExecutionEnvironmentData, its fields in Poseidon's order."""
    return {
        "prewarmingPoolSize": environment.prewarming_pool_size,
        "cpuLimit": environment.cpu_limit,
        "memoryLimit": environment.memory_limit,
        "image": environment.image,
        "networkAccess": environment.network_access,
        "exposedPorts": list(environment.exposed_ports) or None,
        "id": environment.id,
    }


def statistics(serving: dict[int, PoolEntry]) -> dict[str, Any]:
    """`GET /statistics/execution-environments`: keyed by the ID as a string."""
    body: dict[str, Any] = {}
    for env_id, view in sorted(serving.items()):
        body[str(env_id)] = {
            "id": env_id,
            "prewarmingPoolSize": _spec(view).spec.idle_runners,
            "idleRunners": _idle(view),
            "usedRunners": view.status.get("claimedRunners", 0),
        }
    return body


def depleting(serving: dict[int, PoolEntry], threshold: float) -> list[int]:
    """The environments whose idle runners are below `threshold` of their prewarming pool
    size (a size of 0 never depletes, nor does a threshold of 0)."""
    return [
        env_id
        for env_id, view in sorted(serving.items())
        if (size := _spec(view).spec.idle_runners) > 0 and _idle(view) / size < threshold
    ]


def _idle(view: PoolEntry) -> int:
    """Its idle runners: claimable now, as its last pass counted them."""
    idle = view.status.get("idleRunners", 0)
    return idle if isinstance(idle, int) else 0


def _spec(view: PoolEntry) -> RunnerPool:
    assert view.pool is not None  # only active pools serve environments
    return view.pool
