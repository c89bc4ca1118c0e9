"""Diagnosis of ranks that went silent while the others report: a cut-off host, a stopped or a
killed process (the shapes tests/test_fault_injection.py produces on a real namespace cluster).

Built record by record in gloo's shape (state `scheduled`, `retired` set on success and failure
alike) with the agent's metadata (snapshot kind and time, interval, exception), so each rule is
pinned on its own: what the server knows of a silent rank is its last snapshot, taken before the
collective the others are stuck in.
"""

from __future__ import annotations

from flightdeck.analysis import Finding, Options, diagnose, summarize
from flightdeck.records import Entry, GroupInfo, RankDump, SnapshotKind

S = 1_000_000_000
T0 = 1_800_000_000 * S
OPTS = Options(stall_after_s=10.0)
GROUPS = {"0": GroupInfo("0", "default_pg", (0, 1, 2, 3)), "2": GroupInfo("2", "shard1", (2, 3))}


def _e(
    seq: int, *, done: bool = True, group: str = "0", op: str = "all_reduce", at_s: float | None = None
) -> Entry:
    """A gloo entry; `done` sets `retired` (gloo's only mark, on success and on failure)."""
    created = T0 + int((seq if at_s is None else at_s) * S)
    return Entry(
        record_id=(created - T0) // 1_000_000,  # creation order, as in the ring
        group=group,
        collective_seq_id=seq,
        p2p_seq_id=0,
        op_id=seq,
        backend="gloo",
        op=op,
        raw_op=f"gloo:{op}",
        is_p2p=False,
        input_sizes=((64,),),
        output_sizes=((64,),),
        input_dtypes=("Float",),
        output_dtypes=("Float",),
        state="scheduled",
        retired=done,
        time_created_ns=created,
    )


def _dump(
    rank: int,
    entries: list[Entry],
    *,
    at_s: float,
    kind: SnapshotKind = "periodic",
    exception: str | None = None,
) -> RankDump:
    return RankDump(
        rank=rank,
        source=f"rank_{rank}",
        version="2.10",
        entries=entries,
        groups=GROUPS,
        world_size=4,
        host=f"h{rank // 2}",
        pid=100 + rank,
        snapshot_time_ns=T0 + int(at_s * S),
        kind=kind,
        interval_s=1.0,
        exception=exception,
    )


def test_cut_off_host_ranks_are_the_stranded_ones_in_the_collective_the_majority_waits_in() -> None:
    # Host h1 (ranks 2, 3) was cut off at t=8.5: the server's last word from it is at seq 5, while
    # ranks 0 and 1 went on to seq 11 (which needed 2 and 3) and have waited in it since t=11.
    majority = [_e(s) for s in range(1, 11)] + [_e(11, done=False)]
    dumps = [_dump(r, majority, at_s=30) for r in (0, 1)]
    dumps += [_dump(r, [_e(s) for s in range(1, 6)], at_s=8.5) for r in (2, 3)]
    report = diagnose([summarize(d) for d in dumps], now_ns=T0 + 31 * S, options=OPTS)
    (hang,) = [f for f in report.findings if f.kind == "hang"]
    assert (hang.process_group, hang.collective_seq_id, hang.op) == ("0", 11, "all_reduce")
    assert (hang.culprit_ranks, hang.waiting_ranks) == ([2, 3], [0, 1])
    assert [c.host for c in hang.culprits] == ["h1", "h1"]
    assert hang.elapsed_s == 20.0
    assert "not seen entering it" in hang.detail and "never entered" not in hang.detail
    lost = [f for f in report.findings if f.kind == "rank_lost"]
    assert [f.culprit_ranks for f in lost] == [[2, 3]]  # the whole host h1, one finding
    # Lost where the others are, not at its own (finished) last collective; and not called dead.
    assert {(f.process_group, f.collective_seq_id) for f in lost} == {("0", 11)}
    assert all("when its snapshots stopped" in f.detail and "died inside" not in f.detail for f in lost)
    assert all("SIGABRT" not in f.detail and "suspect" not in f.detail for f in lost)


def test_no_hang_while_the_majority_is_not_stuck_long_enough() -> None:
    majority = [_e(s) for s in range(1, 11)] + [_e(11, done=False)]
    dumps = [_dump(r, majority, at_s=15) for r in (0, 1)]
    dumps += [_dump(r, [_e(s) for s in range(1, 6)], at_s=8.5) for r in (2, 3)]
    report = diagnose([summarize(d) for d in dumps], now_ns=T0 + 15 * S, options=OPTS)
    assert not [f for f in report.findings if f.kind == "hang"]


def test_crash_hang_is_found_before_stall_after_once_the_dead_rank_is_silent() -> None:
    # Rank 3 was killed right after t=10; its last snapshot (t=9.5) shows seq 9 of group 0 and
    # seq 1 of its subgroup "2". Ranks 0 and 2 failed in seq 10 (peer gone) and wrote their finals;
    # rank 1 still waits in it and keeps snapshotting, later than those finals: it is not lost.
    done = [_e(s) for s in range(1, 10)]
    failed = [*done, _e(10, at_s=10.0)]  # retired: gloo's mark for the failure too
    sub_ok = [_e(1, group="2", op="all_gather", at_s=5.0)]
    sub_rank2 = [*sub_ok, _e(2, group="2", op="all_gather", at_s=9.8)]
    finals = [
        _dump(0, failed, at_s=10.3, kind="final", exception="RuntimeError: Connection closed by peer"),
        _dump(2, [*failed, *sub_rank2], at_s=10.3, kind="final", exception="RuntimeError: Connection closed"),
        _dump(3, [*done, *sub_ok], at_s=9.5),
    ]

    def named(rank1: RankDump, now_s: float) -> list[Finding]:
        report = diagnose([summarize(d) for d in [*finals, rank1]], now_ns=T0 + int(now_s * S), options=OPTS)
        return [f for f in report.findings if f.kind in ("hang", "rank_lost")]

    # At t=11 rank 1's latest snapshot (t=9.9) predates seq 10 as much as rank 3's, and neither
    # wrote a final: which of the two is dead is not known yet, so nobody is named, hung or lost.
    assert named(_dump(1, done, at_s=9.9), now_s=11) == []
    # At t=13 rank 1 has been seen waiting in seq 10, rank 3 silent for 3.5 s (3 intervals make a
    # rank lost): the hang is told, well before stall_after (10 s), since it cannot complete.
    found = [
        f
        for f in named(_dump(1, [*done, _e(10, done=False, at_s=10.0)], at_s=12.8), now_s=13)
        if f.kind == "hang"
    ]
    assert [(f.process_group, f.collective_seq_id, f.culprit_ranks, f.waiting_ranks) for f in found] == [
        ("0", 10, [3], [0, 1, 2])
    ]
    assert found[0].elapsed_s == 3.0
    # The subgroup's seq 2 finished on rank 2 after rank 3's last snapshot: rank 3 is not known to
    # have missed it, so no hang is claimed there; rank 1, alive after the finals, is not lost.
    report = diagnose(
        [summarize(d) for d in [*finals, _dump(1, [*done, _e(10, done=False, at_s=10.0)], at_s=12.8)]],
        now_ns=T0 + 13 * S,
        options=OPTS,
    )
    assert [f.culprit_ranks for f in report.findings if f.kind == "rank_lost"] == [[3]]
    assert report.findings[0].kind == "rank_lost"
    # Rank 3 was killed (SIGKILL): the snapshots show only that it left no final one; the detail
    # says that much and guesses no cause (it used to suggest gloo's SIGABRT for every dead rank).
    detail = report.findings[0].detail
    assert "died inside that one, without writing its final snapshot" in detail, detail
    assert "SIGABRT" not in detail and "suspect" not in detail


def test_lost_rank_whose_last_collective_is_in_a_subgroup_the_others_do_not_hold() -> None:
    # Ranks 0 and 1 are not members of group "2": looking for their position there must not fail.
    dumps = [
        _dump(r, [_e(s) for s in range(1, 11)], at_s=20, kind="final", exception="RuntimeError: peer")
        for r in (0, 1, 2)
    ]
    dumps.append(_dump(3, [_e(1), _e(2, group="2", op="all_gather", at_s=2.5)], at_s=3))
    report = diagnose([summarize(d) for d in dumps], now_ns=T0 + 21 * S, options=OPTS)
    (lost,) = [f for f in report.findings if f.kind == "rank_lost"]
    assert (lost.culprit_ranks, lost.process_group, lost.collective_seq_id) == ([3], "2", 2)


def test_mismatch_finding_carries_how_long_the_divergent_collective_has_been_pending() -> None:
    dumps = [_dump(r, [_e(1), _e(2), _e(3, done=False, at_s=4.0)], at_s=9) for r in (0, 1, 2)]
    dumps.append(_dump(3, [_e(1), _e(2), _e(3, done=False, op="all_gather", at_s=4.2)], at_s=9))
    report = diagnose([summarize(d) for d in dumps], now_ns=T0 + 9 * S, options=OPTS)
    f = report.findings[0]
    assert (f.kind, f.culprit_ranks, f.collective_seq_id) == ("collective_type_mismatch", [3], 3)
    assert f.elapsed_s == 5.0


def test_a_host_that_went_silent_as_a_whole_is_one_finding_naming_the_host() -> None:
    # Host h1 (ranks 2, 3) cut off: one rank_lost finding for the host, ranks 2 and 3 together,
    # and the hang points back at it as its root cause.
    majority = [_e(s) for s in range(1, 11)] + [_e(11, done=False)]
    dumps = [_dump(r, majority, at_s=30) for r in (0, 1)]
    dumps += [_dump(r, [_e(s) for s in range(1, 6)], at_s=8.5) for r in (2, 3)]
    report = diagnose([summarize(d) for d in dumps], now_ns=T0 + 31 * S, options=OPTS)
    lost = [f for f in report.findings if f.kind == "rank_lost"]
    assert len(lost) == 1 and lost[0].culprit_ranks == [2, 3], lost
    assert lost[0].detail.startswith("Host h1 went silent: all 2 of its ranks (2, 3)"), lost[0].detail
    assert report.findings[0] is lost[0]
    (hang,) = [f for f in report.findings if f.kind == "hang"]
    assert hang.consequence_of is not None


def test_one_silent_rank_of_a_host_whose_other_rank_reports_is_not_folded() -> None:
    # Only rank 3 stopped (SIGSTOP): its host h1 is alive (rank 2 reports), so no host finding.
    majority = [_e(s) for s in range(1, 11)] + [_e(11, done=False)]
    dumps = [_dump(r, majority, at_s=30) for r in (0, 1, 2)]
    dumps += [_dump(3, [_e(s) for s in range(1, 6)], at_s=8.5)]
    report = diagnose([summarize(d) for d in dumps], now_ns=T0 + 31 * S, options=OPTS)
    lost = [f for f in report.findings if f.kind == "rank_lost"]
    assert [f.culprit_ranks for f in lost] == [[3]]
    assert not lost[0].detail.startswith("Host"), lost[0].detail


def _hang_of(dumps: list[RankDump], now_s: float) -> Finding:
    (hang,) = [
        f
        for f in diagnose([summarize(d) for d in dumps], now_ns=T0 + int(now_s * S), options=OPTS).findings
        if f.kind == "hang"
    ]
    return hang


def test_host_cut_off_between_its_ranks_snapshots_strands_both_ranks() -> None:
    # The link of h1 went down at t=11.3: rank 3's last snapshot (t=11.2) shows it in seq 11, rank
    # 2's (t=11.1) only seq 10 finished. Both are silent since, while ranks 0 and 1 keep reporting
    # from seq 11: rank 3 is stranded with rank 2, not waiting with the majority.
    majority = [_e(s) for s in range(1, 11)] + [_e(11, done=False)]
    behind = _dump(2, [_e(s) for s in range(1, 11)], at_s=11.1)
    dumps = [_dump(0, majority, at_s=30), _dump(1, majority, at_s=30), behind, _dump(3, majority, at_s=11.2)]
    hang = _hang_of(dumps, now_s=31)
    assert (hang.collective_seq_id, hang.culprit_ranks, hang.waiting_ranks) == (11, [2, 3], [0, 1])
    assert [c.host for c in hang.culprits] == ["h1", "h1"]
    assert "Rank 3 (h1 pid 103) entered it too but has sent nothing for 19.8 s" in hang.detail, hang.detail
    # Rank 3 still reporting (only rank 2 stuck elsewhere): it waits with the majority.
    hang = _hang_of([*dumps[:3], _dump(3, majority, at_s=30.5)], now_s=31)
    assert (hang.culprit_ranks, hang.waiting_ranks) == ([2], [0, 1, 3])
    # Every waiting rank silent (the job's collectors all gone): none is known to be fresher than
    # the others, so nobody is moved.
    hang = _hang_of([*(_dump(r, majority, at_s=11.2) for r in (0, 1, 3)), behind], now_s=31)
    assert (hang.culprit_ranks, hang.waiting_ranks) == ([2], [0, 1, 3])
