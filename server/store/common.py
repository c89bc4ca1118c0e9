"""Helpers every part of the store shares: the dialect's INSERT, digests, chunking, the
driver-level read of many rows, each rank's newest snapshot of a batch; the chunk sizes of
statements and IN lists."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from flightdeck.wire import Snapshot

#: Rows per executemany call: bounds one statement's parameter memory without costing round trips.
_CHUNK = 10_000
#: Values per IN (...) list (SQLite allows 32,766 host parameters per statement).
_IN_CHUNK = 5_000


def _plain_rows(conn: Any, stmt: Any) -> list[tuple[Any, ...]]:
    """The rows of a Core `stmt` as the driver's plain tuples, its parameters bound by the driver.

    For the reads of many thousand rows (a page's window): SQLAlchemy's Row objects cost 80-90 ms
    of CPU for a 1,024-rank window's 40,959 rows of six columns on PostgreSQL, the driver's
    tuples 19-27 ms (measured in process, median of 5). Only for columns the driver returns as
    the model's Python types (integers, text); booleans come back as 0/1 from SQLite.
    """
    comp = stmt.compile(dialect=conn.dialect, compile_kwargs={"render_postcompile": True})
    params: Any = comp.construct_params()
    if comp.positional:
        params = tuple(params[k] for k in comp.positiontup)
    driver = conn.connection.driver_connection
    # psycopg's binary format: 64-bit times arrive as 8 bytes, not as digits to parse.
    cur = driver.cursor(binary=True) if conn.dialect.name == "postgresql" else driver.cursor()
    try:
        cur.execute(str(comp), params)
        return list(cur.fetchall())
    finally:
        cur.close()


def _insert(session: Session, entity: Any) -> Any:
    """The dialect's INSERT (it has `on_conflict_do_update` / `on_conflict_do_nothing`)."""
    if session.get_bind().dialect.name == "postgresql":
        return postgresql.insert(entity)
    return sqlite.insert(entity)


def _digest(obj: object) -> str:
    return hashlib.sha256(json.dumps(obj, separators=(",", ":")).encode()).hexdigest()[:32]


def _chunks(seq: Sequence[Any], n: int) -> Iterable[Sequence[Any]]:
    for i in range(0, len(seq), n):
        yield seq[i : i + n]


def _latest_per_rank(
    snapshots: Iterable[Snapshot], job_ids: dict[tuple[str, int], int]
) -> dict[tuple[int, int], Snapshot]:
    """Each rank's newest snapshot, keyed by (job id, rank); a later one wins a tie."""
    latest: dict[tuple[int, int], Snapshot] = {}
    for s in snapshots:
        key = (job_ids[(s.job, s.attempt)], s.rank)
        old = latest.get(key)
        if old is None or s.snapshot_time_ns >= old.snapshot_time_ns:
            latest[key] = s
    return latest
