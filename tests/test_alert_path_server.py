"""The real alert path end to end: a real `flightdeck server` process ingests the flight-recorder
snapshots of a real hung gloo job (scenario `skip`), diagnoses the hang, exports it on /metrics;
real Prometheus evaluates the shipped rules and real Alertmanager delivers to a local webhook.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.markers import needs_ops_binaries
from tests.support.ops_stack import (
    HangTarget,
    OpsStack,
)
from tests.support.paging_stack import ServerProcess
from tests.support.server_batches import scenario_snapshots

RULES = Path(__file__).resolve().parents[1] / "dashboards" / "alerts" / "flightdeck.rules.yml"

pytestmark = [
    pytest.mark.slow,
    needs_ops_binaries,
]


@pytest.fixture
def server_target(tmp_path: Path) -> Iterator[HangTarget]:
    """A real server process on 127.0.0.1 with a collector token; triggering ingests the hung job."""
    with ServerProcess(tmp_path / "data", env={"FLIGHTDECK_SERVER_STALL_AFTER_S": "5"}) as server:
        server.start()
        # Without the final snapshots: a job hung now (an ended one pages nobody).
        yield HangTarget(
            address=server.address,
            metrics_path="/metrics",
            trigger_hang=lambda: server.post(scenario_snapshots("skip", "j", live=True)),
        )


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
