"""The op_id-gap and all_to_all-balance rules on cases the real gloo jobs do not cover.

The real jobs (tests/test_analyze_p2p_sizes_coalesced.py) cover the paths with history: a
pipeline chain whose ranks issue different p2p counts, a repeated uneven all_to_all. These
dumps are built record by record, in the gloo shape (state `scheduled`, `retired`), to reach
the paths without history (a first step), MoE-style splits that change every step, a receiver
that expects too much, and NCCL's recorded p2p entries, which must not count as unrecorded ops.
"""

from __future__ import annotations

from flightdeck.analysis import diagnose, summarize
from flightdeck.analysis.p2p_gaps import gap
from flightdeck.records import Entry, GroupInfo, RankDump

S = 1_000_000_000
T0 = 1_800_000_000 * S


def _e(
    rid: int,
    seq: int,
    op_id: int,
    op: str = "all_reduce",
    *,
    ins: int = 8,
    outs: int = 8,
    retired: bool = True,
    p2p: bool = False,
) -> Entry:
    return Entry(
        record_id=rid,
        group="0",
        collective_seq_id=0 if p2p else seq,
        p2p_seq_id=1 if p2p else 0,
        op_id=op_id,
        backend="gloo",
        op=op,
        raw_op=f"gloo:{op}",
        is_p2p=p2p,
        input_sizes=((ins,),),
        output_sizes=((outs,),),
        input_dtypes=("Float",),
        output_dtypes=("Float",),
        state="scheduled",
        retired=retired,
        time_created_ns=T0 + rid * S // 10,
        peer=1 if p2p else None,
    )


def _dump(rank: int, entries: list[Entry], world: int) -> RankDump:
    return RankDump(
        rank=rank,
        source=f"rank_{rank}",
        version="2.10",
        entries=entries,
        groups={"0": GroupInfo("0", "default_pg", tuple(range(world)))},
        world_size=world,
    )


def _diagnose(dumps: list[RankDump]) -> list[tuple[str, int | None, list[int], list[int]]]:
    report = diagnose([summarize(d) for d in dumps], now_ns=T0 + 600 * S)
    return [(f.kind, f.collective_seq_id, f.culprit_ranks, f.waiting_ranks) for f in report.findings]


def test_first_step_ring_exchange_rank_with_fewer_ops_is_the_culprit() -> None:
    # Every rank sends to the next and receives from the previous (2 ops) before collective 2;
    # rank 1 left its send out (1 op) and reached 2; rank 2 waits for that send and never does.
    dumps = []
    for r in range(4):
        if r == 2:
            dumps.append(_dump(r, [_e(0, 1, 1)], 4))
        else:
            dumps.append(_dump(r, [_e(0, 1, 1), _e(1, 2, 3 if r == 1 else 4, retired=False)], 4))
    found = _diagnose(dumps)
    assert found[0] == ("hang", 2, [1], [0, 2, 3])


def test_same_p2p_counts_keep_the_stranded_ranks_named() -> None:
    dumps = [
        _dump(r, [_e(0, 1, 1)] if r in (1, 2) else [_e(0, 1, 1), _e(1, 2, 4, retired=False)], 4)
        for r in range(4)
    ]
    report = diagnose([summarize(d) for d in dumps], now_ns=T0 + 600 * S)
    f = report.findings[0]
    assert (f.kind, f.collective_seq_id, f.culprit_ranks) == ("hang", 2, [1, 2])
    assert "wrong peer" in f.detail


def test_hang_without_p2p_is_left_alone() -> None:
    dumps = [
        _dump(r, [_e(0, 1, 1)] if r == 3 else [_e(0, 1, 1), _e(1, 2, 2, retired=False)], 4) for r in range(4)
    ]
    report = diagnose([summarize(d) for d in dumps], now_ns=T0 + 600 * S)
    f = report.findings[0]
    assert (f.kind, f.culprit_ranks) == ("hang", [3])
    assert "point-to-point" not in f.detail


def test_recorded_p2p_entries_are_not_counted_as_unrecorded_ops() -> None:
    s = summarize(_dump(0, [_e(0, 1, 1), _e(1, 0, 2, "send", p2p=True), _e(2, 2, 3)], 2))
    g = gap(0, s.tracks["0"], 2)
    assert g is not None and g.issued == 0


def test_even_all_to_all_without_history_names_the_short_sender() -> None:
    # Four ranks, 8 elements each way; rank 3 sends 6: inputs add up to 30, outputs to 32.
    dumps = [_dump(r, [_e(0, 1, 1, "all_to_all", ins=6 if r == 3 else 8, outs=8)], 4) for r in range(4)]
    assert _diagnose(dumps)[0][:3] == ("size_mismatch", 1, [3])


def test_receiver_expecting_too_much_is_named_from_history() -> None:
    # Uneven totals per rank; at the second all_to_all rank 0 expects 2 more than is sent to it.
    totals = {0: (4, 6), 1: (6, 4), 2: (5, 5)}
    dumps = []
    for r, (i, o) in totals.items():
        es = [
            _e(0, 1, 1, "all_to_all", ins=i, outs=o),
            _e(1, 2, 2, "all_to_all", ins=i, outs=o + (2 if r == 0 else 0)),
        ]
        dumps.append(_dump(r, es, 3))
    assert _diagnose(dumps)[0][:3] == ("size_mismatch", 2, [0])


def test_splits_that_change_every_step_but_balance_are_healthy() -> None:
    steps = [{0: (4, 6), 1: (6, 4)}, {0: (9, 1), 1: (1, 9)}, {0: (3, 3), 1: (3, 3)}]
    dumps = [
        _dump(
            r,
            [_e(k, k + 1, k + 1, "all_to_all", ins=st[r][0], outs=st[r][1]) for k, st in enumerate(steps)],
            2,
        )
        for r in range(2)
    ]
    assert _diagnose(dumps) == []
