"""The collector daemon in-process: real dumps in a spool, a real HTTP recorder, a real SQLite queue."""

from __future__ import annotations

import gzip
import json
import os
import pickle
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from flightdeck.collector.daemon import GROUPS_RESEND_S
from flightdeck.collector.nixl_consumer import OwnerFinder
from flightdeck.collector.queue import NewBatch
from flightdeck.readers.fr.decode import load_raw
from flightdeck.readers.fr.files import read_dump_file
from tests.support.collector_fixtures import FR_DATA, NIXL_DATA, spool_scenario, thread_guard
from tests.support.collector_harness import Harness, settings_for, stand_ins
from tests.support.collector_recorder import Recorder, wait_for


@pytest.fixture(autouse=True)
def _no_leaked_threads() -> Iterator[None]:
    yield from thread_guard()


@pytest.fixture
def harness(tmp_path: Path, recorder: Recorder) -> Iterator[Harness]:
    h = Harness(settings_for(tmp_path, recorder.url))
    yield h
    h.close()


# --- shipping and deltas ----------------------------------------------------------------------


def test_real_dumps_are_shipped_then_only_changed_entries(
    tmp_path: Path, recorder: Recorder, harness: Harness
) -> None:
    agents = stand_ins(tmp_path / "spool", "healthy_4")
    for a in agents.values():
        a.write()

    harness.flush_and_push()

    rows = recorder.entry_rows()
    expected = {(r, e["record_id"]) for r, a in agents.items() for e in a.entries}
    assert {(row[2], row[3]) for row in rows} == expected
    assert len(rows) == len(expected)  # each entry once
    assert all(row[0] == "healthy_4" and not row[5] for row in rows)
    doc = recorder.docs()[0]
    assert doc["collector"]["host"] == "node-a" and doc["wire_version"] == 2
    snap = doc["snapshots"][0]
    assert snap["world_size"] == 4 and snap["kind"] == "periodic" and snap["host"]
    _, _, headers = recorder.requests[0]
    assert headers["authorization"] == "Bearer s3cret"
    assert headers["content-encoding"] == "gzip"
    assert headers["idempotency-key"] == doc["batch_id"]
    assert 0 <= int(headers["flightdeck-batch-age-ms"]) < 60_000  # how long it waited in the queue

    # Rank 1 finishes three collectives; rank 2 rewrites an unchanged ring (a heartbeat).
    done = agents[1].finish(3)
    agents[1].write()
    agents[2].write()
    recorder.batches.clear()
    harness.flush_and_push()

    snaps = {s["rank"]: s for d in recorder.docs() for s in d["snapshots"]}
    assert set(snaps) == {1, 2}
    cols = snaps[1]["entries"]
    assert list(zip(cols["rid"], cols["ret"], strict=True)) == [(rid, True) for rid in done]
    assert snaps[2]["entries"]["n"] == 0
    assert harness.metric("flightdeck_collector_files_seen_total") == 6


def test_groups_ship_when_new_then_again_only_after_the_resend_interval(
    tmp_path: Path, recorder: Recorder
) -> None:
    now = [1000.0]
    h = Harness(settings_for(tmp_path, recorder.url), monotonic=lambda: now[0])
    try:
        agents = stand_ins(tmp_path / "spool", "healthy_4")
        for a in agents.values():
            a.write()
        h.flush_and_push()
        first = {s["rank"]: s for d in recorder.docs() for s in d["snapshots"]}
        assert set(first) == {0, 1, 2, 3}
        assert all(s["groups"]["0"]["ranks"] == [0, 1, 2, 3] for s in first.values())

        def ship_rank_1() -> dict[str, Any]:
            assert agents[1].finish(1)
            agents[1].write()
            recorder.batches.clear()
            h.flush_and_push()
            (snap,) = [s for d in recorder.docs() for s in d["snapshots"]]
            assert snap["rank"] == 1 and snap["entries"]["n"]
            out: dict[str, Any] = snap
            return out

        now[0] += 1.0
        assert ship_rank_1()["groups"] == {}  # unchanged: the server has them
        now[0] += GROUPS_RESEND_S
        assert ship_rank_1()["groups"] == first[1]["groups"]  # resent after the interval
    finally:
        h.close()


def test_frames_of_a_final_snapshot_reship_entries_sent_without(
    tmp_path: Path, recorder: Recorder, harness: Harness
) -> None:
    d = spool_scenario(tmp_path / "spool", "healthy_2", periodic_only=True)
    harness.flush_and_push()
    periodic = {(r[2], r[3]) for r in recorder.entry_rows()}
    assert periodic and not any(r[6] for r in recorder.entry_rows())
    recorder.batches.clear()

    for rank in (0, 1):
        for suffix in ("", ".meta.json"):
            name = f"rank_{rank}.final.pkl{suffix}"
            shutil.copy2(FR_DATA / "healthy_2" / name, d / name)
    harness.flush_and_push()

    rows = recorder.entry_rows()
    final = {
        (rank, e.record_id) for rank in (0, 1) for e in read_dump_file(d / f"rank_{rank}.final.pkl").entries
    }
    assert {(r[2], r[3]) for r in rows} == final  # the periodic ones again (now with frames), plus new
    assert all(r[6] for r in rows)
    kinds = {s["kind"] for doc in recorder.docs() for s in doc["snapshots"]}
    assert kinds == {"final"}


def test_restart_does_not_ship_again_what_was_shipped(tmp_path: Path, recorder: Recorder) -> None:
    spool_scenario(tmp_path / "spool", "healthy_4")
    first = Harness(settings_for(tmp_path, recorder.url))
    first.flush_and_push()
    first.close()
    n = len(recorder.entry_rows())
    assert n > 0

    docs = len(recorder.docs())
    second = Harness(settings_for(tmp_path, recorder.url))
    try:
        second.flush_and_push()
        assert second.metric("flightdeck_collector_files_seen_total") == 0  # none read again
    finally:
        second.close()

    assert len(recorder.entry_rows()) == n
    # No snapshot again either (its time would move the job's last_seen): one heartbeat only.
    assert [d["snapshots"] for d in recorder.docs()[docs:]] == [[]]


# --- bad input --------------------------------------------------------------------------------


class _Evil:
    """Unpickling this with plain pickle would run a shell command that creates a marker file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (os.system, (f"touch {self.marker}",))


def test_bad_files_are_quarantined_with_reasons_and_the_rest_ships(
    tmp_path: Path, recorder: Recorder
) -> None:
    harness = Harness(settings_for(tmp_path, recorder.url, max_dump_bytes=64 * 1024))
    good = spool_scenario(tmp_path / "spool", "healthy_2", periodic_only=True)
    bad = tmp_path / "spool" / "badjob" / "0"
    bad.mkdir(parents=True)
    real = (FR_DATA / "healthy_2" / "rank_0.final.pkl").read_bytes()
    raw = load_raw(real)
    marker = tmp_path / "pwned"
    (bad / "rank_0.pkl").write_bytes(real[: len(real) // 2])  # truncated
    (bad / "rank_1.pkl").write_bytes(pickle.dumps({"version": "2.10", "entries": [_Evil(marker)]}))
    (bad / "rank_2.pkl").write_bytes(os.urandom(3000))  # garbage
    (bad / "rank_3.pkl").write_bytes(b"\x80" + b"\0" * (100 * 1024))  # over max_dump_bytes
    (bad / "rank_4.pkl").write_bytes(pickle.dumps(dict(raw, version="3.0")))
    torch_dir = tmp_path / "torch"
    torch_dir.mkdir()
    (torch_dir / "comm_lib_trace_rank_0").write_bytes(b"not a dump at all")
    try:
        for _ in range(3):  # first look, second look (stable and still bad), torch files settle
            harness.flush_and_push()

        qdir = tmp_path / "state" / "quarantine"
        reasons = {
            json.loads(p.read_text())["path"]: json.loads(p.read_text())["reason"]
            for p in qdir.glob("*.reason")
        }
        assert reasons == {
            str(bad / "rank_0.pkl"): "truncated",
            str(bad / "rank_1.pkl"): "unsafe_pickle",
            str(bad / "rank_2.pkl"): "not_a_dump",
            str(bad / "rank_3.pkl"): "too_large",
            str(bad / "rank_4.pkl"): "unsupported_version",
            str(torch_dir / "comm_lib_trace_rank_0"): "not_a_dump",
        }
        assert not marker.exists()  # the malicious pickle ran nothing
        assert sorted(p.name for p in bad.iterdir()) == []  # spool files moved out
        assert (torch_dir / "comm_lib_trace_rank_0").exists()  # torch's own file copied, left in place
        assert harness.metric("flightdeck_collector_quarantined_total") == 6
        assert harness.metric("flightdeck_collector_parse_errors_total", reason="not_a_dump") == 2
        assert harness.metric("flightdeck_collector_parse_errors_total", reason="unsafe_pickle") == 1
        # The good files in the same spool were shipped all the same.
        assert {r[2] for r in recorder.entry_rows()} == {0, 1}
        assert all(r[0] == "healthy_2" for r in recorder.entry_rows())
        assert good.exists()
        n_reasons = len(reasons)
        harness.flush_and_push()  # the torch file is not copied again while it is unchanged
        assert len(list(qdir.glob("*.reason"))) == n_reasons
    finally:
        harness.close()


def test_half_written_torch_dump_is_read_once_complete_not_quarantined(
    tmp_path: Path, recorder: Recorder, harness: Harness
) -> None:
    data = (FR_DATA / "healthy_2" / "rank_1.final.pkl").read_bytes()
    torch_dir = tmp_path / "torch"
    torch_dir.mkdir()
    target = torch_dir / "comm_lib_trace_rank_1"
    target.write_bytes(data[:1000])  # PyTorch still writing
    harness.flush_and_push()  # first look
    harness.flush_and_push()  # unchanged: read, fails (truncated), looked at again later
    assert recorder.entry_rows() == []
    target.write_bytes(data)  # the write completes before the failure is confirmed
    for _ in range(3):
        harness.flush_and_push()

    assert not list((tmp_path / "state" / "quarantine").iterdir())
    rows = recorder.entry_rows()
    assert {r[3] for r in rows} == {e.record_id for e in read_dump_file(target).entries}
    assert {(r[0], r[2]) for r in rows} == {("torch-node-a", 1)}


# --- queue bounds -----------------------------------------------------------------------------


def test_full_queue_holds_new_snapshots_back_and_loses_nothing(tmp_path: Path, recorder: Recorder) -> None:
    harness = Harness(settings_for(tmp_path, recorder.url, max_queue_bytes=65536))
    try:
        # A queued batch fills the queue (the server refuses it later as not gzip'd JSON).
        assert harness.collector.queue.enqueue([NewBatch("filler", "fr", 0, os.urandom(65000))])
        agents = stand_ins(tmp_path / "spool", "healthy_2")
        for a in agents.values():
            a.write()
        result = harness.collector.flush()
        assert result.refused and result.batches == 0
        agents[0].finish(2)
        agents[0].write()  # the newest file supersedes the one held back
        assert harness.collector.flush().refused
        assert harness.metric("flightdeck_collector_enqueue_refused_total", kind="snapshots") == 2
        assert harness.metric("flightdeck_collector_queue_bytes") == 65000

        assert harness.collector.pusher.drain(timeout_s=10)  # filler dead-lettered: room again
        harness.flush_and_push()

        assert harness.collector.queue.dead_letters()[0][:2] == ("filler", 400)
        rows = recorder.entry_rows()
        expected = {(r, e["record_id"], e["retired"]) for r, a in agents.items() for e in a.entries}
        assert {(r[2], r[3], r[5]) for r in rows} == expected
        assert len(rows) == len(expected)
    finally:
        harness.close()


# --- NIXL -------------------------------------------------------------------------------------


def test_nixl_ring_and_store_samples_are_shipped(tmp_path: Path, recorder: Recorder) -> None:
    ring_dir, mp_dir = tmp_path / "nixl-ring", tmp_path / "nixl-mp"
    shutil.copytree(NIXL_DATA / "ring-1.5.1", ring_dir)
    shutil.copytree(NIXL_DATA / "mp-1.5.1", mp_dir)
    expected = json.loads((NIXL_DATA / "expected.json").read_text())["1.5.1"]
    (tmp_path / "proc").mkdir()
    harness = Harness(
        settings_for(tmp_path, recorder.url, nixl_telemetry_dir=ring_dir, nixl_multiproc_dir=mp_dir),
        nixl_owner_finder=OwnerFinder(tmp_path / "proc"),
    )
    try:
        harness.flush_and_push()
        samples = {(s["source"], s["agent"]): s for s in recorder.nixl()}
        ring1, ring2 = expected["ring"]
        _, mp2 = expected["mp"]
        ring = samples[("ring", "initiator")]
        assert ring["host"] == "node-a"
        assert ring["tx_bytes"] == ring2["tx_bytes"] - ring1["tx_bytes"]  # the unread phase-2 events
        assert ring["errors"] == {"not_found": 1}
        mp = samples[("mp", "initiator")]
        assert (mp["tx_bytes"], mp["pid"], mp["local_rank"]) == (mp2["tx_bytes"], mp2["pid"], 0)
        assert ("ring", "target") in samples and ("mp", "target") in samples
        before = len(recorder.docs())

        harness.flush_and_push()  # nothing new: no batch (heartbeats come once a minute)

        assert len(recorder.docs()) == before
    finally:
        harness.close()


# --- running: events, polling, metrics --------------------------------------------------------


# watchdog 7.1 warns (RuntimeWarning, in its inotify thread) when a directory created just after a
# recursive watch started is added twice; harmless, but `filterwarnings = error` would turn it into an
# exception that kills watchdog's shared inotify thread for the rest of the session.
@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:Callback with id:RuntimeWarning")
@pytest.mark.parametrize("polling", [False, True])
def test_running_daemon_ships_files_as_the_agent_writes_them(
    tmp_path: Path, recorder: Recorder, polling: bool
) -> None:
    # Rescans effectively off: what arrives is what the watcher's events reported.
    s = settings_for(
        tmp_path,
        recorder.url,
        polling=polling,
        poll_interval_s=0.05,
        rescan_interval_s=3600,
        metrics_listen="127.0.0.1:0",
    )
    (tmp_path / "spool").mkdir()
    harness = Harness(s)
    c = harness.collector
    c.start()
    runner = threading.Thread(target=c.run, name="test-collector-run")
    runner.start()
    try:
        agents = stand_ins(tmp_path / "spool", "healthy_2")
        for a in agents.values():
            a.write()
        total = sum(len(a.entries) for a in agents.values())
        wait_for(lambda: len(recorder.entry_rows()) == total, what="first snapshots")
        done = agents[1].finish(4)
        agents[1].write()
        wait_for(lambda: len(recorder.entry_rows()) == total + 4, what="changed entries")
        assert [r[3] for r in recorder.entry_rows()[total:]] == done

        assert c.metrics_port is not None
        text = httpx.get(f"http://127.0.0.1:{c.metrics_port}/metrics").text
        for name in (
            "flightdeck_collector_files_seen_total",
            "flightdeck_collector_batches_sent_total",
            "flightdeck_collector_queue_depth_batches",
            "flightdeck_collector_queue_bytes",
            "flightdeck_collector_push_lag_seconds",
        ):
            assert name in text
    finally:
        c.stop_event.set()
        runner.join(10)
        harness.close()


@pytest.mark.slow
def test_server_down_for_a_while_then_everything_arrives(tmp_path: Path, recorder: Recorder) -> None:
    recorder.stop()
    harness = Harness(settings_for(tmp_path, recorder.url))
    c = harness.collector
    c.start(metrics=False)
    try:
        agents = stand_ins(tmp_path / "spool", "healthy_4")
        for a in agents.values():
            a.write()
        c.flush()
        for a in agents.values():
            a.finish(5)
            a.write()
        c.flush()
        wait_for(
            lambda: harness.metric("flightdeck_collector_batches_failed_total", reason="connection") >= 3
        )
        assert harness.metric("flightdeck_collector_queue_depth_batches") == 2
        assert harness.metric("flightdeck_collector_push_lag_seconds") > 0
        recorder.start()
        wait_for(
            lambda: harness.metric("flightdeck_collector_queue_depth_batches") == 0, what="queue drained"
        )
        rows = recorder.entry_rows()
        finished = {(r, e["record_id"]) for r, a in agents.items() for e in a.entries if e["retired"]}
        assert {(r[2], r[3]) for r in rows if r[5]} == finished
        assert len({(r[2], r[3]) for r in rows}) == sum(len(a.entries) for a in agents.values())
    finally:
        harness.close()


def test_gzip_body_is_the_wire_batch(tmp_path: Path, recorder: Recorder, harness: Harness) -> None:
    """What is queued is exactly what is sent: gzip of the encoded batch, decodable by the server."""
    from flightdeck.wire import decode_batch

    spool_scenario(tmp_path / "spool", "healthy_2")
    harness.collector.flush()
    batch = harness.collector.queue.peek()
    assert batch is not None
    decoded = decode_batch(json.loads(gzip.decompress(batch.body)))
    assert decoded.batch_id == batch.batch_id and decoded.entry_count == batch.entries > 0
