"""End to end, with real processes: a `flightdeck server` (SQLite and PostgreSQL) and a `flightdeck
collector` watching a spool that holds a healthy job's real dumps (copied: fresh file times) and,
for another job, a dump the store must not take. The collector's check (`flightdeck.snapshot_check`)
refuses by the server's rules (`flightdeck.limits`), so the bad dump is quarantined alone before it
joins a batch; the server's own refusal of a snapshot is exercised with a batch sent straight to
it over HTTP: 422 naming the snapshot, the valid snapshots of the same batch applied. Nothing of the
healthy job is lost, and the collector keeps running (later snapshots of the healthy job arrive).
"""

from __future__ import annotations

import gzip
import json
import pickle
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from flightdeck.readers.fr.decode import load_raw
from flightdeck.wire import encode_batch
from tests.support.collector_fixtures import FR_DATA
from tests.support.collector_stack import Collector, Server, expected, stop_promptly, timeline
from tests.support.server_batches import make_batch, scenario_dumps, snapshots
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.fixture
def server(tmp_path: Path, database_url: str) -> Iterator[Server]:
    s = Server(tmp_path / "server-data", tmp_path / "server.log")
    # A fresh PostgreSQL schema is migrated only when told.
    s.env.update({"FLIGHTDECK_SERVER_DATABASE_URL": database_url, "FLIGHTDECK_SERVER_MIGRATE": "true"})
    try:
        yield s
    finally:
        s.stop()


def _copy_fresh(src_dir: Path, dest: Path, pattern: str) -> None:
    """Copy dumps as a user does: new files, fresh file times (not copy2's preserved ones)."""
    dest.mkdir(parents=True, exist_ok=True)
    for p in sorted(src_dir.glob(pattern)):
        shutil.copyfile(p, dest / p.name)


def _fake_rank(dest: Path) -> None:
    """healthy_4's rank 1 copied as `rank_21.pkl` of another job, its sidecar saying rank 21 and no
    world size: only the dump's own process groups (members 0..3) tell that rank 21 is not one."""
    src = FR_DATA / "healthy_4" / "rank_1.pkl"
    meta = json.loads(src.with_name(src.name + ".meta.json").read_text())
    meta.update({"job": "copiedjob", "rank": 21})
    del meta["world_size"]
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "rank_21.pkl.meta.json").write_text(json.dumps(meta))
    (dest / "rank_21.pkl").write_bytes(pickle.dumps(load_raw(src.read_bytes()), protocol=4))


def test_a_bad_item_is_set_aside_alone_and_the_healthy_job_arrives_whole(
    tmp_path: Path, server: Server
) -> None:
    spool = tmp_path / "spool"
    healthy = spool / "healthy_4" / "0"
    _copy_fresh(FR_DATA / "healthy_4", healthy, "rank_[0-9].pkl*")  # the periodic snapshots first
    _fake_rank(spool / "copiedjob" / "0")
    token_file = tmp_path / "token"
    token = server.token("create", "node-a")
    token_file.write_text(token + "\n")
    server.start()
    collector = Collector(tmp_path, server.url, token_file, spool, None)
    collector.start()
    try:
        wait_until(lambda: timeline(server, "healthy_4") == expected(healthy), 60, "the periodic snapshots")
        wait_until(
            lambda: collector.metric("flightdeck_collector_parse_errors_total", reason="invalid") == 1,
            30,
            "the fake rank quarantined",
        )
        reasons = [
            json.loads(p.read_text()) for p in (tmp_path / "collector-state" / "quarantine").glob("*.reason")
        ]
        assert [r["path"].rsplit("/", 1)[1] for r in reasons] == ["rank_21.pkl"]
        assert "rank: 21 is a member of none of its dump's process groups" in reasons[0]["error"]
        assert timeline(server, "copiedjob") == {}

        # The server's side: one batch, a valid snapshot and one it refuses (a world of 0 ranks).
        dumps = scenario_dumps("healthy_2")
        good = snapshots([dumps[0][-1]], job="direct")
        bad = snapshots([dumps[1][-1]], job="direct-bad")
        bad[0].world_size = 0
        doc = encode_batch(make_batch([*good, *bad], sent_at_ns=1_800_000_000 * 10**9))
        resp = httpx.post(
            f"{server.url}/api/v1/ingest",
            content=gzip.compress(json.dumps(doc).encode()),
            headers={
                "Authorization": f"Bearer {token}",
                "Content-Encoding": "gzip",
                "Content-Type": "application/json",
            },
            timeout=30,
        )
        assert resp.status_code == 422, resp.text
        answer = resp.json()
        assert answer["applied"] is True and answer["refused_count"] == 1, answer
        assert "world_size" in answer["detail"] and "world_size" in json.dumps(answer["refused"])
        assert {k[0] for k in timeline(server, "direct")} == {0}
        assert len(timeline(server, "direct")) == len(good[0].entries)
        assert timeline(server, "direct-bad") == {}

        # The collector kept running: the healthy job's final snapshots arrive, every entry merged.
        _copy_fresh(FR_DATA / "healthy_4", healthy, "rank_[0-9].final.pkl*")
        wait_until(lambda: timeline(server, "healthy_4") == expected(healthy), 60, "the final snapshots")
        assert collector.proc is not None and collector.proc.poll() is None
        assert collector.metric("flightdeck_collector_dead_letter_batches") == 0
        assert collector.metric("flightdeck_collector_batches_failed_total", reason="rejected") == 0
        assert collector.metric("flightdeck_collector_parse_errors_total", reason="invalid") == 1
    finally:
        stop_promptly(collector)
    assert (spool / "copiedjob" / "0" / "rank_21.pkl").exists() is False  # moved to the quarantine


def test_a_dump_copied_from_another_host_is_dead_lettered_alone(tmp_path: Path, server: Server) -> None:
    """A host-bound token (`--host vm`, the host the committed dumps were recorded on) and, beside
    the healthy job, a dump copied from another node (its sidecar names host 'othernode'): it passes
    the collector's check (the collector does not know its token's scope), the server refuses that
    snapshot alone (422), the collector dead-letters it alone and the healthy job arrives whole."""
    spool = tmp_path / "spool"
    healthy = spool / "healthy_4" / "0"
    _copy_fresh(FR_DATA / "healthy_4", healthy, "rank_[0-9].pkl*")
    src = FR_DATA / "healthy_2" / "rank_0.pkl"
    meta = json.loads(src.with_name(src.name + ".meta.json").read_text())
    meta.update({"job": "copied", "host": "othernode"})
    stray = spool / "copied" / "0"
    _copy_fresh(src.parent, stray, "rank_0.pkl")
    (stray / "rank_0.pkl.meta.json").write_text(json.dumps(meta))
    token_file = tmp_path / "token"
    token_file.write_text(server.token("create", "node-vm", "--host", "vm") + "\n")
    server.start()
    collector = Collector(tmp_path, server.url, token_file, spool, None, host="vm")
    collector.start()
    try:
        wait_until(lambda: timeline(server, "healthy_4") == expected(healthy), 60, "the healthy job")
        wait_until(
            lambda: collector.metric("flightdeck_collector_dead_letter_batches") == 1,
            30,
            "the stray dead-lettered",
        )
        _copy_fresh(FR_DATA / "healthy_4", healthy, "rank_[0-9].final.pkl*")
        wait_until(lambda: timeline(server, "healthy_4") == expected(healthy), 60, "the final snapshots")
        assert timeline(server, "copied") == {}
        assert collector.metric("flightdeck_collector_dead_letter_batches") == 1
        assert collector.metric("flightdeck_collector_auth_failures_total") == 0
        assert collector.proc is not None and collector.proc.poll() is None
        assert "the snapshot is of host 'othernode'" in collector.log.read_text()
    finally:
        stop_promptly(collector)
