"""The load generator's batches are what a collector sends (bench/loadgen/job.py builds them as
columns, without `encode_batch`, to keep its own CPU low beside the server it measures), its
faults happen where the command line puts them, and its report tells faults' findings from false
ones. With `--digests` its digests are what `encode_digests` writes of the entries the ranks
recorded, and the batches it ships when asked carry what a collector on digests ships."""

from __future__ import annotations

import dataclasses
import itertools
import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from bench.loadgen.cli import parse_args
from bench.loadgen.findings import explained_by
from bench.loadgen.job import NS, Fault, RankSim, Sim, Topology, plan_faults
from bench.loadgen.stats import Sample, Stats, windows
from flightdeck.analysis.board import Board, progress_of
from flightdeck.digest import MS, DigestBlock, RankDigest, decode_digests, encode_digests
from flightdeck.records import Entry
from flightdeck.wire import decode_batch, encode_batch

T0 = 10**18
ROOT = Path(__file__).resolve().parents[1]


def _loadgen(*args: str) -> dict[str, Any]:
    """`python -m bench.loadgen ARGS` run to the end; its report."""
    out = subprocess.run(
        [sys.executable, "-m", "bench.loadgen", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    report: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return report


def _sim(faults: list[Fault], ranks: int = 16, hosts: int = 2, kinds: int = 3) -> Sim:
    topo = Topology(ranks, hosts, kinds)
    topo.build()
    rng = random.Random(3)
    return Sim(
        job="lg",
        topo=topo,
        rate=10.0,
        interval_s=2.0,
        t0_ns=T0,
        groups_resend_s=60.0,
        faults=plan_faults(faults, T0, 10.0, kinds, ranks),
        ranks=[RankSim(r, rng.randrange(2_000_000)) for r in range(ranks)],
    )


def _wire(doc: object) -> object:
    return orjson.loads(orjson.dumps(doc))


def _run(sim: Sim, ticks: int) -> tuple[dict[tuple[int, int], list[str]], dict[tuple[int, int], Entry]]:
    """Every host's batch every 2 s for `ticks` snapshots, each checked against `encode_batch`;
    returns (rank, record id) -> states shipped, and the last entry shipped."""
    seen: dict[tuple[int, int], list[str]] = {}
    last: dict[tuple[int, int], Entry] = {}
    for k in range(1, ticks + 1):
        now = sim.t0_ns + k * 2 * NS
        for h in range(sim.topo.hosts):
            doc = _wire(sim.host_doc(h, now))
            batch = decode_batch(doc)
            # Re-encoding the decoded batch gives the same document: the generator's columns,
            # signature table and left-out columns are exactly the collector encoder's.
            assert _wire(encode_batch(batch)) == doc
            per_host = sim.topo.per_host
            assert [s.rank for s in batch.snapshots] == list(range(per_host * h, per_host * (h + 1)))
            for s in batch.snapshots:
                assert bool(s.groups) == (k == 1)  # groups go with the first snapshot only
                for e in s.entries:
                    seen.setdefault((s.rank, e.record_id), []).append(e.state)
                    last[(s.rank, e.record_id)] = e
                    assert e.time_created_ns <= now
                    assert e.time_completed_ns is None or e.time_completed_ns <= now
    return seen, last


@pytest.mark.parametrize("fault", ["hang", "mismatch"])
def test_batches_are_what_encode_batch_writes_and_follow_the_job(fault: str) -> None:
    sim = _sim([Fault(fault, 3.0, 5)])
    seen, last = _run(sim, 4)
    fi = sim.faults[0].index
    assert fi == 30 and sim.faults[0].at_ns == T0 + 3 * NS
    # Each collective is shipped when it appears, and again when it completed after having been
    # shipped in flight; by the end only the fault's collective is still in flight, on every
    # rank that entered it (the hung rank 5 never does).
    entered = [r for r in range(16) if not (fault == "hang" and r == 5)]
    assert {key for key, st in seen.items() if st[-1] != "completed"} == {(r, fi) for r in entered}
    assert all(st in (["completed"], ["started", "completed"], ["started"]) for st in seen.values())
    assert {rid for r, rid in seen if r == 5} == set(range(fi + (fault == "mismatch")))
    assert {rid for r, rid in seen if r == 4} == set(range(fi + 1))
    # A mismatch: rank 5 enters that collective with other sizes than its peers.
    sizes = {r: last[(r, fi)].input_sizes for r in entered}
    odd = {r for r in entered if sizes[r] != sizes[4]}
    assert odd == ({5} if fault == "mismatch" else set())
    # Nothing new once every rank waits in the fault's collective.
    later = decode_batch(_wire(sim.host_doc(0, sim.t0_ns + 10 * 2 * NS)))
    assert all(not s.entries for s in later.snapshots)


def test_several_faults_in_one_run_each_where_the_command_line_puts_it() -> None:
    # A silent mismatch on rank 9 at 2 s (the collective completes: the job goes on), a hang of
    # rank 5 at 4 s that clears 3 s later, then a hang of rank 2 for good at 9 s.
    sim = _sim(
        [Fault("hang", 4.0, 5, 3.0), Fault("mismatch", 2.0, 9, 0.0), Fault("hang", 9.0, 2)],
        ranks=32,
        hosts=4,
    )
    mm, stall, hang = sim.faults  # in time order
    assert (mm.index, stall.index) == (21, 42)  # the first world collective from the fault's time
    assert hang.index == 60  # 9 s in, less the 3 s the stall delayed everything after it
    assert hang.at_ns == T0 + 9 * NS
    seen, last = _run(sim, 8)
    # The silent mismatch: rank 9 recorded other sizes there, and every rank completed it.
    assert {r for r in range(32) if last[(r, mm.index)].input_sizes != last[(0, mm.index)].input_sizes} == {9}
    assert all(last[(r, mm.index)].state == "completed" for r in range(32))
    # The stall: rank 5 entered its collective only when the stall cleared, the others waited
    # in it that long, and everything after it came that much later.
    assert last[(5, stall.index)].time_created_ns >= stall.at_ns + 3 * NS
    assert last[(4, stall.index)].time_created_ns < stall.at_ns + NS
    assert all((last[(r, stall.index)].time_completed_ns or 0) >= stall.at_ns + 3 * NS for r in range(32))
    assert seen[(4, stall.index)][0] == "started" and seen[(4, stall.index)][-1] == "completed"
    nxt = last[(4, stall.index + 1)].time_created_ns
    assert stall.at_ns + 3 * NS <= nxt < stall.at_ns + 4 * NS
    # The hang for good: rank 2 never enters it, every other rank waits in it until the end.
    assert {rid for r, rid in seen if r == 2} == set(range(hang.index))
    assert {key for key, st in seen.items() if st[-1] != "completed"} == {
        (r, hang.index) for r in range(32) if r != 2
    }


def test_the_command_line_takes_several_faults_and_the_old_single_form() -> None:
    base = ["--url", "http://127.0.0.1:1", "--duration", "60"]
    args = parse_args([*base, "--fault", "hang@40:rank=5", "--fault", "mismatch@20:rank=9000:for=0"])
    assert [(f.kind, f.at_s, f.rank, f.hold_s) for f in args.faults] == [
        ("hang", 40.0, 5, None),
        ("mismatch", 20.0, 9000, 0.0),
    ]
    old = parse_args([*base, "--fault", "mismatch", "--fault-at", "30", "--fault-rank", "7"])
    assert [(f.kind, f.at_s, f.rank, f.hold_s) for f in old.faults] == [("mismatch", 30.0, 7, None)]
    assert [(f.kind, f.at_s) for f in parse_args(base).faults] == [("hang", 40.0)]  # the default
    assert parse_args([*base, "--fault", "none"]).faults == []
    # A fault after one that holds for ever never comes: refused, not silently dropped.
    with pytest.raises(SystemExit):
        parse_args([*base, "--fault", "mismatch@20", "--fault", "hang@40"])
    with pytest.raises(SystemExit):
        parse_args([*base, "--fault", "stall@20"])


def _cells(block: DigestBlock) -> dict[tuple[int, str], tuple[int, int, int, int]]:
    """(rank, group) -> (entered, finished, open since ns, ms waited as the wire said) of a decoded
    digest block."""
    out = {}
    k = 0
    for rank, t, count in zip(block.rank, block.time_ns, block.n, strict=True):
        for c in range(k, k + count):
            since = block.open_since_ns[c]
            waited = (t - since) // MS if since else -1
            out[(rank, block.groups[block.g[c]])] = (block.entered[c], block.finished[c], since, waited)
        k += count
    return out


@pytest.mark.parametrize("fault", ["hang", "mismatch"])
def test_digests_are_what_encode_digests_writes_of_the_ranks_entries(fault: str) -> None:
    # Two copies of one job: one ships every entry (the batches checked above), the other sends
    # digests. Each digest document is, value for value, `encode_digests` of `progress_of` over the
    # entries the first copy's ranks recorded so far, each span reported once (as the collector
    # does); decoded, it says where the fault holds them.
    ship, dig = (
        _sim([Fault(fault, 7.0, 5)], ranks=32, hosts=4, kinds=4),
        _sim([Fault(fault, 7.0, 5)], 32, 4, 4),
    )
    f = dig.faults[0]
    seq = f.index // 4 + 1
    entries: dict[int, dict[int, Entry]] = {r: {} for r in range(32)}
    reported: dict[tuple[int, str], int] = {}
    waits: list[int] = []
    for k in range(1, 9):
        now = T0 + k * 2 * NS
        sent = now + 3 * MS + k  # sent a little after the snapshot
        for h in range(4):
            for snap in decode_batch(_wire(ship.host_doc(h, now))).snapshots:
                entries[snap.rank] |= {e.record_id: e for e in snap.entries}
            doc = _wire(dig.digest_doc(h, dig.host_steps(h, now), sent))
            ranks = range(8 * h, 8 * h + 8)
            want = []
            for r in ranks:
                progress = []
                for p in progress_of(sorted(entries[r].values(), key=lambda e: e.record_id)):
                    if p.span <= reported.get((r, p.group), -1):
                        p = dataclasses.replace(p, span=-1, span_fp=0)  # reported before
                    reported[(r, p.group)] = max(p.span, reported.get((r, p.group), -1))
                    progress.append(p)
                want.append(RankDigest("lg", 0, r, 32, now, tuple(progress)))
            assert doc == _wire(encode_digests(f"sim-{h:05d}", sent, want))
            (block,) = decode_digests(doc).blocks
            assert block.rank == list(ranks) and block.time_ns == [sent - 3 * MS] * 8
            world = {r: cell for (r, g), cell in _cells(block).items() if g == "0"}
            if now < f.at_ns:
                # Before the fault every rank finished what it entered, or runs its newest one.
                assert all(e - fin in (0, 1) for e, fin, _, _ in world.values())
                continue
            # The fault's world collective: the hung rank never entered it (hang), every other
            # rank waits in it since it entered it (with other sizes, rank 5 too: mismatch).
            for r, (e, fin, since, waited_ms) in world.items():
                if fault == "hang" and r == 5:
                    assert (e, fin, since, waited_ms) == (seq - 1, seq - 1, 0, -1)
                else:
                    stuck = entries[r][f.index]
                    # Waiting since it entered it (to the ms the wire carries), as of the snapshot.
                    assert (e, fin) == (seq, seq - 1) and not stuck.finished
                    assert waited_ms == (now - stuck.time_created_ns) // MS
                    assert 0 <= since - stuck.time_created_ns < MS
            if h == 0:
                waits.append(world[4][3])
    # The wait grows with the snapshots, 2 s apart (the fault came 7 s in, between the 3rd and 4th).
    assert [b - a for a, b in itertools.pairwise(waits)] == [2000] * (len(waits) - 1)
    assert len(waits) == 5 and 0 < waits[0] <= 1000
    # Each group's first span of 16 (10 collectives/s over 4 groups: 6.4 s) was reported, once.
    assert set(reported.values()) == {0}


def test_the_board_of_the_generators_digests_sees_the_hang_and_its_culprit() -> None:
    # The server's board and stall rule, fed the generator's digests as decoded on the server.
    sim = _sim([Fault("hang", 3.0, 5)], ranks=32, hosts=4, kinds=4)
    board = Board()
    stalls = []
    for k in range(1, 7):
        now = T0 + k * 2 * NS
        for h in range(4):
            doc = _wire(sim.digest_doc(h, sim.host_steps(h, now), now))
            for block in decode_digests(doc).blocks:
                board.fold(block)
        stalls.append(board.stalls(min_wait_s=2.5))
    assert stalls[:2] == [[], []]  # 4 s in: waited 1 s, below the rule's threshold
    seq = sim.faults[0].index // 4 + 1
    for got in stalls[2:]:
        (stall,) = got
        assert (stall.group, stall.seq, stall.culprits) == ("0", seq, (5,))
        assert stall.waiting == tuple(r for r in range(32) if r != 5)
    assert [round(got[0].waited_s) for got in stalls[2:]] == [3, 5, 7, 9]


def test_a_batch_asked_for_carries_the_snapshots_changes_and_the_open_entries() -> None:
    # A host on digests ships a batch only when the server asks (here at snapshots 1, 3 and 5 of
    # 6); each carries what changed since the snapshot before, shipped or not, and every entry
    # still open (the fault's collective each time, unchanged); the other changes are dropped.
    ship, dig = _sim([Fault("hang", 3.0, 5)]), _sim([Fault("hang", 3.0, 5)])
    fi = dig.faults[0].index
    for k in range(1, 7):
        now = T0 + k * 2 * NS
        changed = {
            s.rank: {e.record_id: e for e in s.entries}
            for s in decode_batch(_wire(ship.host_doc(0, now))).snapshots
        }
        steps = dig.host_steps(0, now)
        if k not in (1, 3, 5):
            continue
        doc = _wire(dig.detail_doc(0, steps))
        batch = decode_batch(doc)
        assert _wire(encode_batch(batch)) == doc  # what the collector's encoder writes
        for s in batch.snapshots:
            assert bool(s.groups) == (k == 1)  # with the first batch shipped
            got = {e.record_id: e for e in s.entries}
            open_ = {fi} if now > dig.faults[0].at_ns + NS and s.rank != 5 else set()
            assert set(got) == set(changed[s.rank]) | open_
            for rid, e in got.items():
                assert e == changed[s.rank].get(rid, e)  # the changed ones as the collector ships them
                assert rid not in open_ or (e.state == "started" and e.time_completed_ns is None)


def test_a_silent_mismatch_is_seen_in_a_span_and_its_round_ships_the_span() -> None:
    # Rank 9 enters the world collective 3 s in with other sizes, which completes anyway. Its
    # fingerprint of that span differs from the others': the server's board finds the span once
    # every member reported it, and the batch asked for with that span carries its entries.
    sim = _sim([Fault("mismatch", 3.0, 9, 0.0)], ranks=32, hosts=4, kinds=4)
    fi = sim.faults[0].index
    span = (fi // 4) // 16  # the world group's span of that collective (seq fi // 4 + 1)
    board = Board()
    steps = []
    found = []
    for k in range(1, 6):
        now = T0 + k * 2 * NS
        steps = [sim.host_steps(h, now) for h in range(4)]
        for h in range(4):
            for block in decode_digests(_wire(sim.digest_doc(h, steps[h], now))).blocks:
                board.fold(block)
        found.append(board.mismatches())
    assert found[:2] == [[], []]  # the span is not finished yet
    mismatch = next(m for ms in found for m in ms)
    assert (mismatch.group, mismatch.span, mismatch.ranks, mismatch.agreeing) == ("0", span, (9,), 31)
    assert [m for ms in found for m in ms] == [mismatch]  # decided once
    # Rank 9's host, asked for the span: its 16 world entries, rank 9's odd one among them.
    doc = _wire(sim.detail_doc(1, steps[1], {"0": span}))
    batch = decode_batch(doc)
    assert _wire(encode_batch(batch)) == doc
    for snap in batch.snapshots:
        world = {e.collective_seq_id: e for e in snap.entries if e.group == "0"}
        assert set(world) >= set(range(span * 16 + 1, span * 16 + 17))
        odd = {e.collective_seq_id for e in world.values() if e.input_sizes != world[1].input_sizes}
        assert odd == ({fi // 4 + 1} if snap.rank == 9 else set())


@pytest.mark.parametrize("ship_completions", [False, True])
def test_an_entry_shipped_open_whose_completion_is_not_shipped_stays_open_unless_shipped_later(
    ship_completions: bool,
) -> None:
    # Snapshots 5 ms after every 20th collective starts (it runs 20 ms: in flight at each), the
    # server asking at the 1st and 3rd only. Collective 20, shipped open at the 1st, completes by
    # the 2nd, whose changes are dropped: as the collector on digests is specified, no batch ever
    # says it completed (the server holds it open, and once the job stalls its diagnosis may
    # report a hang there: seen in short real runs without the flag); with --ship-completions the
    # 3rd batch carries its completion.
    sim = _sim([])
    sim.ship_completions = ship_completions
    shipped: dict[tuple[int, int], list[str]] = {}
    for k in range(1, 4):
        steps = sim.host_steps(0, T0 + k * 2 * NS + 5 * MS)
        if k == 2:
            continue
        doc = _wire(sim.detail_doc(0, steps))
        for snap in decode_batch(doc).snapshots:
            for e in snap.entries:
                shipped.setdefault((snap.rank, e.record_id), []).append(e.state)
    for r in range(8):
        assert shipped[(r, 20)] == (["started", "completed"] if ship_completions else ["started"])
        assert shipped[(r, 40)] == ["completed"]  # open at the 2nd (not shipped), completed by the 3rd
        assert shipped[(r, 60)] == ["started"]
        assert (r, 30) not in shipped  # created and completed between two shipped snapshots


def _finding(kind: str, opened_s: float, group: str, seq: int, culprits: list[int]) -> dict[str, object]:
    return {
        "id": 1,
        "kind": kind,
        "open": True,
        "opened_at_s": T0 / NS + opened_s,
        "finding": {"process_group": group, "collective_seq_id": seq, "culprit_ranks": culprits},
    }


def test_findings_are_told_apart_by_the_fault_that_explains_them() -> None:
    mm, hang = plan_faults([Fault("mismatch", 2.0, 9, 0.0), Fault("hang", 9.0, 5)], T0, 10.0, 3, 32)
    assert explained_by([mm, hang], _finding("size_mismatch", 4, "0", 8, [9]), 3) is mm
    assert explained_by([mm, hang], _finding("hang", 15, "0", 31, [5]), 3) is hang
    # A consequence at the fault's collective, or naming its rank, after it: explained.
    assert explained_by([mm, hang], _finding("hang", 5, "0", 8, [1, 2]), 3) is mm
    assert explained_by([mm, hang], _finding("straggler", 12, "1", 40, [5]), 3) is hang
    # Naming the rank before its fault, or another rank and collective: false.
    assert explained_by([mm, hang], _finding("straggler", 3, "1", 5, [5]), 3) is None
    assert explained_by([mm, hang], _finding("rank_lost", 20, "0", 20, [17]), 3) is None


def test_windows_give_rates_latency_and_bytes_per_window() -> None:
    stats = Stats(start=0.0)
    for t in range(60):  # one batch a second, slower in the second window
        stats.delivered.append((t + 0.5, 0.01 if t < 30 else 0.1, 0.02, 0.5, 100, 1000))
    stats.throttled = [40.0, 41.0]
    out = windows(stats, ranks=10, end_s=60.0, window_s=30.0)
    assert [w["t_s"] for w in out] == [60.0]  # no samples: one window to the end
    stats.samples = [Sample(s, [s / 10], [2**20], [2**20], s / 100) for s in (0.0, 30.0, 60.0)]
    out = windows(stats, ranks=10, end_s=60.0, window_s=30.0)
    assert [w["t_s"] for w in out] == [30.0, 60.0]
    assert [w["entries_per_s"] for w in out] == [100, 100]
    assert [w["request_ms"] for w in out] == [[10, 10, 10], [100, 100, 100]]
    assert [w["bytes_per_rank_per_s"] for w in out] == [100, 100]
    assert [w["throttled_429"] for w in out] == [0, 2]
    assert [w["server_cpu"] for w in out] == [[0.1], [0.1]]
    assert [w["server_rss_mib"] for w in out] == [[1], [1]]


@pytest.mark.slow
def test_a_short_run_against_a_real_server_reports_each_fault_and_no_false_finding() -> None:
    # 32 ranks, a silent mismatch then a hang for good, against a spawned server on SQLite.
    report = _loadgen(
        "--spawn",
        "sqlite",
        "--ranks",
        "32",
        "--hosts",
        "4",
        "--duration",
        "14",
        "--window-s",
        "5",
        "--stall-after",
        "3",
        "--fault",
        "mismatch@3:rank=9:for=0",
        "--fault",
        "hang@7:rank=5",
        "--drain-s",
        "30",
    )
    assert report["drained"] and report["errors"] == 0
    assert [f["fault"] for f in report["faults"]] == ["mismatch@3:rank=9:for=0", "hang@7:rank=5"]
    mm, hang = report["faults"]
    assert mm["finding_kind"] == "size_mismatch" and mm["to_finding_s"] is not None
    assert hang["finding_kind"] == "hang" and hang["to_finding_s"] is not None
    assert report["false_findings"] == 0, report["false_finding_list"]
    assert len(report["windows"]) >= 3
    assert all(
        set(w) >= {"request_ms", "lag_s", "bytes_per_rank_per_s", "server_rss_mib"} for w in report["windows"]
    )
    assert report["db_mib_start_end"][1] >= report["db_mib_start_end"][0]


@pytest.mark.slow
@pytest.mark.parametrize("protocol", [[], ["--digests"]], ids=["entries", "digests"])
def test_the_owner_killed_mid_run_another_server_diagnoses_the_job_and_finds_a_later_hang(
    pg_database: str, protocol: list[str]
) -> None:
    # Two servers in cluster mode on PostgreSQL; the one owning the job (the one exporting its
    # series) is SIGKILLed 6 s in (its advisory lock dies with its connection), its collectors
    # move to the other one, and a rank hangs 8 s after that: the survivor takes the job over,
    # diagnoses it and finds the hang. On digests too, whose full diagnoses are minutes apart.
    report = _loadgen(
        *protocol,
        "--spawn",
        "postgresql",
        "--servers",
        "2",
        "--ranks",
        "64",
        "--hosts",
        "8",
        "--duration",
        "22",
        "--stall-after",
        "3",
        "--kill-owner-at",
        "6",
        "--fault",
        "hang@14:rank=5",
        "--drain-s",
        "30",
    )
    failover = report["failover"]
    assert failover["diagnosis_back_s"] is not None, failover
    assert failover["by_server"] != failover["killed_server"]
    assert report["drained"], report
    (hang,) = report["faults"]
    assert hang["finding_kind"] == "hang" and hang["to_finding_s"] is not None, hang
    assert report["false_findings"] == 0, report["false_finding_list"]


@pytest.mark.slow
def test_a_short_run_on_digests_against_a_real_server_finds_the_hang_and_nothing_else() -> None:
    # 64 ranks on 8 hosts on progress digests against a spawned server on SQLite; rank 5 hangs
    # 8 s in: the board sees the stall, the server asks the hosts for their entries, the hang is
    # found on them; no finding but the hang's.
    report = _loadgen(
        "--spawn",
        "sqlite",
        "--digests",
        "--ranks",
        "64",
        "--hosts",
        "8",
        "--groups",
        "4",
        "--duration",
        "20",
        "--window-s",
        "5",
        "--fault",
        "hang@8:rank=5",
        "--drain-s",
        "30",
    )
    assert report["digests"] and report["drained"] and report["errors"] == 0
    (hang,) = report["faults"]
    assert hang["finding_kind"] == "hang" and hang["to_finding_s"] is not None, hang
    assert report["false_findings"] == 0, report["false_finding_list"]
    digest = report["digest"]
    # A digest per host and interval (the last one may be cut off by the end), and entries only
    # when asked: at the job's first digests, then while its world group stalls.
    assert digest["requests"] >= 8 * 9 and 0 < digest["detail_answers"] < digest["requests"]
    assert report["entries"] > 0
    assert report["bytes_per_rank_per_s"] > report["ingest_bytes_per_rank_per_s"] > 0
    assert all("digest_request_ms" in w for w in report["windows"])
