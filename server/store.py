"""All SQL of the server: keyword-only functions that take a Session and never commit.

The caller (ingest, diagnosis, routes) owns the transaction: one batch is one transaction, so a
batch is applied completely or not at all, and its id is recorded in the same transaction
(idempotency). Upserts use the dialect's INSERT ... ON CONFLICT (SQLite and PostgreSQL spell it
the same way) and executemany, so a batch of 50,000 entries is a handful of statements.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import case, delete, func, select, text, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from flightdeck.analysis import Finding
from flightdeck.records import Entry, Frame, Stack, ThreadStack, canonical_op, frames_to_wire
from flightdeck.server.models import (
    STATE_CODES,
    STATE_NAMES,
    CollectorToken,
    EntryRow,
    FindingRow,
    Host,
    IngestedBatch,
    Job,
    NixlAgent,
    ProcessGroup,
    Rank,
    Signature,
    StackRow,
)
from flightdeck.wire import Batch, Snapshot

#: Rows per executemany call: bounds one statement's parameter memory without costing round trips.
_CHUNK = 10_000
#: Values per IN (...) list (SQLite allows 32,766 host parameters per statement).
_IN_CHUNK = 5_000


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


# --- ingest --------------------------------------------------------------------------------------


@dataclass(slots=True)
class AppliedSnapshot:
    """A snapshot as applied: the job row it went to and its entries (for the live diagnosis)."""

    job_id: int
    snapshot: Snapshot


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


def claim_batch(*, session: Session, batch_id: str, collector_id: int | None, now_ns: int) -> bool:
    """Record `batch_id` as applied; False when it already was (the batch is a duplicate).

    Runs first in the batch's transaction: on PostgreSQL a concurrent transaction with the same id
    waits on the key and then sees the conflict, so one batch is applied once across servers.
    """
    stmt = (
        _insert(session, IngestedBatch)
        .values(batch_id=batch_id, received_at_ns=now_ns, collector_id=collector_id)
        .on_conflict_do_nothing(index_elements=["batch_id"])
        .returning(IngestedBatch.batch_id)
    )
    return session.execute(stmt).first() is not None


def ingest_batch(*, session: Session, batch: Batch, collector_id: int | None, now_ns: int) -> IngestResult:
    """Apply a decoded batch: jobs, ranks, groups, stacks, signatures, entries, NIXL samples."""
    if not claim_batch(session=session, batch_id=batch.batch_id, collector_id=collector_id, now_ns=now_ns):
        return IngestResult(duplicate=True)
    result = IngestResult(duplicate=False)
    stack_ids = _stack_ids(session, batch)
    sig_ids = _signature_ids(session, batch)
    hosts = _host_ids(session, {s.host for s in batch.snapshots if s.host})
    job_ids: dict[tuple[str, int], int] = {}
    for s in batch.snapshots:
        key = (s.job, s.attempt)
        if key not in job_ids:
            job_id, created = upsert_job(
                session=session, name=s.job, attempt=s.attempt, world_size=s.world_size, seen_ns=now_ns
            )
            job_ids[key] = job_id
            result.jobs[job_id] = key
            if created:
                result.created_jobs.add(job_id)
    group_ids = _group_ids(session, batch, job_ids)
    _upsert_ranks(session, batch, job_ids, hosts, stack_ids, now_ns)
    # One row per (job, rank, record_id): a batch may carry several snapshots of a rank; the newest
    # wins, but a frame-less periodic snapshot must not drop the stack an older one sent.
    rows: dict[tuple[int, int, int], tuple[Any, ...]] = {}
    plain: list[tuple[Any, ...]] = []
    several = len({(s.job, s.attempt, s.rank) for s in batch.snapshots}) < len(batch.snapshots)
    stack_of = stack_ids.get
    for s in sorted(batch.snapshots, key=lambda x: x.snapshot_time_ns):
        job_id = job_ids[(s.job, s.attempt)]
        gids = group_ids[job_id]
        rank = s.rank
        for e in s.entries:
            frames = e.frames
            row = (
                job_id,
                rank,
                e.record_id,
                gids[e.group],
                e.collective_seq_id,
                e.p2p_seq_id,
                e.op_id,
                sig_ids[
                    (
                        e.raw_op,
                        e.backend,
                        e.is_p2p,
                        e.input_sizes,
                        e.output_sizes,
                        e.input_dtypes,
                        e.output_dtypes,
                    )
                ],
                STATE_CODES[e.state],
                e.retired,
                e.time_created_ns,
                e.time_started_ns,
                e.time_completed_ns,
                e.duration_ms,
                e.timeout_ms,
                e.thread_name[:64],
                e.peer,
                stack_of(id(frames)) if frames else None,
            )
            if not several:
                plain.append(row)  # the common case: each rank once per batch, keys are unique
                continue
            row_key = (job_id, rank, e.record_id)
            old = rows.get(row_key)
            if old is not None and row[-1] is None and old[-1] is not None:
                row = (*row[:-1], old[-1])
            rows[row_key] = row
    if several:
        plain = list(rows.values())
    if plain:
        _upsert_entries(session, plain)
    for s in batch.snapshots:
        result.snapshots.append(AppliedSnapshot(job_ids[(s.job, s.attempt)], s))
    result.entries = sum(len(s.entries) for s in batch.snapshots)
    if batch.nixl:
        from flightdeck.nixl_records import NixlSample

        upsert_nixl(session=session, samples=[NixlSample.from_wire(d) for d in batch.nixl])
    if collector_id is not None:
        session.execute(
            update(CollectorToken).where(CollectorToken.id == collector_id).values(last_push_ns=now_ns)
        )
    return result


#: Column order of the entry tuples `_upsert_entries` takes.
ENTRY_COLUMNS = (
    "job_id",
    "rank",
    "record_id",
    "group_id",
    "seq",
    "p2p_seq",
    "op_id",
    "sig_id",
    "state",
    "retired",
    "time_created_ns",
    "time_started_ns",
    "time_completed_ns",
    "duration_ms",
    "timeout_ms",
    "thread_name",
    "peer",
    "stack_id",
)
_COLS = ", ".join(ENTRY_COLUMNS)
#: What a re-sent entry may change: its progress, and frames once a stall snapshot brings them.
_ON_CONFLICT = (
    "ON CONFLICT (job_id, rank, record_id) DO UPDATE SET state = excluded.state, "
    "retired = excluded.retired, time_started_ns = excluded.time_started_ns, "
    "time_completed_ns = excluded.time_completed_ns, duration_ms = excluded.duration_ms, "
    "stack_id = COALESCE(excluded.stack_id, entries.stack_id)"
)
# Built from the constants above only (no input reaches these strings).
_SQLITE_UPSERT = (
    f"INSERT INTO entries ({_COLS}) VALUES ({', '.join('?' * len(ENTRY_COLUMNS))}) {_ON_CONFLICT}"  # noqa: S608
)
_PG_STAGE = "CREATE TEMP TABLE IF NOT EXISTS entries_in (LIKE entries) ON COMMIT DELETE ROWS"
_PG_COPY = f"COPY entries_in ({_COLS}) FROM STDIN"
_PG_UPSERT = f"INSERT INTO entries ({_COLS}) SELECT {_COLS} FROM entries_in {_ON_CONFLICT}"  # noqa: S608


def _upsert_entries(session: Session, rows: list[tuple[Any, ...]]) -> None:
    """Upsert entry tuples (ENTRY_COLUMNS order, unique keys) at driver speed.

    The hottest statement of the server, so it skips SQLAlchemy's per-row parameter processing:
    SQLite gets one executemany (sqlite3 runs it in C); PostgreSQL gets COPY into a temporary
    table and one INSERT ... SELECT ... ON CONFLICT, an order of magnitude faster than one
    INSERT per row even when pipelined.
    """
    conn = session.connection()
    if conn.dialect.name == "postgresql":
        raw: Any = conn.connection.driver_connection
        with raw.cursor() as cur:
            cur.execute(_PG_STAGE)
            with cur.copy(_PG_COPY) as copy:
                for row in rows:
                    copy.write_row(row)
            cur.execute(_PG_UPSERT)
            cur.execute("TRUNCATE entries_in")  # the next batch may come in the same transaction
        return
    for chunk in _chunks(rows, _CHUNK):
        conn.exec_driver_sql(_SQLITE_UPSERT, list(chunk))


def upsert_job(
    *, session: Session, name: str, attempt: int, world_size: int | None, seen_ns: int
) -> tuple[int, bool]:
    """Create or touch the (job, attempt) row; returns its id and whether this call created it."""
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
            first_seen_ns=seen_ns,
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


def _host_ids(session: Session, names: set[str]) -> dict[str, int]:
    if not names:
        return {}
    session.execute(
        _insert(session, Host).on_conflict_do_nothing(index_elements=["name"]),
        [{"name": n[:255]} for n in sorted(names)],
    )
    rows = session.execute(select(Host.name, Host.id).where(Host.name.in_([n[:255] for n in names])))
    return {n: i for n, i in rows.tuples()}


def _stack_ids(session: Session, batch: Batch) -> dict[int, int]:
    """id(stack tuple) -> stack row id, for every stack the batch references.

    Decoding makes every reference to stack table slot k the same tuple object, so `id()` finds
    a stack without hashing its frames once per entry.
    """
    by_obj: dict[int, Stack] = {}
    for s in batch.snapshots:
        for e in s.entries:
            if e.frames:
                by_obj.setdefault(id(e.frames), e.frames)
        for t in s.thread_stacks:
            if t.frames:
                by_obj.setdefault(id(t.frames), t.frames)
    if not by_obj:
        return {}
    wire = {k: frames_to_wire(st) for k, st in by_obj.items()}
    hashes = {k: _digest(w) for k, w in wire.items()}
    unique = {h: wire[k] for k, h in hashes.items()}
    session.execute(
        _insert(session, StackRow).on_conflict_do_nothing(index_elements=["hash"]),
        [{"hash": h, "frames": w} for h, w in sorted(unique.items())],
    )
    ids: dict[str, int] = {}
    for chunk in _chunks(sorted(unique), _IN_CHUNK):
        ids.update(
            dict(
                session.execute(select(StackRow.hash, StackRow.id).where(StackRow.hash.in_(chunk)))
                .tuples()
                .all()
            )
        )
    return {k: ids[h] for k, h in hashes.items()}


SigKey = tuple[
    str, str, bool, tuple[tuple[int, ...], ...], tuple[tuple[int, ...], ...], tuple[str, ...], tuple[str, ...]
]


def _sig_key(e: Entry) -> SigKey:
    return (e.raw_op, e.backend, e.is_p2p, e.input_sizes, e.output_sizes, e.input_dtypes, e.output_dtypes)


def _signature_ids(session: Session, batch: Batch) -> dict[SigKey, int]:
    keys = {_sig_key(e) for s in batch.snapshots for e in s.entries}
    if not keys:
        return {}
    rows = {}
    for k in keys:
        raw_op, backend, is_p2p, isz, osz, idt, odt = k
        d = {
            "raw_op": raw_op[:256],
            "backend": backend[:64],
            "is_p2p": is_p2p,
            "input_sizes": [list(x) for x in isz],
            "output_sizes": [list(x) for x in osz],
            "input_dtypes": list(idt),
            "output_dtypes": list(odt),
        }
        d["hash"] = _digest(
            [raw_op, backend, is_p2p, d["input_sizes"], d["output_sizes"], list(idt), list(odt)]
        )
        rows[k] = d
    session.execute(
        _insert(session, Signature).on_conflict_do_nothing(index_elements=["hash"]),
        sorted(rows.values(), key=lambda d: str(d["hash"])),
    )
    ids: dict[str, int] = {}
    hashes = sorted({str(d["hash"]) for d in rows.values()})
    for chunk in _chunks(hashes, _IN_CHUNK):
        ids.update(
            dict(
                session.execute(select(Signature.hash, Signature.id).where(Signature.hash.in_(chunk)))
                .tuples()
                .all()
            )
        )
    return {k: ids[str(d["hash"])] for k, d in rows.items()}


def _group_ids(
    session: Session, batch: Batch, job_ids: dict[tuple[str, int], int]
) -> dict[int, dict[str, int]]:
    """job id -> group name -> group row id, creating groups (and updating desc / members)."""
    wanted: dict[tuple[int, str], dict[str, Any]] = {}
    for s in batch.snapshots:
        job_id = job_ids[(s.job, s.attempt)]
        for name, g in s.groups.items():
            wanted[(job_id, name)] = {
                "job_id": job_id,
                "name": name[:128],
                "desc": g.desc[:256],
                "ranks": None if g.ranks is None else list(g.ranks),
            }
        for e in s.entries:
            if (job_id, e.group) not in wanted:
                wanted[(job_id, e.group)] = {
                    "job_id": job_id,
                    "name": e.group[:128],
                    "desc": "",
                    "ranks": None,
                }
    out: dict[int, dict[str, int]] = {j: {} for j in job_ids.values()}
    if not wanted:
        return out
    ins = _insert(session, ProcessGroup)
    ex = ins.excluded
    stmt = ins.on_conflict_do_update(
        index_elements=["job_id", "name"],
        set_={
            "desc": case((ex.desc != "", ex.desc), else_=ProcessGroup.desc),
            "ranks": func.coalesce(ex.ranks, ProcessGroup.ranks),
        },
    )
    session.execute(stmt, [wanted[k] for k in sorted(wanted)])
    for job_id in out:
        names = [n for (j, n) in wanted if j == job_id]
        for chunk in _chunks(names, _IN_CHUNK):
            q = select(ProcessGroup.name, ProcessGroup.id).where(
                ProcessGroup.job_id == job_id, ProcessGroup.name.in_(chunk)
            )
            out[job_id].update(dict(session.execute(q).tuples().all()))
    return out


def _upsert_ranks(
    session: Session,
    batch: Batch,
    job_ids: dict[tuple[str, int], int],
    hosts: dict[str, int],
    stack_ids: dict[int, int],
    now_ns: int,
) -> None:
    latest: dict[tuple[int, int], Snapshot] = {}
    for s in batch.snapshots:
        key = (job_ids[(s.job, s.attempt)], s.rank)
        old = latest.get(key)
        if old is None or s.snapshot_time_ns >= old.snapshot_time_ns:
            latest[key] = s
    rows = []
    for (job_id, rank), s in sorted(latest.items()):
        threads = [
            [t.thread_name, t.thread_id, stack_ids.get(id(t.frames)) if t.frames else None]
            for t in s.thread_stacks
        ]
        rows.append(
            {
                "job_id": job_id,
                "rank": rank,
                "host_id": hosts.get(s.host) if s.host else None,
                "pid": s.pid,
                "local_rank": s.local_rank,
                "world_size": s.world_size,
                "last_snapshot_ns": s.snapshot_time_ns,
                "received_ns": now_ns,
                "kind": s.kind,
                "interval_s": s.interval_s,
                "exception": s.exception,
                "wrapped": s.wrapped,
                "oldest_record_id": s.oldest_record_id,
                "torch_version": (s.torch_version or "")[:64] or None,
                "backend": (s.backend or "")[:64] or None,
                "version": s.version[:64],
                "thread_stacks": threads or None,
            }
        )
    if not rows:
        return
    ins = _insert(session, Rank)
    ex = ins.excluded
    stmt = ins.on_conflict_do_update(
        index_elements=["job_id", "rank"],
        set_={
            "host_id": func.coalesce(ex.host_id, Rank.host_id),
            "pid": func.coalesce(ex.pid, Rank.pid),
            "local_rank": func.coalesce(ex.local_rank, Rank.local_rank),
            "world_size": func.coalesce(ex.world_size, Rank.world_size),
            "last_snapshot_ns": ex.last_snapshot_ns,
            "received_ns": ex.received_ns,
            "kind": ex.kind,
            "interval_s": func.coalesce(ex.interval_s, Rank.interval_s),
            "exception": func.coalesce(ex.exception, Rank.exception),
            "wrapped": ex.wrapped,
            "oldest_record_id": func.coalesce(ex.oldest_record_id, Rank.oldest_record_id),
            "torch_version": func.coalesce(ex.torch_version, Rank.torch_version),
            "backend": func.coalesce(ex.backend, Rank.backend),
            "version": ex.version,
            "thread_stacks": func.coalesce(ex.thread_stacks, Rank.thread_stacks),
        },
        # A late, older snapshot (a retried batch overtaken by a newer one) must not roll back.
        where=Rank.last_snapshot_ns <= ex.last_snapshot_ns,
    )
    session.execute(stmt, rows)


# --- NIXL ----------------------------------------------------------------------------------------

#: Cumulative scalar counters of a NIXL sample.
NIXL_COUNTERS = ("tx_bytes", "rx_bytes", "tx_requests", "rx_requests", "events_dropped")
NIXL_HISTOGRAMS = ("xfer_time", "post_time")


def _add_counters(base: dict[str, Any] | None, sample: dict[str, Any]) -> dict[str, Any]:
    """base + the counters of `sample` (a finished counter run), histograms bucket-wise."""
    out: dict[str, Any] = dict(base or {})
    for k in NIXL_COUNTERS:
        out[k] = int(out.get(k, 0)) + int(sample.get(k, 0))
    errors: dict[str, int] = dict(out.get("errors") or {})
    for kind, n in (sample.get("errors") or {}).items():
        errors[kind] = errors.get(kind, 0) + int(n)
    out["errors"] = errors
    for h in NIXL_HISTOGRAMS:
        new = sample.get(h) or {}
        old = out.get(h)
        if old and old.get("bounds_us") == new.get("bounds_us"):
            out[h] = {
                "bounds_us": new["bounds_us"],
                "counts": [a + b for a, b in zip(old["counts"], new["counts"], strict=True)],
                "sum_us": old["sum_us"] + new["sum_us"],
                "count": old["count"] + new["count"],
            }
        elif new:
            # Different bucket layout: the older runs cannot be merged bucket-wise; keep the newest.
            out[h] = new
    return out


def upsert_nixl(*, session: Session, samples: Sequence[Any]) -> None:
    """Store the latest sample per agent; a new counter run carries the old run's totals over."""
    for smp in samples:
        wire = smp.to_wire()
        row = session.execute(
            select(NixlAgent)
            .where(NixlAgent.host == smp.host, NixlAgent.agent == smp.agent, NixlAgent.source == smp.source)
            .with_for_update()
        ).scalar_one_or_none()
        if row is None:
            session.add(
                NixlAgent(
                    host=smp.host,
                    agent=smp.agent,
                    source=smp.source,
                    pid=smp.pid,
                    local_rank=smp.local_rank,
                    run=smp.run,
                    read_time_ns=smp.read_time_ns,
                    sample=wire,
                    carried=None,
                )
            )
            continue
        if row.run != smp.run:
            row.carried = _add_counters(row.carried, row.sample)
        elif smp.read_time_ns < row.read_time_ns:
            continue  # an older sample of the same run: counters only grow, keep the newer one
        row.run = smp.run
        row.pid = smp.pid
        row.local_rank = smp.local_rank
        row.read_time_ns = smp.read_time_ns
        row.sample = wire
    session.flush()


def nixl_agents(*, session: Session) -> list[NixlAgent]:
    """Every NIXL agent with its latest sample and carried totals."""
    return list(session.execute(select(NixlAgent).order_by(NixlAgent.host, NixlAgent.agent)).scalars())


def nixl_totals(agent: NixlAgent) -> dict[str, Any]:
    """The agent's counters over all its runs (latest sample plus the carried totals)."""
    return _add_counters(agent.carried, agent.sample)


# --- jobs, ranks and entries (reads) -------------------------------------------------------------


def list_jobs(*, session: Session) -> list[Job]:
    """Every job attempt, most recently seen first."""
    return list(session.execute(select(Job).order_by(Job.last_seen_ns.desc(), Job.id.desc())).scalars())


def get_job(*, session: Session, name: str, attempt: int | None = None) -> Job | None:
    """A job attempt; the latest attempt when `attempt` is None."""
    q = select(Job).where(Job.name == name)
    q = q.where(Job.attempt == attempt) if attempt is not None else q.order_by(Job.attempt.desc())
    return session.execute(q.limit(1)).scalar_one_or_none()


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


def _signatures(session: Session, ids: Iterable[int]) -> dict[int, Signature]:
    out: dict[int, Signature] = {}
    for chunk in _chunks(sorted(set(ids)), _IN_CHUNK):
        for row in session.execute(select(Signature).where(Signature.id.in_(chunk))).scalars():
            out[row.id] = row
    return out


def load_entries(*, session: Session, job_id: int) -> dict[int, list[Entry]]:
    """Every stored entry of a job as records, per rank, oldest (by record id) first."""
    groups = {g.id: g.name for g in job_groups(session=session, job_id=job_id)}
    rows = session.execute(
        select(EntryRow).where(EntryRow.job_id == job_id).order_by(EntryRow.rank, EntryRow.record_id)
    ).scalars()
    out: dict[int, list[Entry]] = {}
    for rank, e in _entry_records(session, list(rows), groups):
        out.setdefault(rank, []).append(e)
    return out


def _entry_records(
    session: Session, raw: Sequence[EntryRow], groups: dict[int, str]
) -> list[tuple[int, Entry]]:
    """Entry rows as (rank, record) pairs, in the given order (signatures and stacks batch-loaded)."""
    sigs = _signatures(session, (r.sig_id for r in raw))
    stacks = stacks_by_id(session=session, ids=(r.stack_id for r in raw if r.stack_id is not None))
    sig_cache: dict[int, tuple[Any, ...]] = {}
    out: list[tuple[int, Entry]] = []
    for r in raw:
        sv = sig_cache.get(r.sig_id)
        if sv is None:
            s = sigs[r.sig_id]
            sv = sig_cache[r.sig_id] = (
                s.raw_op,
                canonical_op(s.raw_op),
                s.backend,
                s.is_p2p,
                tuple(tuple(x) for x in s.input_sizes),
                tuple(tuple(x) for x in s.output_sizes),
                tuple(s.input_dtypes),
                tuple(s.output_dtypes),
            )
        raw_op, op, backend, is_p2p, isz, osz, idt, odt = sv
        out.append(
            (
                r.rank,
                Entry(
                    record_id=r.record_id,
                    group=groups.get(r.group_id, str(r.group_id)),
                    collective_seq_id=r.seq,
                    p2p_seq_id=r.p2p_seq,
                    op_id=r.op_id,
                    backend=backend,
                    op=op,
                    raw_op=raw_op,
                    is_p2p=is_p2p,
                    input_sizes=isz,
                    output_sizes=osz,
                    input_dtypes=idt,
                    output_dtypes=odt,
                    state=STATE_NAMES[r.state],  # type: ignore[arg-type]
                    retired=r.retired,
                    time_created_ns=r.time_created_ns,
                    time_started_ns=r.time_started_ns,
                    time_completed_ns=r.time_completed_ns,
                    duration_ms=r.duration_ms,
                    timeout_ms=r.timeout_ms,
                    thread_name=r.thread_name,
                    peer=r.peer,
                    frames=stacks.get(r.stack_id, ()) if r.stack_id is not None else (),
                ),
            )
        )
    return out


def rank_counts(*, session: Session) -> dict[int, int]:
    """job id -> number of ranks that reported (jobs without any are absent)."""
    q = select(Rank.job_id, func.count()).group_by(Rank.job_id)
    return {j: int(n) for j, n in session.execute(q).tuples()}


def group_seq_ranges(*, session: Session, job_id: int) -> dict[int, tuple[int, int]]:
    """group row id -> (min, max) collective seq of the job's collective (non-p2p) entries."""
    q = (
        select(EntryRow.group_id, func.min(EntryRow.seq), func.max(EntryRow.seq))
        .join(Signature, Signature.id == EntryRow.sig_id)
        .where(EntryRow.job_id == job_id, Signature.is_p2p.is_(False))
        .group_by(EntryRow.group_id)
    )
    return {g: (int(lo), int(hi)) for g, lo, hi in session.execute(q).tuples()}


def rank_seq_ranges(
    *, session: Session, job_id: int, group_id: int, ranks: Sequence[int] | None = None
) -> dict[int, tuple[int, int]]:
    """rank -> (min, max) collective seq it holds of one group (non-p2p entries; `ranks`: None = all)."""
    q = (
        select(EntryRow.rank, func.min(EntryRow.seq), func.max(EntryRow.seq))
        .join(Signature, Signature.id == EntryRow.sig_id)
        .where(EntryRow.job_id == job_id, EntryRow.group_id == group_id, Signature.is_p2p.is_(False))
        .group_by(EntryRow.rank)
    )
    if ranks is not None:
        q = q.where(EntryRow.rank.in_(list(ranks)))
    return {r: (int(lo), int(hi)) for r, lo, hi in session.execute(q).tuples()}


def window_entries(
    *,
    session: Session,
    job_id: int,
    group_id: int,
    group_name: str,
    ranks: Sequence[int] | None = None,
    seq_from: int | None = None,
    seq_to: int | None = None,
    limit: int = 200_000,
) -> dict[int, list[Entry]]:
    """rank -> collective (non-p2p) entries of one group with seq in [seq_from, seq_to], as records
    sorted by seq; a seq held twice by a rank keeps its newest record."""
    q = (
        select(EntryRow)
        .join(Signature, Signature.id == EntryRow.sig_id)
        .where(EntryRow.job_id == job_id, EntryRow.group_id == group_id, Signature.is_p2p.is_(False))
    )
    if ranks is not None:
        q = q.where(EntryRow.rank.in_(list(ranks)))
    if seq_from is not None:
        q = q.where(EntryRow.seq >= seq_from)
    if seq_to is not None:
        q = q.where(EntryRow.seq <= seq_to)
    q = q.order_by(EntryRow.rank, EntryRow.seq, EntryRow.record_id).limit(limit)
    raw = list(session.execute(q).scalars())
    out: dict[int, list[Entry]] = {}
    for rank, e in _entry_records(session, raw, {group_id: group_name}):
        lst = out.setdefault(rank, [])
        if lst and lst[-1].collective_seq_id == e.collective_seq_id:
            lst[-1] = e
        else:
            lst.append(e)
    return out


def recent_entries(*, session: Session, job_id: int, rank: int, limit: int = 50) -> list[Entry]:
    """The rank's `limit` most recently created entries across all groups, oldest first."""
    groups = {g.id: g.name for g in job_groups(session=session, job_id=job_id)}
    q = (
        select(EntryRow)
        .where(EntryRow.job_id == job_id, EntryRow.rank == rank)
        .order_by(EntryRow.time_created_ns.desc(), EntryRow.record_id.desc())
        .limit(limit)
    )
    raw = list(session.execute(q).scalars())[::-1]
    return [e for _, e in _entry_records(session, raw, groups)]


def count_entries(*, session: Session, job_id: int | None = None) -> int:
    """Stored entries (of one job, or all)."""
    q = select(func.count()).select_from(EntryRow)
    if job_id is not None:
        q = q.where(EntryRow.job_id == job_id)
    return int(session.execute(q).scalar_one())


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
        FindingRow,
        IngestedBatch,
    ):
        out[str(model.__tablename__)] = int(
            session.execute(select(func.count()).select_from(model)).scalar_one()
        )
    return out


def timeline(
    *,
    session: Session,
    job_id: int,
    group: str | None = None,
    rank_from: int | None = None,
    rank_to: int | None = None,
    seq_from: int | None = None,
    seq_to: int | None = None,
    limit: int = 1000,
) -> list[dict[str, Any]]:
    """Entries of a job in a window, by (group, seq, rank), as readable dicts (bounds inclusive)."""
    q = (
        select(EntryRow, Signature, ProcessGroup.name)
        .join(Signature, Signature.id == EntryRow.sig_id)
        .join(ProcessGroup, ProcessGroup.id == EntryRow.group_id)
        .where(EntryRow.job_id == job_id)
    )
    if group is not None:
        q = q.where(ProcessGroup.name == group)
    if rank_from is not None:
        q = q.where(EntryRow.rank >= rank_from)
    if rank_to is not None:
        q = q.where(EntryRow.rank <= rank_to)
    if seq_from is not None:
        q = q.where(EntryRow.seq >= seq_from)
    if seq_to is not None:
        q = q.where(EntryRow.seq <= seq_to)
    q = q.order_by(EntryRow.group_id, EntryRow.seq, EntryRow.rank, EntryRow.record_id).limit(limit)
    out = []
    for e, s, gname in session.execute(q).tuples():
        out.append(
            {
                "rank": e.rank,
                "record_id": e.record_id,
                "process_group": gname,
                "collective_seq_id": e.seq,
                "p2p_seq_id": e.p2p_seq,
                "op": canonical_op(s.raw_op),
                "profiling_name": s.raw_op,
                "is_p2p": s.is_p2p,
                "input_sizes": s.input_sizes,
                "output_sizes": s.output_sizes,
                "input_dtypes": s.input_dtypes,
                "output_dtypes": s.output_dtypes,
                "state": STATE_NAMES[e.state],
                "retired": e.retired,
                "time_created_ns": e.time_created_ns,
                "time_started_ns": e.time_started_ns,
                "time_completed_ns": e.time_completed_ns,
                "duration_ms": e.duration_ms,
                "peer": e.peer,
                "stack_id": e.stack_id,
            }
        )
    return out


# --- findings ------------------------------------------------------------------------------------

FindingKey = tuple[str, str, int, int]


def finding_key(f: Finding) -> FindingKey:
    """The identity of a finding across diagnoses: (kind, group, seq, rank)."""
    per_rank = f.kind in ("rank_lost", "straggler", "missing_dump") or f.collective_seq_id is None
    rank = f.culprit_ranks[0] if per_rank and f.culprit_ranks else -1
    seq = f.collective_seq_id if f.collective_seq_id is not None else -1
    return (f.kind, f.process_group or "", seq, rank)


@dataclass(frozen=True, slots=True)
class FindingEvent:
    """A finding that was opened or resolved by one diagnosis (for webhooks and counters)."""

    event: str  # "finding.opened" | "finding.resolved"
    row_id: int
    kind: str
    data: dict[str, Any]


def open_findings(*, session: Session, job_id: int) -> list[FindingRow]:
    """The job's open findings, oldest first."""
    q = (
        select(FindingRow)
        .where(FindingRow.job_id == job_id, FindingRow.resolved_at_ns.is_(None))
        .order_by(FindingRow.opened_at_ns, FindingRow.id)
    )
    return list(session.execute(q).scalars())


def open_finding_counts(*, session: Session) -> dict[int, int]:
    """job id -> number of open findings (jobs without any are absent)."""
    q = (
        select(FindingRow.job_id, func.count())
        .where(FindingRow.resolved_at_ns.is_(None))
        .group_by(FindingRow.job_id)
    )
    return {j: int(n) for j, n in session.execute(q).tuples()}


def findings_history(*, session: Session, job_id: int) -> list[FindingRow]:
    """Every finding episode of a job (open and resolved), oldest first."""
    q = select(FindingRow).where(FindingRow.job_id == job_id).order_by(FindingRow.opened_at_ns, FindingRow.id)
    return list(session.execute(q).scalars())


def apply_findings(
    *,
    session: Session,
    job_id: int,
    findings: Sequence[Finding],
    report: dict[str, Any],
    status: str,
    now_ns: int,
) -> list[FindingEvent]:
    """Reconcile a diagnosis with the stored findings: open new ones, update the ones still seen,
    resolve the ones that disappeared; store the report and the job status."""
    current: dict[FindingKey, Finding] = {}
    for f in findings:
        current.setdefault(finding_key(f), f)  # identical identities in one report: keep the first
    existing = {
        (r.kind, r.group_key, r.seq_key, r.rank_key): r for r in open_findings(session=session, job_id=job_id)
    }
    events: list[FindingEvent] = []
    for key, row in existing.items():
        seen = current.get(key)
        if seen is None:
            row.resolved_at_ns = now_ns
            row.updated_at_ns = now_ns
            events.append(FindingEvent("finding.resolved", row.id, row.kind, row.data))
        else:
            row.data = seen.to_json()
            row.updated_at_ns = now_ns
    new_rows = []
    for key, f in current.items():
        if key in existing:
            continue
        kind, group_key, seq_key, rank_key = key
        row = FindingRow(
            job_id=job_id,
            kind=kind,
            group_key=group_key,
            seq_key=seq_key,
            rank_key=rank_key,
            opened_at_ns=now_ns,
            updated_at_ns=now_ns,
            resolved_at_ns=None,
            data=f.to_json(),
        )
        session.add(row)
        new_rows.append(row)
    session.flush()
    events.extend(FindingEvent("finding.opened", r.id, r.kind, r.data) for r in new_rows)
    session.execute(
        update(Job).where(Job.id == job_id).values(report=report, status=status, diagnosed_at_ns=now_ns)
    )
    return events


def finding_rows(*, session: Session, ids: Sequence[int]) -> list[FindingRow]:
    """Finding episodes by id."""
    return list(session.execute(select(FindingRow).where(FindingRow.id.in_(list(ids)))).scalars())


# --- collector tokens ----------------------------------------------------------------------------


def create_token(*, session: Session, name: str, token_hash: str, now_ns: int) -> CollectorToken:
    """Store a new collector token (its hash only); raises IntegrityError when the name exists."""
    tok = CollectorToken(name=name, token_hash=token_hash, created_at_ns=now_ns)
    session.add(tok)
    session.flush()
    return tok


def revoke_token(*, session: Session, name: str, now_ns: int) -> bool:
    """Revoke a token by collector name; False when there is no such active token."""
    res = session.execute(
        update(CollectorToken)
        .where(CollectorToken.name == name, CollectorToken.revoked_at_ns.is_(None))
        .values(revoked_at_ns=now_ns)
    )
    return bool(getattr(res, "rowcount", 0))


def list_tokens(*, session: Session) -> list[CollectorToken]:
    """Every collector token (active and revoked), by name."""
    return list(session.execute(select(CollectorToken).order_by(CollectorToken.name)).scalars())


def active_token(*, session: Session, token_hash: str) -> CollectorToken | None:
    """The unrevoked token with this hash, if any."""
    q = select(CollectorToken).where(
        CollectorToken.token_hash == token_hash, CollectorToken.revoked_at_ns.is_(None)
    )
    return session.execute(q).scalar_one_or_none()


# --- retention -----------------------------------------------------------------------------------


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
