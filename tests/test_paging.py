"""One page per incident (issue 20), through the shipped alert path: real Prometheus and
Alertmanager running the shipped files (`render_shipped`: only addresses changed), a real
`flightdeck server` with default settings, and a webhook receiver on 127.0.0.1 that counts the
notifications reaching the paging receiver.

- a server SIGSTOPped for 60 s while a hang is open: 1 firing notification, none resolved, and
  FlightdeckServerDown does not page either (held 2 minutes, as long as the hang's keep_firing_for);
- a server restarted on the same database with a hang open: no resolve, no second page;
- a lost rank and the hang it causes: one notification.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.markers import needs_ops_binaries
from tests.support.ops_stack import (
    Delivery,
    HangTarget,
    OpsStack,
)
from tests.support.paging_stack import ServerProcess, incident, more_evaluations, notifications
from tests.support.waiting import wait_until

pytestmark = [
    pytest.mark.slow,
    needs_ops_binaries,
]


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    with ServerProcess(tmp_path / "data") as srv:
        srv.start()
        yield srv


def _stack(server: ServerProcess, tmp_path: Path) -> OpsStack:
    target = HangTarget(address=server.address, metrics_path="/metrics", trigger_hang=lambda: None)
    return OpsStack(rule_files=[], targets=[target], workdir=tmp_path / "ops", shipped=True)


def _paged(stack: OpsStack, server: ServerProcess, name: str, job: str) -> Delivery:
    stack.wait_for_targets_up(timeout=90)
    stack.wait_for_alertmanager_discovered(timeout=90)
    server.post(incident(name, job))
    return stack.webhook.wait_for(lambda d: bool(notifications([d], job, "firing")), timeout=120)


@pytest.mark.timeout(420)
def test_a_60_s_stall_of_the_server_neither_resolves_nor_refires_the_page(
    server: ServerProcess, tmp_path: Path
) -> None:
    with _stack(server, tmp_path) as stack:
        _paged(stack, server, "hang", "j")
        server.pause()
        stalled = time.monotonic()
        # Prometheus sees the target down: its series go stale at the first failed scrape.
        wait_until(lambda: stack.query('up{job="flightdeck"} == 0'), 30, "the failed scrape")
        while time.monotonic() - stalled < 60:
            time.sleep(1)
        server.resume()
        wait_until(lambda: stack.query('up{job="flightdeck"} == 1'), 60, "a successful scrape again")
        more_evaluations(stack, 5, 120)
        deliveries = list(stack.webhook.deliveries)
        assert len(notifications(deliveries, "j", "firing")) == 1, deliveries
        assert notifications(deliveries, "j", "resolved") == [], deliveries
        # the stall itself pages nothing (FlightdeckServerDown waits 2 minutes)
        assert notifications(deliveries, "flightdeck", "firing") == [], deliveries
        assert stack.query('ALERTS{alertname="FlightdeckCollectiveHang",job="j",alertstate="firing"}')


@pytest.mark.timeout(360)
def test_a_restart_of_the_server_neither_resolves_nor_refires_the_page(
    server: ServerProcess, tmp_path: Path
) -> None:
    with _stack(server, tmp_path) as stack:
        _paged(stack, server, "hang", "j")
        server.stop()
        server.start()
        # Its first answered scrape already exports the open hang (loaded from the store).
        first = server.metrics()
        assert 'flightdeck_job_hang_active{group="0",job="j"} 1.0' in first
        wait_until(lambda: stack.query('up{job="flightdeck"} == 1'), 60, "a successful scrape again")
        more_evaluations(stack, 5, 120)
        deliveries = list(stack.webhook.deliveries)
        assert len(notifications(deliveries, "j", "firing")) == 1, deliveries
        assert notifications(deliveries, "j", "resolved") == [], deliveries


@pytest.mark.timeout(360)
def test_a_lost_rank_and_the_hang_it_causes_page_once(server: ServerProcess, tmp_path: Path) -> None:
    with _stack(server, tmp_path) as stack:
        page = _paged(stack, server, "lost_rank", "k")
        kinds = {f["kind"] for f in server.open_findings("k")}
        assert {"rank_lost", "hang"} <= kinds, kinds
        wait_until(
            lambda: stack.query('ALERTS{job="k",alertstate="firing",alertname="FlightdeckCollectiveHang"}'),
            60,
            "the hang alert firing in Prometheus",
        )
        # Past the critical route's group_interval (1 m): an update of the group would be out by now.
        wait_until(lambda: time.monotonic() - page.received_at > 70, 90, "a group_interval")
        deliveries = list(stack.webhook.deliveries)
        pages = notifications(deliveries, "k", "firing")
        assert len(pages) == 1, deliveries
        names = {a["labels"]["alertname"] for a in pages[0].alerts("firing")}
        assert names == {"FlightdeckRankLost"}, names  # the hang it causes is inhibited
