"""The load generator's batches are what a collector sends (bench/loadgen/job.py builds them as
columns, without `encode_batch`, to keep its own CPU low beside the server it measures), its
faults happen where the command line puts them, and its report tells faults' findings from false
ones."""

from __future__ import annotations

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


def _sim(faults: list[Fault], ranks: int = 16, hosts: int = 2) -> Sim:
    topo = Topology(ranks, hosts, 3)
    topo.build()
    rng = random.Random(3)
    return Sim(
        job="lg",
        topo=topo,
        rate=10.0,
        interval_s=2.0,
        t0_ns=T0,
        groups_resend_s=60.0,
        faults=plan_faults(faults, T0, 10.0, 3, ranks),
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
def test_the_owner_killed_mid_run_another_server_diagnoses_the_job_and_finds_a_later_hang(
    pg_database: str,
) -> None:
    # Two servers in cluster mode on PostgreSQL; the one diagnosing the job is SIGKILLed 6 s in
    # (its advisory lock dies with its connection), its collectors move to the other one, and a
    # rank hangs 8 s after that: the survivor takes the job over, diagnoses it and finds the hang.
    report = _loadgen(
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
