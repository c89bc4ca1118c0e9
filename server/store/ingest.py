"""The ingest transaction: `ingest_batches` applies decoded batches in one pass (batch ids
claimed first, then jobs, ids, ranks, entries, configurations, NIXL samples, gone reports), and
what it reports back per batch (`IngestResult`)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import chain
from typing import Any

from sqlalchemy import case, func, select, update
from sqlalchemy.orm import Session

from flightdeck.server.models import CollectorToken, Host, Job, Rank
from flightdeck.server.store.common import _insert
from flightdeck.server.store.configs import _upsert_rank_configs
from flightdeck.server.store.ingest_ids import (
    CacheUpdate,
    IngestCache,
    _group_ids,
    _host_ids,
    _signature_ids,
    _stack_ids,
)
from flightdeck.server.store.ingest_pg import _PG_CLAIM
from flightdeck.server.store.ingest_rows import _entry_rows, _upsert_entries, _upsert_ranks
from flightdeck.server.store.nixl import upsert_nixl
from flightdeck.wire import Batch, GoneRank, Snapshot


@dataclass(slots=True)
class AppliedSnapshot:
    """A snapshot as applied: the job row it went to and its entries (for the live diagnosis)."""

    job_id: int
    snapshot: Snapshot


@dataclass(frozen=True, slots=True)
class AppliedGone:
    """A gone report as applied: the rank's job row and when its process was seen gone."""

    job_id: int
    name: str
    attempt: int
    rank: int
    gone_at_ns: int


@dataclass(slots=True)
class IngestResult:
    """What one batch changed."""

    duplicate: bool
    entries: int = 0
    snapshots: list[AppliedSnapshot] = field(default_factory=list)
    #: job id -> (name, attempt) of every job the batch touched.
    jobs: dict[int, tuple[str, int]] = field(default_factory=dict)
    #: ids of the jobs this batch created.
    created_jobs: set[int] = field(default_factory=set)
    #: job id -> id of the batch's feed row (cluster mode, `add_feed`).
    feed_ids: dict[int, int] = field(default_factory=dict)
    #: The batch's gone reports that named a stored rank (of the allowed host, with that pid).
    gone: list[AppliedGone] = field(default_factory=list)
    #: The batch's gone reports that did not (another host's rank, an unknown rank or pid).
    gone_ignored: list[GoneRank] = field(default_factory=list)


def claim_batches(*, session: Session, batches: Sequence[tuple[str, int | None]], now_ns: int) -> set[str]:
    """Record batch ids as applied, in one statement; returns the ids that were new (the others
    were applied before: duplicates).

    Runs first in the transaction: on PostgreSQL a concurrent transaction with one of the ids
    waits on its key and then sees the conflict, so a batch is applied once across servers. Ids
    go in sorted order, so two transactions claiming overlapping sets cannot deadlock.
    """
    first = {bid: cid for bid, cid in reversed(batches)}
    ids = sorted(first)
    conn = session.connection()
    if conn.dialect.name == "postgresql":
        # One statement text whatever the number of batches: psycopg parses each new text in Python.
        # Pipelined: the transaction's BEGIN goes with it, one round trip instead of two.
        raw: Any = conn.connection.driver_connection
        with raw.pipeline(), raw.cursor() as cur:
            cur.execute(_PG_CLAIM, (ids, [now_ns] * len(ids), [first[b] for b in ids]))
            return {row[0] for row in cur.fetchall()}
    # Driver-level: SQLAlchemy would compile (and cache-key) a new multi-row statement per size.
    values = ", ".join(["(?, ?, ?)"] * len(first))
    sql = (
        "INSERT INTO ingested_batches (batch_id, received_at_ns, collector_id) "  # noqa: S608 (marks only)
        f"VALUES {values} ON CONFLICT (batch_id) DO NOTHING RETURNING batch_id"
    )
    params = tuple(chain.from_iterable((bid, now_ns, first[bid]) for bid in ids))
    return {row[0] for row in conn.exec_driver_sql(sql, params)}


def ingest_batches(
    *,
    session: Session,
    batches: Sequence[tuple[Batch, int | None]],
    now_ns: int,
    cache: IngestCache | None = None,
    gone_hosts: Sequence[str | None] | None = None,
) -> tuple[list[IngestResult], CacheUpdate]:
    """Apply decoded (batch, collector id) pairs in one pass: jobs, ranks, groups, stacks,
    signatures, entries, NIXL samples, gone reports; one result per batch, in order.

    A job's `last_seen_ns` is the newest snapshot time it was sent (not when the batch arrived:
    a replayed batch must not move it), at most `now_ns`; a new job's `first_seen_ns` its oldest.
    `gone_hosts[i]` is the host whose ranks batch i may report gone (its token's scope; None:
    any host): a report naming another host's rank is ignored (`IngestResult.gone_ignored`).

    Several batches share every statement (group commit: see `flightdeck.server.group_commit`),
    so a transaction costs the same round trips for one batch or fifty. A batch id already
    applied, or repeated in `batches`, gives a duplicate result and changes nothing. With a
    `cache`, rows the process already knows are neither looked up nor rewritten; the ids found
    are in the returned update, for `cache.learn` after COMMIT.
    """
    claimed = claim_batches(session=session, batches=[(b.batch_id, c) for b, c in batches], now_ns=now_ns)
    cache = cache or IngestCache(touch_every_ns=0)
    learned = CacheUpdate()
    results: list[IngestResult] = []
    fresh: list[tuple[Batch, IngestResult]] = []
    for b, _ in batches:
        r = IngestResult(duplicate=b.batch_id not in claimed)
        claimed.discard(b.batch_id)  # a second copy in this call is a duplicate
        results.append(r)
        if not r.duplicate:
            fresh.append((b, r))
    if not fresh:
        return results, learned
    snapshots = [s for b, _ in fresh for s in b.snapshots]
    # Each snapshot's entries as columns (as decoded, or built once here), then its rows go in
    # time order (a rank's newer snapshot last).
    columns = [s.entry_columns() for s in snapshots]
    stack_ids = _stack_ids(session, snapshots, columns, cache, learned)
    ordered = sorted(range(len(snapshots)), key=lambda i: snapshots[i].snapshot_time_ns)
    sig_ids = _signature_ids(
        session,
        list(dict.fromkeys(chain.from_iterable(c.sigs for c in columns))),
        cache,
        learned,
    )
    hosts = _host_ids(session, {s.host for s in snapshots if s.host}, cache, learned)
    job_ids: dict[tuple[str, int], int] = {}
    created: set[int] = set()
    touch: list[tuple[int, int]] = []  # known jobs to mark seen (id, newest time), last
    # Per job, the oldest and newest snapshot time of this call (what the ranks say happened).
    span: dict[tuple[str, int], tuple[int, int]] = {}
    for s in snapshots:
        t = min(s.snapshot_time_ns or now_ns, now_ns)
        lo, hi = span.get((s.job, s.attempt), (t, t))
        span[(s.job, s.attempt)] = (min(lo, t), max(hi, t))
    for s in snapshots:
        key = (s.job, s.attempt)
        if key in job_ids:
            continue
        oldest, newest = span[key]
        known = cache.jobs.get(key)
        if known is not None and (s.world_size is None or s.world_size == known[1]):
            job_ids[key] = known[0]
            if now_ns - known[2] >= cache.touch_every_ns:
                touch.append((known[0], newest))
                learned.jobs[key] = (known[0], known[1], now_ns)
            continue
        job_id, new_job = upsert_job(
            session=session,
            name=s.job,
            attempt=s.attempt,
            world_size=s.world_size,
            seen_ns=newest,
            first_seen_ns=oldest,
        )
        learned.jobs[key] = (job_id, s.world_size or (known[1] if known else None), now_ns)
        job_ids[key] = job_id
        if new_job:
            created.add(job_id)
    group_ids = _group_ids(session, snapshots, columns, job_ids, cache, learned)
    rows: list[list[Any]] | None = None
    if any(c.n for c in columns):
        rows = _entry_rows(
            [(snapshots[i], columns[i]) for i in ordered], sig_ids, job_ids, group_ids, stack_ids
        )
    with _pipeline(session):  # PostgreSQL: the two statements in one round trip
        _upsert_ranks(session, snapshots, job_ids, hosts, stack_ids, now_ns)
        if rows is not None:
            _upsert_entries(session, rows)
    _upsert_rank_configs(session, snapshots, job_ids)
    for b, r in fresh:
        for s in b.snapshots:
            job_id = job_ids[(s.job, s.attempt)]
            r.jobs[job_id] = (s.job, s.attempt)
            r.snapshots.append(AppliedSnapshot(job_id, s))
        # Every batch of the job learns it is new: their diagnosis may see any of them first.
        r.created_jobs = created & r.jobs.keys()
        r.entries = b.entry_count
        if b.nixl:
            from flightdeck.nixl_records import NixlSample

            upsert_nixl(session=session, samples=[NixlSample.from_wire(d) for d in b.nixl])
    # Rows every transaction may touch (the job's, the token's) are updated last: a row lock is
    # held to the commit, and concurrent writers must not wait on each other for a whole write.
    for job_id, newest in sorted(touch):
        session.execute(
            update(Job).where(Job.id == job_id, Job.last_seen_ns < newest).values(last_seen_ns=newest)
        )
    hosts_of = {id(b): (None if gone_hosts is None else gone_hosts[i]) for i, (b, _) in enumerate(batches)}
    for b, r in fresh:
        if b.gone:
            _apply_gone(session, b, r, hosts_of[id(b)])
    for collector_id in sorted(
        {c for (b, c), r in zip(batches, results, strict=True) if c is not None and not r.duplicate}
    ):
        if now_ns - cache.tokens.get(collector_id, 0) >= cache.touch_every_ns:
            session.execute(
                update(CollectorToken).where(CollectorToken.id == collector_id).values(last_push_ns=now_ns)
            )
            learned.tokens[collector_id] = now_ns
    return results, learned


@contextmanager
def _pipeline(session: Session) -> Iterator[None]:
    """On PostgreSQL, the driver statements inside go in one round trip (psycopg's pipeline
    mode); their errors are raised at the end. Elsewhere, nothing changes."""
    conn = session.connection()
    if conn.dialect.name != "postgresql":
        yield
        return
    raw: Any = conn.connection.driver_connection
    with raw.pipeline():
        yield


def _apply_gone(session: Session, batch: Batch, result: IngestResult, host: str | None) -> None:
    """Mark the ranks the batch reports gone (the first report counts): only a stored rank of
    that job attempt, with that pid, and (scoped token) on `host`; the others are ignored."""
    for g in batch.gone:
        q = (
            select(Job.id, Rank.pid, Rank.gone_at_ns, Host.name)
            .join(Rank, Rank.job_id == Job.id)
            .outerjoin(Host, Host.id == Rank.host_id)
            .where(Job.name == g.job, Job.attempt == g.attempt, Rank.rank == g.rank)
        )
        row = session.execute(q).first()
        if (
            row is None
            or (row.pid is not None and row.pid != g.pid)
            or (host is not None and row.name != host)
        ):
            result.gone_ignored.append(g)
            continue
        gone_at = row.gone_at_ns if row.gone_at_ns is not None else g.gone_at_ns
        if row.gone_at_ns is None:
            session.execute(
                update(Rank).where(Rank.job_id == row.id, Rank.rank == g.rank).values(gone_at_ns=gone_at)
            )
        result.gone.append(AppliedGone(row.id, g.job, g.attempt, g.rank, gone_at))
        result.jobs.setdefault(row.id, (g.job, g.attempt))


def upsert_job(
    *,
    session: Session,
    name: str,
    attempt: int,
    world_size: int | None,
    seen_ns: int,
    first_seen_ns: int | None = None,
) -> tuple[int, bool]:
    """Create or touch the (job, attempt) row; returns its id and whether this call created it.

    `seen_ns`: the newest snapshot time (last_seen_ns never moves back); `first_seen_ns`: the
    oldest, for a new row (default `seen_ns`)."""
    existed = session.execute(
        select(Job.id).where(Job.name == name, Job.attempt == attempt)
    ).scalar_one_or_none()
    ins = _insert(session, Job)
    ex = ins.excluded
    stmt = (
        ins.values(
            name=name,
            attempt=attempt,
            world_size=world_size,
            first_seen_ns=min(seen_ns, first_seen_ns if first_seen_ns is not None else seen_ns),
            last_seen_ns=seen_ns,
            status="running",
        )
        .on_conflict_do_update(
            index_elements=["name", "attempt"],
            set_={
                "last_seen_ns": case(
                    (ex.last_seen_ns > Job.last_seen_ns, ex.last_seen_ns), else_=Job.last_seen_ns
                ),
                "world_size": func.coalesce(ex.world_size, Job.world_size),
            },
        )
        .returning(Job.id)
    )
    job_id: int = session.execute(stmt).scalar_one()
    return job_id, existed is None
