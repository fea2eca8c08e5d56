"""The simulator's log of runner job writes tells a lease holder's writes from others'."""

from __future__ import annotations

from controller.core.paths import lease_path
from controller.lab.simulator.audit import WriteAudit

RUNNER = {"Meta": {"poolkeeper_pool": "default/py"}}


def audit_with_holder(holder: str | None) -> WriteAudit:
    variables: dict[tuple[str, str], dict[str, object]] = {}
    if holder is not None:
        variables[("default", lease_path("default/py"))] = {
            "Items": {"holder": holder},
            "Lock": {"ID": "l"},
        }
    return WriteAudit(variables)


def test_writes_by_the_holder_pass_and_others_are_caught() -> None:
    audit = audit_with_holder("host-a/1")
    audit.record("poolkeeper/0.1.0 (host-a/1)", "register", "default", "py-1", RUNNER)
    audit.record("poolkeeper/0.1.0 (host-b/2)", "register", "default", "py-2", RUNNER)
    audit.record("python-requests/2.3", "register", "default", "py-3", RUNNER)  # no identity
    audit.record("poolkeeper/0.1.0 (host-b/2)", "register", "default", "x", {"Meta": {}})
    assert [(w.writer, w.job_id) for w in audit.by_non_holders()] == [("host-b/2", "py-2")]
    assert len(audit.writes) == 3  # the job without a pool is no runner


def test_nobody_holding_the_lease_makes_every_identified_write_a_violation() -> None:
    audit = audit_with_holder(None)
    audit.record("poolkeeper/0.1.0 (host-a/1)", "purge", "default", "py-1", RUNNER)
    assert len(audit.by_non_holders()) == 1


def test_a_purge_of_a_released_runner_by_a_non_holder_is_caught_too() -> None:
    audit = audit_with_holder("host-a/1")
    audit._vars[("default", "poolkeeper/claims/py-1")] = {"Items": {"state": "released"}}
    audit.record("poolkeeper/0.1.0 (host-b/2)", "purge", "default", "py-1", RUNNER)
    assert [(w.writer, w.job_id) for w in audit.by_non_holders()] == [("host-b/2", "py-1")]
