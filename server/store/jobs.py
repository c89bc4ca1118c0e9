"""Reads of jobs and their ranks: the job list (paged, filtered), recent and active jobs, a
job's ranks, groups and stacks, per-job counts, and the data tables' row counts."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, func, or_, select
from sqlalchemy.orm import Session

from flightdeck.records import Frame, Progress, Stack, ThreadStack, progress_from_dict
from flightdeck.server.models import (
    EntryRow,
    FindingRow,
    Host,
    IngestedBatch,
    Job,
    NixlAgent,
    NixlSampleRow,
    ProcessGroup,
    Rank,
    Signature,
    StackRow,
)
from flightdeck.server.store.common import _IN_CHUNK, _chunks


def list_jobs(
    *,
    session: Session,
    status: str | None = None,
    name: str | None = None,
    before: tuple[int, int] | None = None,
    limit: int | None = None,
) -> list[Job]:
    """Job attempts, most recently seen first: of one `status`, whose name contains `name`
    (case-insensitive), seen before the `(last_seen_ns, id)` cursor `before` (the last row of the
    previous page), at most `limit`. Walks `ix_jobs_last_seen` (or `ix_jobs_status_last_seen`)
    in order, so a page costs the same with thousands of jobs stored."""
    q = _list_jobs_query(status=status, name=name, before=before, limit=limit)
    return list(session.execute(q).scalars())


def list_jobs_plan(
    *,
    session: Session,
    status: str | None = None,
    name: str | None = None,
    before: tuple[int, int] | None = None,
    limit: int | None = None,
) -> str:
    """The database's query plan of `list_jobs` with these arguments (EXPLAIN), as text."""
    q = _list_jobs_query(status=status, name=name, before=before, limit=limit)
    conn = session.connection()
    compiled = q.compile(dialect=conn.dialect)
    prefix = "EXPLAIN QUERY PLAN " if conn.dialect.name == "sqlite" else "EXPLAIN "
    rows = conn.exec_driver_sql(
        prefix + str(compiled),
        compiled.params
        if conn.dialect.name != "sqlite"
        else tuple(compiled.params[k] for k in compiled.positiontup or ()),
    )
    return "\n".join(" ".join(str(c) for c in row) for row in rows)


def _list_jobs_query(
    *, status: str | None, name: str | None, before: tuple[int, int] | None, limit: int | None
) -> Any:
    q = select(Job)
    if status is not None:
        q = q.where(Job.status == status)
    if name:
        # LIKE with the wildcards of the search text escaped: it is matched as typed.
        pattern = "%" + name.lower().replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        q = q.where(func.lower(Job.name).like(pattern, escape="\\"))
    if before is not None:
        seen, job_id = before
        q = q.where(or_(Job.last_seen_ns < seen, and_(Job.last_seen_ns == seen, Job.id < job_id)))
    q = q.order_by(Job.last_seen_ns.desc(), Job.id.desc())
    if limit is not None:
        q = q.limit(limit)
    return q


def _heard_since(since_ns: int) -> Any:
    """Jobs any of whose ranks the server received a snapshot of after `since_ns` (server clock).

    A job's `last_seen_ns` is its newest snapshot time, which a host's skewed clock (or old dumps
    ingested now) may put long before the server heard it: "recent" and "active" are told by the
    server's own clock, `ranks.received_ns`."""
    return Job.id.in_(select(Rank.job_id).where(Rank.received_ns > since_ns).distinct())


def _heard_ns() -> Any:
    """Per job (a correlated subquery): when the server last received a snapshot of it."""
    return select(func.max(Rank.received_ns)).where(Rank.job_id == Job.id).scalar_subquery()


def recent_jobs(*, session: Session, since_ns: int) -> list[tuple[Job, int]]:
    """The jobs a starting server holds in memory: not ended, heard of after `since_ns`; each with
    when the server last heard of it (its ranks' newest `received_ns`)."""
    heard = _heard_ns()
    q = select(Job, heard).where(
        Job.ended_at_ns.is_(None), or_(Job.last_seen_ns > since_ns, _heard_since(since_ns))
    )
    rows = session.execute(q.order_by(Job.last_seen_ns.desc(), Job.id.desc())).tuples()
    return [(j, max(j.last_seen_ns, int(h or 0))) for j, h in rows]


def get_job(*, session: Session, name: str, attempt: int | None = None) -> Job | None:
    """A job attempt; the latest attempt when `attempt` is None."""
    q = select(Job).where(Job.name == name)
    q = q.where(Job.attempt == attempt) if attempt is not None else q.order_by(Job.attempt.desc())
    return session.execute(q.limit(1)).scalar_one_or_none()


@dataclass(frozen=True, slots=True)
class JobBrief:
    """A job's identity and status, without its stored report."""

    id: int
    name: str
    attempt: int
    world_size: int | None
    status: str
    first_seen_ns: int
    last_seen_ns: int
    ended_at_ns: int | None = None
    #: When the server last received a snapshot of the job (its clock); 0 when unknown.
    heard_ns: int = 0


def active_jobs(*, session: Session, since_ns: int) -> list[JobBrief]:
    """Jobs seen or heard of after `since_ns` (`_heard_since`), with when the server last heard
    of each in `heard_ns` (the report column, which can be large, is not read)."""
    heard = _heard_ns()
    q = select(
        Job.id,
        Job.name,
        Job.attempt,
        Job.world_size,
        Job.status,
        Job.first_seen_ns,
        Job.last_seen_ns,
        Job.ended_at_ns,
        heard,
    ).where(or_(Job.last_seen_ns > since_ns, _heard_since(since_ns)))
    out = []
    for i, name, attempt, world, status, first, last, ended, heard_ns in session.execute(q).tuples():
        brief = JobBrief(i, name, attempt, world, status, first, last, ended, max(last, int(heard_ns or 0)))
        out.append(brief)
    return out


def get_job_by_id(*, session: Session, job_id: int) -> Job | None:
    """A job attempt by row id."""
    return session.get(Job, job_id)


def job_ranks(*, session: Session, job_id: int) -> list[tuple[Rank, str | None]]:
    """The job's ranks with their host names, by rank."""
    q = (
        select(Rank, Host.name)
        .outerjoin(Host, Host.id == Rank.host_id)
        .where(Rank.job_id == job_id)
        .order_by(Rank.rank)
    )
    return [(r, h) for r, h in session.execute(q).tuples()]


def job_rank_hosts(*, session: Session, job_id: int) -> list[tuple[int, int | None, str | None]]:
    """(rank, pid, host name) of the job's ranks, by rank: what a timeline row says of its rank,
    three columns rather than the whole rows (with their configuration) `job_ranks` loads."""
    q = (
        select(Rank.rank, Rank.pid, Host.name)
        .outerjoin(Host, Host.id == Rank.host_id)
        .where(Rank.job_id == job_id)
        .order_by(Rank.rank)
    )
    return [(int(r), p, h) for r, p, h in session.execute(q).tuples()]


def gone_ranks(*, session: Session, job_ids: Sequence[int]) -> dict[int, dict[int, int]]:
    """job id -> rank -> when its process was reported gone (the ranks reported only)."""
    if not job_ids:
        return {}
    q = select(Rank.job_id, Rank.rank, Rank.gone_at_ns).where(
        Rank.job_id.in_(list(job_ids)), Rank.gone_at_ns.is_not(None)
    )
    out: dict[int, dict[int, int]] = {}
    for job_id, rank, at in session.execute(q).tuples():
        if at is not None:
            out.setdefault(job_id, {})[rank] = at
    return out


def job_groups(*, session: Session, job_id: int) -> list[ProcessGroup]:
    """The job's process groups."""
    return list(session.execute(select(ProcessGroup).where(ProcessGroup.job_id == job_id)).scalars())


def stacks_by_id(*, session: Session, ids: Iterable[int]) -> dict[int, Stack]:
    """Stacks by row id."""
    out: dict[int, Stack] = {}
    for chunk in _chunks(sorted(set(ids)), _IN_CHUNK):
        for sid, frames in session.execute(
            select(StackRow.id, StackRow.frames).where(StackRow.id.in_(chunk))
        ):
            out[sid] = tuple(Frame(str(n), str(f), int(ln)) for n, f, ln in frames)
    return out


def thread_stacks_of(rank: Rank, stacks: dict[int, Stack]) -> tuple[ThreadStack, ...]:
    """A rank row's thread stacks as records (`stacks` must hold the referenced ids)."""
    return tuple(
        ThreadStack(str(name), int(tid), stacks.get(sid, ()) if sid is not None else ())
        for name, tid, sid in (rank.thread_stacks or [])
    )


def progress_of(rank: Rank, stacks: dict[int, Stack]) -> Progress | None:
    """A rank row's progress evidence as a record (`stacks` must hold its stack id)."""
    d = rank.progress
    if not isinstance(d, dict):
        return None
    sid = d.get("stk")
    return progress_from_dict(d, stacks.get(sid, ()) if isinstance(sid, int) else ())


def progress_stack_ids(ranks: Iterable[Rank]) -> set[int]:
    """The stack ids the rows' progress evidence refers to."""
    out: set[int] = set()
    for r in ranks:
        if isinstance(r.progress, dict) and isinstance(r.progress.get("stk"), int):
            out.add(int(r.progress["stk"]))
    return out


def rank_counts(*, session: Session, job_ids: Sequence[int] | None = None) -> dict[int, int]:
    """job id -> number of ranks that reported (jobs without any are absent); of `job_ids` only
    when given (a page of the job list)."""
    q = select(Rank.job_id, func.count()).group_by(Rank.job_id)
    if job_ids is not None:
        q = q.where(Rank.job_id.in_(list(job_ids)))
    return {j: int(n) for j, n in session.execute(q).tuples()}


def host_counts(*, session: Session, job_ids: Sequence[int] | None = None) -> dict[int, int]:
    """job id -> number of distinct hosts its ranks reported from (jobs without any are absent);
    of `job_ids` only when given."""
    q = select(Rank.job_id, func.count(func.distinct(Rank.host_id))).group_by(Rank.job_id)
    if job_ids is not None:
        q = q.where(Rank.job_id.in_(list(job_ids)))
    return {j: int(n) for j, n in session.execute(q).tuples()}


def table_counts(*, session: Session) -> dict[str, int]:
    """Row counts of the data tables (tests and benchmarks compare them)."""
    out = {}
    for model in (
        Host,
        Job,
        Rank,
        ProcessGroup,
        StackRow,
        Signature,
        EntryRow,
        NixlAgent,
        NixlSampleRow,
        FindingRow,
        IngestedBatch,
    ):
        out[str(model.__tablename__)] = int(
            session.execute(select(func.count()).select_from(model)).scalar_one()
        )
    return out
