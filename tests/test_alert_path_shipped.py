"""The alert path exactly as docker-compose.yml ships it, fed by a real `flightdeck server`.

Prometheus and Alertmanager run the shipped files (dashboards/prometheus/prometheus.yml with the
shipped rule file, dashboards/alertmanager/alertmanager.yml), rendered by `render_shipped`: the
same scrape and evaluation intervals, routes and `group_wait`; only the compose service addresses
become 127.0.0.1 ports. The server runs with its default settings (no test threshold). It ingests
the snapshots of a real hung gloo job (scenario `skip`) and of a real job with a straggler rank
(scenario `straggler`, its periodic snapshots: still running): the hang pages once, at the paging
receiver; the straggler, a warning-severity finding, does not page. How fast is measured by the
benchmarks (bench/fault_injection.py, bench/demo_scenarios.py), not asserted here.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.markers import needs_ops_binaries
from tests.support.ops_stack import (
    PAGE_PATH,
    SHIPPED_ALERTMANAGER,
    SHIPPED_PROMETHEUS,
    HangTarget,
    OpsStack,
    pages,
    render_shipped,
)
from tests.support.paging_stack import ServerProcess, incident, more_evaluations
from tests.support.server_batches import scenario_snapshots
from tests.support.waiting import wait_until


def _masked(doc: Any) -> Any:
    """`doc` with every address-bearing value blanked (what render_shipped may change; the scrape
    token file is compose's secret mount in the shipped file)."""
    if isinstance(doc, dict):
        out = {}
        for k, v in doc.items():
            if k in ("targets", "url", "credentials_file"):
                out[k] = "<address>"
            elif k in ("dns_sd_configs", "static_configs"):
                out["<discovery>"] = "<address>"
            else:
                out[k] = _masked(v)
        return out
    if isinstance(doc, list):
        return [_masked(v) for v in doc]
    return doc


def test_render_changes_only_addresses(tmp_path: Path) -> None:
    """The rendered configs equal the shipped ones but for addresses; receiver paths are kept."""
    _, _, prometheus, alertmanager = render_shipped(
        tmp_path,
        flightdeck_targets=["127.0.0.1:1"],
        prometheus_port=2,
        alertmanager_port=3,
        webhook_address="127.0.0.1:4",
    )
    shipped_prometheus = yaml.safe_load(SHIPPED_PROMETHEUS.read_text(encoding="utf-8"))
    shipped_alertmanager = yaml.safe_load(SHIPPED_ALERTMANAGER.read_text(encoding="utf-8"))
    assert _masked(prometheus) == _masked(shipped_prometheus)
    assert _masked(alertmanager) == _masked(shipped_alertmanager)
    urls = sorted(h["url"] for r in alertmanager["receivers"] for h in r["webhook_configs"])
    assert urls == [
        "http://127.0.0.1:4/flightdeck/critical",
        "http://127.0.0.1:4/flightdeck/warning",
        "http://127.0.0.1:4/flightdeck/watchdog",
    ]
    text = json.dumps([prometheus, alertmanager])
    for compose_name in ("alertmanager:9093", "localhost:9090", "alert-receiver", '"flightdeck"]'):
        assert compose_name not in text
    # the rule file sits where the config's relative path expects it, as in the container
    (rules,) = prometheus["rule_files"]
    assert (tmp_path / "prometheus" / rules).resolve().is_file()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    """The server under test (shipped defaults), stopped at teardown."""
    with ServerProcess(tmp_path / "data") as srv:
        srv.start()
        yield srv


@needs_ops_binaries
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_shipped_stack_pages_a_hang_once_and_not_a_straggler(server: ServerProcess, tmp_path: Path) -> None:
    target = HangTarget(
        address=f"127.0.0.1:{server.port}", metrics_path="/metrics", trigger_hang=lambda: None
    )
    with OpsStack(rule_files=[], targets=[target], workdir=tmp_path / "ops", shipped=True) as stack:
        stack.wait_for_targets_up(timeout=90)
        stack.wait_for_alertmanager_discovered(timeout=90)
        # The warning first: a straggler finding, open and exported, while nothing pages.
        server.post(scenario_snapshots("straggler", "s", live=True))
        straggler = wait_until(
            lambda: [f for f in server.open_findings("s") if f["kind"] == "straggler"],
            60,
            "the straggler finding",
        )
        assert straggler[0]["culprit_ranks"] == [3]
        assert not [f for f in server.open_findings("s") if f["kind"] == "hang"]
        wait_until(
            lambda: stack.query('flightdeck_job_straggler_lag_seconds{job="s",rank="3"}'),
            60,
            "Prometheus to scrape the straggler's lag",
        )

        # Then the hang (as a live server sees the stuck `skip` job: no rank looks lost): it pages,
        # at the paging receiver, naming job, group and culprit count.
        ingested = time.monotonic()
        server.post(incident("hang", "j"))
        page = stack.webhook.wait_for(lambda d: bool(pages([d], "j")), timeout=120)
        (alert,) = page.alerts("firing")
        assert page.path == PAGE_PATH
        assert alert["labels"]["alertname"] == "FlightdeckCollectiveHang"
        assert (alert["labels"]["job"], alert["labels"]["group"]) == ("j", "0")
        assert alert["labels"]["severity"] == "critical"
        assert alert["annotations"]["summary"] == "Collective hang in job j, group 0: 1 culprit rank(s)"
        print(f"\nshipped alert path: ingest of an old hang -> page {page.received_at - ingested:.1f} s")

        # Five more 2 s evaluations of both jobs (and a 15 s tick of the rest): the hang is not
        # paged again, the straggler not at all.
        more_evaluations(stack, 5, 60)
        wait_until(
            lambda: bool(stack.query('ALERTS{alertname="FlightdeckCollectiveHang",job="j"}')), 30, "ALERTS"
        )
        assert len(pages(stack.webhook.deliveries, "j")) == 1
        assert pages(stack.webhook.deliveries, "s") == []
        assert [f for f in server.open_findings("s") if f["kind"] == "straggler"]
