"""RunnerPool spec -> Nomad job JSON and the template hash.

``render_job`` gives the pool's job without identity (no ID, Name, Namespace or
poolkeeper Meta); ``template_hash`` hashes exactly that, so every runner of one spec
version carries the same ``poolkeeper_template``; ``runner_job`` adds one runner's
identity. The result is the ``Job`` object of a register request (``{"Job": ...}``).
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Mapping
from typing import Any, Final

from controller.core.runner_ids import META_POOL, META_TEMPLATE
from controller.model import MAP_FIELDS, NetworkMode, RunnerPool

GROUP_NAME: Final = "runner"
TASK_NAME: Final = "runner"
# A fork bomb in a runner should hit its own limit, not the node's.
PIDS_LIMIT: Final = 1024

# The lists the template merges into index by index instead of replacing.
_INDEXED_LISTS: Final = frozenset({"taskgroups", "tasks"})


def port_label(port: int) -> str:
    """The Nomad port label of a container port (also ``NOMAD_PORT_<label>``)."""
    return f"port_{port}"


def _base_job(pool: RunnerPool) -> dict[str, Any]:
    runner = pool.spec.runner
    config: dict[str, Any] = {"image": runner.image}
    if runner.command:
        config["command"] = runner.command[0]
        if len(runner.command) > 1:
            config["args"] = list(runner.command[1:])
    # Hardened defaults: only options the docker driver knows. A jobTemplate may relax them.
    config.update(
        {
            "privileged": False,
            "cap_drop": ["ALL"],
            "security_opt": ["no-new-privileges"],
            "pids_limit": PIDS_LIMIT,
            # An init process reaps zombies and lets the runner stop on SIGTERM at once
            # (``sleep`` as PID 1 ignores it, so every destroy would wait the kill timeout).
            "init": True,
        }
    )
    group: dict[str, Any] = {"Name": GROUP_NAME, "Count": 1}
    if runner.network is NetworkMode.BRIDGE:
        network: dict[str, Any] = {"Mode": "bridge"}
        if runner.ports:
            network["DynamicPorts"] = [
                {"Label": port_label(port), "To": port} for port in runner.ports
            ]
            config["ports"] = [port_label(port) for port in runner.ports]
        group["Networks"] = [network]
    else:
        # Without this the docker driver attaches the default bridge: the runner would
        # have network access.
        config["network_mode"] = "none"

    resources: dict[str, Any] = {"CPU": runner.cpu, "MemoryMB": runner.memory_mb}
    if runner.memory_max_mb is not None:
        resources["MemoryMaxMB"] = runner.memory_max_mb
    task: dict[str, Any] = {
        "Name": TASK_NAME,
        "Driver": "docker",
        "Config": config,
        "Resources": resources,
    }
    if runner.env:
        task["Env"] = dict(runner.env)
    group["Tasks"] = [task]

    nomad = pool.spec.nomad
    job: dict[str, Any] = {"Type": "batch", "Datacenters": list(nomad.datacenters)}
    if nomad.node_pool is not None:
        job["NodePool"] = nomad.node_pool
    job["TaskGroups"] = [group]
    return job


def _find_key(obj: Mapping[str, Any], key: str, case_sensitive: bool) -> str | None:
    if key in obj:
        return key
    if case_sensitive:
        return None
    folded = key.lower()
    return next((k for k in obj if k.lower() == folded), None)


def _merge_indexed(base: list[Any], overlay: list[Any]) -> list[Any]:
    merged: list[Any] = []
    for index in range(max(len(base), len(overlay))):
        if index >= len(overlay):
            merged.append(base[index])
        elif (
            index < len(base)
            and isinstance(base[index], dict)
            and isinstance(overlay[index], Mapping)
        ):
            merged.append(merge_objects(base[index], overlay[index]))
        else:
            merged.append(copy.deepcopy(overlay[index]))
    return merged


def merge_objects(
    base: dict[str, Any], overlay: Mapping[str, Any], *, in_map: bool = False
) -> dict[str, Any]:
    """``overlay`` deep-merged over ``base`` by the jobTemplate rules (docs/reference.md).

    Objects merge key by key; ``TaskGroups`` and ``Tasks`` merge index by index; other
    lists and scalars replace. Outside map fields (Meta, Env, Config) keys match ignoring
    case, as Nomad decodes them, and keep ``base``'s spelling. ``base`` is not changed.
    """
    result = dict(base)
    for key, value in overlay.items():
        target = _find_key(result, key, case_sensitive=in_map)
        if target is None:
            result[key] = copy.deepcopy(value)
            continue
        current = result[target]
        folded = target.lower()
        if (
            not in_map
            and folded in _INDEXED_LISTS
            and isinstance(current, list)
            and isinstance(value, list)
        ):
            result[target] = _merge_indexed(current, value)
        elif isinstance(current, dict) and isinstance(value, Mapping):
            result[target] = merge_objects(current, value, in_map=in_map or folded in MAP_FIELDS)
        else:
            result[target] = copy.deepcopy(value)
    return result


def render_job(pool: RunnerPool) -> dict[str, Any]:
    """The pool's Nomad job (without runner identity), jobTemplate merged in."""
    return merge_objects(_base_job(pool), pool.spec.nomad.job_template)


def canonical_json(value: Any) -> str:
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False
    )


def template_hash(rendered: Mapping[str, Any]) -> str:
    """A stable hash of a rendered job: sha256 of its canonical JSON, 16 hex characters."""
    return hashlib.sha256(canonical_json(rendered).encode("utf-8")).hexdigest()[:16]


def runner_job(
    rendered: Mapping[str, Any],
    runner_id: str,
    pool_key: str,
    template_hash: str,
    namespace: str,
) -> dict[str, Any]:
    """The job to register for one runner: the rendered job plus identity and Meta."""
    job = copy.deepcopy(dict(rendered))
    job["ID"] = runner_id
    job["Name"] = runner_id
    job["Namespace"] = namespace
    job["Type"] = "batch"
    # A template may have spelled it "meta"; Nomad would read both keys as one field.
    meta_key = _find_key(job, "Meta", case_sensitive=False) or "Meta"
    meta = dict(job.get(meta_key) or {})
    meta[META_POOL] = pool_key
    meta[META_TEMPLATE] = template_hash
    job[meta_key] = meta
    return job
