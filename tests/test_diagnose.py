"""Diagnosis rules that the gloo corpus cannot show: NCCL states, point-to-point, even splits.

NCCL cannot run on these CPU-only machines, so these dumps are built record by record in NCCL's
shape (states `scheduled`/`started`/`completed`, `nccl:send 0->1` profiling names, `is_p2p`), as
read from PyTorch's source; every gloo behaviour is tested on real dumps elsewhere.
"""

from __future__ import annotations

import json
from dataclasses import replace

from flightdeck.analysis import Options, add_entries, diagnose, summarize
from flightdeck.readers.fr.files import read_dump_file
from flightdeck.readers.fr.parse import parse_dump
from flightdeck.records import Entry, Frame, GroupInfo, RankDump, State
from flightdeck.wire import Batch, decode_batch, encode_batch, snapshot_from_dump

S = 1_000_000_000
T0 = 1_800_000_000 * S


def _e(
    rid: int,
    seq: int,
    op: str = "all_reduce",
    *,
    state: State = "completed",
    size: int = 8,
    dtype: str = "Float",
    p2p: bool = False,
    peer: int | None = None,
    p2p_seq: int = 0,
) -> Entry:
    name = f"nccl:{op}" + (f" 0->{peer}" if p2p and op == "send" else f" 0<-{peer}" if p2p else "")
    return Entry(
        record_id=rid,
        group="0",
        collective_seq_id=0 if p2p else seq,
        p2p_seq_id=p2p_seq,
        op_id=rid + 1,
        backend="nccl",
        op=op,
        raw_op=name,
        is_p2p=p2p,
        input_sizes=((size,),),
        output_sizes=((size,),),
        input_dtypes=(dtype,),
        output_dtypes=(dtype,),
        state=state,
        retired=state == "completed",
        time_created_ns=T0 + rid * S // 10,
        peer=peer,
        frames=(Frame(f"step_{op}", "train.py", 10 + rid),),
    )


def _dump(rank: int, entries: list[Entry], world: int = 2) -> RankDump:
    return RankDump(
        rank=rank,
        source=f"rank_{rank}",
        version="2.10",
        entries=entries,
        groups={"0": GroupInfo("0", "default_pg", tuple(range(world)))},
        world_size=world,
        snapshot_time_ns=T0 + 60 * S,
    )


def test_nccl_rank_that_never_started_the_kernel_is_the_culprit() -> None:
    dumps = [
        _dump(r, [_e(0, 1), _e(1, 2, state="scheduled" if r == 2 else "started")], world=4) for r in range(4)
    ]
    report = diagnose([summarize(d) for d in dumps], now_ns=T0 + 60 * S)
    f = report.findings[0]
    assert (f.kind, f.culprit_ranks, f.collective_seq_id) == ("hang", [2], 2)
    assert "never started it on the device" in f.detail


def test_all_entered_none_finished_says_why_no_culprit() -> None:
    dumps = [_dump(r, [_e(0, 1), _e(1, 2, state="started")], world=3) for r in range(3)]
    f = diagnose([summarize(d) for d in dumps], now_ns=T0 + 60 * S).findings[0]
    assert f.kind == "hang" and f.culprit_ranks == []
    assert "No rank is behind" in f.detail


def test_two_ranks_disagreeing_evenly_are_both_named_never_rank_0_as_reference() -> None:
    dumps = [_dump(0, [_e(0, 1, size=8)]), _dump(1, [_e(0, 1, size=16)])]
    f = diagnose([summarize(d) for d in dumps], now_ns=T0 + 60 * S).findings[0]
    assert f.kind == "size_mismatch"
    assert f.culprit_ranks == [0, 1]
    assert "split evenly" in f.detail


def test_majority_decides_the_culprit_even_when_rank_0_differs() -> None:
    dumps = [_dump(r, [_e(0, 1, dtype="Double" if r == 0 else "Float")], world=4) for r in range(4)]
    f = diagnose([summarize(d) for d in dumps], now_ns=T0 + 60 * S).findings[0]
    assert (f.kind, f.culprit_ranks) == ("dtype_mismatch", [0])


def test_p2p_size_mismatch_and_unmatched_send() -> None:
    r0 = _dump(0, [_e(0, 0, "send", p2p=True, peer=1, size=8), _e(1, 0, "send", p2p=True, peer=1, size=8)])
    r1 = _dump(1, [_e(0, 0, "recv", p2p=True, peer=0, size=4)])
    f = diagnose([summarize(r0), summarize(r1)], now_ns=T0 + 60 * S).findings[0]
    assert f.kind == "p2p_mismatch" and f.culprit_ranks == [0, 1]
    # Sizes agree, but rank 1 never posts the second recv: a point-to-point hang naming rank 1.
    r1ok = _dump(1, [_e(0, 0, "recv", p2p=True, peer=0, size=8)])
    r0b = replace(r0, entries=[r0.entries[0], replace(r0.entries[1], state="started", retired=False)])
    findings = diagnose([summarize(r0b), summarize(r1ok)], now_ns=T0 + 60 * S).findings
    assert [(x.kind, x.culprit_ranks, x.waiting_ranks) for x in findings] == [("hang", [1], [0])]


def test_options_validate() -> None:
    import pytest

    with pytest.raises(ValueError, match="stall_after_s"):
        Options(stall_after_s=-1)


def test_wire_round_trip_on_a_real_dump() -> None:
    from pathlib import Path

    path = Path(__file__).parent / "data" / "fr" / "skip" / "rank_0.stall.pkl"
    dump = read_dump_file(path)
    batch = Batch("b-1", "node-1", "0.1.0", T0, [snapshot_from_dump(dump)])
    doc = json.loads(json.dumps(encode_batch(batch)))
    decoded = decode_batch(doc)
    assert decoded.snapshots[0].entries == dump.entries
    assert decoded.snapshots[0].thread_stacks == dump.thread_stacks
    # Each distinct stack travels once.
    assert len(doc["stacks"]) == len(
        {e.frames for e in dump.entries if e.frames} | {t.frames for t in dump.thread_stacks if t.frames}
    )


def test_wire_errors_name_the_field() -> None:
    import pytest

    from flightdeck.wire import WireError

    with pytest.raises(WireError, match=r"batch\.snapshots\[0\]\.rank: expected int"):
        decode_batch(
            {
                "wire_version": 2,
                "batch_id": "x",
                "collector": {"host": "h"},
                "sent_at_ns": 1,
                "stacks": [],
                "sigs": [],
                "snapshots": [{"job": "j", "kind": "periodic", "rank": "3"}],
            }
        )
    with pytest.raises(WireError, match="wire_version"):
        decode_batch({"wire_version": 99})


def test_json_dump_of_nccl_shape_parses_timestamps_and_p2p_peer() -> None:
    raw = {
        "version": "2.10",
        "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}},
        "entries": [
            {
                "record_id": 0,
                "pg_id": 0,
                "process_group": ["0", "default_pg"],
                "collective_seq_id": 0,
                "p2p_seq_id": 1,
                "op_id": 1,
                "profiling_name": "nccl:send 0->1",
                "time_created_ns": T0,
                "input_sizes": [[4]],
                "output_sizes": [[4]],
                "input_dtypes": ["Float"],
                "output_dtypes": ["Float"],
                "state": "completed",
                "time_discovered_started_ns": 0,
                "time_discovered_completed_ns": T0 + 5,
                "retired": True,
                "timeout_ms": 600000,
                "is_p2p": True,
                "duration_ms": 0.5,
                "thread_name": "t",
                "thread_id": "1",
            }
        ],
    }
    d = parse_dump(raw, rank=0, source="x")
    e = d.entries[0]
    assert (e.op, e.peer, e.time_started_ns, e.time_completed_ns, e.duration_ms) == (
        "send",
        1,
        None,
        T0 + 5,
        0.5,
    )
    assert d.groups["0"].ranks == (0, 1)


def test_resent_p2p_entries_replace_their_earlier_copy() -> None:
    from flightdeck.analysis import add_entries

    first = _e(0, 0, "send", p2p=True, peer=1, state="started")
    s = summarize(_dump(0, [first]))
    add_entries(s, [replace(first, state="completed", retired=True)])
    assert [(e.record_id, e.state) for e in s.tracks["0"].p2p] == [(0, "completed")]


def test_incremental_diagnosis_compares_only_new_collectives_and_still_finds_a_mismatch() -> None:
    # A live server passes each diagnosis's `agreed` to the next: the history already found in
    # agreement is not compared again, and a divergence among the newer collectives is found.
    summaries = [summarize(_dump(r, [_e(i, i + 1) for i in range(6)], world=3)) for r in range(3)]
    first = diagnose(summaries, now_ns=T0 + 60 * S)
    assert first.healthy
    assert first.agreed == {"0": (6, 3)}
    assert "agreed" not in first.to_json()
    for r, s in enumerate(summaries):
        add_entries(s, [_e(6, 7), _e(7, 8, size=16 if r == 1 else 8)])
    second = diagnose(summaries, now_ns=T0 + 60 * S, agreed=first.agreed)
    f = second.findings[0]
    assert (f.kind, f.culprit_ranks, f.collective_seq_id) == ("size_mismatch", [1], 8)
    assert second.agreed == {"0": (7, 3)}
    # Found again from the same state: the agreement stops before the divergent collective.
    again = diagnose(summaries, now_ns=T0 + 60 * S, agreed=second.agreed)
    assert [x.kind for x in again.findings] == ["size_mismatch"]


def test_incremental_diagnosis_compares_everything_again_when_a_rank_joins() -> None:
    # A rank heard from late (its collector was down) disagrees at an old collective: the
    # agreement of the others does not cover it, so its whole window is compared.
    early = [summarize(_dump(r, [_e(i, i + 1) for i in range(6)], world=3)) for r in range(2)]
    first = diagnose(early, now_ns=T0 + 60 * S, world_size=3)
    assert first.agreed == {"0": (6, 2)}
    late = summarize(_dump(2, [_e(i, i + 1, dtype="Half" if i == 2 else "Float") for i in range(6)], world=3))
    report = diagnose([*early, late], now_ns=T0 + 60 * S, agreed=first.agreed)
    f = report.findings[0]
    assert (f.kind, f.culprit_ranks, f.collective_seq_id) == ("dtype_mismatch", [2], 3)
