"""Progress evidence through the server, in-process on real SQLite and real PostgreSQL: the wire
batch -> the store (`ranks.progress`, frames by stack id) -> live summaries -> a `slow_rank`
finding, the same after a restart (summaries rebuilt from the database), and the plain hang once
the evidence is older than `stall_after_s`.

The job is the committed `skip` dumps of a real gloo job (rank 2 went on without seq 12, the
others wait in it), with rank 2's snapshot carrying a busy main thread.
"""

from __future__ import annotations

from dataclasses import replace

from flightdeck.records import Frame, Progress
from flightdeck.wire import Snapshot
from tests.support.clock import FakeClock
from tests.support.server_app import NS, STALL_S, make_server
from tests.support.server_batches import skip_stuck_view

SAVE = (
    Frame("_write", "/venv/lib/python3.11/site-packages/torch/serialization.py", 650),
    Frame("save_checkpoint", "/job/train.py", 88),
)


def _busy_view(now_ns: int) -> list[Snapshot]:
    """The stuck view, rank 2's main thread busy up to `now_ns` (its newest sample)."""
    out = []
    for s in skip_stuck_view():
        if s.rank == 2:
            p = Progress(now_ns, active_ns=now_ns, since_ns=now_ns - 60 * NS, cpu_ns=55 * NS, cpu_share=0.9)
            s = replace(s, snapshot_time_ns=now_ns, progress=replace(p, state="R", frames=SAVE))
        out.append(s)
    return out


def test_a_busy_culprit_is_slow_live_and_after_a_restart_then_hung_when_its_evidence_ages(
    database_url: str, clock: FakeClock
) -> None:
    entered = max(e.time_created_ns for s in skip_stuck_view() for e in s.entries)
    clock.now_ns = entered + int((STALL_S + 1) * NS)
    first = make_server(database_url, clock, slow_ceiling_s=60.0)  # the job's timeout is 6 s
    try:
        assert first.push(_busy_view(clock.now_ns)).status_code == 200
        first.diagnose()
        doc = first.job("skip")
        slow = [f for f in doc["findings"] if f["kind"] == "slow_rank"]
        assert [f["kind"] for f in doc["findings"]] == ["slow_rank"], [f["detail"] for f in doc["findings"]]
        assert slow[0]["culprit_ranks"] == [2] and slow[0]["waiting_ranks"] == [0, 1, 3]
        assert "rank 2 is busy in save_checkpoint (train.py:88), 90% of a core" in slow[0]["detail"]
        assert doc["status"] != "hung"
    finally:
        first.svc.close()
    # A restarted server rebuilds the summaries, evidence included, from the database.
    second = make_server(database_url, clock, slow_ceiling_s=60.0)
    try:
        second.diagnose()
        doc = second.job("skip")
        assert [f["kind"] for f in doc["findings"]] == ["slow_rank"], doc["findings"]
        frames = doc["findings"][0]["culprit_frames"]
        assert [(f["name"], f["line"]) for f in frames] == [("_write", 650), ("save_checkpoint", 88)]
        # No new evidence for longer than stall_after: it says nothing about now; the hang stands.
        clock.advance(STALL_S + 1)
        second.diagnose()
        doc = second.job("skip")
        assert doc["findings"][0]["kind"] == "hang" and doc["findings"][0]["culprit_ranks"] == [2]
    finally:
        second.svc.close()
