"""The entries and ranks of an ingest as rows, and their upserts at driver speed
(each upsert has its PostgreSQL and SQLite branch: `ingest_pg`, `ingest_sqlite`)."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from itertools import chain, repeat
from typing import Any

from sqlalchemy.orm import Session

from flightdeck.records import Signature, progress_to_dict
from flightdeck.server.models import STATE_CODES
from flightdeck.server.store.common import _CHUNK, _chunks, _latest_per_rank
from flightdeck.server.store.ingest_pg import (
    _PG_RANK_TYPES,
    _PG_RANK_UPSERT,
    _PG_TYPES,
    _PG_UNNEST,
    _pg_arrays,
)
from flightdeck.server.store.ingest_sql import _RANK_UPSERT, ENTRY_COLUMNS
from flightdeck.server.store.ingest_sqlite import (
    _RANK_ROWS_PER_STATEMENT,
    _SQLITE_RANK_ROW,
    _SQLITE_ROWS_PER_STATEMENT,
    _SQLITE_UPSERTS,
)
from flightdeck.wire import EntryColumns, Snapshot

#: `ENTRY_COLUMNS` column -> the wire column (`flightdeck.wire.WIRE_COLUMNS`) it is as sent.
_PLAIN_COLUMNS = {
    "record_id": "rid",
    "seq": "seq",
    "p2p_seq": "p2p",
    "op_id": "opid",
    "retired": "ret",
    "time_created_ns": "tc",
    "time_started_ns": "ts",
    "time_completed_ns": "td",
    "duration_ms": "dur",
    "timeout_ms": "to",
    "peer": "peer",
}


def _entry_rows(
    ordered: list[tuple[Snapshot, EntryColumns]],
    sig_ids: dict[Signature, int],
    job_ids: dict[tuple[str, int], int],
    group_ids: dict[int, dict[str, int]],
    stack_ids: dict[int, int],
) -> list[list[Any]]:
    """The entries rows of the snapshots' entries (in this order) as `ENTRY_COLUMNS` columns.

    Snapshot by snapshot, each column extended from the wire column as it came (a list extend in
    C), with a signature's row id looked up once per signature table, not per entry. One row
    per (job, rank, record_id): the batches may carry several snapshots of a rank; the newest
    wins, but a frame-less periodic snapshot must not drop the stack an older one sent.
    """
    out: dict[str, list[Any]] = {name: [] for name in ENTRY_COLUMNS}
    plain = [(out[name], key) for name, key in _PLAIN_COLUMNS.items()]
    job_col, rank_col, group_col = out["job_id"], out["rank"], out["group_id"]
    sig_col, state_col, thread_col, stack_col = (
        out["sig_id"],
        out["state"],
        out["thread_name"],
        out["stack_id"],
    )
    state_code = STATE_CODES.__getitem__
    stack_of = stack_ids.get
    table_ids: dict[int, list[int]] = {}  # id(signature table) -> row id of each signature
    for s, c in ordered:
        n = c.n
        if not n:
            continue
        job_id = job_ids[(s.job, s.attempt)]
        job_col += repeat(job_id, n)
        rank_col += repeat(s.rank, n)
        group_col += map(group_ids[job_id].__getitem__, c.cols["g"])
        for col, key in plain:
            col += c.column(key)
        ids = table_ids.get(id(c.sigs))
        if ids is None:
            ids = table_ids[id(c.sigs)] = [sig_ids[t] for t in c.sigs]
        sig_col += map(ids.__getitem__, c.sig)
        state_col += map(state_code, c.cols["st"])
        thr = c.cols.get("thr")
        thread_col += repeat("", n) if thr is None else [t[:64] for t in thr]
        stack_col += (
            repeat(None, n) if c.stk is None else [stack_of(id(f)) if f else None for f in c.frames()]
        )
    cols = [out[name] for name in ENTRY_COLUMNS]
    if len({(s.job, s.attempt, s.rank) for s, _ in ordered}) == len(ordered):
        return cols  # the common case: each rank once, keys are unique
    last: dict[tuple[int, int, int], int] = {}
    for i, row_key in enumerate(zip(job_col, rank_col, out["record_id"], strict=True)):
        old = last.get(row_key)
        if old is not None and stack_col[i] is None:
            stack_col[i] = stack_col[old]
        last[row_key] = i
    keep = sorted(last.values())
    return [[col[i] for i in keep] for col in cols]


def _upsert_entries(session: Session, cols: Sequence[Sequence[Any]]) -> None:
    """Upsert entry rows given as columns (ENTRY_COLUMNS order, unique keys) at driver speed.

    The hottest statement of the server, so it skips SQLAlchemy's per-row parameter processing:
    SQLite gets multi-row INSERT ... VALUES statements run by executemany (in C, one step per
    hundreds of rows; see `_SQLITE_ROWS_PER_STATEMENT`); PostgreSQL gets one INSERT ... SELECT
    FROM unnest(arrays) ... ON CONFLICT, the arrays in binary (`pg_arrays`): one round trip, and
    no value formatted in Python or parsed by the server.
    """
    conn = session.connection()
    n = len(cols[0])
    if conn.dialect.name == "postgresql":
        raw: Any = conn.connection.driver_connection
        with raw.cursor() as cur:
            cur.execute(_PG_UNNEST, _pg_arrays(cols, _PG_TYPES))
        return
    # Rows of one statement are applied in order, as executemany would: a key sent twice in a
    # batch updates the row its first copy inserted.
    rows = list(zip(*cols, strict=True))
    dbapi: Any = conn.connection.driver_connection
    limit = dbapi.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER)
    done = 0
    for size in _SQLITE_ROWS_PER_STATEMENT:
        k = (n - done) // size
        if not k or size * len(ENTRY_COLUMNS) > limit:
            continue
        params = [tuple(chain.from_iterable(rows[i : i + size])) for i in range(done, done + k * size, size)]
        done += k * size
        for chunk in _chunks(params, max(1, _CHUNK // size)):
            conn.exec_driver_sql(_SQLITE_UPSERTS[size], list(chunk))


def _upsert_ranks(
    session: Session,
    snapshots: Sequence[Snapshot],
    job_ids: dict[tuple[str, int], int],
    hosts: dict[str, int],
    stack_ids: dict[int, int],
    now_ns: int,
) -> None:
    latest = _latest_per_rank(snapshots, job_ids)
    if not latest:
        return
    # Tuples in _RANK_COLUMNS order; thread_stacks as JSON text (SQL NULL when absent).
    rows = []
    for (job_id, rank), s in sorted(latest.items()):
        threads = [
            [t.thread_name, t.thread_id, stack_ids.get(id(t.frames)) if t.frames else None]
            for t in s.thread_stacks
        ]
        rows.append(
            (
                job_id,
                rank,
                hosts.get(s.host) if s.host else None,
                s.pid,
                s.local_rank,
                s.world_size,
                s.snapshot_time_ns,
                now_ns,
                s.kind,
                s.interval_s,
                s.exception,
                s.wrapped,
                s.oldest_record_id,
                (s.torch_version or "")[:64] or None,
                (s.backend or "")[:64] or None,
                s.version[:64],
                json.dumps(threads) if threads else None,
                None
                if s.progress is None
                else json.dumps(
                    progress_to_dict(
                        s.progress, stack_ids.get(id(s.progress.frames)) if s.progress.frames else None
                    )
                ),
            )
        )
    # Driver-level upsert: the ORM's or Core's per-statement work was a sixth of the ingest CPU
    # for small batches.
    conn = session.connection()
    if conn.dialect.name == "postgresql":
        # One statement for all ranks, the columns as arrays (like the entries upsert): a
        # pipelined executemany dumped 17 parameters per row in Python, a tenth of ingest CPU.
        raw: Any = conn.connection.driver_connection
        with raw.cursor() as cur:
            cur.execute(_PG_RANK_UPSERT, _pg_arrays(zip(*rows, strict=True), _PG_RANK_TYPES))
        return
    for chunk in _chunks(rows, _RANK_ROWS_PER_STATEMENT):
        conn.exec_driver_sql(
            _RANK_UPSERT.format(values="VALUES " + ", ".join([_SQLITE_RANK_ROW] * len(chunk))),
            tuple(chain.from_iterable(chunk)),
        )
