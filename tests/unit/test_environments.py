"""Poseidon execution environments as pools: the pool an environment makes from the
template, the environment a pool describes, and a variable's items."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from controller.core.environments import Environment
from controller.model import NetworkMode
from controller.sources.environments import EnvironmentInvalid, EnvironmentTemplate, environment_of

PYTHON = Environment(
    id=10,
    prewarming_pool_size=5,
    cpu_limit=20,
    memory_limit=256,
    image="openhpi/co_execenv_python:3.8",
    network_access=False,
)


def test_an_environment_makes_a_labelled_pool_in_its_own_prefix() -> None:
    pool = EnvironmentTemplate({}).pool_for(PYTHON)
    assert pool.key == "poseidon/environment-10"
    assert pool.job_prefix == "environment-10-"
    assert pool.metadata.labels == {"poolkeeper.dev/poseidon-environment": "10"}
    runner = pool.spec.runner
    assert (pool.spec.idle_runners, runner.image, runner.cpu) == (5, PYTHON.image, 20)
    assert (runner.memory_mb, runner.memory_max_mb, runner.network) == (256, None, NetworkMode.NONE)
    assert environment_of(pool) == PYTHON


def test_the_template_gives_everything_else() -> None:
    template = EnvironmentTemplate(
        {
            "metadata": {"namespace": "codeocean", "labels": {"team": "ocean"}},
            "spec": {
                "maxRunners": 40,
                "claims": {"maxInactivityTimeoutSeconds": 900},
                "runner": {"memoryMB": 64, "env": {"LANG": "C.UTF-8"}},
                "nomad": {"namespace": "learners"},
            },
        }
    )
    networked = Environment(11, 2, 40, 512, "openhpi/co_execenv_node:16", True, (8080, 80, 80))
    pool = template.pool_for(networked)
    assert pool.key == template.key(11) == "codeocean/environment-11"
    assert pool.metadata.labels == {"team": "ocean", "poolkeeper.dev/poseidon-environment": "11"}
    assert (pool.spec.max_runners, pool.spec.nomad.namespace) == (40, "learners")
    assert pool.spec.claims.max_inactivity_timeout_seconds == 900
    runner = pool.spec.runner
    # The template's memoryMB is what Nomad reserves; memoryLimit stays the hard limit.
    assert (runner.memory_mb, runner.memory_max_mb) == (64, 512)
    assert (runner.network, runner.ports, runner.env) == (
        NetworkMode.BRIDGE,
        [80, 8080],
        {"LANG": "C.UTF-8"},
    )
    described = environment_of(pool)
    assert described is not None
    assert described.differences(networked) == []
    # A limit below the template's reservation is both.
    small = template.pool_for(Environment(12, 0, 10, 32, "busybox", False))
    assert (small.spec.runner.memory_mb, small.spec.runner.memory_max_mb) == (32, None)


@pytest.mark.parametrize(
    ("environment", "message"),
    [
        (Environment(1, 5, 0, 256, "img", False), "cpuLimit: input should be greater than"),
        (Environment(1, 5, 20, 5, "img", False), "memoryLimit: input should be greater than"),
        (Environment(1, 5, 20, 256, " ", False), "image: must not be blank"),
        (Environment(1, 5, 20, 256, "img", True, (0,)), "exposedPorts[0]: input should be"),
        (Environment(1, 101, 20, 256, "img", False), "prewarmingPoolSize: must not be greater"),
    ],
)
def test_an_environment_that_makes_no_pool_says_why_in_poseidons_words(
    environment: Environment, message: str
) -> None:
    with pytest.raises(EnvironmentInvalid, match=message.replace("[", r"\[")):
        EnvironmentTemplate({}).pool_for(environment)


def test_ports_count_only_with_network_access_sorted_once() -> None:
    closed = Environment(1, 1, 20, 256, "img", False, (8080,))
    assert closed.ports == ()
    assert EnvironmentTemplate({}).pool_for(closed).spec.runner.ports == []
    assert Environment(1, 1, 20, 256, "img", True, (81, 80, 81)).ports == (80, 81)
    assert closed.differences(Environment(1, 1, 20, 256, "img", False)) == []
    assert closed.differences(Environment(1, 1, 20, 256, "img", True, (8080,))) == [
        "networkAccess is false, not true",
        "exposedPorts is [], not [8080]",
    ]


def test_a_pool_without_the_label_serves_no_environment() -> None:
    pool = EnvironmentTemplate({}).pool_for(PYTHON)
    unlabelled = pool.model_copy(
        update={"metadata": pool.metadata.model_copy(update={"labels": {}})}
    )
    assert environment_of(unlabelled) is None


def test_items_round_trip_and_bad_items_are_refused() -> None:
    networked = Environment(3, 0, 100, 128, "img:1", True, (80, 443))
    assert networked.items()["exposedPorts"] == "80,443"
    assert Environment.from_items(3, networked.items()) == networked
    assert Environment.from_items(10, PYTHON.items()) == PYTHON
    for bad in ({"cpuLimit": "-1"}, {"networkAccess": "yes"}, {"exposedPorts": "80;81"}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            Environment.from_items(10, {**PYTHON.items(), **bad})
    with pytest.raises(ValueError, match="image"):
        Environment.from_items(10, {k: v for k, v in PYTHON.items().items() if k != "image"})


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ({"spec": {"idleRunners": 3}}, "spec.idleRunners is set by each environment"),
        ({"spec": {"runner": {"image": "x"}}}, "spec.runner.image is set by each environment"),
        ({"spec": {"nomad": {"jobPrefix": "x-"}}}, "spec.nomad.jobPrefix is set by each"),
        ({"spec": {"deletionPolicy": "Delete"}}, "spec.deletionPolicy is set by each"),
        ({"metadata": {"name": "x"}}, "metadata.name is set by each environment"),
        (
            {"metadata": {"labels": {"poolkeeper.dev/poseidon-environment": "1"}}},
            "is set by each environment",
        ),
        ({"spec": {"maxRunners": "many"}}, "spec.maxRunners: input should be a valid integer"),
        ({"spec": {"surprise": 1}}, "spec.surprise: unknown field"),
    ],
)
def test_a_template_setting_what_environments_set_or_invalid_is_refused(
    document: dict[str, Any], message: str
) -> None:
    with pytest.raises(EnvironmentInvalid, match=message):
        EnvironmentTemplate(document)


def test_a_template_is_read_from_yaml(tmp_path: Path) -> None:
    path = tmp_path / "template.yaml"
    path.write_text("metadata: {namespace: ocean}\nspec: {maxRunners: 7}\n")
    assert EnvironmentTemplate.read(path).pool_for(PYTHON).spec.max_runners == 7
    path.write_text("- a list\n")
    with pytest.raises(EnvironmentInvalid, match="must be a RunnerPool document"):
        EnvironmentTemplate.read(path)
    with pytest.raises(EnvironmentInvalid, match="No such file"):
        EnvironmentTemplate.read(tmp_path / "missing.yaml")
