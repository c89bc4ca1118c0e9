"""What the store keeps (server/store.py), through the in-process server's API on real SQLite and
PostgreSQL: entries upserted, the timeline window, retention and the per-rank entry window."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from flightdeck.server import store
from tests.support.clock import FakeClock
from tests.support.server_app import NS, STALL_S, Server, healthy_prefix, make_server
from tests.support.server_batches import scenario_dumps, snapshots


@pytest.fixture
def server(database_url: str, clock: FakeClock) -> Iterator[Server]:
    """A server on a fresh database (SQLite file or PostgreSQL schema)."""
    with make_server(database_url, clock) as srv:
        yield srv


def test_entry_state_is_upserted(server: Server) -> None:
    stuck, finals, _ = healthy_prefix(10)
    assert server.push(stuck).status_code == 200
    n = server.counts()["entries"]

    def state_of_seq10(rank: int) -> tuple[str, bool]:
        r = server.client.get(
            "/api/v1/jobs/healthy_4/timeline", params={"group": "0", "seq_from": 10, "seq_to": 10}
        )
        row = next(e for e in r.json()["entries"] if e["rank"] == rank)
        return row["state"], row["retired"]

    assert state_of_seq10(0) == ("scheduled", False)
    assert server.push(finals).status_code == 200
    assert state_of_seq10(0) == ("scheduled", True)  # gloo: retired is the finished signal
    after = server.counts()["entries"]
    assert after == sum(len(s.entries) for s in finals)
    assert after > n


def test_timeline_window(server: Server) -> None:
    server.push(snapshots([d for ds in scenario_dumps("healthy_4").values() for d in ds]))
    r = server.client.get(
        "/api/v1/jobs/healthy_4/timeline",
        params={"group": "0", "rank_from": 1, "rank_to": 2, "seq_from": 3, "seq_to": 5, "limit": 100},
    )
    rows = r.json()["entries"]
    assert {(e["rank"], e["collective_seq_id"]) for e in rows} == {(r, s) for r in (1, 2) for s in (3, 4, 5)}
    assert [e["collective_seq_id"] for e in rows] == sorted(e["collective_seq_id"] for e in rows)
    r = server.client.get("/api/v1/jobs/healthy_4/timeline", params={"limit": 2})
    assert len(r.json()["entries"]) == 2
    assert server.client.get("/api/v1/jobs/nope/timeline").status_code == 404


def test_retention_deletes_old_entries_and_keeps_findings(server: Server) -> None:
    stuck, _finals, t_k = healthy_prefix(10)
    server.clock.now_ns = t_k + int((STALL_S + 1) * NS)
    server.push(stuck)
    server.diagnose()
    assert server.counts()["entries"] > 0
    server.clock.advance(server.svc.settings.retention_days * 86400 + 60)
    deleted = server.svc.run_retention()
    counts = server.counts()
    assert deleted > 0 and counts["entries"] == 0
    assert counts["findings"] == 1
    assert counts["ingested_batches"] == 0


def test_entry_window_keeps_each_ranks_newest_entries_and_the_findings(
    database_url: str, clock: FakeClock
) -> None:
    srv = make_server(database_url, clock, entries_per_rank=4)
    try:
        stuck, _finals, t_k = healthy_prefix(10)
        clock.now_ns = t_k + int((STALL_S + 1) * NS)
        srv.push(stuck)
        srv.diagnose()
        with srv.svc.db.read() as session:
            before = store.load_entries(session=session, job_id=1)
        assert all(len(es) > 4 for es in before.values())
        deleted = srv.svc.trim_entries()
        with srv.svc.db.read() as session:
            after = store.load_entries(session=session, job_id=1)
        assert deleted == sum(len(es) - 4 for es in before.values())
        for rank, es in before.items():
            top = max(e.record_id for e in es)
            assert [e.record_id for e in after[rank]] == list(range(top - 3, top + 1))
        assert srv.counts()["findings"] == 1
        srv.diagnose()  # the in-memory summaries keep the history: the verdict stands
        assert srv.job("healthy_4")["findings"][0]["culprit_ranks"] == [3]
    finally:
        srv.svc.close()


def test_entries_read_a_few_ranks_at_a_time_are_the_jobs_entries(server: Server) -> None:
    """`store.rank_entries` (the restart's rebuild reads it, issue 22): what `load_entries`
    gives, a rank at a time in the order asked, ranks without entries left out."""
    stuck, _finals, t_k = healthy_prefix(10)
    server.clock.now_ns = t_k + int((STALL_S + 1) * NS)
    server.push(stuck)
    with server.svc.db.read() as session:
        whole = store.load_entries(session=session, job_id=1)
        for per_read in (1, 3, 16):
            ranks = [3, 99, 1, 0, 2]
            got = list(store.rank_entries(session=session, job_id=1, ranks=ranks, per_read=per_read))
            assert [r for r, _ in got] == [3, 1, 0, 2]
            assert dict(got) == whole
