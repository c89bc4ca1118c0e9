"""Entries built by hand for the ingest tests: a completed all_reduce over the stack table `STACKS`."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from flightdeck.records import Entry, Frame

STACKS = [(Frame("f", "a.py", 1),), (Frame("g", "b.py", 2), Frame("h", "c.py", 3))]


def entry(i: int, **kw: Any) -> Entry:
    """A completed all_reduce with record id `i` (fields overridable)."""
    e = Entry(
        record_id=i,
        group="0",
        collective_seq_id=i + 1,
        p2p_seq_id=0,
        op_id=i + 1,
        backend="gloo",
        op="all_reduce",
        raw_op="gloo:all_reduce",
        is_p2p=False,
        input_sizes=((4, 16),),
        output_sizes=((4, 16),),
        input_dtypes=("Float",),
        output_dtypes=("Float",),
        state="completed",
        retired=True,
        time_created_ns=1_000 + i,
        time_started_ns=2_000 + i,
        time_completed_ns=3_000 + i,
        duration_ms=0.25,
        timeout_ms=600_000,
        thread_name="python",
        peer=None,
        frames=STACKS[i % 2],
    )
    return replace(e, **kw)
