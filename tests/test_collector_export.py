"""What the server exports about collectors (issue 20): a real server process; a collector's idle
heartbeat (an empty batch) keeps its push age fresh, and revoking its token with the CLI
(`flightdeck token revoke`, another process writing the store) removes its series from /metrics
without a restart, while the other collectors stay.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.cli import flightdeck
from tests.support.paging_stack import ServerProcess

AGE = "flightdeck_collector_last_push_age_seconds"


def _ages(server: ServerProcess) -> dict[str, float]:
    """collector -> exported push age."""
    return {
        s.labels["collector"]: s.value
        for fam in text_string_to_metric_families(server.metrics())
        for s in fam.samples
        if s.name == AGE
    }


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    with ServerProcess(tmp_path / "data") as srv:
        srv.start()
        yield srv


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_heartbeat_exports_and_revocation_removes_the_collector(server: ServerProcess) -> None:
    def cli(*args: str) -> str:
        return flightdeck(server.env, "token", *args)

    other = cli("create", "rack-2", "--any-host")
    assert _ages(server) == {}  # no collector has pushed yet
    server.post([])  # an idle collector's heartbeat: an empty batch
    server.post([], token=other)
    ages = _ages(server)
    assert set(ages) == {"paging-test", "rack-2"}
    assert all(a < 60 for a in ages.values()), ages
    cli("revoke", "paging-test")
    deadline = time.monotonic() + 30
    while "paging-test" in _ages(server):
        assert time.monotonic() < deadline, "the revoked collector is still exported"
        time.sleep(0.2)
    # gone for good (not re-exported from memory), the other collector still there
    time.sleep(4)
    assert set(_ages(server)) == {"rack-2"}
