"""Hostile and broken input on the collector's host, with the real collector process pushing to a real
`flightdeck server` process (SQLite): a FIFO where a dump belongs, dumps whose values the store cannot
hold next to a healthy job's. The healthy job's entries all arrive; the bad files are skipped or set
aside alone; the collector honours SIGTERM.
"""

from __future__ import annotations

import json
import os
import pickle
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from flightdeck.readers.fr.decode import load_raw
from flightdeck.readers.fr.files import read_dump_file
from flightdeck.wire import decode_batch
from tests.support.collector_fixtures import FR_DATA, spool_scenario, write_atomic
from tests.support.collector_stack import (
    Collector,
    Server,
    expected,
    stop_promptly,
    timeline,
)
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    with Server(tmp_path / "server-data", tmp_path / "server.log") as s:
        yield s


def start(tmp_path: Path, server: Server, spool: Path) -> Collector:
    token_file = tmp_path / "token"
    token_file.write_text(server.token("create", "node-a") + "\n")
    server.start()
    collector = Collector(tmp_path, server.url, token_file, spool, None)
    collector.start()
    return collector


def test_fifo_in_the_spool_never_blocks_the_collector(tmp_path: Path, server: Server) -> None:
    spool = tmp_path / "spool"
    healthy = spool_scenario(spool, "healthy_2")
    want = expected(healthy)
    # Named pipes where dumps belong: opening one for reading waits for a writer for ever.
    os.mkfifo(healthy / "rank_30.pkl")
    (spool / "other" / "0").mkdir(parents=True)
    os.mkfifo(spool / "other" / "0" / "rank_0.pkl")
    collector = start(tmp_path, server, spool)
    try:
        wait_until(lambda: timeline(server, "healthy_2") == want, 60, "the healthy job's entries")
        wait_until(
            lambda: collector.metric("flightdeck_collector_files_skipped_total", reason="fifo") == 2,
            30,
            "both FIFOs counted",
        )
        # A new snapshot of the healthy job is still read after the FIFOs were seen.
        raw = load_raw((healthy / "rank_0.pkl").read_bytes())
        meta = json.loads((healthy / "rank_0.pkl.meta.json").read_text())
        meta["snapshot_time_ns"] += 10**9
        raw["entries"] = [dict(e, retired=True) for e in raw["entries"]]
        write_atomic(healthy / "rank_0.pkl.meta.json", json.dumps(meta).encode())
        write_atomic(healthy / "rank_0.pkl", pickle.dumps(raw, protocol=4))
        wait_until(
            lambda: all(v[1] for k, v in timeline(server, "healthy_2").items() if k[0] == 0),
            60,
            "the rewritten rank 0 snapshot",
        )
        time.sleep(1.5)  # a rescan or two (rescan_interval_s = 1) look at the FIFOs again
        assert collector.metric("flightdeck_collector_files_skipped_total", reason="fifo") == 2
        log = collector.log.read_text()
        assert log.count("rank_30.pkl: not a regular file (a fifo)") == 1, log[-3000:]
        assert collector.metric("flightdeck_collector_dead_letter_batches") == 0
    finally:
        stop_promptly(collector)
    assert (healthy / "rank_30.pkl").exists()  # left where it was, not moved


def _bad_copy(dest: Path, rank: int, *, raw_change: Any = None, **meta_changes: Any) -> None:
    """A copy of healthy_2's rank 0 snapshot as `dest/rank_<rank>.pkl`, job 'badjob', changed."""
    src = FR_DATA / "healthy_2" / "rank_0.pkl"
    raw = load_raw(src.read_bytes())
    meta = json.loads(src.with_name(src.name + ".meta.json").read_text())
    meta.update({"job": "badjob", "rank": rank, "world_size": 8, **meta_changes})
    if raw_change is not None:
        raw_change(raw)
    dest.mkdir(parents=True, exist_ok=True)
    (dest / f"rank_{rank}.pkl.meta.json").write_text(json.dumps(meta))
    (dest / f"rank_{rank}.pkl").write_bytes(pickle.dumps(raw, protocol=4))


def _set_entries(**fields: Any) -> Any:
    def change(raw: dict[str, Any]) -> None:
        for e in raw["entries"]:
            e.update(fields)

    return change


def test_bad_dumps_are_set_aside_alone_and_the_healthy_job_arrives(tmp_path: Path, server: Server) -> None:
    spool = tmp_path / "spool"
    healthy = spool_scenario(spool, "healthy_4", periodic_only=True)
    bad = spool / "badjob" / "0"
    # Read in the same flushes as the healthy job's files, so they would share its batches.
    _bad_copy(bad, 0, raw_change=_set_entries(timeout_ms="600000"))  # a number as a string: normalized
    _bad_copy(bad, 1, pid=2**63)  # the store's integers are 64-bit signed
    _bad_copy(bad, 21, world_size=2)  # a rank outside its world (a copied dump renamed)
    _bad_copy(bad, 3, job="bad\x1b[31mjob")  # an ANSI escape sequence in a job name
    _bad_copy(bad, 4, raw_change=lambda raw: raw["entries"][0].update(record_id=2**64))
    _bad_copy(bad, 5, raw_change=lambda raw: raw["entries"].append(dict(raw["entries"][-1])))  # an id twice
    want = expected(healthy)
    collector = start(tmp_path, server, spool)
    try:
        wait_until(lambda: timeline(server, "healthy_4") == want, 60, "the healthy job's entries")
        wait_until(
            lambda: collector.metric("flightdeck_collector_parse_errors_total", reason="invalid") == 5,
            30,
            "the five invalid dumps quarantined",
        )
        # The one that could be normalized arrived, as its own rank.
        n0 = len(read_dump_file(FR_DATA / "healthy_2" / "rank_0.pkl").entries)
        wait_until(lambda: len(timeline(server, "badjob")) == n0, 30, "the normalized dump")
        assert {k[0] for k in timeline(server, "badjob")} == {0}
        assert collector.metric("flightdeck_collector_dead_letter_batches") == 0
        assert collector.metric("flightdeck_collector_batches_failed_total", reason="rejected") == 0
        reasons = {
            json.loads(p.read_text())["path"].rsplit("/", 1)[1]: json.loads(p.read_text())["error"]
            for p in (tmp_path / "collector-state" / "quarantine").glob("*.reason")
        }
        assert sorted(reasons) == ["rank_1.pkl", "rank_21.pkl", "rank_3.pkl", "rank_4.pkl", "rank_5.pkl"]
        assert "pid: 9223372036854775808 is not an int in [0, 2^63)" in reasons["rank_1.pkl"]
        assert "rank: 21 is not in [0, 2)" in reasons["rank_21.pkl"]
        assert "job: holds a control character" in reasons["rank_3.pkl"]
        assert "entries.record_id: 18446744073709551616 is not an int" in reasons["rank_4.pkl"]
        assert "appears twice" in reasons["rank_5.pkl"]
        assert sorted(p.name for p in bad.iterdir()) == ["rank_0.pkl", "rank_0.pkl.meta.json"]
    finally:
        stop_promptly(collector)


# --- a pickle that is small on disk and huge to walk ---------------------------------------------


def _crafted(entries: int, *, distinct: bool) -> bytes:
    """A real entry with a 200-frame stack, referenced `entries` times (0.8 MB for 400,000): the
    unpickler builds it once; normalizing walks every reference. With `distinct`, each entry is its
    own dict but all share the one stack."""
    raw = load_raw((FR_DATA / "healthy_2" / "rank_0.pkl").read_bytes())
    entry = dict(raw["entries"][0])
    entry["frames"] = [{"name": f"fn{i}", "filename": f"/src/mod{i}.py", "line": i} for i in range(200)]
    if distinct:
        raw["entries"] = [dict(entry, record_id=i) for i in range(entries)]
    else:
        raw["entries"] = [entry] * entries
    return pickle.dumps(raw, protocol=4)


@pytest.mark.parametrize(
    ("entries", "distinct", "message"),
    [
        (400_000, False, "400000 entries, over the budget of 100000 per file"),
        (90_000, False, "18000000 stack frames over 90000 entries, over the budget of 4000000"),
        (30_000, True, "6000000 stack frames over 30000 entries, over the budget of 4000000"),
    ],
)
def test_crafted_shared_references_are_refused_within_bounded_memory(
    tmp_path: Path, entries: int, distinct: bool, message: str
) -> None:
    import tracemalloc

    from flightdeck.readers.fr.errors import DumpBudgetError

    # Named as one of its pg_config's ranks (healthy_2: 0..1): a rank outside them is refused first.
    path = tmp_path / "rank_1.pkl"
    path.write_bytes(_crafted(entries, distinct=distinct))
    tracemalloc.start()
    try:
        with pytest.raises(DumpBudgetError, match=message):
            read_dump_file(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # Before the budget the 400,000-reference file reached 211 MB here (and 16.5 s of CPU).
    assert peak < 8 * path.stat().st_size + (16 << 20), f"peak {peak / 1e6:.1f} MB"


def test_crafted_pickle_is_quarantined_and_other_jobs_keep_flowing(tmp_path: Path) -> None:
    import httpx
    from prometheus_client import CollectorRegistry

    from flightdeck.collector.daemon import Collector as Daemon
    from flightdeck.collector.settings import CollectorSettings
    from tests.support.collector_recorder import Recorder

    spool = tmp_path / "spool"
    healthy = spool_scenario(spool, "healthy_4", periodic_only=True)
    bad = spool / "crafted" / "0"
    bad.mkdir(parents=True)
    (bad / "rank_7.pkl").write_bytes(_crafted(400_000, distinct=False))
    with Recorder() as rec, httpx.Client() as client:
        registry = CollectorRegistry()
        settings = CollectorSettings(
            server_url=rec.url,
            spool_dirs=[spool],
            torch_dump_prefixes=[],
            state_dir=tmp_path / "state",
            metrics_listen="",
            host="node-a",
            push_interval_s=0.05,
            rescan_interval_s=0.001,
        )
        daemon = Daemon(settings, client=client, registry=registry)
        try:
            daemon.flush()
            daemon.flush()  # a bad file is quarantined once it is seen unchanged a second time
            assert daemon.pusher.drain(timeout_s=10)
        finally:
            daemon.close(drain_s=0)
        got = {(s.job, s.rank) for d in rec.docs() for s in decode_batch(d).snapshots}
        assert got == {("healthy_4", r) for r in range(4)}
        assert (
            registry.get_sample_value("flightdeck_collector_parse_errors_total", {"reason": "over_budget"})
            == 1
        )
        [reason] = (tmp_path / "state" / "quarantine").glob("*.reason")
        assert "over the budget of 100000 per file" in json.loads(reason.read_text())["error"]
    assert not (bad / "rank_7.pkl").exists()
    assert len(expected(healthy)) == sum(1 for _ in rec.entry_rows())


# --- NIXL rings: headers checked against the geometry, silent losses exported -----------------------


def test_nixl_ring_losses_are_exported_and_a_bad_header_is_never_written_back(tmp_path: Path) -> None:
    import struct

    import httpx
    from prometheus_client import CollectorRegistry

    from flightdeck.collector.daemon import Collector as Daemon
    from flightdeck.collector.settings import CollectorSettings
    from tests.support.collector_recorder import Recorder

    def ring(capacity: int, events: list[tuple[int, int]], *, write_pos: int, read_pos: int = 0) -> bytes:
        slots = [struct.pack("<I4xQ", t, v) for t, v in events]
        body = b"".join(slots) + bytes(16 * (capacity - len(slots)))
        return struct.pack("<QQiiQQ", write_pos, read_pos, 4, 4, capacity, capacity - 1) + body

    nixl = tmp_path / "nixl"
    nixl.mkdir()
    # Full (capacity - 1 unread: NIXL is discarding new events), two of them of an unknown type.
    (nixl / "full").write_bytes(ring(8, [(2, 1)] * 5 + [(77, 1), (99, 1)], write_pos=7))
    # A header whose positions are outside the ring: its "unread" slots would be phantom events.
    phantom = ring(32, [(2, 1)] * 4, write_pos=32 + 904, read_pos=3)
    (nixl / "phantom").write_bytes(phantom)
    # Samples the store cannot hold: an escape sequence in the agent (file) name, a sum past 2^63.
    (nixl / "agent\x1b[2J").write_bytes(ring(4, [(2, 1)], write_pos=1))
    (nixl / "huge").write_bytes(ring(4, [(0, 2**64 - 1), (0, 2**64 - 1)], write_pos=2))
    with Recorder() as rec, httpx.Client() as client:
        registry = CollectorRegistry()
        settings = CollectorSettings(
            server_url=rec.url,
            spool_dirs=[tmp_path / "spool"],
            torch_dump_prefixes=[],
            state_dir=tmp_path / "state",
            metrics_listen="",
            host="node-a",
            nixl_telemetry_dir=nixl,
        )
        daemon = Daemon(settings, client=client, registry=registry)
        try:
            daemon.flush()
            (nixl / "full").write_bytes(ring(8, [(2, 1)] * 8, write_pos=6, read_pos=7))  # full again
            daemon.flush()
            assert daemon.pusher.drain(timeout_s=10)
        finally:
            daemon.close(drain_s=0)

        def value(name: str, **labels: str) -> float:
            return registry.get_sample_value(name, labels) or 0.0

        assert value("flightdeck_collector_nixl_ring_full_reads_total") == 2
        assert value("flightdeck_collector_nixl_unknown_events_total") == 2
        assert value("flightdeck_collector_parse_errors_total", reason="nixl_format") == 3  # once each
        agents = {n["agent"]: n for n in rec.nixl()}
        assert set(agents) == {"full"}  # nothing of the phantom ring was shipped
        assert agents["full"]["tx_requests"] == 5 + 7
    assert (nixl / "phantom").read_bytes() == phantom  # never written to
