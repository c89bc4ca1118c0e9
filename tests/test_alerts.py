"""The Prometheus alert rules: promtool accepts and unit-tests them; every alert is documented."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml

if TYPE_CHECKING:
    from tests.metrics_doc import documented_series, metric_names
else:
    from metrics_doc import documented_series, metric_names

REPO = Path(__file__).resolve().parents[1]
ALERTS = REPO / "dashboards" / "alerts"
RULES = ALERTS / "flightdeck.rules.yml"
RULE_TESTS = ALERTS / "flightdeck.rules.test.yml"
RUNBOOK = REPO / "docs" / "runbook.md"

#: the alerts the operations stack promises (issue "Operations stack").
EXPECTED_ALERTS = {
    "FlightdeckCollectiveHang",
    "FlightdeckCollectiveMismatch",
    "FlightdeckRankLost",
    "FlightdeckStraggler",
    "FlightdeckNixlTransferErrors",
    "FlightdeckNixlStalled",
    "FlightdeckCollectorDown",
    "FlightdeckIngestFailing",
    "FlightdeckConfigSkew",
    "FlightdeckServerDown",
    "FlightdeckWebhookBacklog",
}

#: the one base URL every incident link starts with (edit the anchors in the rule file).
INCIDENT_BASE = "http://127.0.0.1:8470/"


def _rules() -> list[dict[str, Any]]:
    """Every rule (recording and alerting) of the rule file."""
    document = yaml.safe_load(RULES.read_text(encoding="utf-8"))
    return [rule for group in document["groups"] for rule in group["rules"]]


def _alerts() -> dict[str, dict[str, Any]]:
    """Alerting rules by name."""
    return {rule["alert"]: rule for rule in _rules() if "alert" in rule}


def _promtool() -> str:
    """Path of promtool, or skip the test with the reason."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (Debian: apt-get install prometheus); CI installs it")
    return promtool


def _run(command: list[str], cwd: Path) -> None:
    """Run a checker; fail with its output when it exits non-zero."""
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"{' '.join(command)}:\n{result.stdout}\n{result.stderr}"


def test_promtool_check_rules() -> None:
    """`promtool check rules` accepts the rule file."""
    _run([_promtool(), "check", "rules", str(RULES)], cwd=ALERTS)


def test_promtool_unit_tests() -> None:
    """`promtool test rules` passes (firing and not-firing cases for every rule)."""
    _run([_promtool(), "test", "rules", RULE_TESTS.name], cwd=ALERTS)


def test_every_alert_is_unit_tested_firing_and_quiet() -> None:
    """Each alert has at least one test case expecting it and one expecting silence."""
    document = yaml.safe_load(RULE_TESTS.read_text(encoding="utf-8"))
    firing: set[str] = set()
    quiet: set[str] = set()
    for case in document["tests"]:
        for check in case.get("alert_rule_test", []):
            (firing if check.get("exp_alerts") else quiet).add(check["alertname"])
    alerts = set(_alerts())
    assert alerts - firing == set(), "alerts without a firing test"
    assert alerts - quiet == set(), "alerts without a not-firing test"
    recorded = {rule["record"] for rule in _rules() if "record" in rule}
    tested = {check["expr"] for case in document["tests"] for check in case.get("promql_expr_test", [])}
    assert recorded <= tested, "recording rules without a promql_expr_test"


def test_expected_alerts_exist() -> None:
    """The rule file defines exactly the promised alerts."""
    assert set(_alerts()) == EXPECTED_ALERTS


@pytest.mark.parametrize("name", sorted(EXPECTED_ALERTS))
def test_alert_is_complete(name: str) -> None:
    """Severity, summary, description, incident and runbook links are all present and consistent."""
    rule = _alerts()[name]
    assert rule["labels"]["severity"] in {"critical", "warning"}
    annotations = rule["annotations"]
    for key in ("summary", "description", "incident_url", "runbook_url"):
        assert annotations.get(key, "").strip(), f"{name} lacks {key}"
    assert annotations["runbook_url"] == f"docs/runbook.md#{name.lower()}"
    assert annotations["incident_url"].startswith(INCIDENT_BASE)
    if "job" in annotations["incident_url"]:
        assert annotations["incident_url"] == INCIDENT_BASE + "jobs/{{ $labels.job }}"
        assert re.search(r"by \(job\b", rule["expr"]), (
            f"{name} links to a job but does not keep the job label"
        )


def test_job_alerts_name_job_group_and_culprits() -> None:
    """Hang and mismatch summaries name job, group and the culprit count from the culprit gauge."""
    for name in ("FlightdeckCollectiveHang", "FlightdeckCollectiveMismatch"):
        rule = _alerts()[name]
        assert "flightdeck_job_culprit_ranks" in rule["expr"]
        summary = rule["annotations"]["summary"]
        for part in ("{{ $labels.job }}", "{{ $labels.group }}", "{{ $value }} culprit"):
            assert part in summary, f"{name}: {part} missing from summary"


@pytest.mark.parametrize("rule", _rules(), ids=lambda r: r.get("alert") or r.get("record"))
def test_rule_uses_only_documented_metrics(rule: dict[str, Any]) -> None:
    """Rules query only series in docs/metrics.md, recorded earlier in this file, or Prometheus'
    own per-target `up`."""
    allowed = documented_series().keys() | {r["record"] for r in _rules() if "record" in r} | {"up"}
    used = metric_names(rule["expr"])
    assert used
    assert used <= allowed, f"undocumented: {sorted(used - allowed)}"
    for text in rule.get("annotations", {}).values():
        for expr in re.findall(r'query\s+"([^"]+)"', text):
            assert metric_names(expr) <= allowed, expr


def test_runbook_has_a_section_per_alert() -> None:
    """docs/runbook.md has a `## <AlertName>` section (the runbook_url anchor) for every alert."""
    headings = re.findall(r"^## (\S+)\s*$", RUNBOOK.read_text(encoding="utf-8"), flags=re.MULTILINE)
    assert set(_alerts()) <= set(headings)
    for heading in headings:
        body = RUNBOOK.read_text(encoding="utf-8").split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
        assert "**Means" in body and "**At 3 a.m.**" in body, f"runbook section {heading} is incomplete"


def _seconds(duration: str) -> float:
    """A Prometheus duration of one unit (`2s`, `1m`) in seconds."""
    m = re.fullmatch(r"(\d+)(ms|s|m|h)", duration)
    assert m, duration
    return int(m[1]) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[m[2]]


def test_shipped_intervals_fit_the_page_budget() -> None:
    """The shipped intervals add up to a page within 15 s of a hang (docs/alerting.md):
    stall_after + diagnosis tick + debounce + scrape + evaluation + group_wait, each at its worst,
    with 2 s left for the agent/collector hops the threshold does not hide and the deliveries."""
    from flightdeck.server.settings import ServerSettings

    prometheus = yaml.safe_load((REPO / "dashboards/prometheus/prometheus.yml").read_text(encoding="utf-8"))
    alertmanager = yaml.safe_load(
        (REPO / "dashboards/alertmanager/alertmanager.yml").read_text(encoding="utf-8")
    )
    groups = {g["name"]: g for g in yaml.safe_load(RULES.read_text(encoding="utf-8"))["groups"]}
    (scrape,) = [j for j in prometheus["scrape_configs"] if j["job_name"] == "flightdeck"]
    page = groups["flightdeck-page"]
    paged = {r["alert"] for r in page["rules"]}
    assert paged == {"FlightdeckCollectiveHang", "FlightdeckCollectiveMismatch", "FlightdeckRankLost"}
    assert all(r["labels"]["severity"] == "critical" for r in page["rules"])
    (critical,) = [r for r in alertmanager["route"]["routes"] if r["matchers"] == ['severity="critical"']]
    (warning,) = [r for r in alertmanager["route"]["routes"] if r["matchers"] == ['severity="warning"']]
    # warnings keep the normal batching of the root route
    assert "group_wait" not in warning and _seconds(alertmanager["route"]["group_wait"]) >= 10
    defaults = ServerSettings()
    hang = {"FlightdeckCollectiveHang", "FlightdeckCollectiveMismatch"}
    assert all(_seconds(r["for"]) == 0 for r in page["rules"] if r["alert"] in hang)
    worst = (
        defaults.stall_after_s
        + defaults.diagnosis_interval_s
        + defaults.diagnosis_debounce_s
        + _seconds(scrape["scrape_interval"])
        + _seconds(page["interval"])
        + _seconds(critical["group_wait"])
    )
    assert worst <= 15 - 2, worst
    # everything else keeps the 15 s global resolution
    assert _seconds(prometheus["global"]["scrape_interval"]) == 15
    assert "interval" not in groups["flightdeck"]
