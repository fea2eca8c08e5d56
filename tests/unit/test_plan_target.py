"""Plan against an idle target other than idleRunners, and runners on leaving nodes."""

from __future__ import annotations

import dataclasses
from collections import Counter

import pytest

from controller.core.classify import classify
from controller.core.plan import DestroyReason, Plan, plan
from controller.core.views import AllocationView, JobView, PoolObservation, PoolPolicy
from tests.support.builders import NOW, POLICY, alloc, job, observe, rid

DRAINING = "node-drains"


def on(node: str, n: int, template: str = "t1") -> tuple[list[JobView], list[AllocationView]]:
    return [job(n, template=template)], [dataclasses.replace(alloc(n, f"a{n}"), node_id=node)]


def pool(
    *runners: tuple[list[JobView], list[AllocationView]], leaving: frozenset[str]
) -> PoolObservation:
    observation = observe([j for r in runners for j in r[0]], [a for r in runners for a in r[1]])
    return dataclasses.replace(observation, leaving_nodes=leaving)


def run(policy: PoolPolicy, observation: PoolObservation, target: int) -> Plan:
    runners = classify(policy, observation, NOW)
    return plan(policy, observation, runners, NOW, creation_allowed=True, target=target)


def reasons(result: Plan) -> Counter[DestroyReason]:
    return Counter(d.reason for d in result.destroy)


@pytest.mark.parametrize(
    ("target", "create", "scale_down"),
    [(3, 0, 0), (7, 4, 0), (1, 0, 2), (0, 0, 3)],
)
def test_the_target_replaces_idle_runners_as_the_floor(
    target: int, create: int, scale_down: int
) -> None:
    policy = dataclasses.replace(POLICY, desired_idle=3)  # the floor does not decide
    result = run(policy, pool(*(on("n", i) for i in range(3)), leaving=frozenset()), target)
    assert result.create == create
    assert reasons(result)[DestroyReason.SCALE_DOWN] == scale_down


def test_the_target_is_capped_by_max_runners_room() -> None:
    policy = dataclasses.replace(POLICY, max_runners=5)
    result = run(policy, pool(*(on("n", i) for i in range(3)), leaving=frozenset()), 50)
    assert result.create == 2


def test_idle_runners_on_a_leaving_node_are_replaced_first_and_kept_meanwhile() -> None:
    observation = pool(
        on("healthy", 1), on(DRAINING, 2), on(DRAINING, 3), leaving=frozenset({DRAINING})
    )
    # Two runners to move: two replacements, and nothing retired yet (3 claimable of 3).
    result = run(POLICY, observation, 3)
    assert result.create == 2
    assert result.destroy == ()


def test_once_replacements_run_the_leaving_runners_are_retired() -> None:
    observation = pool(
        on("healthy", 1),
        on("healthy", 4),
        on("healthy", 5),
        on(DRAINING, 2),
        on(DRAINING, 3),
        leaving=frozenset({DRAINING}),
    )
    result = run(POLICY, observation, 3)
    assert result.create == 0
    assert sorted(d.runner_id for d in result.destroy) == [rid(2), rid(3)]
    assert reasons(result) == Counter({DestroyReason.NODE_LEAVING: 2})


def test_half_way_only_the_surplus_goes() -> None:
    observation = pool(
        on("healthy", 1), on("healthy", 4), on(DRAINING, 2), on(DRAINING, 3),
        leaving=frozenset({DRAINING}),
    )  # fmt: skip
    result = run(POLICY, observation, 3)
    # 4 claimable for a target of 3: one leaving runner goes, one replacement comes.
    assert reasons(result) == Counter({DestroyReason.NODE_LEAVING: 1})
    assert result.create == 1


def test_an_outdated_runner_on_a_leaving_node_goes_as_leaving() -> None:
    observation = pool(
        on("healthy", 1), on("healthy", 4), on("healthy", 5), on(DRAINING, 2, template="t0"),
        leaving=frozenset({DRAINING}),
    )  # fmt: skip
    result = run(POLICY, observation, 3)
    assert reasons(result) == Counter({DestroyReason.NODE_LEAVING: 1})


def test_no_leaving_node_changes_nothing() -> None:
    runners = [on(DRAINING, i) for i in range(3)]
    assert run(POLICY, pool(*runners, leaving=frozenset()), 3) == Plan()
