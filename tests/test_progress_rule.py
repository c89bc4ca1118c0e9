"""Busy or stuck, the pure rule (`flightdeck.analysis.progress`) on plain records.

Four gloo-shaped ranks: ranks 1-3 wait in barrier seq 5, rank 0 (the culprit) last finished seq 4.
What rank 0's agent evidence says (`Progress`) decides between a `slow_rank` finding, a hang and
no verdict yet. Real jobs show the same end to end in tests/test_busy_or_stuck.py.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from flightdeck.analysis import Options, diagnose, summarize
from flightdeck.analysis.frames import innermost_user_frame, is_user_frame
from flightdeck.records import Entry, Frame, GroupInfo, Progress, RankDump, progress_from_dict
from flightdeck.wire import Batch, WireError, decode_batch, encode_batch, snapshot_from_dump

S = 1_000_000_000
T0 = 1_800_000_000 * S
#: When rank 1-3 entered the barrier.
WAIT_START = T0 + 10 * S
STALL = 5.0

SAVE = (
    Frame("_write", "/venv/lib/python3.11/site-packages/torch/serialization.py", 650),
    Frame("save", "/venv/lib/python3.11/site-packages/torch/serialization.py", 600),
    Frame("save_checkpoint", "/job/train.py", 88),
    Frame("main", "/job/train.py", 120),
)
QUEUE = (
    Frame("wait", "/usr/lib/python3.11/threading.py", 320),
    Frame("get", "/usr/lib/python3.11/queue.py", 171),
    Frame("next_batch", "/job/loader.py", 42),
    Frame("main", "/job/train.py", 118),
)


def _e(rid: int, seq: int, *, done: bool) -> Entry:
    return Entry(
        record_id=rid,
        group="0",
        collective_seq_id=seq,
        p2p_seq_id=0,
        op_id=rid + 1,
        backend="gloo",
        op="barrier",
        raw_op="gloo:barrier",
        is_p2p=False,
        input_sizes=((1,),),
        output_sizes=((1,),),
        input_dtypes=("Float",),
        output_dtypes=("Float",),
        state="scheduled",
        retired=done,
        time_created_ns=WAIT_START if seq == 5 else T0 + seq * S,
        timeout_ms=120_000,
    )


def _dumps(now: int, progress: Progress | None, *, kind: str = "periodic") -> list[RankDump]:
    out = []
    for r in range(4):
        entries = [_e(i, i + 1, done=True) for i in range(4)]
        if r:
            entries.append(_e(4, 5, done=False))
        out.append(
            RankDump(
                rank=r,
                source=f"rank_{r}",
                version="2.13",
                entries=entries,
                groups={"0": GroupInfo("0", "default_pg", (0, 1, 2, 3))},
                world_size=4,
                snapshot_time_ns=now,
                kind="periodic" if r else kind,  # type: ignore[arg-type]
                interval_s=1.0,
                progress=progress if r == 0 else None,
            )
        )
    return out


def _busy(now: int, frames: tuple[Frame, ...] = SAVE) -> Progress:
    """Working at its latest sample (CPU time grew in the last window)."""
    return Progress(now, active_ns=now, since_ns=T0, cpu_ns=40 * S, cpu_share=0.97, state="R", frames=frames)


def _idle(now: int, since: int, frames: tuple[Frame, ...] = QUEUE) -> Progress:
    """No progress since `since`."""
    return Progress(now, active_ns=since, since_ns=T0, cpu_ns=3 * S, cpu_share=0.0, state="S", frames=frames)


def _findings(now: int, progress: Progress | None, opts: Options | None = None, **kw: str) -> list:  # type: ignore[type-arg]
    report = diagnose(
        [summarize(d) for d in _dumps(now, progress, **kw)],
        now_ns=now,
        options=opts or Options(stall_after_s=STALL),
    )
    return [f for f in report.findings if f.kind in ("hang", "slow_rank")]


def test_a_busy_culprit_is_a_slow_rank_that_names_its_frame_not_a_hang() -> None:
    now = WAIT_START + 41 * S
    (f,) = _findings(now, _busy(now))
    assert f.kind == "slow_rank"
    assert (f.culprit_ranks, f.waiting_ranks, f.collective_seq_id) == ([0], [1, 2, 3], 5)
    assert "rank 0 is busy in save_checkpoint (train.py:88), 97% of a core" in f.detail, f.detail
    assert "for 41.0 s so far; ranks 1-3 wait in barrier (group 0, collective_seq_id 5)" in f.detail
    assert "half the group's timeout of 120 s" in f.detail
    assert f.culprit_frames == SAVE


def test_a_culprit_without_progress_for_stall_after_is_a_hang_naming_its_line() -> None:
    now = WAIT_START + 7 * S
    (f,) = _findings(now, _idle(now, since=WAIT_START))
    assert f.kind == "hang" and f.culprit_ranks == [0]
    assert "Its main thread is in next_batch (loader.py:42), without progress for 7.0 s." in f.detail
    assert f.culprit_frames == QUEUE


def test_a_culprit_whose_evidence_stopped_is_a_hang_naming_where_it_was_last_seen() -> None:
    """SIGSTOP, SIGKILL or a cut link: its last sample is older than stall_after, so it says
    nothing about now (the plain rule decides: a hang), but it is the only code line there is
    (periodic snapshots carry no entry frames, and a stopped process writes no stall snapshot)."""
    now = WAIT_START + 8 * S
    (f,) = _findings(now, _busy(WAIT_START - S, frames=QUEUE))
    assert f.kind == "hang" and f.culprit_ranks == [0]
    assert f.culprit_frames == QUEUE
    assert "Its main thread was last seen in next_batch (loader.py:42), 9.0 s ago" in f.detail, f.detail
    # Without evidence at all (torch's own dumps): nothing is made up.
    (plain,) = _findings(now, None)
    assert plain.kind == "hang" and plain.culprit_frames == () and "last seen" not in plain.detail


def test_progress_seen_a_little_while_ago_gives_no_verdict_yet() -> None:
    """Between busy and stuck (progress 3 s ago, stall_after 5 s): neither finding, for now."""
    now = WAIT_START + 6 * S
    assert _findings(now, _idle(now, since=now - 3 * S)) == []
    # A busy sample that arrived late: busy 1.5 s before it was taken, 4 s ago, says nothing about
    # the 5.5 s since its last progress (it may have blocked right after).
    late = replace(_busy(now - 4 * S), active_ns=now - int(5.5 * S))
    assert _findings(now, late) == []
    # Delivered 3 s late but busy up to its sample: still busy.
    assert [f.kind for f in _findings(now, _busy(now - 3 * S))] == ["slow_rank"]


def test_progress_now_and_then_is_slow_once_the_others_waited_twice_stall_after() -> None:
    """A culprit that makes progress every 3 s (a loop polling with a sleep) is never stuck: after
    twice stall_after of waiting it is slow, and past the ceiling a hang, never left unreported."""
    now = WAIT_START + 11 * S
    (f,) = _findings(now, _idle(now, since=now - 3 * S))
    assert f.kind == "slow_rank" and f.culprit_ranks == [0]
    now = WAIT_START + 61 * S
    (f,) = _findings(now, _idle(now, since=now - 3 * S))
    assert f.kind == "hang" and "longer than half the group's timeout" in f.detail


def test_slow_longer_than_the_ceiling_is_a_hang() -> None:
    # Default ceiling: half the group's 120 s timeout.
    now = WAIT_START + 59 * S
    assert [f.kind for f in _findings(now, _busy(now))] == ["slow_rank"]
    now = WAIT_START + 61 * S
    (f,) = _findings(now, _busy(now))
    assert f.kind == "hang" and "longer than half the group's timeout of 120 s (60 s)" in f.detail, f.detail
    assert f.culprit_frames == SAVE
    # A configured ceiling wins.
    now = WAIT_START + 31 * S
    (f,) = _findings(now, _busy(now), Options(stall_after_s=STALL, slow_ceiling_s=30.0))
    assert f.kind == "hang" and "longer than the configured ceiling (30 s)" in f.detail, f.detail


def test_without_fresh_evidence_the_plain_rule_stands() -> None:
    now = WAIT_START + 41 * S
    # No evidence at all (torch's own dumps, an older agent).
    assert [f.kind for f in _findings(now, None)] == ["hang"]
    # Evidence older than stall_after: the process may be stopped; it says nothing about now.
    (f,) = _findings(now, _busy(now - 10 * S))
    assert f.kind == "hang"


def test_a_culprit_that_exited_is_not_judged_by_its_evidence() -> None:
    now = WAIT_START + 41 * S
    assert [f.kind for f in _findings(now, _busy(now), kind="final")] == ["hang"]


def test_before_stall_after_nothing_is_reported_either_way() -> None:
    now = WAIT_START + 4 * S
    assert _findings(now, _busy(now)) == []
    assert _findings(now, _idle(now, WAIT_START)) == []


def test_the_user_frame_rule_skips_torch_the_stdlib_and_the_agent() -> None:
    assert innermost_user_frame(SAVE) == SAVE[2]
    assert innermost_user_frame(QUEUE) == QUEUE[2]
    assert not is_user_frame(Frame("run", "/work/flightdeck/agent.py", 1))
    assert not is_user_frame(Frame("_run", "/work/flightdeck/agent/core.py", 1))
    assert not is_user_frame(Frame("_run_code", "<frozen runpy>", 88))
    # The user's own package installed into site-packages is the user's code.
    assert is_user_frame(Frame("step", "/venv/lib/python3.11/site-packages/mytrainer/loop.py", 5))
    # typing_extensions' `deprecated` wrapper (around torch's all_gather_into_tensor) is not.
    wrapped = (
        Frame("wrapper", "/venv/lib/python3.11/site-packages/typing_extensions.py", 3140),
        Frame("sync_grads", "/job/train.py", 77),
    )
    assert innermost_user_frame(wrapped) == wrapped[1]


def test_progress_survives_the_wire_round_trip() -> None:
    now = WAIT_START + 41 * S
    dump = _dumps(now, _busy(now))[0]
    batch = Batch("b1", "host", "0", now, [snapshot_from_dump(dump, job="j")])
    (snap,) = decode_batch(encode_batch(batch)).snapshots
    assert snap.progress == dump.progress


def test_bad_progress_on_the_wire_is_named() -> None:
    now = WAIT_START
    doc = encode_batch(
        Batch("b1", "host", "0", now, [snapshot_from_dump(_dumps(now, _busy(now))[0], job="j")])
    )
    doc["snapshots"][0]["progress"]["stk"] = 99
    with pytest.raises(WireError, match=r"progress\.stk: 99 is not an index"):
        decode_batch(doc)
    doc["snapshots"][0]["progress"] = {"sampled_ns": "soon"}
    with pytest.raises(WireError, match=r"progress\.sampled_ns"):
        decode_batch(doc)
    # Lenient on the sidecar side: wrong-typed fields are dropped, not fatal.
    p = progress_from_dict({"sampled_ns": 5, "cpu_ns": "x", "frames": [{"name": 1}], "state": 3})
    assert p == Progress(5, frames=(Frame("1", "", 0),))
    assert progress_from_dict({"cpu_ns": 1}) is None
