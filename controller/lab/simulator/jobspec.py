"""Job canonicalisation (the API defaults Nomad applies on register) and comparisons."""

from __future__ import annotations

import copy
import json
from typing import Any

from controller.lab.simulator.util import JSON, bad_request

_NS = 1_000_000_000
_MIN = 60 * _NS
_HOUR = 60 * _MIN

# Fields that change without the job spec changing (structs.Job.SpecChanged ignores them).
_VOLATILE = (
    "Status",
    "StatusDescription",
    "Stable",
    "Version",
    "SubmitTime",
    "CreateIndex",
    "ModifyIndex",
    "JobModifyIndex",
)


def _restart_policy(job_type: str) -> JSON:
    if job_type == "batch":
        return {"Attempts": 3, "Interval": 24 * _HOUR, "Delay": 15 * _NS, "Mode": "fail"}
    return {"Attempts": 2, "Interval": 30 * _MIN, "Delay": 15 * _NS, "Mode": "fail"}


def _reschedule_policy(job_type: str) -> JSON | None:
    if job_type == "batch":
        return {
            "Attempts": 1,
            "Interval": 24 * _HOUR,
            "Delay": 5 * _NS,
            "DelayFunction": "constant",
            "MaxDelay": 0,
            "Unlimited": False,
        }
    if job_type == "service":
        return {
            "Attempts": 0,
            "Interval": 0,
            "Delay": 30 * _NS,
            "DelayFunction": "exponential",
            "MaxDelay": _HOUR,
            "Unlimited": True,
        }
    return None


def _update_block() -> JSON:
    return {
        "Stagger": 30 * _NS,
        "MaxParallel": 1,
        "HealthCheck": "checks",
        "MinHealthyTime": 10 * _NS,
        "HealthyDeadline": 5 * _MIN,
        "ProgressDeadline": 10 * _MIN,
        "AutoRevert": False,
        "AutoPromote": False,
        "Canary": 0,
    }


def _fill(target: JSON, defaults: JSON) -> None:
    for key, value in defaults.items():
        if target.get(key) is None:
            target[key] = value
        elif isinstance(value, dict) and isinstance(target[key], dict):
            _fill(target[key], value)


def canonicalize(raw: Any, namespace: str) -> JSON:
    """A deep copy of `raw` with Nomad's API defaults applied; 400 on bad shapes."""
    if not isinstance(raw, dict):
        raise bad_request("Job must be specified")
    job = copy.deepcopy(raw)
    job_id = job.get("ID")
    if not isinstance(job_id, str) or not job_id:
        raise bad_request("Job ID hasn't been provided")
    job_type = job.get("Type") or "service"
    _fill(
        job,
        {
            "Region": "global",
            "Name": job_id,
            "Type": job_type,
            "Priority": 50,
            "AllAtOnce": False,
            "Datacenters": ["*"],
            "NodePool": "default",
            "ParentID": "",
            "Stop": False,
            "Dispatched": False,
            "TaskGroups": [],
            "Meta": None,
        },
    )
    job["Namespace"] = namespace
    if job_type == "service" and job.get("Update") is None:
        job["Update"] = _update_block()
    _require_list(job, "TaskGroups", "Job")
    for group in job["TaskGroups"]:
        if not isinstance(group, dict) or not isinstance(group.get("Name"), str):
            raise bad_request("Task group must have a name")
        _fill(
            group,
            {
                "Count": 1,
                "RestartPolicy": _restart_policy(job_type),
                "EphemeralDisk": {"SizeMB": 300, "Migrate": False, "Sticky": False},
                "Tasks": [],
                "Meta": None,
            },
        )
        resched = _reschedule_policy(job_type)
        if resched is not None:
            _fill(group, {"ReschedulePolicy": resched})
        if job_type == "service":
            _fill(group, {"Update": job["Update"], "Migrate": _migrate_block()})
        _require_list(group, "Tasks", "TaskGroup")
        count = group["Count"]
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise bad_request(f'Task group "{group["Name"]}" has invalid count')
        for task in group["Tasks"]:
            if not isinstance(task, dict) or not isinstance(task.get("Name"), str):
                raise bad_request("Task must have a name")
            _fill(
                task,
                {
                    "Driver": "docker",
                    "Config": {},
                    "Resources": {"CPU": 100, "MemoryMB": 300},
                    "KillTimeout": 5 * _NS,
                    "Meta": None,
                },
            )
    _validate(job)
    return job


def _require_list(obj: JSON, key: str, struct: str) -> None:
    """A list field holding another JSON type fails Nomad's decoding of the whole body."""
    value = obj[key]
    if not isinstance(value, list):
        raise bad_request(
            f"Failed to decode request body: json: cannot unmarshal {_json_type(value)} into "
            f"Go struct field {struct}.{key} of type []"
        )


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "object" if isinstance(value, dict) else "null"


def _check_meta(meta: Any, where: str) -> None:
    if meta is None:
        return
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise bad_request(
            f"Failed to decode request body: {where} Meta must map strings to strings"
        )


def _validate(job: JSON) -> None:
    """Shape checks Go's JSON decoding would fail on (400), so bad input never crashes us."""
    if job["Type"] not in ("service", "batch", "system", "sysbatch"):
        raise bad_request(f'Invalid job type: "{job["Type"]}"')
    priority = job["Priority"]
    if isinstance(priority, bool) or not isinstance(priority, int) or not 1 <= priority <= 100:
        raise bad_request("job priority must be between [1, 100]")
    _check_meta(job.get("Meta"), "job")
    for group in job["TaskGroups"]:
        _check_meta(group.get("Meta"), "group")
        for task in group["Tasks"]:
            _check_meta(task.get("Meta"), "task")
            if not isinstance(task["Config"], dict):
                raise bad_request("Failed to decode request body: task Config must be an object")
            res = task["Resources"]
            if not isinstance(res, dict) or not all(
                isinstance(res.get(k, 0), int)
                and not isinstance(res.get(k, 0), bool)
                and res.get(k, 0) >= 0
                for k in ("CPU", "MemoryMB")
            ):
                raise bad_request("Failed to decode request body: task Resources must be numbers")


def _migrate_block() -> JSON:
    return {
        "MaxParallel": 1,
        "HealthCheck": "checks",
        "MinHealthyTime": 10 * _NS,
        "HealthyDeadline": 5 * _MIN,
    }


def spec_of(job: JSON) -> str:
    """A comparable encoding of the job spec (volatile fields removed)."""
    return json.dumps({k: v for k, v in job.items() if k not in _VOLATILE}, sort_keys=True)


def group_key(job: JSON, group_name: str) -> str:
    """What decides a destructive update: the group minus Count, plus job Meta."""
    for group in job.get("TaskGroups") or []:
        if group.get("Name") == group_name:
            shaped = {k: v for k, v in group.items() if k != "Count"}
            return json.dumps([shaped, job.get("Meta")], sort_keys=True)
    return ""


def group_resources(group: JSON) -> tuple[int, int]:
    cpu = mem = 0
    for task in group.get("Tasks") or []:
        res = task.get("Resources") or {}
        cpu += int(res.get("CPU") or 0)
        mem += int(res.get("MemoryMB") or 0)
    return cpu, mem


def group_images(group: JSON) -> list[str]:
    return [str((t.get("Config") or {}).get("image", "")) for t in group.get("Tasks") or []]


def validation_errors(job: JSON) -> list[str]:
    """The errors of Nomad's Job.Validate that concern what the simulator reads (the
    job's identity, type, priority, groups and tasks), in its words and order; [] for a
    valid job. `job` is canonicalized (see `canonicalize_for_validation`)."""
    errors: list[str] = []
    if not job.get("Region"):
        errors.append("Missing job region")
    job_id = job.get("ID") or ""
    if not job_id:
        errors.append("Missing job ID")
    elif " " in job_id:
        errors.append("Job ID contains a space")
    elif "\0" in job_id:
        errors.append("Job ID contains a null character")
    name = job.get("Name") or ""
    if not name:
        errors.append("Missing job name")
    elif "\0" in name:
        errors.append("Job Name contains a null character")
    if not job.get("Namespace"):
        errors.append("Job must be in a namespace")
    if not job.get("Type"):
        errors.append("Missing job type")
    elif job["Type"] not in ("service", "batch", "system", "sysbatch"):
        errors.append(f'Invalid job type: "{job["Type"]}"')
    datacenters = job.get("Datacenters") or []
    if not datacenters:
        errors.append("Missing job datacenters")
    elif any(not dc for dc in datacenters):
        errors.append("Job datacenter must be non-empty string")
    groups = job.get("TaskGroups") or []
    if not groups:
        errors.append("Missing job task groups")
    seen: dict[str, int] = {}
    for idx, group in enumerate(groups, 1):
        group_name = group.get("Name") or ""
        errors += _name_errors(group_name, idx, seen, "Job task group", "group")
        if job.get("Type") == "system" and (group.get("Count") or 0) > 1:
            errors.append(
                f"Job task group {group_name} has count {group['Count']}. "
                "Count cannot exceed 1 with system scheduler"
            )
    for group in groups:
        problems = _group_errors(group)
        if problems:
            errors.append(
                f"Task group {group.get('Name') or ''} validation failed: {multierror(problems)}"
            )
    return errors


def _group_errors(group: JSON) -> list[str]:
    problems: list[str] = []
    tasks = group.get("Tasks") or []
    if not tasks:
        problems.append("Missing tasks for task group")
    seen: dict[str, int] = {}
    for idx, task in enumerate(tasks, 1):
        problems += _name_errors(task.get("Name") or "", idx, seen, "Task", "task")
    for task in tasks:
        if not task.get("Driver"):
            problems.append(
                f"Task {task.get('Name') or ''} validation failed: "
                + multierror(["Missing task driver"])
            )
    return problems


def _name_errors(name: str, idx: int, seen: dict[str, int], what: str, kind: str) -> list[str]:
    """Nomad's check of the name of the idx-th (from 1) group of a job or task of a group:
    it has one, and no earlier one has it (`seen`: the names so far, which it joins)."""
    if not name:
        return [f"{what} {idx} missing name"]
    if name in seen:
        return [f"{what} {idx} redefines '{name}' from {kind} {seen[name]}"]
    seen[name] = idx
    return []


def multierror(errors: list[str]) -> str:
    """Go's multierror text, as Nomad's errors carry it."""
    listed = "".join(f"\t* {e}\n" for e in errors)
    noun = "error" if len(errors) == 1 else "errors"
    return f"{len(errors)} {noun} occurred:\n{listed}\n"
