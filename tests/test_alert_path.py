"""The real alert path: a hang reported by the scrape target reaches a webhook through real
Prometheus and Alertmanager, evaluating the shipped rule file.

The target comes from the `hang_target` fixture. Today it is a small real HTTP exposition we
control; to run the same test against `flightdeck server`, make the fixture yield a `HangTarget`
with the server's `host:port` and a callable that makes the server open a hang finding (e.g. by
ingesting a stuck job's batches).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.markers import needs_ops_binaries
from tests.support.ops_stack import (
    Delivery,
    HangTarget,
    OpsStack,
    fake_hang_target,
)

RULES = Path(__file__).resolve().parents[1] / "dashboards" / "alerts" / "flightdeck.rules.yml"

#: generous bound: the alert must arrive, however slow the machine (typically ~1–2 s).
DELIVERY_BOUND_S = 60.0

pytestmark = [
    pytest.mark.slow,
    needs_ops_binaries,
]


@pytest.fixture
def hang_target() -> Iterator[HangTarget]:
    """The scrape target and its hang trigger (swap in the real server here)."""
    pytest.importorskip("prometheus_client", reason="the fake target needs prometheus_client (.[server])")
    with fake_hang_target(job="j", group="0", culprits=1) as target:
        yield target


def _names_hang(target: HangTarget) -> Callable[[Delivery], bool]:
    """A webhook-delivery predicate: a firing FlightdeckCollectiveHang for the target's job and group."""

    def predicate(delivery: Delivery) -> bool:
        return any(
            alert["labels"].get("alertname") == "FlightdeckCollectiveHang"
            and alert["labels"].get("job") == target.job
            and alert["labels"].get("group") == target.group
            for alert in delivery.alerts("firing")
        )

    return predicate


@pytest.mark.timeout(180)
def test_hang_reaches_webhook(hang_target: HangTarget, tmp_path: Path) -> None:
    """Flip the hang gauge; the webhook gets FlightdeckCollectiveHang naming job and group."""
    with OpsStack(rule_files=[RULES], targets=[hang_target], workdir=tmp_path) as stack:
        started = time.monotonic()
        stack.wait_for_targets_up(timeout=30)
        stack.wait_for_alertmanager_discovered(timeout=30)
        # the not-hung state has been scraped and evaluated: nothing fires
        assert stack.query('flightdeck_job_hang_active{job="j",group="0"}')[0]["value"][1] == "0"
        time.sleep(2)  # two more evaluation cycles of the quiet state
        assert stack.webhook.deliveries == []
        warmup = time.monotonic() - started

        flipped = time.monotonic()
        hang_target.trigger_hang()
        delivery = stack.webhook.wait_for(_names_hang(hang_target), timeout=DELIVERY_BOUND_S)
        latency = delivery.received_at - flipped
        print(f"\nalert path: gauge flip -> webhook delivery {latency:.2f} s (stack warm-up {warmup:.1f} s)")

        (alert,) = [
            a for a in delivery.alerts("firing") if a["labels"]["alertname"] == "FlightdeckCollectiveHang"
        ]
        assert alert["labels"]["severity"] == "critical"
        assert alert["annotations"]["summary"] == "Collective hang in job j, group 0: 1 culprit rank(s)"
        assert alert["annotations"]["incident_url"] == "http://127.0.0.1:8470/jobs/j"
        assert delivery.payload["groupLabels"] == {
            "alertname": "FlightdeckCollectiveHang",
            "job": "j",
            "group": "0",
        }
        assert latency < DELIVERY_BOUND_S
