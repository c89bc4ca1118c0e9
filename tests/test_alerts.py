"""The Prometheus alert rules: promtool accepts and unit-tests them; every alert is documented."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from flightdeck.dashboards.alert_links import RULE_FILES, render, write
from flightdeck.dashboards.defaults import DEFAULT_FLIGHTDECK_URL, DEFAULT_RUNBOOK_URL
from tests.support.metrics_doc import documented_series, metric_names

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
    # the alerting pipeline watching itself (issue 23)
    "Watchdog",
    "PrometheusRuleEvaluationFailures",
    "PrometheusNotificationsFailing",
    "PrometheusConfigReloadFailed",
    "AlertmanagerNotificationsFailing",
    "AlertmanagerConfigReloadFailed",
}

#: Prometheus' and Alertmanager's own series the self-monitoring rules read (from their scrape
#: jobs `prometheus` and `alertmanager` in prometheus.yml).
PIPELINE_SERIES = {
    "prometheus_rule_evaluation_failures_total",
    "prometheus_notifications_errors_total",
    "prometheus_notifications_dropped_total",
    "prometheus_config_last_reload_successful",
    "alertmanager_notifications_failed_total",
    "alertmanager_config_last_reload_successful",
}

#: the one base URL every incident link starts with, and where the runbook is published (the
#: shipped rule file is the rendering of these defaults: `flightdeck dashboards alerts`).
INCIDENT_BASE = DEFAULT_FLIGHTDECK_URL + "/"
RUNBOOK_BASE = DEFAULT_RUNBOOK_URL


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


@pytest.mark.slow
def test_promtool_check_rules() -> None:
    """`promtool check rules` accepts the rule file."""
    _run([_promtool(), "check", "rules", str(RULES)], cwd=ALERTS)


@pytest.mark.slow
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
    # the Watchdog has no quiet case: it always fires (that is what it is for)
    assert alerts - quiet == {"Watchdog"}, "alerts without a not-firing test"
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
    # `none`: the Watchdog only, which its own receiver takes (never the pager)
    assert rule["labels"]["severity"] in ({"none"} if name == "Watchdog" else {"critical", "warning"})
    annotations = rule["annotations"]
    for key in ("summary", "description", "incident_url", "runbook_url"):
        assert annotations.get(key, "").strip(), f"{name} lacks {key}"
    assert annotations["runbook_url"] == f"{RUNBOOK_BASE}#{name.lower()}"
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
    allowed = (
        documented_series().keys()
        | {r["record"] for r in _rules() if "record" in r}
        | {"up"}
        | PIPELINE_SERIES
    )
    used = metric_names(rule["expr"])
    assert used or rule.get("alert") == "Watchdog"  # vector(1)
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


def _anchors(markdown: str) -> set[str]:
    """The heading anchors of a Markdown page as GitHub (and most forges) generate them."""
    out = set()
    for heading in re.findall(r"^#+ (.+?)\s*$", markdown, flags=re.MULTILINE):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        out.add(slug)
    return out


def test_every_link_is_absolute_and_the_runbook_anchor_exists() -> None:
    """Every incident_url and runbook_url is an absolute http(s) URL; each runbook_url is the
    runbook's published address plus an anchor that docs/runbook.md has."""
    from urllib.parse import urlsplit

    anchors = _anchors(RUNBOOK.read_text(encoding="utf-8"))
    for name, rule in _alerts().items():
        for key in ("incident_url", "runbook_url"):
            parts = urlsplit(rule["annotations"][key])
            assert parts.scheme in ("http", "https") and parts.netloc, f"{name}: {key} is not absolute"
        runbook = urlsplit(rule["annotations"]["runbook_url"])
        assert runbook.path.endswith("/runbook"), name  # the page the server serves
        assert runbook.fragment in anchors, f"{name}: no #{runbook.fragment} in docs/runbook.md"


@pytest.mark.slow
def test_links_come_from_one_pair_of_base_urls(tmp_path: Path) -> None:
    """The shipped files are the rendering of the defaults; rendered with a site's bases, every
    link starts with them, no default remains, and the promtool tests still pass."""
    for name in RULE_FILES:
        text = (ALERTS / name).read_text(encoding="utf-8")
        assert render(text, flightdeck_url=DEFAULT_FLIGHTDECK_URL, runbook_url=DEFAULT_RUNBOOK_URL) == text
    write(
        tmp_path, flightdeck_url="https://fd.corp.test/", runbook_url="https://wiki.corp.test/fd/runbook.md"
    )
    rendered = yaml.safe_load((tmp_path / "flightdeck.rules.yml").read_text(encoding="utf-8"))
    alerts = [r for g in rendered["groups"] for r in g["rules"] if "alert" in r]
    assert len(alerts) == len(EXPECTED_ALERTS)
    for rule in alerts:
        assert rule["annotations"]["incident_url"].startswith("https://fd.corp.test/"), rule["alert"]
        assert (
            rule["annotations"]["runbook_url"]
            == f"https://wiki.corp.test/fd/runbook.md#{rule['alert'].lower()}"
        )
    for name in RULE_FILES:
        text = (tmp_path / name).read_text(encoding="utf-8")
        assert DEFAULT_RUNBOOK_URL not in text and f'"{DEFAULT_FLIGHTDECK_URL}' not in text
    _run([_promtool(), "test", "rules", "flightdeck.rules.test.yml"], cwd=tmp_path)
    with pytest.raises(ValueError):
        render("", flightdeck_url="fd.corp.test", runbook_url=DEFAULT_RUNBOOK_URL)


def test_paging_alerts_survive_the_blips_the_server_has() -> None:
    """The paging alerts keep firing through a server blip (docs/alerting.md: a 60 s stall, a
    restart, a failover, each plus a scrape and an evaluation), and FlightdeckServerDown waits
    that long too, so a blip pages nothing; the lost rank fires no later than its hang."""
    groups = {g["name"]: g for g in yaml.safe_load(RULES.read_text(encoding="utf-8"))["groups"]}
    page = groups["flightdeck-page"]
    for rule in page["rules"]:
        assert _seconds(rule["keep_firing_for"]) >= 60 + 2 * _seconds(page["interval"]) + 30, rule["alert"]
        assert _seconds(rule["for"]) == 0, rule["alert"]
    keep = max(_seconds(r["keep_firing_for"]) for r in page["rules"])
    assert _seconds(_alerts()["FlightdeckServerDown"]["for"]) >= keep


def _amtool() -> str:
    amtool = shutil.which("amtool")
    if amtool is None:
        pytest.skip("amtool not installed (Debian: apt-get install prometheus-alertmanager); CI installs it")
    return amtool


AM_CONFIG = REPO / "dashboards" / "alertmanager" / "alertmanager.yml"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("labels", "receiver"),
    [
        (["alertname=FlightdeckCollectiveHang", "severity=critical", "job=j", "group=0"], "oncall-webhook"),
        (["alertname=FlightdeckRankLost", "severity=critical", "job=j"], "oncall-webhook"),
        (["alertname=FlightdeckServerDown", "severity=critical", "job=flightdeck"], "oncall-webhook"),
        (["alertname=FlightdeckStraggler", "severity=warning", "job=j", "rank=3"], "ticket-webhook"),
        (["alertname=Watchdog", "severity=none"], "watchdog"),
        # unknown or missing severities: the default receiver, which does not page
        (["alertname=SomethingNew", "severity=info"], "ticket-webhook"),
        (["alertname=SomethingNew", "severity=page"], "ticket-webhook"),
        (["alertname=SomethingNew"], "ticket-webhook"),
    ],
)
def test_alertmanager_routes(labels: list[str], receiver: str) -> None:
    """`amtool config routes test` sends each alert to the receiver docs/alerting.md promises."""
    result = subprocess.run(
        [_amtool(), "config", "routes", "test", f"--config.file={AM_CONFIG}", *labels],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [receiver]


@pytest.mark.slow
def test_alertmanager_config_and_root_receiver() -> None:
    """amtool accepts the config; the root route's receiver is not the pager; the critical route
    groups one training job's alerts into one notification and the lost rank inhibits its hang."""
    _run([_amtool(), "check-config", str(AM_CONFIG)], cwd=AM_CONFIG.parent)
    doc = yaml.safe_load(AM_CONFIG.read_text(encoding="utf-8"))
    assert doc["route"]["receiver"] != "oncall-webhook"
    (critical,) = [r for r in doc["route"]["routes"] if r.get("matchers") == ['severity="critical"']]
    assert "job" in critical["group_by"] and "alertname" not in critical["group_by"]
    inhibits = {(tuple(i["source_matchers"]), tuple(i["target_matchers"])) for i in doc["inhibit_rules"]}
    assert (('alertname="FlightdeckRankLost"',), ('alertname="FlightdeckCollectiveHang"',)) in inhibits
