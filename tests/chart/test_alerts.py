"""The optional PrometheusRule: it renders, its rules pass promtool and the schema check,
each alert fires on the series that mean trouble and stays quiet on those that do not, and
each has its runbook in docs/operator.md."""

from __future__ import annotations

import copy
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import pytest
import yaml

from tests.chart.alert_rules import (
    OPERATOR_DOCS,
    doc_anchors,
    exported_series,
    promtool,
    rule_problems,
    rules_of,
)
from tests.chart.helm import Manifest, only, render

ENABLED: Final = {"prometheusRule.enabled": "true"}
ALERTS: Final = (
    "PoolkeeperPoolBelowIdleTarget",
    "PoolkeeperPoolDegraded",
    "PoolkeeperNomadUnreachable",
    "PoolkeeperEventStreamDown",
    "PoolkeeperNoReconcilePass",
    "PoolkeeperLeaseHeldByNobody",
    "PoolkeeperClaimErrors",
)


def prometheus_rule(values: dict[str, str] | None = None) -> Manifest:
    return only(render({**ENABLED, **(values or {})}), "PrometheusRule")


def rules(values: dict[str, str] | None = None) -> dict[str, dict[str, Any]]:
    return {rule["alert"]: rule for rule in rules_of(prometheus_rule(values))}


def anchors() -> set[str]:
    return doc_anchors(OPERATOR_DOCS.read_text(encoding="utf-8"))


def test_every_alert_is_there_with_its_severity() -> None:
    found = rules()
    assert tuple(found) == ALERTS
    assert {name: rule["labels"]["severity"] for name, rule in found.items()} == {
        "PoolkeeperPoolBelowIdleTarget": "warning",
        "PoolkeeperPoolDegraded": "warning",
        "PoolkeeperNomadUnreachable": "critical",
        "PoolkeeperEventStreamDown": "warning",
        "PoolkeeperNoReconcilePass": "critical",
        "PoolkeeperLeaseHeldByNobody": "critical",
        "PoolkeeperClaimErrors": "warning",
    }
    assert {name: rule.get("for") for name, rule in found.items()} == {
        "PoolkeeperPoolBelowIdleTarget": "5m",
        "PoolkeeperPoolDegraded": "5m",
        "PoolkeeperNomadUnreachable": "5m",
        "PoolkeeperEventStreamDown": "5m",
        "PoolkeeperNoReconcilePass": None,  # the window is the wait
        "PoolkeeperLeaseHeldByNobody": "2m",
        "PoolkeeperClaimErrors": "5m",
    }


def test_the_rules_pass_the_schema_check() -> None:
    assert rule_problems(prometheus_rule(), anchors()) == []


def test_the_schema_check_catches_broken_rules() -> None:
    broken = copy.deepcopy(prometheus_rule())
    below, degraded, nomad, stream, passes, lease, claims = rules_of(broken)
    below["expr"] = below["expr"].replace("poolkeeper_desired_idle_runners", "poolkeeper_desired")
    degraded["expr"] = 'max by (pool) (poolkeeper_pool_condition{kind="Degraded"}) == 1'
    nomad["expr"] = nomad["expr"].replace("[5m]))", "[5m])")
    stream["labels"] = {}
    passes["for"] = "a while"
    lease["alert"] = "PoolkeeperLeaseHeldByNoOne"
    claims["annotations"]["summary"] = "Claims from {{ $labels.instance }} fail"
    problems = rule_problems(broken, anchors())
    assert problems == [
        "poolkeeper/PoolkeeperPoolBelowIdleTarget: expr: no series poolkeeper_desired "
        "(controller/metrics.py)",
        "poolkeeper/PoolkeeperPoolDegraded: expr: poolkeeper_pool_condition has no label kind",
        "poolkeeper/PoolkeeperNomadUnreachable: expr: unclosed, expected ')'",
        "poolkeeper/PoolkeeperEventStreamDown: severity None",
        "poolkeeper/PoolkeeperNoReconcilePass: for 'a while' is not a duration",
        "poolkeeper/PoolkeeperLeaseHeldByNoOne: the description names no runbook",
        "poolkeeper/PoolkeeperLeaseHeldByNoOne: docs/operator.md has no heading "
        "PoolkeeperLeaseHeldByNoOne",
        "poolkeeper/PoolkeeperClaimErrors: summary uses $labels.instance, not on the alert",
    ]


def test_the_rules_use_only_series_the_controller_exports() -> None:
    """The same check as for the dashboard: a renamed metric breaks the test, not the
    alert (which would stay silent for ever)."""
    exported = exported_series()
    used = {
        name
        for rule in rules_of(prometheus_rule())
        for name in re.findall(r"poolkeeper_\w+", rule["expr"])
    }
    assert used <= set(exported), used - set(exported)
    assert "poolkeeper_pool_lease_held" in used and "poolkeeper_pool_condition" in used


def rule_file(tmp_path: Path, values: dict[str, str] | None = None) -> Path:
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump(prometheus_rule(values)["spec"], sort_keys=False))
    return path


def test_promtool_checks_the_rules(tmp_path: Path) -> None:
    binary = promtool()
    result = subprocess.run(
        [str(binary), "check", "rules", "--lint=all", "--lint-fatal", str(rule_file(tmp_path))],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(ALERTS)} rules found" in result.stdout


# --- each alert on series that mean trouble, and on series that do not ---------------


@dataclass(frozen=True)
class Firing:
    labels: dict[str, str]
    value: str = ""  # how the alert's {{ $value }} renders (with its pipeline)


@dataclass(frozen=True)
class Case:
    """One promtool test group: series (one sample a minute), then the alerts firing."""

    alert: str
    series: dict[str, str]  # series -> values, in promtool's expanding notation
    quiet_at: str  # still pending (or never true)
    firing_at: str
    firing: list[Firing] = field(default_factory=list)


def series(name: str, instance: str, **labels: str) -> str:
    """A series of one scraped process, as promtool's input takes it."""
    matchers = {"job": "poolkeeper", "instance": instance, **labels}
    return name + "{" + ",".join(f'{key}="{value}"' for key, value in matchers.items()) + "}"


RUNNERS, DESIRED = "poolkeeper_runners", "poolkeeper_desired_idle_runners"
CONDITION, LEASE = "poolkeeper_pool_condition", "poolkeeper_pool_lease_held"
NOMAD, CLAIMS = "poolkeeper_nomad_requests_total", "poolkeeper_claims_total"
STREAM, PASSES = "poolkeeper_event_stream_up", "poolkeeper_reconcile_duration_seconds_count"
ON = {"job": "poolkeeper"}
CASES: Final = [
    Case(
        "PoolkeeperPoolBelowIdleTarget",
        {
            # Two processes see the pool; the better-informed one counts, starting
            # runners do not.
            series(DESIRED, "a", pool="default/short"): "5x10",
            series(DESIRED, "b", pool="default/short"): "5x10",
            series(RUNNERS, "a", pool="default/short", state="idle"): "3x10",
            series(RUNNERS, "b", pool="default/short", state="idle"): "2x10",
            series(RUNNERS, "a", pool="default/short", state="starting"): "2x10",
            # A rollout: outdated runners are claimable.
            series(DESIRED, "a", pool="default/rolling"): "5x10",
            series(RUNNERS, "a", pool="default/rolling", state="idle"): "2x10",
            series(RUNNERS, "a", pool="default/rolling", state="outdated"): "3x10",
        },
        quiet_at="4m",
        firing_at="6m",
        firing=[Firing({"pool": "default/short"}, "2")],
    ),
    Case(
        "PoolkeeperPoolDegraded",
        {
            series(CONDITION, "a", pool="default/p", type="Degraded"): "0x10",
            series(CONDITION, "b", pool="default/p", type="Degraded"): "1x10",
            series(CONDITION, "a", pool="default/q", type="Degraded"): "0x10",
            series(CONDITION, "a", pool="default/q", type="Ready"): "1x10",
        },
        quiet_at="4m",
        firing_at="6m",
        firing=[Firing({"pool": "default/p"})],
    ),
    Case(
        "PoolkeeperNomadUnreachable",
        {
            # a: no answer at all; b: a few errors among many answers; c: no leader (500);
            # d: scraped without honouring poolkeeper's labels (exported_endpoint).
            series(NOMAD, "a", endpoint="/v1/jobs", code="error"): "0+10x15",
            series(NOMAD, "a", endpoint="/v1/jobs", code="200"): "100x15",
            series(NOMAD, "b", endpoint="/v1/jobs", code="error"): "0+1x15",
            series(NOMAD, "b", endpoint="/v1/jobs", code="200"): "0+100x15",
            series(NOMAD, "c", endpoint="/v1/jobs", code="500"): "0+10x15",
            series(NOMAD, "c", endpoint="/v1/vars", code="200"): "0+5x15",
            series(NOMAD, "d", endpoint="http", exported_endpoint="/v1/jobs", code="error"): (
                "0+10x15"
            ),
            series(NOMAD, "d", endpoint="http", exported_endpoint="/v1/vars", code="200"): (
                "0+2x15"
            ),
        },
        quiet_at="4m",
        firing_at="10m",
        firing=[
            Firing({**ON, "instance": "a"}, "100%"),
            Firing({**ON, "instance": "c"}, "66.67%"),
            Firing({**ON, "instance": "d"}, "83.33%"),
        ],
    ),
    Case(
        "PoolkeeperEventStreamDown",
        {
            series(STREAM, "a", namespace="runners"): "0x10",
            series(STREAM, "b", namespace="runners"): "1x10",
            series(STREAM, "c", namespace="runners"): "0 0 1x8",  # back after 2 minutes
        },
        quiet_at="4m",
        firing_at="6m",
        firing=[Firing({**ON, "instance": "a", "namespace": "runners"})],
    ),
    Case(
        "PoolkeeperNoReconcilePass",
        {
            # a: holds pools, no pass; b: holds none (others hold the leases), no pass; c: passes.
            series(PASSES, "a"): "7x10",
            series(DESIRED, "a", pool="default/p"): "2x10",
            series(PASSES, "b"): "7x10",
            series(PASSES, "c"): "0+6x10",
            series(DESIRED, "c", pool="default/p"): "2x10",
        },
        quiet_at="0m",  # one scrape: nothing to compare with yet
        firing_at="3m",
        firing=[Firing({**ON, "instance": "a"})],
    ),
    Case(
        "PoolkeeperLeaseHeldByNobody",
        {
            series(LEASE, "a", pool="default/orphaned"): "0x10",
            series(LEASE, "b", pool="default/orphaned"): "0x10",
            series(LEASE, "a", pool="default/held"): "1x10",
            series(LEASE, "b", pool="default/held"): "0x10",
        },
        quiet_at="1m",
        firing_at="3m",
        firing=[Firing({"pool": "default/orphaned"})],
    ),
    Case(
        "PoolkeeperClaimErrors",
        {
            # Claims from one pool are served by two processes; errors add up per pool.
            series(CLAIMS, "a", pool="default/p", result="error"): "0+1x15",
            series(CLAIMS, "a", pool="default/p", result="claimed"): "0+4x15",
            series(CLAIMS, "b", pool="default/p", result="claimed"): "0+5x15",
            series(CLAIMS, "a", pool="default/q", result="error"): "0+1x15",
            series(CLAIMS, "a", pool="default/q", result="claimed"): "0+99x15",
        },
        quiet_at="4m",
        firing_at="10m",
        firing=[Firing({"pool": "default/p"}, "10%")],
    ),
]


def expected_annotations(rule: dict[str, Any], firing: Firing) -> dict[str, str]:
    """The rule's annotations as Prometheus renders them for this alert (the templates use
    only $labels.NAME and $value, with or without humanizePercentage)."""
    rendered = {}
    for key, text in rule["annotations"].items():
        text = re.sub(r"\{\{ \$value( \| humanizePercentage)? \}\}", firing.value, text)
        rendered[key] = re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: firing.labels[m[1]], text)
    return rendered


def promtool_tests(found: dict[str, dict[str, Any]]) -> dict[str, Any]:
    tests = []
    for case in CASES:
        rule = found[case.alert]
        firing = [
            {
                "exp_labels": {**alert.labels, "severity": rule["labels"]["severity"]},
                "exp_annotations": expected_annotations(rule, alert),
            }
            for alert in case.firing
        ]
        tests.append(
            {
                "name": case.alert,
                "interval": "1m",
                "input_series": [{"series": s, "values": v} for s, v in case.series.items()],
                "alert_rule_test": [
                    {"eval_time": case.quiet_at, "alertname": case.alert, "exp_alerts": []},
                    {"eval_time": case.firing_at, "alertname": case.alert, "exp_alerts": firing},
                ],
            }
        )
    return {"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": tests}


def test_each_alert_fires_on_trouble_and_only_there(tmp_path: Path) -> None:
    binary = promtool()
    rule_file(tmp_path)
    assert [case.alert for case in CASES] == list(ALERTS)
    tests = tmp_path / "tests.yaml"
    tests.write_text(yaml.safe_dump(promtool_tests(rules()), sort_keys=False))
    result = subprocess.run(
        [str(binary), "test", "rules", str(tests)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout + result.stderr


# --- values -------------------------------------------------------------------------------


def test_values_place_label_and_route_the_rule() -> None:
    manifest = prometheus_rule(
        {
            "prometheusRule.namespace": '"monitoring"',
            "prometheusRule.labels": '{"release": "kube-prometheus-stack"}',
            "prometheusRule.alertLabels": '{"team": "runners"}',
            "prometheusRule.severities.PoolkeeperClaimErrors": '"critical"',
            "prometheusRule.runbookUrl": '"https://git.example/poolkeeper/docs/operator.md"',
        }
    )
    assert manifest["metadata"]["namespace"] == "monitoring"
    assert manifest["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    found = {rule["alert"]: rule for rule in rules_of(manifest)}
    claims = found["PoolkeeperClaimErrors"]
    assert claims["labels"] == {"severity": "critical", "team": "runners"}
    url = "https://git.example/poolkeeper/docs/operator.md#poolkeeperclaimerrors"
    assert claims["annotations"]["runbook_url"] == url
    assert claims["annotations"]["description"].endswith(f" Runbook: {url}")
    assert rule_problems(manifest, anchors()) == []


def test_without_a_runbook_url_the_description_names_the_page() -> None:
    for name, rule in rules().items():
        assert "runbook_url" not in rule["annotations"]
        assert rule["annotations"]["description"].endswith(
            f" Runbook: docs/operator.md#{name.lower()} in poolkeeper's documentation."
        )


@pytest.mark.parametrize(
    ("resync", "window"), [("10", "120s"), ("60", "180s"), ("0.5", "120s"), ("45.5", "137s")]
)
def test_no_reconcile_window_is_three_resync_periods_but_two_minutes_at_least(
    resync: str, window: str
) -> None:
    rule = rules({"resyncSeconds": resync})["PoolkeeperNoReconcilePass"]
    assert f"poolkeeper_reconcile_duration_seconds_count[{window}]" in rule["expr"]
    assert f"in {window} (its resync period is {resync} s)" in rule["annotations"]["description"]


def test_thresholds_come_from_the_values() -> None:
    found = rules(
        {"prometheusRule.nomadErrorRatio": "0.9", "prometheusRule.claimErrorRatio": "0.2"}
    )
    assert found["PoolkeeperNomadUnreachable"]["expr"].endswith("> 0.9")
    assert found["PoolkeeperClaimErrors"]["expr"].endswith("> 0.2")


# --- runbooks -----------------------------------------------------------------------------


def test_every_alert_has_a_runbook_saying_what_it_means_and_what_to_do() -> None:
    docs = OPERATOR_DOCS.read_text(encoding="utf-8")
    sections = re.split(r"^### ", docs, flags=re.MULTILINE)
    for name in ALERTS:
        (section,) = [s for s in sections if s.startswith(f"{name}\n")]
        for part in ("**What it means.**", "**What to look at.**", "**What to do.**"):
            assert part in section, f"{name}: {part}"
