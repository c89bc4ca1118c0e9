"""The server's /metrics (server/metrics.py): the names docs/metrics.md documents, and the state they
show, through the in-process server on real SQLite and PostgreSQL."""

from __future__ import annotations

import platform
import re
import shutil
import subprocess
from collections.abc import Iterator

import pytest

from tests.support.clock import FakeClock
from tests.support.metrics_doc import METRICS_DOC
from tests.support.server_app import NS, STALL_S, Server, make_server, nixl_wire_sample
from tests.support.server_batches import skip_stuck_view


@pytest.fixture
def server(database_url: str, clock: FakeClock) -> Iterator[Server]:
    """A server on a fresh database (SQLite file or PostgreSQL schema)."""
    with make_server(database_url, clock) as srv:
        yield srv


def server_metric_names() -> set[str]:
    """The metric names of the `## Server` table of docs/metrics.md (other tables: other processes)."""
    doc = METRICS_DOC.read_text(encoding="utf-8")
    section = doc.split("## Server", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\|\s*`(flightdeck_[a-z0-9_]+)`\s*\|", section, flags=re.M))


def _families(text_: str) -> set[str]:
    return {line.split()[2] for line in text_.splitlines() if line.startswith("# TYPE ")}


@pytest.mark.slow
def test_metrics_expose_the_documented_names_and_the_state(server: Server) -> None:
    snaps = skip_stuck_view()
    server.clock.now_ns = max(s.snapshot_time_ns for s in snaps) + int((STALL_S + 3) * NS)
    server.push(snaps, nixl=[nixl_wire_sample("run-1", 1000)])
    server.push([], nixl=[nixl_wire_sample("run-2", 300)])  # the agent restarted: counters start over
    server.diagnose()
    r = server.client.get("/metrics")
    assert r.status_code == 200
    exposed = _families(r.text)
    assert {f for f in exposed if f.startswith("flightdeck_")} == server_metric_names()
    assert {"process_cpu_seconds_total", "process_resident_memory_bytes"} <= exposed
    get = server.svc.registry.get_sample_value
    from flightdeck import __version__

    # In process, under the tests' interpreter: CPython's own allocator (`flightdeck server`
    # re-executes itself under malloc: tests/test_server_allocator.py).
    labels = {"version": __version__, "python": platform.python_version(), "allocator": "pymalloc"}
    assert get("flightdeck_build_info", labels) == 1
    assert (get("process_resident_memory_bytes") or 0) > 0
    assert get("flightdeck_jobs", {"status": "hung"}) == 1
    assert get("flightdeck_job_hang_active", {"job": "skip", "group": "0"}) == 1
    assert get("flightdeck_job_culprit_ranks", {"job": "skip", "group": "0"}) == 1
    assert get("flightdeck_job_waiting_ranks", {"job": "skip", "group": "0"}) == 3
    assert get("flightdeck_job_findings_open", {"job": "skip", "kind": "hang"}) == 1
    assert get("flightdeck_job_findings_total", {"kind": "hang"}) == 1
    assert (
        get("flightdeck_job_oldest_unfinished_elapsed_seconds", {"job": "skip", "group": "0"}) or 0
    ) > STALL_S
    assert (
        get("flightdeck_job_collectives_total", {"job": "skip", "group": "0", "op": "all_reduce"}) or 0
    ) > 0
    assert get("flightdeck_ingest_entries_total") == sum(len(s.entries) for s in snaps)
    assert get("flightdeck_rank_last_seen_age_seconds", {"job": "skip", "rank": "2"}) == pytest.approx(
        STALL_S + 3
    )
    assert get("flightdeck_collector_last_push_age_seconds", {"collector": "test-collector"}) == 0
    labels = {"host": "node-1", "agent": "agent-a"}
    assert get("flightdeck_nixl_tx_bytes_total", labels) == 1300  # both runs
    assert get("flightdeck_nixl_errors_total", {**labels, "kind": "backend"}) == 2
    assert get("flightdeck_nixl_memory_registered_bytes", labels) == 3072
    assert get("flightdeck_nixl_xfer_time_seconds_bucket", {**labels, "le": "1e-05"}) == 2
    assert get("flightdeck_nixl_xfer_time_seconds_count", labels) == 4
    agents = server.client.get("/api/v1/nixl/agents").json()
    assert [(a["host"], a["agent"], a["totals"]["tx_bytes"]) for a in agents] == [("node-1", "agent-a", 1300)]
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (Debian package `prometheus`)")
    out = subprocess.run([promtool, "check", "metrics"], input=r.content, capture_output=True, timeout=30)
    assert out.returncode == 0, out.stdout.decode() + out.stderr.decode()
    assert not out.stdout.strip() and not out.stderr.strip(), out.stdout.decode() + out.stderr.decode()
