"""The normalized records: the shapes every layer after the reader shares."""

from __future__ import annotations

import inspect
from dataclasses import fields
from typing import Any

from flightdeck.records import Entry, Frame, Signature, entries_from_columns, signature_fields


def _distinct_entry() -> Entry:
    """An entry whose every value differs from the others of its type."""
    return Entry(
        record_id=1,
        group="g",
        collective_seq_id=2,
        p2p_seq_id=3,
        op_id=4,
        backend="nccl",
        op="all_reduce",
        raw_op="nccl:allreduce",
        is_p2p=True,
        input_sizes=((5,),),
        output_sizes=((6, 7),),
        input_dtypes=("Float",),
        output_dtypes=("Half",),
        state="started",
        retired=False,
        time_created_ns=8,
        time_started_ns=9,
        time_completed_ns=10,
        duration_ms=11.5,
        timeout_ms=12,
        thread_name="main",
        peer=13,
        frames=(Frame("f", "x.py", 14),),
    )


def test_entries_from_columns_takes_every_field_in_entry_order() -> None:
    # It passes the columns to Entry by position: a field added to Entry, or reordered, must be
    # added or moved there too.
    names = [f.name for f in fields(Entry)]
    assert list(inspect.signature(entries_from_columns).parameters) == names
    e = _distinct_entry()
    columns: dict[str, Any] = {name: [getattr(e, name)] for name in names}
    assert entries_from_columns(**columns) == [e]
    assert entries_from_columns(**{name: [] for name in names}) == []


def test_signature_fields_are_entry_fields_and_key_like_the_signature() -> None:
    names = [f.name for f in fields(Entry)]
    assert set(Signature._fields) <= set(names)
    assert sorted(Signature._fields, key=names.index) == list(Signature._fields)  # Entry's order
    e = _distinct_entry()
    key = signature_fields(e)
    sig = Signature._make(key)
    assert sig == key and hash(sig) == hash(key) and {key: 1}[sig] == 1
    assert sig.raw_op == e.raw_op and sig.output_dtypes == e.output_dtypes
