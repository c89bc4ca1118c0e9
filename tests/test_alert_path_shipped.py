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
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from flightdeck.demo.ranks import free_port
from tests.support.ops_stack import (
    ALERTMANAGER_BINARIES,
    PAGE_PATH,
    PROMETHEUS_BINARIES,
    SHIPPED_ALERTMANAGER,
    SHIPPED_PROMETHEUS,
    HangTarget,
    OpsStack,
    find_binary,
    pages,
    render_shipped,
)
from tests.support.paging_stack import incident
from tests.support.server_batches import body, make_batch, scenario_dumps, snapshots

_BINARIES = find_binary(PROMETHEUS_BINARIES) is not None and find_binary(ALERTMANAGER_BINARIES) is not None
needs_binaries = pytest.mark.skipif(
    not _BINARIES,
    reason="needs `prometheus` and `prometheus-alertmanager` (Debian packages of the same names)",
)


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


class _Server:
    """A real `flightdeck server` on 127.0.0.1 with default thresholds and a collector token."""

    def __init__(self, data_dir: Path) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        # the caller's FLIGHTDECK_* variables would change the defaults under test
        env = {k: v for k, v in os.environ.items() if not k.startswith("FLIGHTDECK_")}
        env |= {"FLIGHTDECK_DATA_DIR": str(data_dir), "FLIGHTDECK_PORT": str(self.port)}
        data_dir.mkdir()
        cmd = [sys.executable, "-m", "flightdeck"]
        self.token = subprocess.run(
            [*cmd, "token", "create", "alert-test", "--any-host"],
            env=env,
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        ).stdout.strip()
        self.proc = subprocess.Popen(
            [*cmd, "server"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.monotonic() + 60
        while not self._healthy():
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.stop()
                raise RuntimeError("flightdeck server did not come up")
            time.sleep(0.2)

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.base}/healthz", timeout=2) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def ingest(self, scenario: str, job: str, *, periodic_only: bool = False) -> None:
        """POST a committed scenario's snapshots as job `job` (optionally without final snapshots)."""
        dumps = scenario_dumps(scenario)
        snaps = [
            s
            for rank_dumps in dumps.values()
            for s in snapshots([d for d in rank_dumps if not periodic_only or d.kind != "final"], job=job)
        ]
        data, headers = body(make_batch(snaps))
        req = urllib.request.Request(
            f"{self.base}/api/v1/ingest",
            data=data,
            headers={**headers, "Authorization": f"Bearer {self.token}"},
            method="POST",
        )
        with urllib.request.urlopen(req, timeout=30) as r:
            assert r.status == 200

    def post(self, snaps: list[Any]) -> None:
        """POST these snapshots as one batch."""
        data, headers = body(make_batch(snaps))
        req = urllib.request.Request(
            f"{self.base}/api/v1/ingest",
            data=data,
            headers={**headers, "Authorization": f"Bearer {self.token}"},
            method="POST",
        )
        with urllib.request.urlopen(req, timeout=30) as r:
            assert r.status == 200

    def findings(self, job: str) -> list[dict[str, Any]]:
        """The job's open findings (GET /api/v1/jobs/{job}/findings)."""
        try:
            with urllib.request.urlopen(f"{self.base}/api/v1/jobs/{job}/findings", timeout=5) as r:
                doc = json.loads(r.read())
        except OSError:
            return []
        return [row["finding"] for row in doc.get("findings", []) if row["open"]]

    def stop(self) -> None:
        """Terminate the server."""
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[_Server]:
    """The server under test, stopped at teardown."""
    srv = _Server(tmp_path / "data")
    try:
        yield srv
    finally:
        srv.stop()


def _wait(predicate: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.2)


@needs_binaries
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_shipped_stack_pages_a_hang_once_and_not_a_straggler(server: _Server, tmp_path: Path) -> None:
    target = HangTarget(
        address=f"127.0.0.1:{server.port}", metrics_path="/metrics", trigger_hang=lambda: None
    )
    with OpsStack(rule_files=[], targets=[target], workdir=tmp_path / "ops", shipped=True) as stack:
        stack.wait_for_targets_up(timeout=90)
        stack.wait_for_alertmanager_discovered(timeout=90)
        # The warning first: a straggler finding, open and exported, while nothing pages.
        server.ingest("straggler", "s", periodic_only=True)
        straggler = _wait(
            lambda: [f for f in server.findings("s") if f["kind"] == "straggler"], 60, "the straggler finding"
        )
        assert straggler[0]["culprit_ranks"] == [3]
        assert not [f for f in server.findings("s") if f["kind"] == "hang"]
        _wait(
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
        seen_evals = stack.query('prometheus_rule_group_iterations_total{rule_group=~".*;flightdeck-page"}')
        start = float(seen_evals[0]["value"][1]) if seen_evals else 0.0
        _wait(
            lambda: any(
                float(r["value"][1]) >= start + 5
                for r in stack.query(
                    'prometheus_rule_group_iterations_total{rule_group=~".*;flightdeck-page"}'
                )
            ),
            60,
            "five more evaluations of the paging rules",
        )
        _wait(lambda: bool(stack.query('ALERTS{alertname="FlightdeckCollectiveHang",job="j"}')), 30, "ALERTS")
        assert len(pages(stack.webhook.deliveries, "j")) == 1
        assert pages(stack.webhook.deliveries, "s") == []
        assert [f for f in server.findings("s") if f["kind"] == "straggler"]
