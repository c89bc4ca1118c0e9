"""Retention: deleting old entries and NIXL samples, trimming a job's entries per rank,
and the size of a table."""

from __future__ import annotations

from sqlalchemy import bindparam, delete, func, select, text
from sqlalchemy.orm import Session

from flightdeck.server.models import EntryRow, IngestedBatch, Job, NixlSampleRow, Rank
from flightdeck.server.store.common import _IN_CHUNK, _chunks


def delete_entries_before(*, session: Session, before_ns: int) -> int:
    """Delete entries created before `before_ns` (and batch ids received before it); findings stay.

    Runs per job so each DELETE walks one job's primary-key range instead of the whole table.
    """
    deleted = 0
    for (job_id,) in session.execute(select(Job.id)).tuples():
        res = session.execute(
            delete(EntryRow).where(EntryRow.job_id == job_id, EntryRow.time_created_ns < before_ns)
        )
        deleted += int(getattr(res, "rowcount", 0) or 0)
    session.execute(delete(IngestedBatch).where(IngestedBatch.received_at_ns < before_ns))
    return deleted


def delete_nixl_samples_before(*, session: Session, before_ns: int) -> int:
    """Delete NIXL history samples read before `before_ns` (agents and their latest sample stay)."""
    res = session.execute(delete(NixlSampleRow).where(NixlSampleRow.read_time_ns < before_ns))
    return int(getattr(res, "rowcount", 0) or 0)


def trim_entries(*, session: Session, job_id: int, keep_per_rank: int) -> int:
    """Keep only each rank's newest `keep_per_rank` entries (by record id) of a job; returns how
    many went. Each rank's newest id is one primary-key lookup and each delete one key range, so
    the cost follows what is deleted, not what the job holds."""
    highest = (
        select(func.max(EntryRow.record_id))
        .where(EntryRow.job_id == Rank.job_id, EntryRow.rank == Rank.rank)
        .scalar_subquery()
    )
    tops = session.execute(select(Rank.rank, highest).where(Rank.job_id == job_id)).tuples().all()
    cuts = [{"j": job_id, "r": r, "cut": hi - keep_per_rank} for r, hi in tops if hi is not None]
    cuts = [c for c in cuts if c["cut"] >= 0]
    if not cuts:
        return 0
    stmt = delete(EntryRow).where(
        EntryRow.job_id == bindparam("j"),
        EntryRow.rank == bindparam("r"),
        EntryRow.record_id <= bindparam("cut"),
    )
    deleted = 0
    for chunk in _chunks(cuts, _IN_CHUNK):
        # Core executemany (the ORM has no bulk DELETE); both drivers report the total rowcount.
        deleted += int(session.connection().execute(stmt, list(chunk)).rowcount or 0)
    return deleted


def db_size_bytes(*, session: Session, table: str) -> int | None:
    """Bytes a table uses with its indexes (PostgreSQL; SQLite when the dbstat table exists)."""
    if session.get_bind().dialect.name == "postgresql":
        return int(session.execute(select(func.pg_total_relation_size(table))).scalar_one())
    try:
        q = text(
            "SELECT SUM(pgsize) FROM dbstat "
            "WHERE name IN (SELECT name FROM sqlite_master WHERE tbl_name = :t)"
        )
        v = session.execute(q, {"t": table}).scalar_one()
        return None if v is None else int(v)
    except Exception:  # dbstat is a compile-time option of SQLite
        return None
