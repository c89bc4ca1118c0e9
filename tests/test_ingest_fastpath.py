"""The ingest fast paths give what the plain ones give: batch decoding (`flightdeck.wire`'s entry
columns, against the entries encoded), the SQLite multi-row entry upsert (against the rows read
back), and the garbage-collector pause around decoding."""

from __future__ import annotations

import gc
import json
import re
import sqlite3
import uuid
from dataclasses import replace
from typing import Any

import pytest
from sqlalchemy import event

from flightdeck.records import Entry, Frame
from flightdeck.runtime_tuning import GcPause
from flightdeck.server import store
from flightdeck.server.db import connect, migrate
from flightdeck.server.models import EntryRow
from flightdeck.wire import Batch, Snapshot, WireError, decode_batch, encode_batch
from tests.support.wire_docs import STACKS, entry

ODD_ENTRIES = [
    entry(0),
    entry(1, state="scheduled", retired=False, time_started_ns=None, time_completed_ns=None),
    entry(2, is_p2p=True, raw_op="gloo:send 0->1", op="send", peer=1, p2p_seq_id=3, frames=()),
    entry(3, input_sizes=(), output_sizes=((1,), (2, 3)), input_dtypes=(), duration_ms=None),
    entry(4, raw_op="nccl:_allgather_base", op="all_gather", backend="nccl", thread_name=""),
    entry(5, timeout_ms=None, state="started"),
]


def columns_doc(entries: list[Entry]) -> dict[str, Any]:
    """A batch document of one snapshot with these entries, through JSON."""
    snap = Snapshot(job="j", attempt=0, rank=0, snapshot_time_ns=1, entries=entries)
    doc: dict[str, Any] = json.loads(json.dumps(encode_batch(Batch("b1", "host", "1", 1, [snap]))))
    return doc


def test_columns_round_trip_and_share_what_repeats() -> None:
    doc = columns_doc(ODD_ENTRIES)
    cols = doc["snapshots"][0]["entries"]
    assert doc["wire_version"] == 2 and cols["n"] == len(ODD_ENTRIES)
    assert len(doc["sigs"]) == 4  # entries 0, 1 and 5 share one signature
    assert decode_batch(doc).snapshots[0].entries == ODD_ENTRIES
    # Columns holding only their default are left out, and decode to it.
    plain = [entry(i, frames=(), peer=None, thread_name="") for i in range(3)]
    cols = columns_doc(plain)["snapshots"][0]["entries"]
    assert not {"stk", "peer", "thr"} & cols.keys()
    assert decode_batch(columns_doc(plain)).snapshots[0].entries == plain
    empty = columns_doc([])
    required = ("rid", "g", "seq", "p2p", "opid", "st", "ret", "tc", "sig")
    assert empty["snapshots"][0]["entries"] == {"n": 0, **{k: [] for k in required}}
    assert decode_batch(empty).snapshots[0].entries == []


def test_columns_take_int_durations_as_floats() -> None:
    doc = columns_doc([entry(0), entry(1)])
    doc["snapshots"][0]["entries"]["dur"] = [1, None]
    got = decode_batch(doc).snapshots[0].entries
    assert [e.duration_ms for e in got] == [1.0, None] and type(got[0].duration_ms) is float


def several_snapshots_doc() -> tuple[dict[str, Any], list[list[Entry]]]:
    """A version 2 batch of three snapshots whose optional columns differ (frames, peers and
    thread names in the first only, none in the second, an empty third), through JSON."""
    ents = [ODD_ENTRIES, [entry(10 + i, frames=(), peer=None, thread_name="") for i in range(3)], []]
    snaps = [Snapshot(job="j", attempt=0, rank=r, snapshot_time_ns=1, entries=e) for r, e in enumerate(ents)]
    doc: dict[str, Any] = json.loads(json.dumps(encode_batch(Batch("b1", "host", "1", 1, snaps))))
    return doc, ents


def test_the_columns_of_several_snapshots_decode_together() -> None:
    doc, ents = several_snapshots_doc()
    assert "stk" in doc["snapshots"][0]["entries"] and "stk" not in doc["snapshots"][1]["entries"]
    assert [s.entries for s in decode_batch(doc).snapshots] == ents


def test_a_bad_column_in_a_later_snapshot_is_named() -> None:
    # The error names the snapshot and the field, not only the first snapshot's.
    doc, _ = several_snapshots_doc()
    doc["snapshots"][1]["entries"]["tc"][2] = "late"
    with pytest.raises(WireError) as exc:
        decode_batch(doc)
    assert str(exc.value) == "batch.snapshots[1].entries.tc: expected ints, got int, str"
    doc, _ = several_snapshots_doc()
    doc["snapshots"][2]["entries"]["n"] = 1
    with pytest.raises(WireError) as exc:
        decode_batch(doc)
    assert str(exc.value) == "batch.snapshots[2].entries.rid: expected a list of 1 values"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"n": -1}, "entries.n: expected the number of entries (an int >= 0)"),
        ({"n": 3}, "entries.rid: expected a list of 3 values"),
        ({"rid": None}, "entries: missing column 'rid'"),
        ({"rid": [0, "1"]}, "entries.rid: expected ints, got int, str"),
        ({"seq": [1, True]}, "entries.seq: expected ints, got bool, int"),
        ({"tc": [1.0, 2]}, "entries.tc: expected ints, got float, int"),
        ({"ret": [1, 0]}, "entries.ret: expected booleans, got int"),
        ({"g": "00"}, "entries.g: expected a list of 2 values"),
        ({"st": ["completed", "done"]}, "entries.st: unknown entry state 'done'"),
        ({"st": [["completed"], "started"]}, "entries.st: expected strings, got list, str"),
        ({"dur": ["0.5", None]}, "entries.dur: expected numbers or nulls, got NoneType, str"),
        ({"thr": [None, "x"]}, "entries.thr: expected strings, got NoneType, str"),
        ({"sig": [0, 7]}, "entries.sig: 7 is not an index into batch.sigs"),
        ({"sig": [0, -1]}, "entries.sig: -1 is not an index into batch.sigs"),
        ({"sig": [0, None]}, "entries.sig: expected ints, got NoneType, int"),
        ({"stk": [0, 9]}, "entries.stk: 9 is not an index into batch.stacks"),
        ({"stk": [0, "1"]}, "entries.stk: expected ints or nulls, got int, str"),
    ],
)
def test_column_errors_name_the_field(change: dict[str, Any], message: str) -> None:
    doc = columns_doc([entry(0), entry(1)])
    cols = doc["snapshots"][0]["entries"]
    for k, v in change.items():
        if v is None and k == "rid":
            del cols[k]
        else:
            cols[k] = v
    with pytest.raises(WireError) as exc:
        decode_batch(doc)
    assert str(exc.value) == "batch.snapshots[0]." + message


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"isz": [[1, "x"]]}, "batch.sigs[0].isz: expected a list of lists of ints"),
        ({"osz": [1]}, "batch.sigs[0].osz: expected a list of lists of ints"),
        ({"idt": [1]}, "batch.sigs[0].idt: expected a list of strings"),
        ({"isp2p": 0}, "batch.sigs[0].isp2p: expected bool, got int"),
        ({"op": None}, "batch.sigs[0].op: expected str, got NoneType"),
    ],
)
def test_signature_errors_name_the_field(change: dict[str, Any], message: str) -> None:
    doc = columns_doc([entry(0)])
    doc["sigs"][0].update(change)
    with pytest.raises(WireError) as exc:
        decode_batch(doc)
    assert str(exc.value) == message


def columns(rows: list[tuple[Any, ...]]) -> list[list[Any]]:
    """Entry rows as the columns `store._upsert_entries` takes."""
    return [list(c) for c in zip(*rows, strict=True)]


@pytest.mark.parametrize("n", [1, 9, 600, 1_100, 6_000])
def test_entry_upsert_inserts_then_updates(database_url: str, n: int) -> None:
    # Sizes that use each SQLite statement size (512, 64, 8, 1); on PostgreSQL, one unnest
    # statement of binary arrays, all NULL columns included. On SQLite a key sent twice in one
    # call keeps the last copy (PostgreSQL refuses it: callers send unique keys).
    db = connect(database_url)
    migrate(db)
    sqlite = db.dialect == "sqlite"
    try:

        def row(i: int, state: int, dur: float | None) -> tuple[Any, ...]:
            times = (10 + i, None if state == 0 else 11 + i, None if state < 2 else 12 + i)
            return (1, 0, i, 1, i + 1, 0, i + 1, 1, state, state == 2, *times, dur, None, "t", None, None)

        with db.write() as session, session.begin():
            store._upsert_entries(session, columns([row(i, 0, None) for i in range(n)]))
        later = [row(i, 2, 0.5) for i in range(0, n - 1, 2)]
        last = [row(n - 1, 1, 0.75), row(n - 1, 2, 1.5)] if sqlite else [row(n - 1, 2, 1.5)]
        with db.write() as session, session.begin():
            store._upsert_entries(session, columns([*later, *last]))
        with db.read() as session:
            got = {
                r.record_id: (r.state, r.retired, r.time_started_ns, r.time_completed_ns, r.duration_ms)
                for r in session.query(EntryRow).all()
            }
        want = {
            i: ((2, True, 11 + i, 12 + i, 0.5) if i % 2 == 0 else (0, False, None, None, None))
            for i in range(n)
        }
        want[n - 1] = (2, True, n + 10, n + 11, 1.5)
        assert got == want
    finally:
        db.dispose()


def test_gc_pause_nests_and_restores() -> None:
    assert gc.isenabled()
    pause = GcPause()
    with pause:
        assert not gc.isenabled()
        with pause:
            assert not gc.isenabled()
        assert not gc.isenabled()  # another decode is still running
    assert gc.isenabled()


def test_gc_pause_leaves_a_disabled_gc_off() -> None:
    pause = GcPause()
    gc.disable()
    try:
        with pause:
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_gc_pause_collects_during_a_long_overlapping_pause() -> None:
    # A pause longer than max_pause_s (here: any) collects when a thread leaves it while others
    # still decode: cyclic garbage made meanwhile does not wait for the load to stop.
    pause = GcPause(max_pause_s=0.0, full_every=1)
    with pause:
        cycle: dict[str, Any] = {"id": uuid.uuid4().hex}
        cycle["self"] = cycle
        del cycle
        before = gc.get_stats()[2]["collections"]
        with pause:
            pass
        assert gc.get_stats()[2]["collections"] == before + 1
        assert not gc.isenabled()
    assert gc.isenabled()


def test_sqlite_upsert_respects_a_low_parameter_limit(tmp_path: Any) -> None:
    # A SQLite built with 999 host parameters (older default) gets statements of at most 8 rows.
    db = connect(f"sqlite:///{tmp_path}/fd.db")
    migrate(db)
    try:
        rows = [
            (1, 0, i, 1, i + 1, 0, i + 1, 1, 2, True, i, i, i, 0.5, None, "", None, None) for i in range(700)
        ]
        with db.write() as session, session.begin():
            raw = session.connection().connection.driver_connection
            assert raw is not None
            raw.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, 999)
            store._upsert_entries(session, columns(rows))
        with db.read() as session:
            assert session.query(EntryRow).count() == 700
    finally:
        db.dispose()


def test_batches_applied_together_equal_batches_applied_one_by_one(database_url: str) -> None:
    """Group commit: one `ingest_batches` call over several batches stores what one call per
    batch stores; a batch id repeated in the call, or applied before, is a duplicate."""
    db = connect(database_url)
    migrate(db)

    def batches(job: str) -> list[Batch]:
        def snap(rank: int, t: int, entries: list[Entry]) -> Snapshot:
            return Snapshot(job=job, attempt=0, rank=rank, snapshot_time_ns=t, host="h", entries=entries)

        started = [
            replace(entry(i), state="started", retired=False, time_completed_ns=None) for i in range(5)
        ]
        return [
            Batch(f"{job}-1", "h", "1", 1, [snap(0, 10, started), snap(1, 10, [entry(i) for i in range(3)])]),
            Batch(f"{job}-2", "h", "1", 2, [snap(2, 11, [entry(i) for i in range(4)])]),
            # Rank 0 again, later: its in-flight entries completed, entry 3 now without frames
            # (a frame-less periodic snapshot keeps the stack an older one sent).
            Batch(f"{job}-3", "h", "1", 3, [snap(0, 12, [entry(3, frames=()), entry(4), entry(5)])]),
        ]

    def stored(job: str) -> list[tuple[Any, ...]]:
        with db.read() as session:
            j = store.get_job(session=session, name=job)
            assert j is not None
            rows = session.query(EntryRow).filter(EntryRow.job_id == j.id).all()
            return sorted(
                (r.rank, r.record_id, r.seq, r.state, r.retired, r.time_completed_ns, r.stack_id is not None)
                for r in rows
            )

    try:
        one = batches("single")
        with db.write() as session, session.begin():
            store.ingest_batches(session=session, batches=[(one[0], None)], now_ns=5)
        for b in one:  # the first again: a duplicate
            with db.write() as session, session.begin():
                store.ingest_batches(session=session, batches=[(b, None)], now_ns=5)
        together = batches("group")
        with db.write() as session, session.begin():
            store.ingest_batches(session=session, batches=[(together[0], None)], now_ns=5)
        with db.write() as session, session.begin():
            results, _ = store.ingest_batches(
                session=session,
                batches=[(together[0], None), (together[1], None), (together[1], None), (together[2], None)],
                now_ns=5,
            )
        assert [r.duplicate for r in results] == [True, False, True, False]
        assert [r.entries for r in results] == [0, 4, 0, 3]
        assert [[a.snapshot.rank for a in r.snapshots] for r in results] == [[], [2], [], [0]]
        assert stored("group") == stored("single")
        assert (0, 3, 4, 2, True, 3_003, True) in stored("group")  # completed, stack kept
    finally:
        db.dispose()


def test_known_stacks_are_not_written_again_and_keep_their_rows(database_url: str) -> None:
    """The ingest cache remembers committed stack ids: a later batch with the same stacks (new
    tuple objects, as every decode makes) writes no stack statement and points at the same rows;
    a new stack is still stored; past `max_stacks` the cache starts over and still finds them."""
    db = connect(database_url)
    migrate(db)
    cache = store.IngestCache(max_stacks=3)
    third = (Frame("k", "d.py", 4),)

    def ingest(batch_id: str, first: int, stacks: list[tuple[Frame, ...]]) -> int:
        """Apply one batch (entries `first`.. with these stacks, decoded afresh); returns the
        number of statements that touched the stacks table."""
        entries = [
            entry(first + i, frames=tuple(Frame(f.name, f.filename, f.line) for f in st))
            for i, st in enumerate(stacks)
        ]
        batch = Batch(
            batch_id, "h", "1", 1, [Snapshot(job="j", attempt=0, rank=0, snapshot_time_ns=1, entries=entries)]
        )
        statements: list[str] = []

        def seen(_conn: Any, _cur: Any, sql: str, *_: Any) -> None:
            if re.search(r"\bstacks\b", sql):  # the table, not a stack_id column
                statements.append(sql)

        event.listen(db.write_engine, "before_cursor_execute", seen)
        try:
            with db.write() as session, session.begin():
                _, learned = store.ingest_batches(
                    session=session, batches=[(batch, None)], now_ns=5, cache=cache
                )
            cache.learn(learned)
        finally:
            event.remove(db.write_engine, "before_cursor_execute", seen)
        return len(statements)

    def stack_of() -> dict[int, tuple[Frame, ...]]:
        with db.read() as session:
            rows = session.query(EntryRow).all()
            frames = store.stacks_by_id(session=session, ids={r.stack_id for r in rows if r.stack_id})
            return {r.record_id: frames[r.stack_id] for r in rows if r.stack_id}

    try:
        assert ingest("b1", 0, STACKS) > 0
        assert ingest("b2", 2, STACKS) == 0  # both known
        assert ingest("b3", 4, [STACKS[0], third]) > 0  # the third is new
        assert len(cache.stacks) == 3
        assert ingest("b4", 6, [third, STACKS[1]]) == 0
        # Full (3): one more new stack empties the cache rather than letting it grow.
        assert ingest("b5", 8, [(Frame("m", "e.py", 5),)]) > 0
        assert len(cache.stacks) == 1
        assert ingest("b6", 9, [STACKS[0]]) > 0  # forgotten: looked up again, same row
        want = [STACKS[0], STACKS[1], STACKS[0], STACKS[1], STACKS[0], third, third, STACKS[1]]
        got = stack_of()
        assert [got[i] for i in range(8)] == want and got[9] == STACKS[0]
        with db.read() as session:
            assert store.table_counts(session=session)["stacks"] == 4
    finally:
        db.dispose()
