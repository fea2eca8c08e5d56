"""Job rendering, jobTemplate merging, template hash and runner IDs."""

from __future__ import annotations

import copy
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controller.core.runner_ids import (
    META_POOL,
    META_TEMPLATE,
    RUNNER_ID_PATTERN,
    is_runner_id,
    new_runner_id,
    runner_prefix,
)
from controller.model import RunnerPool
from controller.nomad.jobs import merge_objects, port_label, render_job, runner_job, template_hash
from tests.support.documents import IMAGE, pool_doc


def make_pool(
    runner: dict[str, Any] | None = None, nomad: dict[str, Any] | None = None, name: str = "py"
) -> RunnerPool:
    return RunnerPool.parse_document(
        pool_doc(
            name,
            idle=1,
            namespace=None,
            runner={"image": IMAGE, **(runner or {})},
            nomad=nomad or {},
        )
    )


def group_of(job: dict[str, Any]) -> dict[str, Any]:
    (group,) = job["TaskGroups"]
    assert isinstance(group, dict)
    return group


def task_of(job: dict[str, Any]) -> dict[str, Any]:
    (task,) = group_of(job)["Tasks"]
    assert isinstance(task, dict)
    return task


# --- rendering -----------------------------------------------------------------------------


def test_default_render() -> None:
    job = render_job(make_pool())
    assert job["Type"] == "batch"
    assert job["Datacenters"] == ["*"]
    assert "NodePool" not in job
    assert not {"ID", "Name", "Namespace", "Meta"} & job.keys()
    group = group_of(job)
    assert (group["Name"], group["Count"]) == ("runner", 1)
    assert "Networks" not in group
    task = task_of(job)
    assert (task["Name"], task["Driver"]) == ("runner", "docker")
    assert task["Resources"] == {"CPU": 100, "MemoryMB": 128}
    assert "Env" not in task
    config = task["Config"]
    assert config["image"] == "python:3.12-slim"
    assert (config["command"], config["args"]) == ("sleep", ["infinity"])
    assert config["network_mode"] == "none"
    assert "ports" not in config


def test_hardened_defaults() -> None:
    config = task_of(render_job(make_pool()))["Config"]
    assert config["privileged"] is False
    assert config["cap_drop"] == ["ALL"]
    assert config["security_opt"] == ["no-new-privileges"]
    assert isinstance(config["pids_limit"], int) and config["pids_limit"] > 0
    assert "cap_add" not in config


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        (["sleep", "infinity"], {"command": "sleep", "args": ["infinity"]}),
        (["/bin/runner"], {"command": "/bin/runner"}),
        (
            ["python3", "-c", "import time; time.sleep(1e9)"],
            {
                "command": "python3",
                "args": ["-c", "import time; time.sleep(1e9)"],
            },
        ),
        ([], {}),
    ],
)
def test_command_split(command: list[str], expected: dict[str, Any]) -> None:
    config = task_of(render_job(make_pool({"command": command})))["Config"]
    assert {k: config[k] for k in ("command", "args") if k in config} == expected


def test_bridge_network_with_ports() -> None:
    job = render_job(make_pool({"network": "bridge", "ports": [8080, 9000]}))
    assert group_of(job)["Networks"] == [
        {
            "Mode": "bridge",
            "DynamicPorts": [
                {"Label": port_label(8080), "To": 8080},
                {"Label": port_label(9000), "To": 9000},
            ],
        }
    ]
    config = task_of(job)["Config"]
    assert config["ports"] == [port_label(8080), port_label(9000)]
    assert "network_mode" not in config  # the group network owns it


def test_bridge_network_without_ports() -> None:
    job = render_job(make_pool({"network": "bridge"}))
    assert group_of(job)["Networks"] == [{"Mode": "bridge"}]
    assert "ports" not in task_of(job)["Config"]


def test_resources_env_datacenters_node_pool() -> None:
    job = render_job(
        make_pool(
            {"cpu": 500, "memoryMB": 256, "memoryMaxMB": 1024, "env": {"A": "1"}},
            {"datacenters": ["dc1", "dc2"], "nodePool": "runners"},
        )
    )
    assert job["Datacenters"] == ["dc1", "dc2"]
    assert job["NodePool"] == "runners"
    task = task_of(job)
    assert task["Resources"] == {"CPU": 500, "MemoryMB": 256, "MemoryMaxMB": 1024}
    assert task["Env"] == {"A": "1"}


# --- jobTemplate merge -------------------------------------------------------------------


def test_template_reaches_group_and_task_index_by_index() -> None:
    template = {
        "Priority": 70,
        "TaskGroups": [
            {
                "RestartPolicy": {"Attempts": 0},
                "Tasks": [{"Config": {"pids_limit": 64, "cap_drop": []}, "KillTimeout": 10**9}],
            }
        ],
    }
    job = render_job(make_pool(nomad={"jobTemplate": template}))
    assert job["Priority"] == 70
    group = group_of(job)
    assert group["RestartPolicy"] == {"Attempts": 0}
    assert (group["Name"], group["Count"]) == ("runner", 1)  # the rendered group survives
    task = task_of(job)
    assert task["KillTimeout"] == 10**9
    assert task["Config"]["pids_limit"] == 64
    assert task["Config"]["cap_drop"] == []  # lists replace, even with an empty one
    assert task["Config"]["image"] == "python:3.12-slim"
    assert task["Resources"] == {"CPU": 100, "MemoryMB": 128}


def test_other_lists_replace() -> None:
    job = render_job(
        make_pool(
            {"network": "bridge", "ports": [80]},
            {
                "datacenters": ["dc1", "dc2"],
                "jobTemplate": {
                    "Datacenters": ["dc3"],
                    "TaskGroups": [{"Networks": [{"Mode": "host"}]}],
                },
            },
        )
    )
    assert job["Datacenters"] == ["dc3"]
    assert group_of(job)["Networks"] == [{"Mode": "host"}]


def test_struct_keys_merge_ignoring_case_map_keys_do_not() -> None:
    template = {
        "taskgroups": [
            {
                "tasks": [
                    {
                        "resources": {"cpu": 300},
                        "config": {"Image": "ignored-by-docker", "image": "other:1"},
                        "env": {"a": "lower"},
                    }
                ]
            }
        ],
    }
    job = render_job(make_pool({"env": {"A": "upper"}}, {"jobTemplate": template}))
    # One TaskGroups key, spelled as rendered: Nomad would read both spellings as one.
    assert "taskgroups" not in job
    task = task_of(job)
    assert task["Resources"] == {"CPU": 300, "MemoryMB": 128}
    assert task["Config"]["image"] == "other:1"
    assert task["Config"]["Image"] == "ignored-by-docker"
    assert task["Env"] == {"A": "upper", "a": "lower"}


def test_empty_task_groups_list_leaves_the_runner_group() -> None:
    plain = render_job(make_pool())
    assert render_job(make_pool(nomad={"jobTemplate": {"TaskGroups": []}})) == plain


def test_merge_does_not_touch_its_inputs() -> None:
    base = {"A": {"B": [1, 2]}, "TaskGroups": [{"Tasks": [{"Config": {"x": 1}}]}]}
    overlay = {"A": {"C": 3}, "TaskGroups": [{"Tasks": [{"Config": {"y": [2]}}]}]}
    snapshot = copy.deepcopy((base, overlay))
    merged = merge_objects(base, overlay)
    assert (base, overlay) == snapshot
    assert merged == {
        "A": {"B": [1, 2], "C": 3},
        "TaskGroups": [{"Tasks": [{"Config": {"x": 1, "y": [2]}}]}],
    }
    merged["TaskGroups"][0]["Tasks"][0]["Config"]["y"].append(3)
    assert overlay == snapshot[1]


def test_render_output_is_independent_of_the_pool() -> None:
    p = make_pool(nomad={"jobTemplate": {"Meta": {"a": "1"}, "Constraints": [{"Operand": "x"}]}})
    job = render_job(p)
    job["Meta"]["a"] = "changed"
    job["Constraints"].append({})
    assert render_job(p) != job
    assert p.spec.nomad.job_template == {"Meta": {"a": "1"}, "Constraints": [{"Operand": "x"}]}


# --- hash ----------------------------------------------------------------------------------


def test_hash_is_stable_and_short() -> None:
    job = render_job(make_pool())
    digest = template_hash(job)
    assert len(digest) == 16 and all(c in "0123456789abcdef" for c in digest)
    reordered = dict(reversed(list(job.items())))
    assert template_hash(reordered) == digest
    # The same spec in another process renders the same hash: it is a pure function.
    assert template_hash(render_job(make_pool())) == digest


@pytest.mark.parametrize(
    ("runner", "nomad"),
    [
        ({"image": "python:3.13-slim"}, {}),
        ({"command": ["sleep", "1000"]}, {}),
        ({"cpu": 101}, {}),
        ({"memoryMaxMB": 256}, {}),
        ({"network": "bridge"}, {}),
        ({"env": {"A": "1"}}, {}),
        ({}, {"datacenters": ["dc1"]}),
        ({}, {"nodePool": "x"}),
        ({}, {"jobTemplate": {"Priority": 51}}),
    ],
)
def test_hash_changes_with_the_job(runner: dict[str, Any], nomad: dict[str, Any]) -> None:
    base = template_hash(render_job(make_pool()))
    assert template_hash(render_job(make_pool(runner, nomad))) != base


def test_hash_ignores_what_does_not_reach_the_job() -> None:
    # idleRunners, maxRunners, the name and the prefix change no runner.
    base = template_hash(render_job(make_pool()))
    other = make_pool(name="other", nomad={"jobPrefix": "x-"})
    assert template_hash(render_job(other)) == base


# --- runner jobs and IDs -----------------------------------------------------------------


def test_runner_job_adds_identity_and_meta() -> None:
    p = make_pool(nomad={"namespace": "runners", "jobTemplate": {"Meta": {"team": "a"}}})
    rendered = render_job(p)
    digest = template_hash(rendered)
    snapshot = copy.deepcopy(rendered)
    job = runner_job(rendered, "py-0123456789ab", p.key, digest, p.nomad_namespace)
    assert (job["ID"], job["Name"], job["Namespace"], job["Type"]) == (
        "py-0123456789ab",
        "py-0123456789ab",
        "runners",
        "batch",
    )
    assert job["Meta"] == {"team": "a", META_POOL: "default/py", META_TEMPLATE: digest}
    assert rendered == snapshot  # the pool's rendered job is shared: never mutated
    assert template_hash(rendered) == digest


def test_runner_job_uses_the_templates_meta_spelling() -> None:
    p = make_pool(nomad={"jobTemplate": {"meta": {"team": "a"}}})
    job = runner_job(render_job(p), "py-0123456789ab", p.key, "h", "default")
    assert "Meta" not in job
    assert job["meta"] == {"team": "a", META_POOL: "default/py", META_TEMPLATE: "h"}


def test_new_runner_ids() -> None:
    ids = {new_runner_id("py-") for _ in range(200)}
    assert len(ids) == 200
    assert all(is_runner_id("py-", i) and RUNNER_ID_PATTERN.match(i) for i in ids)
    assert new_runner_id("py-", random.Random(7)) == new_runner_id("py-", random.Random(7))
    assert new_runner_id("py-", random.Random(7)) != new_runner_id("py-", random.Random(8))


@pytest.mark.parametrize(
    ("prefix", "job_id", "expected"),
    [
        ("python-", "python-0123456789ab", True),
        ("python-", "python-312-0123456789ab", False),  # python-312-'s runner
        ("python-312-", "python-312-0123456789ab", True),
        ("python-", "python-0123456789AB", False),
        ("python-", "python-0123456789a", False),
        ("python-", "python-0123456789abc", False),
        ("python-", "python-0123456789ag", False),
        ("python-", "python-0123456789ab\n", False),
        ("python-", "xpython-0123456789ab", False),
    ],
)
def test_is_runner_id(prefix: str, job_id: str, expected: bool) -> None:
    assert is_runner_id(prefix, job_id) is expected


@pytest.mark.parametrize(
    ("job_id", "prefix"),
    [
        ("python-312-0123456789ab", "python-312-"),
        ("a-000000000000", "a-"),
        ("python-0123456789ab\n", None),
        ("Python-0123456789ab", None),
        ("python0123456789ab", None),
        ("-0123456789ab", None),
        ("python-0123456789a", None),
        ("a" * 64 + "-0123456789ab", None),
    ],
)
def test_runner_id_pattern_and_prefix(job_id: str, prefix: str | None) -> None:
    assert runner_prefix(job_id) == prefix
    assert bool(RUNNER_ID_PATTERN.match(job_id)) is (prefix is not None)


# --- property: rendering is a pure function of the spec ----------------------------------

_names = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,20}[a-z0-9])?", fullmatch=True)
_json_scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=5))


@st.composite
def documents(draw: st.DrawFn) -> dict[str, Any]:
    network = draw(st.sampled_from(["none", "bridge"]))
    memory = draw(st.integers(10, 4096))
    runner: dict[str, Any] = {
        "image": draw(st.text(min_size=1, max_size=20).filter(str.strip)),
        "command": draw(st.lists(st.text(min_size=1, max_size=8), max_size=4)),
        "cpu": draw(st.integers(1, 10_000)),
        "memoryMB": memory,
        "memoryMaxMB": draw(st.none() | st.integers(memory, 8192)),
        "network": network,
        "env": draw(
            st.dictionaries(st.from_regex(r"[A-Z_][A-Z0-9_]{0,6}", fullmatch=True), st.text())
        ),
    }
    if network == "bridge":
        runner["ports"] = draw(st.lists(st.integers(1, 65535), unique=True, max_size=3))
    template = {
        "Meta": draw(st.dictionaries(st.text(alphabet="abc", min_size=1), st.text(), max_size=3)),
        "TaskGroups": [{"Tasks": [{"Config": draw(st.dictionaries(_names, _json_scalars))}]}],
    }
    return {
        "apiVersion": "poolkeeper.dev/v1alpha1",
        "kind": "RunnerPool",
        "metadata": {"name": draw(_names)},
        "spec": {
            "idleRunners": 0,
            "runner": runner,
            "nomad": {
                "datacenters": draw(st.lists(_names, min_size=1, max_size=3)),
                "jobTemplate": template,
            },
        },
    }


@settings(max_examples=150, deadline=None)
@given(documents())
def test_render_and_hash_are_deterministic(doc: dict[str, Any]) -> None:
    first = RunnerPool.parse_document(doc)
    again = RunnerPool.parse_document(first.model_dump(by_alias=True, mode="json"))
    rendered = render_job(first)
    assert render_job(again) == rendered
    assert template_hash(render_job(again)) == template_hash(rendered)
    assert group_of(rendered)["Count"] == 1
    assert task_of(rendered)["Config"]["image"] == doc["spec"]["runner"]["image"]
