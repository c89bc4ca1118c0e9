"""The live server judges with the same rules as `flightdeck analyze` (issue 26): a healthy job whose
ranks were snapshotted mid-collective, at different moments, is never called hung, however long
after the snapshots the server looks again.

The snapshots are the raw PyTorch dumps of real healthy gloo jobs (tests/data/fr/healthy_*_raw),
shipped as a collector would ship them: each with the time it was taken (just after the newest
entry it holds) and the agent's snapshot interval. The server runs in-process on real SQLite and
PostgreSQL with its clock in the test's hand.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from flightdeck.readers.fr.files import read_dump_file
from flightdeck.wire import Snapshot, snapshot_from_dump
from tests.support.clock import FakeClock
from tests.support.server_app import NS, STALL_S, Server, make_server
from tests.support.server_batches import FR_DATA

FAULT_KINDS = {"hang", "state_mismatch", "rank_lost", "size_mismatch", "collective_type_mismatch"}


def _as_snapshots(scenario: str, job: str) -> list[Snapshot]:
    """Each rank's raw pickle as a periodic snapshot taken 50 ms after its newest entry began."""
    out = []
    for p in sorted((FR_DATA / scenario / "pickle").glob("comm_lib_trace_rank_*")):
        d = read_dump_file(Path(p))
        taken = max(e.time_created_ns for e in d.entries) + NS // 20
        d = replace(d, kind="periodic", snapshot_time_ns=taken, interval_s=1.0, world_size=4, host="node-a")
        out.append(snapshot_from_dump(d, job=job))
    assert len(out) == 4
    return out


@pytest.mark.parametrize("scenario", ["healthy_midtrain_raw", "healthy_exit_raw"])
def test_a_healthy_job_snapshotted_mid_collective_is_never_hung(
    database_url: str, clock: FakeClock, scenario: str
) -> None:
    snaps = _as_snapshots(scenario, job=scenario)
    newest = max(s.snapshot_time_ns for s in snaps)
    srv: Server = make_server(database_url, clock)
    try:
        clock.now_ns = newest + NS // 10
        assert srv.push(snaps).status_code == 200
        # Well past stall_after (and past several snapshot intervals) with nothing newer.
        for later_s in (STALL_S + 1, STALL_S + 10, STALL_S + 40):
            clock.now_ns = newest + int(later_s * NS)
            srv.diagnose()
            doc = srv.job(scenario)
            kinds = [f["kind"] for f in doc["findings"]]
            assert not FAULT_KINDS & set(kinds), [f["detail"] for f in doc["findings"]]
            assert doc["status"] not in ("hung", "lost", "mismatch")
    finally:
        srv.svc.close()
