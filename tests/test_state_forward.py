"""State only moves forward: an older batch arriving after a newer one changes nothing that the
newer one said, in the store (SQLite and PostgreSQL) and in the live summaries.

The collector's `--requeue-dead-letters` sends old batches last, and a retried batch can be
overtaken by a newer one. Batches go through the real app (ingest route, group commit, store,
live fold); the data is the committed real gloo job `healthy_4`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import pytest

from flightdeck.analysis import add_entries, summarize
from flightdeck.records import Entry, RankDump
from flightdeck.server import store
from flightdeck.server.live import JobState
from flightdeck.wire import Snapshot
from tests.support.clock import FakeClock
from tests.support.server_app import STALL_S, Server, healthy_prefix, make_server

NS = 1_000_000_000
JOB = "healthy_4"


@pytest.fixture
def server(database_url: str, clock: FakeClock) -> Iterator[Server]:
    """A server on a fresh database (SQLite file or PostgreSQL schema), workers off."""
    srv = make_server(database_url, clock)
    yield srv
    srv.svc.close()


def _completed(e: Entry) -> Entry:
    return replace(
        e,
        state="completed",
        retired=True,
        time_started_ns=e.time_created_ns + 1000,
        time_completed_ns=e.time_created_ns + 2000,
        duration_ms=0.001,
    )


def _in_flight(e: Entry) -> Entry:
    return replace(e, state="started", retired=False, time_completed_ns=None, duration_ms=None)


def newer_and_older() -> tuple[list[Snapshot], list[Snapshot]]:
    """Each rank's final snapshot with every entry completed (newer), and the same rank 5 s
    earlier, its last three collectives still in flight (older; periodic)."""
    _, finals, _ = healthy_prefix(10)
    newer, older = [], []
    for s in finals:
        done = [_completed(e) for e in s.entries]
        newer.append(replace(s, entries=done, columns=None))
        back = [*done[:-3], *(_in_flight(e) for e in done[-3:])]
        older.append(
            replace(
                s, entries=back, kind="periodic", snapshot_time_ns=s.snapshot_time_ns - 5 * NS, columns=None
            )
        )
    return newer, older


def stored(srv: Server) -> tuple[dict[int, list[Entry]], dict[int, int]]:
    """The job's entries per rank and each rank's stored snapshot time."""
    with srv.svc.db.read() as session:
        job = store.get_job(session=session, name=JOB)
        assert job is not None
        entries = store.load_entries(session=session, job_id=job.id)
        ranks = {r.rank: r.last_snapshot_ns for r, _ in store.job_ranks(session=session, job_id=job.id)}
    return entries, ranks


def test_an_older_batch_after_a_newer_one_moves_nothing_back(server: Server) -> None:
    newer, older = newer_and_older()
    server.clock.now_ns = max(s.snapshot_time_ns for s in newer) + NS
    assert server.push(newer).status_code == 200
    server.diagnose()
    entries_before, ranks_before = stored(server)
    assert all(e.state == "completed" and e.retired for es in entries_before.values() for e in es)
    r = server.push(older)
    assert r.status_code == 200 and r.json()["duplicate"] is False  # applied, not refused
    entries, ranks = stored(server)
    assert entries == entries_before  # state, retired, times, frames: all as the newer batch left them
    assert ranks == ranks_before == {s.rank: s.snapshot_time_ns for s in newer}
    timeline = server.client.get(f"/api/v1/jobs/{JOB}/timeline", params={"group": "0"}).json()["entries"]
    assert timeline and {(e["state"], e["retired"]) for e in timeline} == {("completed", True)}

    # The live view: long after, the older in-flight collectives must not look hung.
    server.clock.advance(10 * STALL_S)
    server.diagnose()
    js = server.svc.live.jobs[next(iter(server.svc.live.jobs))]
    assert js.summaries is not None
    for s in js.summaries.values():
        assert s.snapshot_time_ns == ranks_before[s.rank] and s.kind == "final"
        track = s.tracks["0"]
        assert all(e.state == "completed" and e.retired for e in track.tail)
    doc = server.job(JOB)
    assert doc["findings"] == []
    assert doc["status"] == "finished"

    # A restarted server rebuilds the summaries from the store: the newer state there too.
    url = server.svc.settings.effective_database_url
    again = make_server(url, server.clock)
    try:
        # An ended job is not held in memory after a restart; this one is asked for.
        assert again.svc.live.jobs == {}
        js = again.svc.live.jobs[js.job_id] = JobState(job_id=js.job_id, name=JOB, attempt=0, dirty=True)
        again.diagnose()
        assert js.summaries is not None and len(js.summaries) == 4
        assert all(e.finished for s in js.summaries.values() for e in s.tracks["0"].tail)
        assert again.job(JOB)["findings"] == []
    finally:
        again.svc.close()


def test_an_older_batch_still_fills_in_what_the_newer_one_lacks(server: Server) -> None:
    """Forward only, nothing lost: the older batch's collectives that the newer one did not
    carry (a delta snapshot) are added, in place, and its frames fill rows that had none."""
    newer, older = newer_and_older()
    server.clock.now_ns = max(s.snapshot_time_ns for s in newer) + NS
    # The newer batch carries only the last 10 entries of each rank, without frames.
    delta = [
        replace(s, entries=[replace(e, frames=()) for e in s.entries[-10:]], columns=None) for s in newer
    ]
    assert server.push(delta).status_code == 200
    server.diagnose()
    assert server.push(older).status_code == 200
    entries, _ = stored(server)
    for s_new, s_old in zip(newer, older, strict=True):
        got = entries[s_new.rank]
        assert [e.record_id for e in got] == [e.record_id for e in s_old.entries]
        # The first 11: only the older batch had them; the last 10: the newer state, older frames.
        assert got[:-10] == s_old.entries[:-10]
        assert all(e.state == "completed" and e.retired for e in got[-10:])
        assert [e.frames for e in got[-10:]] == [e.frames for e in s_old.entries[-10:]]
    server.clock.advance(10 * STALL_S)
    server.diagnose()
    js = server.svc.live.jobs[next(iter(server.svc.live.jobs))]
    assert js.summaries is not None
    for s in js.summaries.values():
        track = s.tracks["0"]
        seqs = list(track.seqs)
        assert seqs == sorted(seqs) and seqs == [e.collective_seq_id for e in older[0].entries]
        assert all(e.state == "completed" for e in track.tail)
    assert server.job(JOB)["findings"] == []


def _dump(entries: list[Entry]) -> RankDump:
    return RankDump(rank=0, source="t", version="2.10", entries=entries, snapshot_time_ns=1)


def test_summary_keeps_the_furthest_state_and_sequence_order() -> None:
    """`add_entries` (the live fold, shared with the offline merge): an entry seen further along
    is not moved back, and collectives older than the track's newest go in their place."""
    _, finals, _ = healthy_prefix(10)
    done = [_completed(e) for e in finals[0].entries]
    s = summarize(_dump(done[10:]))
    add_entries(s, [_in_flight(e) for e in done])
    track = s.tracks["0"]
    assert list(track.seqs) == [e.collective_seq_id for e in done]
    assert [e.collective_seq_id for e in track.tail] == [e.collective_seq_id for e in done[-4:]]
    assert all(e.state == "completed" for e in track.tail)
    # Forward still works.
    s2 = summarize(_dump([_in_flight(e) for e in done]))
    add_entries(s2, done[-2:])
    assert [e.state for e in s2.tracks["0"].tail] == ["started", "started", "completed", "completed"]
