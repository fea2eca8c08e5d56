"""The chart's alert rules (templates/prometheusrule.yaml): promtool when it is there
(scripts/fetch-promtool.sh; CI requires it), and always a check of our own that knows the
series the controller exports."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Final

import pytest
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.parser import text_string_to_metric_families

from controller.metrics import Metrics
from tests.chart.helm import ROOT, Manifest

PROMTOOL: Final = ROOT / ".cache" / "promtool" / "promtool"
# Set by .ci/run: there a missing promtool fails the rule tests instead of skipping them.
REQUIRE_PROMTOOL: Final = "POOLKEEPER_REQUIRE_PROMTOOL"
OPERATOR_DOCS: Final = ROOT / "docs" / "operator.md"

# Labels a scrape adds to every series (Prometheus's own and the ServiceMonitor's), and
# their exported_ names for where a scrape renames poolkeeper's labels of the same name.
TARGET_LABELS: Final = frozenset({"instance", "job", "namespace", "pod", "service", "endpoint"})
SCRAPE_LABELS: Final = TARGET_LABELS | {f"exported_{label}" for label in TARGET_LABELS}
SEVERITIES: Final = frozenset({"critical", "warning", "info"})
RULE_KEYS: Final = frozenset({"alert", "expr", "for", "labels", "annotations"})
ALERT_NAME: Final = re.compile(r"Poolkeeper[A-Z][A-Za-z]+")
DURATION: Final = re.compile(r"[1-9]\d*[smh]")
SELECTOR: Final = re.compile(r"(poolkeeper_\w+)\s*(\{[^}]*\})?")
MATCHER: Final = re.compile(r'(\w+)\s*(?:=~|!~|!=|=)\s*"(?:[^"\\]|\\.)*"')
GROUPING: Final = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")
RANGE: Final = re.compile(r"\[([^\]]*)\]")
TEMPLATE_LABEL: Final = re.compile(r"\$labels\.(\w+)")
PAIRS: Final = {"(": ")", "[": "]", "{": "}"}


def promtool() -> Path:
    """The promtool binary; without one the test is skipped (failed where CI asks for it)."""
    if PROMTOOL.is_file():
        return PROMTOOL
    message = (
        f"promtool is missing at {PROMTOOL.relative_to(ROOT)} (scripts/fetch-promtool.sh "
        "fetches it from Debian's prometheus package); the rules had the schema check only"
    )
    if os.environ.get(REQUIRE_PROMTOOL):
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


def exported_series() -> dict[str, frozenset[str]]:
    """Every series name a controller's /metrics serves, with its label names: one child
    of each collector of controller/metrics.py, read back from the exposition."""
    metrics = Metrics()
    for collector in vars(metrics).values():
        if isinstance(collector, MetricWrapperBase) and collector._labelnames:
            collector.labels(*("x" for _ in collector._labelnames))
    series: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(metrics.exposition().decode()):
        for sample in family.samples:
            series.setdefault(sample.name, set()).update(sample.labels)
    return {name: frozenset(labels) for name, labels in series.items()}


def rules_of(manifest: Manifest) -> Iterator[dict[str, Any]]:
    for group in manifest["spec"]["groups"]:
        yield from group["rules"]


def doc_anchors(markdown: str) -> set[str]:
    """GitHub's anchors of a page's headings (what a runbook_url points at)."""
    anchors = set()
    for heading in re.findall(r"^#+ (.+)$", markdown, flags=re.MULTILINE):
        anchor = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        anchors.add(anchor)
    return anchors


def _unbalanced(expr: str) -> str | None:
    """Brackets and quotes of a PromQL expression, outside string literals."""
    stack: list[str] = []
    quote = ""
    escaped = False
    for char in expr:
        if quote:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == quote:
                quote = ""
        elif char in "\"'`":
            quote = char
        elif char in PAIRS:
            stack.append(PAIRS[char])
        elif char in PAIRS.values() and (not stack or stack.pop() != char):
            return f"unexpected {char!r}"
    if quote:
        return f"unclosed {quote}"
    return f"unclosed, expected {stack[-1]!r}" if stack else None


def _expr_problems(expr: str, series: Mapping[str, frozenset[str]]) -> tuple[list[str], set[str]]:
    """What is wrong with an expression, and the labels its result may carry."""
    problems = []
    unbalanced = _unbalanced(expr)
    if unbalanced:
        problems.append(f"expr: {unbalanced}")
    labels: set[str] = set(SCRAPE_LABELS)
    for name, matchers in SELECTOR.findall(expr):
        if name not in series:
            problems.append(f"expr: no series {name} (controller/metrics.py)")
            continue
        labels |= series[name]
        for label in MATCHER.findall(matchers):
            if label not in series[name]:
                problems.append(f"expr: {name} has no label {label}")
    grouped: set[str] = set()
    for group in GROUPING.findall(expr):
        for label in filter(None, (part.strip() for part in group.split(","))):
            grouped.add(label)
            if label not in labels:
                problems.append(f"expr: grouping by {label}, which no series of it has")
    for window in RANGE.findall(expr):
        if not DURATION.fullmatch(window):
            problems.append(f"expr: range [{window}] is not a duration")
    by = {
        label.strip()
        for group in re.findall(r"\bby\s*\(([^)]*)\)", expr)
        for label in group.split(",")
        if label.strip()
    }
    return problems, by or labels


def rule_problems(manifest: Manifest, anchors: set[str]) -> list[str]:
    """A PrometheusRule as the Prometheus operator and Alertmanager need it: groups of
    alerting rules with known keys, unique CamelCase names, durations, a severity, a
    summary and a description, and a runbook that exists; expressions that balance, over
    series the controller exports and labels those series have; annotation templates that
    use labels the alert carries."""
    series = exported_series()
    problems: list[str] = []
    spec = manifest.get("spec", {})
    if set(spec) != {"groups"} or not spec["groups"]:
        return ["spec: one key, groups, with at least one group"]
    names: set[str] = set()
    for group in spec["groups"]:
        if set(group) != {"name", "rules"} or not group["rules"]:
            problems.append(f"group {group.get('name')}: name and rules, no other key")
            continue
        for rule in group["rules"]:
            name = str(rule.get("alert", ""))
            where = f"{group['name']}/{name or '?'}"
            if not ALERT_NAME.fullmatch(name) or name in names:
                problems.append(f"{where}: a new alert name PoolkeeperCamelCase")
            names.add(name)
            if not set(rule) <= RULE_KEYS or not {"alert", "expr", "labels"} <= set(rule):
                problems.append(f"{where}: keys {sorted(rule)}")
                continue
            if "for" in rule and not DURATION.fullmatch(str(rule["for"])):
                problems.append(f"{where}: for {rule['for']!r} is not a duration")
            if rule["labels"].get("severity") not in SEVERITIES:
                problems.append(f"{where}: severity {rule['labels'].get('severity')!r}")
            expr_problems, carried = _expr_problems(str(rule["expr"]), series)
            problems += [f"{where}: {p}" for p in expr_problems]
            annotations = rule.get("annotations") or {}
            for key in ("summary", "description"):
                text = annotations.get(key)
                if not isinstance(text, str) or not text.strip():
                    problems.append(f"{where}: annotation {key} missing")
                    continue
                outside = re.sub(r"\{\{.*?\}\}", "", text)  # the template actions removed
                if "{{" in outside or "}}" in outside:
                    problems.append(f"{where}: {key}: unbalanced template")
                for label in set(TEMPLATE_LABEL.findall(text)) - carried:
                    problems.append(f"{where}: {key} uses $labels.{label}, not on the alert")
            anchor = name.lower()
            runbook = f"docs/operator.md#{anchor}"
            described = str(annotations.get("description", ""))
            if runbook not in described and f"#{anchor}" not in described:
                problems.append(f"{where}: the description names no runbook")
            if "runbook_url" in annotations and not annotations["runbook_url"].endswith(
                f"#{anchor}"
            ):
                problems.append(f"{where}: runbook_url {annotations['runbook_url']}")
            if anchor not in anchors:
                problems.append(f"{where}: docs/operator.md has no heading {name}")
    return problems
