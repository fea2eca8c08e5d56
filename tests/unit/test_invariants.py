import pytest

from controller.lab.invariants import NomadJob, PoolSnapshot, check_invariants

HEALTHY = PoolSnapshot(
    key="default/py",
    desired_idle=2,
    max_runners=3,
    idle=2,
    total=3,
    runner_ids=frozenset({"py-000000000001", "py-000000000002", "py-000000000003"}),
)
JOBS = [NomadJob(id, "default/py", live=True) for id in sorted(HEALTHY.runner_ids)]


def test_a_settled_pool_has_no_violation():
    assert check_invariants([HEALTHY], JOBS) == []


@pytest.mark.parametrize(
    ("pool", "jobs", "expected"),
    [
        pytest.param(
            HEALTHY,
            [*JOBS, NomadJob("py-00000000000f", "default/py", live=True)],
            "job py-00000000000f of pool default/py is not counted: leaked",
            id="leaked job",
        ),
        pytest.param(
            PoolSnapshot("default/py", 2, 3, 1, 2, frozenset(sorted(HEALTHY.runner_ids)[:2])),
            JOBS[:2],
            "pool default/py has 1 idle runners, wants 2",
            id="missing runner",
        ),
        pytest.param(
            PoolSnapshot("default/py", 2, 3, 2, 4, HEALTHY.runner_ids),
            JOBS,
            "pool default/py has 4 runners, more than maxRunners 3",
            id="cap overrun",
        ),
    ],
)
def test_each_violation_is_reported(pool, jobs, expected):
    assert check_invariants([pool], jobs) == [expected]


def test_dead_jobs_and_foreign_pools_are_not_leaks():
    jobs = [
        *JOBS,
        NomadJob("py-0000000000aa", "default/py", live=False),
        NomadJob("other-0000000000aa", "default/other", live=True),
    ]
    assert check_invariants([HEALTHY], jobs) == []
