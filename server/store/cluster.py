"""Several servers on one PostgreSQL: advisory locks for a job's diagnosis and for the
leader, and the ingest feed through which servers see each other's batches."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from sqlalchemy import bindparam, delete, literal_column, select, text
from sqlalchemy.orm import Session
from sqlalchemy.sql.elements import ColumnElement

from flightdeck.server.models import FeedRow
from flightdeck.server.store.common import _IN_CHUNK, _chunks, _insert

#: First key of the advisory locks that give one process a job's diagnosis ("FDJ"); the job's
#: row id is the second: no hash, no collisions.
_JOB_LOCK_CLASS = 0x46444A


def try_own_job(*, session: Session, job_id: int) -> bool:
    """Take the session-level advisory lock of a job's diagnosis without waiting; True if held.

    Session-level: the lock lives as long as the database connection, not the transaction, so
    `session` must be bound to a connection the caller keeps open. A process that dies (or loses
    its connection) releases its jobs; another one takes them on its next try.
    """
    q = text("SELECT pg_try_advisory_lock(:c, :j)")
    return bool(session.execute(q, {"c": _JOB_LOCK_CLASS, "j": job_id}).scalar_one())


#: First key of the advisory lock held by the cluster's leader ("FDL"), the one process that
#: exports the cluster-wide series (jobs by status, collectors, NIXL agents) to Prometheus.
_LEADER_LOCK_CLASS = 0x46444C


def try_lead(*, session: Session) -> bool:
    """Take the session-level advisory lock of the cluster's leader without waiting; True if held
    (as `try_own_job`: on a connection the caller keeps open; released when it closes)."""
    q = text("SELECT pg_try_advisory_lock(:c, 0)")
    return bool(session.execute(q, {"c": _LEADER_LOCK_CLASS}).scalar_one())


def ping(*, session: Session) -> None:
    """A round trip: raises OperationalError when the connection is broken."""
    session.execute(text("SELECT 1"))


def disown_job(*, session: Session, job_id: int) -> None:
    """Release a job's diagnosis lock taken by `try_own_job` on the same connection."""
    session.execute(text("SELECT pg_advisory_unlock(:c, :j)"), {"c": _JOB_LOCK_CLASS, "j": job_id})


def add_feed(*, session: Session, job_ids: Iterable[int], body: bytes, received_ns: int) -> dict[int, int]:
    """Keep an ingested batch (gzip body) in the feed, once per job it touched; job id -> feed id.

    Each row carries the id of the transaction that writes it (`feed_after` reads by it);
    `received_ns` only ages rows out (`prune_feed`).
    """
    out = {}
    for job_id in sorted(set(job_ids)):
        stmt = (
            _insert(session, FeedRow)
            .values(job_id=job_id, received_ns=received_ns, body=body, xid=_CURRENT_XID)
            .returning(FeedRow.id)
        )
        out[job_id] = int(session.execute(stmt).scalar_one())
    return out


#: The writing transaction's id as a bigint (xid8 has no SQLAlchemy type; 64 bits either way).
_CURRENT_XID: ColumnElement[int] = literal_column("(pg_current_xact_id()::text)::bigint")


def feed_snapshot(*, session: Session) -> str:
    """The snapshot `session` reads with (`pg_current_snapshot()`, as text): what `feed_after`
    takes as "already read". In a REPEATABLE READ transaction, the one its every query sees."""
    return str(session.execute(text("SELECT pg_current_snapshot()::text")).scalar_one())


_FEED_AFTER = text(
    "SELECT id, job_id FROM ingest_feed WHERE job_id IN :jobs"
    " AND xid >= (pg_snapshot_xmin(CAST(:after AS pg_snapshot))::text)::bigint"
    " AND NOT pg_visible_in_snapshot((xid::text)::xid8, CAST(:after AS pg_snapshot))"
    " ORDER BY id"
).bindparams(bindparam("jobs", expanding=True))


def feed_after(*, session: Session, job_ids: Sequence[int], after: str | None) -> list[tuple[int, int]]:
    """(feed id, job id) of these jobs' feed rows that `session` sees and the snapshot `after`
    (`feed_snapshot`) did not, by id; every row `session` sees when `after` is None.

    By transaction, not by time or id: a row is new when its writer committed after `after` was
    taken, however long its transaction ran and whatever ids committed before it. So a reader
    that passes each read's snapshot to the next gets every row exactly once.
    """
    if not job_ids:
        return []
    if after is None:
        q = select(FeedRow.id, FeedRow.job_id).where(FeedRow.job_id.in_(list(job_ids))).order_by(FeedRow.id)
        return [(int(i), int(j)) for i, j in session.execute(q).tuples()]
    rows = session.execute(_FEED_AFTER, {"jobs": list(job_ids), "after": after}).tuples()
    return [(int(i), int(j)) for i, j in rows]


def feed_bodies(*, session: Session, ids: Sequence[int]) -> dict[int, bytes]:
    """feed id -> gzip body."""
    out: dict[int, bytes] = {}
    for chunk in _chunks(sorted(ids), _IN_CHUNK):
        for i, b in session.execute(select(FeedRow.id, FeedRow.body).where(FeedRow.id.in_(chunk))).tuples():
            out[int(i)] = bytes(b)
    return out


def prune_feed(*, session: Session, before_ns: int) -> int:
    """Delete feed rows received before `before_ns`; returns how many."""
    res = session.execute(delete(FeedRow).where(FeedRow.received_ns < before_ns))
    return int(getattr(res, "rowcount", 0) or 0)
