"""The collector's digest mode (collector/digests.py): the ranks of jobs of `digest_from_ranks` ranks
or more send progress digests, and ship their entries when the server asks (a detail round), or at
once for stall and final snapshots.

The in-process `Collector` reads the committed dumps of real gloo jobs (tests/data/fr/) copied into
its spool as a user copies them (fresh file times, so the files are read in the order they were
copied, not the order they were taken) and sends to a real `flightdeck server` process on SQLite,
or, for what does not need an answer, to a port where nothing listens (every digest request fails
as in an outage: no detail round, ever).
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import shutil
import time
import urllib.error
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from flightdeck.analysis.board import progress_of
from flightdeck.collector.daemon import FlushResult
from flightdeck.collector.digests import Asked, RankProgress, _detail
from flightdeck.digest import GroupProgress
from flightdeck.launch.demo.ranks import free_port
from flightdeck.readers.fr.files import read_dump_file
from flightdeck.readers.fr.merge import merge
from flightdeck.records import RankDump
from flightdeck.wire import snapshot_from_dump
from tests.support.collector_fixtures import FR_DATA, thread_guard
from tests.support.collector_harness import Harness, settings_for, stand_ins
from tests.support.collector_stack import Server, get_json
from tests.support.waiting import wait_until

HOST = "node-a"


@pytest.fixture(autouse=True)
def _no_leaked_threads() -> Iterator[None]:
    yield from thread_guard()


@dataclass(frozen=True, slots=True)
class Live:
    """A running server and a collector token for it."""

    server: Server
    token: str

    def metric(self, name: str, **labels: str) -> float:
        return self.server.metric(name, **labels)

    def digests_accepted(self) -> float:
        return self.metric("flightdeck_ingest_digests_total", outcome="accepted")

    def batches_accepted(self) -> float:
        return self.metric("flightdeck_ingest_batches_total", outcome="accepted")


def start_server(tmp: Path, **settings: str) -> Iterator[Live]:
    """A `flightdeck server` process on SQLite with these settings (FLIGHTDECK_SERVER_<NAME>)."""
    server = Server(tmp / "server-data", tmp / "server.log")
    server.env.update({f"FLIGHTDECK_SERVER_{k.upper()}": v for k, v in settings.items()})
    token = server.token("create", HOST)
    server.start()
    try:
        yield Live(server, token)
    finally:
        server.stop()


@pytest.fixture(scope="module")
def quiet_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    """Rounds only when a job is first heard of (the next one an hour later), none for a stall: a
    flush after the first round has closed is outside any round."""
    yield from start_server(
        tmp_path_factory.mktemp("quiet-server"),
        detail_interval_s="3600",
        detail_round_s="1",
        stall_after_s="3600",
    )


@pytest.fixture
def stall_server(tmp_path: Path) -> Iterator[Live]:
    """A round of a stall's ranks every second while a group has waited in a collective for 1 s or more."""
    yield from start_server(tmp_path, detail_interval_s="3600", detail_round_s="1", stall_after_s="2")


def harness(tmp_path: Path, url: str, token: str = "s3cret", **overrides: Any) -> Harness:
    return Harness(settings_for(tmp_path, url, token=token, heartbeat_s=0, **overrides))


def copy_fresh(scenario: str, dest: Path, suffix: str = "") -> list[Path]:
    """Copy a scenario's dumps of one kind ("" periodic, ".recent", ".stall", ".final") with their sidecars,
    sidecar first (the agent's order), with fresh file times as a user's copy has them; returns the
    dumps copied."""
    return [
        copy_one(src, dest)
        for src in sorted((FR_DATA / scenario).glob(f"rank_*{suffix}.pkl"))
        if src.name.count(".") == suffix.count(".") + 1  # rank_0.stall.pkl is no periodic dump
    ]


def copy_one(src: Path, dest: Path) -> Path:
    """Copy one dump and its sidecar (sidecar first) with fresh file times; returns the copy."""
    dest.mkdir(parents=True, exist_ok=True)
    meta = src.with_name(src.name + ".meta.json")
    shutil.copy(meta, dest / meta.name)
    shutil.copy(src, dest / src.name)
    return dest / src.name


def touch(paths: list[Path]) -> None:
    """A new modification time, the same bytes: the collector reads the file again (a hung rank's
    agent rewriting an unchanged ring)."""
    for p in paths:
        # Later than the copy's time even where file times are coarse.
        t = max(time.time_ns(), p.stat().st_mtime_ns + 1_000_000)
        os.utime(p, ns=(t, t))


def groups(progress: tuple[GroupProgress, ...] | None) -> list[GroupProgress]:
    assert progress is not None
    return sorted(progress, key=lambda g: g.group)


def tracked(h: Harness, dump: RankDump) -> list[GroupProgress]:
    """The digest the collector holds for the dump's rank, its groups in order."""
    assert dump.job is not None
    d = h.collector.digest_of((dump.job, dump.attempt, dump.rank))
    assert d is not None, f"rank {dump.rank} is not tracked"
    assert d.world_size == dump.world_size
    return groups(d.groups)


def timeline(live: Live, job: str) -> dict[tuple[int, int], bool]:
    """(rank, record_id) -> retired, of the job's entries on the server ({} before it exists)."""
    try:
        doc = get_json(f"{live.server.url}/api/v1/jobs/{job}/timeline?limit=10000")
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return {}
        raise
    return {(e["rank"], e["record_id"]): e["retired"] for e in doc["entries"]}


def queued(h: Harness) -> list[dict[str, Any]]:
    """The snapshots of the batches waiting in the collector's queue (taken out of it)."""
    snaps = []
    while (b := h.collector.queue.peek()) is not None:
        snaps += json.loads(gzip.decompress(b.body))["snapshots"]
        h.collector.queue.ack(b.seq)
    return snaps


def flush_until_held_back(h: Harness, files: list[Path], what: str) -> FlushResult:
    """Rewrite the files unchanged and flush until a flush held their snapshots back: the round the
    server opened when it first heard of the job has closed."""

    def held() -> FlushResult | None:
        touch(files)
        r = h.collector.flush()
        assert h.collector.pusher.drain(timeout_s=10)
        return r if r.held_back else None

    result: FlushResult = wait_until(held, 60, what)
    return result


# --- against a real server --------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_round_ships_the_entries_then_only_digests_go_until_a_final(
    tmp_path: Path, quiet_server: Live
) -> None:
    """The server's first round for a job makes the collector ship its ranks' entries; after it,
    every flush sends the digests and ships nothing (the progress is in the digest, the entries
    are recorded as shipped); a final snapshot ships at once."""
    live = quiet_server
    h = harness(tmp_path, live.server.url, live.token, digest_from_ranks=1)
    try:
        agents = stand_ins(tmp_path / "spool", "healthy_4")
        for a in agents.values():
            a.write()
        digests, batches = live.digests_accepted(), live.batches_accepted()

        # 1. The first flush: the server first hears of the job and opens a round; the collector
        # ships every entry of the round's ranks.
        r = h.collector.flush()
        assert h.collector.pusher.drain(timeout_s=10)
        assert (r.digest_ranks, r.snapshots, r.held_back) == (4, 4, 0)
        assert h.metric("flightdeck_collector_digest_requests_total", outcome="sent") == 1
        assert live.digests_accepted() == digests + 1
        assert live.batches_accepted() > batches

        def job_ranks() -> dict[str, Any] | None:
            ranks: dict[str, Any] = get_json(f"{live.server.url}/api/v1/jobs/healthy_4")["ranks"]
            return ranks if ranks["with_dump"] == [0, 1, 2, 3] else None

        ranks = wait_until(job_ranks, 30, "the job and its 4 ranks on the server")
        assert ranks["expected"] == 4
        expected = {(rank, e["record_id"]): False for rank, a in agents.items() for e in a.entries}
        assert timeline(live, "healthy_4") == expected

        # 2. Once the round has closed, an unchanged ring rewritten is read, its snapshot held back.
        held = flush_until_held_back(h, [agents[2].target], "the first round to close")
        assert (held.snapshots, held.held_back) == (0, 1)

        # 3. Outside a round, real progress is held back too: the digest says it, no entry ships.
        done = agents[1].finish(3)
        agents[1].write()
        digests, batches = live.digests_accepted(), live.batches_accepted()
        enqueued = h.metric("flightdeck_collector_batches_enqueued_total")
        entries = h.metric("flightdeck_collector_entries_enqueued_total")
        held_back = h.metric("flightdeck_collector_snapshots_held_back_total")
        sent = h.metric("flightdeck_collector_digest_requests_total", outcome="sent")
        r = h.collector.flush()
        assert h.collector.pusher.drain(timeout_s=10)
        assert (r.digest_ranks, r.snapshots, r.entries, r.held_back, r.batches) == (4, 0, 0, 1, 0)
        assert h.metric("flightdeck_collector_digest_requests_total", outcome="sent") == sent + 1
        assert h.metric("flightdeck_collector_snapshots_held_back_total") == held_back + 1
        assert h.metric("flightdeck_collector_batches_enqueued_total") == enqueued
        assert h.metric("flightdeck_collector_entries_enqueued_total") == entries
        assert live.digests_accepted() == digests + 1
        assert live.batches_accepted() == batches  # no ingest batch
        assert {k: v for k, v in timeline(live, "healthy_4").items() if k[0] == 1 and k[1] in done} == {
            (1, rid): False for rid in done
        }
        written = read_dump_file(agents[1].target)
        assert tracked(h, written) == groups(progress_of(written.entries))
        assert tracked(h, written)[0].finished == 3
        # What was read is recorded as shipped all the same: read again, nothing has changed.
        touch([agents[1].target])
        r = h.collector.flush()
        assert r.files_read == 1 and r.entries == 0 and r.held_back == 1

        # 4. A final snapshot ships at once, round or not.
        batches = live.batches_accepted()
        final = copy_one(FR_DATA / "healthy_4" / "rank_0.final.pkl", agents[0].target.parent)
        r = h.collector.flush()
        assert h.collector.pusher.drain(timeout_s=10)
        assert (r.snapshots, r.held_back) == (1, 0)
        assert live.batches_accepted() == batches + 1
        rank0 = {k: v for k, v in timeline(live, "healthy_4").items() if k[0] == 0}
        assert rank0 == {(0, e.record_id): e.retired for e in read_dump_file(final).entries}
        assert all(rank0.values())
    finally:
        h.close()


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_round_heard_twice_is_answered_once(tmp_path: Path) -> None:
    """A round stays open over two intervals so that every collector hears it: a collector that
    heard it already holds its next snapshots back, as outside a round."""
    for live in start_server(tmp_path, detail_interval_s="3600", detail_round_s="600", stall_after_s="3600"):
        h = harness(tmp_path, live.server.url, live.token, digest_from_ranks=1)
        try:
            files = copy_fresh("healthy_4", tmp_path / "spool" / "healthy_4" / "0")
            r = h.collector.flush()
            assert h.collector.pusher.drain(timeout_s=10)
            assert (r.digest_ranks, r.snapshots, r.held_back) == (4, 4, 0)
            batches = live.batches_accepted()
            touch(files)
            r = h.collector.flush()  # the round is open for 10 minutes
            assert h.collector.pusher.drain(timeout_s=10)
            assert (r.digest_ranks, r.snapshots, r.held_back) == (4, 0, 4)
            assert live.batches_accepted() == batches
        finally:
            h.close()


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_in_a_stall_round_a_waiting_rank_ships_what_it_waits_in(tmp_path: Path, stall_server: Live) -> None:
    """A hung job: while it stalls the server asks for its culprits' and a few waiters' entries
    (here every rank of four); a rank whose ring did not change ships its snapshot with the
    entries it waits in."""
    live = stall_server
    h = harness(tmp_path, live.server.url, live.token, digest_from_ranks=1)
    try:
        files = copy_fresh("subgroup_hang", tmp_path / "spool" / "subgroup_hang" / "0")
        r = h.collector.flush()
        assert h.collector.pusher.drain(timeout_s=10)
        assert (r.snapshots, r.held_back) == (4, 0)
        dumps = [read_dump_file(p) for p in files]
        for d in dumps:
            assert tracked(h, d) == groups(progress_of(d.entries))
        waits_in = {
            d.rank: {e.record_id for e in d.entries if not e.finished and not e.is_p2p} for d in dumps
        }
        assert waits_in == {0: {17}, 1: {17}, 2: {16}, 3: set()}  # collective 13 of group 0, 5 of 2
        # The round of a job first heard of is over by then (detail_round_s): any round after it is
        # one the stall opened.
        first_round_over = time.monotonic() + 1.0
        wait_until(lambda: time.monotonic() > first_round_over, 10, "the first round to be over")

        def shipped_unchanged() -> list[dict[str, Any]] | None:
            touch(files)
            r = h.collector.flush()
            if r.snapshots != 4:
                assert h.collector.pusher.drain(timeout_s=10)
                return None  # between two rounds
            snaps: list[dict[str, Any]] = json.loads(gzip.decompress(_head(h)))["snapshots"]
            assert h.collector.pusher.drain(timeout_s=10)
            return snaps

        snaps = wait_until(shipped_unchanged, 60, "a stall round")
        assert {s["rank"]: set(s["entries"]["rid"]) for s in snaps} == waits_in
        assert h.collector.queue.peek() is None
    finally:
        h.close()


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_mismatch_round_ships_the_span_the_ranks_disagree_on(tmp_path: Path, quiet_server: Live) -> None:
    """dtype_same_bytes: rank 2 sent collective 14 with another dtype of the same size and gloo
    completed it. The ranks' fingerprints of span 0 (collectives 1-16) disagree; the server's round
    for it names the span, and every rank ships that span's entries, though none changed since."""
    live = quiet_server
    h = harness(tmp_path, live.server.url, live.token, digest_from_ranks=1)
    try:
        files = copy_fresh("dtype_same_bytes", tmp_path / "spool" / "dtype_same_bytes" / "0")
        r = h.collector.flush()
        assert h.collector.pusher.drain(timeout_s=10)
        assert r.digest_ranks == 4
        span0 = {
            d.rank: {e.record_id for e in d.entries if e.group == "0" and 1 <= e.collective_seq_id <= 16}
            for d in (read_dump_file(p) for p in files)
        }

        def shipped_span() -> dict[int, set[int]] | None:
            touch(files)
            r = h.collector.flush()
            snaps = queued(h) if r.snapshots else []
            # The round opened when the server first heard of the job ships unchanged rings empty;
            # the mismatch round ships them with the span.
            got = {s["rank"]: set(s["entries"]["rid"]) for s in snaps}
            return got if len(got) == 4 and any(got.values()) else None

        got = wait_until(shipped_span, 30, "a round asking for span 0")
        assert got == span0
    finally:
        h.close()


def _head(h: Harness) -> bytes:
    b = h.collector.queue.peek()
    assert b is not None
    return b.body


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize(("digest_from_ranks", "scenario"), [(0, "healthy_2"), (8, "coalesced_healthy")])
def test_without_digest_mode_every_change_ships_as_before(
    tmp_path: Path, quiet_server: Live, digest_from_ranks: int, scenario: str
) -> None:
    """Digest mode off (0), or a job below its threshold (4 ranks < 8): no digest, no snapshot held."""
    live = quiet_server
    h = harness(tmp_path, live.server.url, live.token, digest_from_ranks=digest_from_ranks)
    try:
        files = copy_fresh(scenario, tmp_path / "spool" / scenario / "0")
        files += copy_fresh(scenario, tmp_path / "spool" / scenario / "0", ".final")
        digests = live.digests_accepted()
        r = h.collector.flush()
        assert h.collector.pusher.drain(timeout_s=10)
        assert (r.snapshots, r.held_back, r.digest_ranks) == (len(files), 0, 0)
        assert live.digests_accepted() == digests
        for outcome in ("sent", "failed"):
            assert h.metric("flightdeck_collector_digest_requests_total", outcome=outcome) == 0
        assert h.metric("flightdeck_collector_snapshots_held_back_total") == 0
        expected = {(d.rank, e.record_id) for p in files for d in [read_dump_file(p)] for e in d.entries}
        assert set(timeline(live, scenario)) == expected
        assert h.collector.digest_of((scenario, 0, 0)) is None
    finally:
        h.close()


# --- digests tracked across flushes; no server to answer ---------------------------------------


@pytest.mark.parametrize(
    "scenario", ["subgroup_hang", "coalesced_hang", "p2p_skip_send", "tp_pp_dp_hang", "healthy_4", "wrapped"]
)
def test_tracked_digest_is_progress_of_the_rank_and_stall_and_final_ship_at_once(
    tmp_path: Path, scenario: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Only changed entries reach the tracker, in the order the files were copied (a stall dump
    older than the periodic one read after it, the agent's recent-changes files); its digest is
    `progress_of` the rank's whole ring as its dumps so far tell it, and again after a restart.
    Every digest request fails: no round, so periodic and recent snapshots are held back (their
    state recorded as shipped), stall and final ones ship."""
    caplog.set_level(logging.INFO, logger="flightdeck.collector.daemon")
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens: connection refused
    dest = tmp_path / "spool" / scenario / "0"
    seen: dict[int, list[RankDump]] = {}

    def check(h: Harness, copied: list[Path]) -> None:
        for p in copied:
            d = read_dump_file(p)
            seen.setdefault(d.rank, []).append(d)
        for rank, dumps in seen.items():
            whole = merge(dumps)
            assert tracked(h, whole) == groups(progress_of(whole.entries)), f"rank {rank}"
            digest = h.collector.digest_of((scenario, 0, rank))
            assert digest is not None and digest.time_ns == max(d.snapshot_time_ns or 0 for d in dumps)

    def flush(h: Harness, copied: list[Path], reads: int | None = None) -> FlushResult:
        r = h.collector.flush()
        assert r.files_read == (len(copied) if reads is None else reads)
        check(h, copied)
        return r

    h = harness(tmp_path, url, digest_from_ranks=4)
    try:
        held = []
        for kind in ("", ".recent"):
            copied = copy_fresh(scenario, dest, kind)
            r = flush(h, copied)
            assert (r.snapshots, r.held_back, r.digest_ranks) == (0, len(copied), 0)
            held += copied
        assert h.collector.queue.peek() is None
        # Read once: what was held back is recorded as shipped (the next flush reads nothing).
        r = flush(h, [])
        assert r.held_back == 0
        assert h.metric("flightdeck_collector_digest_requests_total", outcome="failed") == 3
    finally:
        h.close()

    # A restart: the tracked progress was in memory. The next read of each rank is a full one, so
    # the entries the ranks wait in are known though none of them changed since.
    h = harness(tmp_path, url, digest_from_ranks=4)
    try:
        touch(held)
        r = flush(h, [], reads=len(held))
        assert (r.files_read, r.held_back) == (len(held), len(held))
        stall = copy_fresh(scenario, dest, ".stall")
        r = flush(h, stall)
        assert (r.snapshots, r.held_back) == (len(stall), 0)
        final = copy_fresh(scenario, dest, ".final")
        r = flush(h, final)
        assert (r.snapshots, r.held_back) == (len(final), 0)
        assert final
        # Spans of 16 finished collectives are reported as `progress_of` reports them: healthy_4's
        # ranks finished 21, the others' rings hold no whole span finished.
        digests = [h.collector.digest_of((scenario, 0, rank)) for rank in seen]
        spans = {g.span for d in digests if d is not None for g in d.groups}
        assert spans == ({0} if scenario == "healthy_4" else {-1})
        kinds = [s["kind"] for s in queued(h)]
        assert sorted(kinds) == sorted(["stall"] * len(stall) + ["final"] * len(final))
        assert h.metric("flightdeck_collector_digest_requests_total", outcome="failed") == 3
        assert h.metric("flightdeck_collector_digest_requests_total", outcome="sent") == 0
    finally:
        h.close()
    # One warning per outage (one per collector process here), not one per flush.
    said = [rec for rec in caplog.records if "progress digests cannot be sent" in rec.getMessage()]
    assert len(said) == 2


def test_an_entry_shipped_open_ships_again_once_finished() -> None:
    """subgroup_hang, rank 0: collective 13 of group 0 is open in its periodic dump and finished
    (retired) in its final one. Shipped open in a round, its completion is held by a flush outside
    any round (its changes are dropped) and goes with the rank's next shipped snapshot: the server
    would otherwise hold it open, and every later stall would name the group as hung too."""
    dumps = {
        d.kind: d
        for d in (read_dump_file(p) for p in sorted((FR_DATA / "subgroup_hang").glob("rank_0*.pkl")))
    }
    periodic, final = snapshot_from_dump(dumps["periodic"]), snapshot_from_dump(dumps["final"])
    (stuck,) = [e for e in periodic.entries if e.group == "0" and e.collective_seq_id == 13]
    assert not stuck.finished
    p = RankProgress(periodic.job, periodic.attempt, periodic.rank)
    p.take(periodic, None, 0.0)
    assert p.shipped(periodic.entries) == []  # a round: shipped, 13 open among them
    (done,) = [e for e in final.entries if e.record_id == stuck.record_id]
    assert done.finished
    final.entries = [done]  # what the reader gives: the changed entries
    p.take(final, None, 1.0)  # a flush outside any round: held back
    assert p.shipped([]) == [done]  # the next shipped snapshot carries it
    assert p.shipped([]) == []  # once


def test_the_answer_is_read_with_what_each_round_asks() -> None:
    """A round for a stall's evidence names its ranks; a mismatch round its spans; anything else in
    the answer's place makes it no answer (the flush then ships nothing but stall and final)."""
    answer = {
        "ranks": 8,
        "detail": [
            {"job": "a", "attempt": 0},
            {"job": "b", "attempt": 1, "spans": {"3": 60}},
            {"job": "c", "attempt": 0, "ranks": [5, 9], "round": 77},
        ],
    }
    assert _detail(httpx.Response(200, json=answer)) == {
        ("a", 0): Asked({}, frozenset()),
        ("b", 1): Asked({"3": 60}, frozenset()),
        ("c", 0): Asked({}, frozenset({5, 9}), 77),
    }
    bad_answers: list[object] = [
        {"detail": [{"job": "c", "attempt": 0, "ranks": ["5"]}]},
        {"detail": [{"job": "c", "attempt": 0, "round": "77"}]},
        {"detail": "x"},
        [],
    ]
    for bad in bad_answers:
        assert _detail(httpx.Response(200, json=bad)) is None
