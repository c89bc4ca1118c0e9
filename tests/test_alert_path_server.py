"""The real alert path end to end: a real `flightdeck server` process ingests the flight-recorder
snapshots of a real hung gloo job (scenario `skip`), diagnoses the hang, exports it on /metrics;
real Prometheus evaluates the shipped rules and real Alertmanager delivers to a local webhook.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.ops_stack import (
    ALERTMANAGER_BINARIES,
    PROMETHEUS_BINARIES,
    HangTarget,
    OpsStack,
    find_binary,
)
from tests.support.server_batches import body, make_batch, scenario_dumps, snapshots

RULES = Path(__file__).resolve().parents[1] / "dashboards" / "alerts" / "flightdeck.rules.yml"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        find_binary(PROMETHEUS_BINARIES) is None or find_binary(ALERTMANAGER_BINARIES) is None,
        reason="needs `prometheus` and `prometheus-alertmanager` (Debian packages of the same names)",
    ),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture
def server_target(tmp_path: Path) -> Iterator[HangTarget]:
    """A real server process on 127.0.0.1 with a collector token; triggering ingests the hung job."""
    port = _free_port()
    env = {
        **os.environ,
        "FLIGHTDECK_DATA_DIR": str(tmp_path / "data"),
        "FLIGHTDECK_PORT": str(port),
        "FLIGHTDECK_STALL_AFTER_S": "5",
    }
    (tmp_path / "data").mkdir()
    cmd = [sys.executable, "-m", "flightdeck"]
    token = subprocess.run(
        [*cmd, "token", "create", "alert-test", "--any-host"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.strip()
    proc = subprocess.Popen([*cmd, "server"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{base}/healthz", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("flightdeck server did not come up") from None
                time.sleep(0.2)

        def ingest_hung_job() -> None:
            # Without the final snapshots: a job hung now (an ended one pages nobody).
            dumps = [d for ds in scenario_dumps("skip").values() for d in ds if d.kind != "final"]
            snaps = snapshots(dumps, job="j")
            data, headers = body(make_batch(snaps))
            req = urllib.request.Request(
                f"{base}/api/v1/ingest",
                data=data,
                headers={**headers, "Authorization": f"Bearer {token}"},
                method="POST",
            )
            with urllib.request.urlopen(req, timeout=30) as r:
                assert r.status == 200

        yield HangTarget(address=f"127.0.0.1:{port}", metrics_path="/metrics", trigger_hang=ingest_hung_job)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.mark.timeout(240)
def test_hang_in_real_server_reaches_webhook(server_target: HangTarget, tmp_path: Path) -> None:
    with OpsStack(rule_files=[RULES], targets=[server_target], workdir=tmp_path / "ops") as stack:
        stack.wait_for_targets_up(timeout=60)
        stack.wait_for_alertmanager_discovered(timeout=60)
        assert stack.webhook.deliveries == []
        started = time.monotonic()
        server_target.trigger_hang()
        delivery = stack.webhook.wait_for(
            lambda d: any(
                a["labels"].get("alertname") == "FlightdeckCollectiveHang"
                and a["labels"].get("job") == "j"
                and a["labels"].get("group") == "0"
                for a in d.alerts("firing")
            ),
            timeout=90,
        )
        print(f"\nalert path (real server): ingest -> webhook {delivery.received_at - started:.2f} s")
        (alert,) = [
            a for a in delivery.alerts("firing") if a["labels"]["alertname"] == "FlightdeckCollectiveHang"
        ]
        # The skip scenario: rank 2 never entered the all_reduce at seq 12 of group 0: one culprit.
        assert alert["annotations"]["summary"] == "Collective hang in job j, group 0: 1 culprit rank(s)"
        assert alert["annotations"]["incident_url"] == "http://127.0.0.1:8470/jobs/j"
