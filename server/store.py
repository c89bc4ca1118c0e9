"""All SQL of the server: keyword-only functions that take a Session and never commit.

The caller (ingest, diagnosis, routes) owns the transaction: one batch is one transaction, so a
batch is applied completely or not at all, and its id is recorded in the same transaction
(idempotency). Upserts use the dialect's INSERT ... ON CONFLICT (SQLite and PostgreSQL spell it
the same way) and executemany, so a batch of 50,000 entries is a handful of statements.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import chain, repeat
from operator import itemgetter
from typing import Any

from sqlalchemy import and_, bindparam, case, delete, func, or_, select, text, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from flightdeck.analysis import Finding
from flightdeck.analysis.config_skew import PeerJob
from flightdeck.analysis.findings import CONFIG_KINDS
from flightdeck.records import (
    Entry,
    Frame,
    Progress,
    RankConfig,
    SignatureKey,
    Stack,
    ThreadStack,
    canonical_op,
    config_from_dict,
    config_to_dict,
    frames_to_wire,
    progress_from_dict,
    progress_to_dict,
)
from flightdeck.server.models import (
    RESOLUTION_ENDED,
    STATE_CODES,
    STATE_NAMES,
    CollectorToken,
    EntryRow,
    FeedRow,
    FindingRow,
    Host,
    IngestedBatch,
    Job,
    NixlAgent,
    NixlSampleRow,
    ProcessGroup,
    Rank,
    RankConfigRow,
    Signature,
    StackRow,
    WebhookDelivery,
)
from flightdeck.wire import Batch, EntryColumns, GoneRank, Snapshot

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


# --- ingest --------------------------------------------------------------------------------------


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


@dataclass(slots=True)
class CacheUpdate:
    """Row ids one transaction found or created; valid only once it committed."""

    signatures: dict[str, int] = field(default_factory=dict)
    hosts: dict[str, int] = field(default_factory=dict)
    #: (job id, group name) -> (group row id, desc, members)
    groups: dict[tuple[int, str], tuple[int, str, tuple[int, ...] | None]] = field(default_factory=dict)
    #: (job name, attempt) -> (job row id, world size, server time of this write)
    jobs: dict[tuple[str, int], tuple[int, int | None, int]] = field(default_factory=dict)
    #: collector token id -> server time of this `last_push_ns` write
    tokens: dict[int, int] = field(default_factory=dict)
    #: stack -> its row id
    stacks: dict[Stack, int] = field(default_factory=dict)


@dataclass(slots=True)
class IngestCache:
    """Per-process memory of rows that every batch of a job would otherwise look up or rewrite.

    Signatures, hosts and stacks are content-addressed and never deleted: their ids are cached
    for good (stacks up to `max_stacks`: the frames of every collective call site of every job).
    Process groups are rewritten only when their description or members change. The job row's
    `last_seen_ns` and a token's `last_push_ns` are written at most every `touch_every_ns`: every
    batch of a job updating the same row serializes all ingest transactions on its row lock.
    Only committed ids are learned (`learn` after COMMIT), so a rolled-back batch leaves no id
    of a row that does not exist.
    """

    touch_every_ns: int = 1_000_000_000
    signatures: dict[str, int] = field(default_factory=dict)
    hosts: dict[str, int] = field(default_factory=dict)
    groups: dict[tuple[int, str], tuple[int, str, tuple[int, ...] | None]] = field(default_factory=dict)
    jobs: dict[tuple[str, int], tuple[int, int | None, int]] = field(default_factory=dict)
    tokens: dict[int, int] = field(default_factory=dict)
    stacks: dict[Stack, int] = field(default_factory=dict)
    max_stacks: int = 100_000

    def learn(self, update: CacheUpdate) -> None:
        """Remember what a committed transaction found (dict updates: safe across threads)."""
        if len(self.stacks) + len(update.stacks) > self.max_stacks:
            self.stacks = {}  # a miss costs one lookup; unbounded memory costs the process
        self.stacks.update(update.stacks)
        self.signatures.update(update.signatures)
        self.hosts.update(update.hosts)
        self.groups.update(update.groups)
        self.jobs.update(update.jobs)
        self.tokens.update(update.tokens)


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


_PG_CLAIM = (
    "INSERT INTO ingested_batches (batch_id, received_at_ns, collector_id) "
    "SELECT * FROM unnest(%s::text[], %s::bigint[], %s::int[]) "
    "ON CONFLICT (batch_id) DO NOTHING RETURNING batch_id"
)


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
        list(dict.fromkeys(map(_sig_key, chain.from_iterable(c.sigs for c in columns)))),
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


def _sig_key(sig: tuple[Any, ...]) -> SignatureKey:
    """The store's key of a wire signature (`EntryColumns.sigs` item)."""
    be, _op, raw_op, is_p2p, isz, osz, idt, odt = sig
    return (raw_op, be, is_p2p, isz, osz, idt, odt)


def _entry_rows(
    ordered: list[tuple[Snapshot, EntryColumns]],
    sig_ids: dict[SignatureKey, int],
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
            ids = table_ids[id(c.sigs)] = [sig_ids[_sig_key(t)] for t in c.sigs]
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


#: Column order of the entry columns `_upsert_entries` takes.
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
#: Whether a re-sent entry is at least as far along as the stored row: a higher state
#: (scheduled 0 < started 1 < completed 2), or the same one and not un-retired (a row-value
#: comparison is exactly that order, in SQLite and PostgreSQL alike). An older
#: snapshot arriving after a newer one (a retried or re-queued batch) is not: it must not move
#: the row back.
_FORWARD = "((excluded.state, excluded.retired) >= (entries.state, entries.retired))"  # row order
#: What a re-sent entry may change: its progress, only forward, and frames once a stall
#: snapshot brings them (even an older one: frames are never taken away). A row neither moves
#: nor gains frames is not written at all (the WHERE).
_ON_CONFLICT = (
    "ON CONFLICT (job_id, rank, record_id) DO UPDATE SET "
    + ", ".join(
        f"{c} = CASE WHEN {_FORWARD} THEN excluded.{c} ELSE entries.{c} END"
        for c in ("state", "retired", "time_started_ns", "time_completed_ns", "duration_ms")
    )
    + f", stack_id = COALESCE(CASE WHEN {_FORWARD} THEN excluded.stack_id END, entries.stack_id, "
    "excluded.stack_id) "
    f"WHERE {_FORWARD} OR (entries.stack_id IS NULL AND excluded.stack_id IS NOT NULL)"
)
_SQLITE_ROW = f"({', '.join('?' * len(ENTRY_COLUMNS))})"
#: Rows per SQLite upsert statement, largest first; a batch is cut into these sizes. Many rows
#: per statement, because sqlite3 releases the GIL around each statement step: with one step per
#: row, an ingest thread writing gets the GIL back only every switch interval (5 ms) while
#: another thread decodes a batch, so writes and decoding could not overlap. Sizes whose
#: parameters exceed the SQLite build's limit (32,766 by default: 1,820 rows) are skipped; each
#: size's statement is prepared once per connection (sqlite3's statement cache).
_SQLITE_ROWS_PER_STATEMENT = (2048, 512, 64, 8, 1)


def _sqlite_upsert(rows: int) -> str:
    """The SQLite entries upsert of `rows` rows (built from the constants above only: no input
    reaches this string, the values are bound parameters)."""
    values = ", ".join([_SQLITE_ROW] * rows)
    return f"INSERT INTO entries ({_COLS}) VALUES {values} {_ON_CONFLICT}"  # noqa: S608


_SQLITE_UPSERTS = {n: _sqlite_upsert(n) for n in _SQLITE_ROWS_PER_STATEMENT}


def _pg_placeholders(types: Sequence[str]) -> str:
    """unnest's array parameters of these element types: text as a literal, others in binary."""
    return ", ".join(f"%s::{t}[]" if t == "text" else f"%b::{t}[]" for t in types)


def _pg_arrays(cols: Iterable[Sequence[Any]], types: Sequence[str]) -> list[Any]:
    """The values of `_pg_placeholders(types)`: columns as array parameters."""
    from flightdeck.server.pg_arrays import binary_array  # numpy: PostgreSQL servers only

    return [
        _pg_text_array(c) if t == "text" else binary_array(c, t) for c, t in zip(cols, types, strict=True)
    ]


#: PostgreSQL element type of each ENTRY_COLUMNS column (`pg_arrays.TYPES`, or text).
_PG_TYPES = (
    "int", "int", "bigint", "int", "bigint", "bigint", "bigint", "int", "smallint", "boolean",
    "bigint", "bigint", "bigint", "float8", "bigint", "text", "int", "int",
)  # fmt: skip
#: One statement whatever the size: each column one array parameter, binary except the text one.
_PG_UNNEST = (
    f"INSERT INTO entries ({_COLS}) SELECT * FROM unnest("  # noqa: S608
    + _pg_placeholders(_PG_TYPES)
    + f") {_ON_CONFLICT}"
)


def _pg_text(v: str) -> str:
    return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _pg_text_array(col: Sequence[str | None]) -> str:
    """A text column as a PostgreSQL array literal, each distinct string escaped once (a column
    repeats a few thread names)."""
    quoted = {v: "NULL" if v is None else _pg_text(v) for v in set(col)}
    return "{" + ",".join(map(quoted.__getitem__, col)) + "}"


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


def _host_ids(session: Session, names: set[str], cache: IngestCache, learned: CacheUpdate) -> dict[str, int]:
    out = {n: cache.hosts[n] for n in names if n in cache.hosts}
    missing = sorted({n[:255] for n in names if n not in out})
    if not missing:
        return out
    session.execute(
        _insert(session, Host).on_conflict_do_nothing(index_elements=["name"]),
        [{"name": n} for n in missing],
    )
    rows = dict(session.execute(select(Host.name, Host.id).where(Host.name.in_(missing))).tuples().all())
    for n in names:
        if n not in out and n[:255] in rows:
            out[n] = learned.hosts[n] = rows[n[:255]]
    return out


def _stack_ids(
    session: Session,
    snapshots: Sequence[Snapshot],
    columns: Sequence[EntryColumns],
    cache: IngestCache,
    learned: CacheUpdate,
) -> dict[int, int]:
    """id(stack tuple) -> stack row id, for every stack the snapshots reference.

    Decoding makes every reference to stack table slot k the same tuple object, so `id()` finds
    a stack without hashing its frames once per entry. Stacks the process has stored or seen
    before are not written again: stall and final snapshots, and torch's own dumps, carry every
    entry's call-site stack.
    """
    by_obj: dict[int, Stack] = {}
    for s, c in zip(snapshots, columns, strict=True):
        if c.stk is not None:
            for i in set(c.stk):
                if i is not None and c.stacks[i]:
                    by_obj.setdefault(id(c.stacks[i]), c.stacks[i])
        for t in s.thread_stacks:
            if t.frames:
                by_obj.setdefault(id(t.frames), t.frames)
        if s.progress is not None and s.progress.frames:
            by_obj.setdefault(id(s.progress.frames), s.progress.frames)
    out: dict[int, int] = {}
    missing: dict[int, Stack] = {}
    for k, st in by_obj.items():
        known = cache.stacks.get(st)
        if known is None:
            missing[k] = st
        else:
            out[k] = known
    if not missing:
        return out
    wire = {k: frames_to_wire(st) for k, st in missing.items()}
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
    for k, h in hashes.items():
        out[k] = learned.stacks[missing[k]] = ids[h]
    return out


def _signature_ids(
    session: Session, keys: Sequence[SignatureKey], cache: IngestCache, learned: CacheUpdate
) -> dict[SignatureKey, int]:
    """Signature row id of each distinct key, creating the missing signatures."""
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
    ids: dict[str, int] = {
        str(d["hash"]): cache.signatures[str(d["hash"])]
        for d in rows.values()
        if d["hash"] in cache.signatures
    }
    new = sorted((d for d in rows.values() if d["hash"] not in ids), key=lambda d: str(d["hash"]))
    if new:
        session.execute(_insert(session, Signature).on_conflict_do_nothing(index_elements=["hash"]), new)
        hashes = sorted({str(d["hash"]) for d in new})
        for chunk in _chunks(hashes, _IN_CHUNK):
            found = dict(
                session.execute(select(Signature.hash, Signature.id).where(Signature.hash.in_(chunk)))
                .tuples()
                .all()
            )
            ids.update(found)
            learned.signatures.update(found)
    return {k: ids[str(d["hash"])] for k, d in rows.items()}


def _group_ids(
    session: Session,
    snapshots: Sequence[Snapshot],
    columns: Sequence[EntryColumns],
    job_ids: dict[tuple[str, int], int],
    cache: IngestCache,
    learned: CacheUpdate,
) -> dict[int, dict[str, int]]:
    """job id -> group name -> group row id, creating groups (and updating desc / members).

    A group the cache holds with the same description and members is not written again: the
    collector sends every rank's groups with each snapshot, and rewriting a 4,096-member list
    per snapshot would be most of the work of a batch.
    """
    wanted: dict[tuple[int, str], tuple[str, tuple[int, ...] | None]] = {}
    for s, c in zip(snapshots, columns, strict=True):
        job_id = job_ids[(s.job, s.attempt)]
        for name, g in s.groups.items():
            wanted[(job_id, name[:128])] = (g.desc[:256], None if g.ranks is None else tuple(g.ranks))
        for name in dict.fromkeys(c.cols["g"]):
            if (job_id, name) not in wanted:
                wanted[(job_id, name[:128])] = ("", None)
    out: dict[int, dict[str, int]] = {j: {} for j in job_ids.values()}
    if not wanted:
        return out
    write: dict[tuple[int, str], tuple[str, tuple[int, ...] | None]] = {}
    for key, (desc, ranks) in wanted.items():
        known = cache.groups.get(key)
        if known is not None and desc in ("", known[1]) and (ranks is None or ranks == known[2]):
            out[key[0]][key[1]] = known[0]
        else:
            write[key] = (desc or (known[1] if known else ""), ranks or (known[2] if known else None))
    if not write:
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
    session.execute(
        stmt,
        [
            {"job_id": j, "name": n, "desc": d, "ranks": None if r is None else list(r)}
            for (j, n), (d, r) in sorted(write.items())
        ],
    )
    for job_id in out:
        names = [n for (j, n) in write if j == job_id]
        for chunk in _chunks(names, _IN_CHUNK):
            q = select(ProcessGroup.name, ProcessGroup.id).where(
                ProcessGroup.job_id == job_id, ProcessGroup.name.in_(chunk)
            )
            for n, gid in session.execute(q).tuples():
                out[job_id][n] = gid
                learned.groups[(job_id, n)] = (gid, *write[(job_id, n)])
    return out


def _upsert_ranks(
    session: Session,
    snapshots: Sequence[Snapshot],
    job_ids: dict[tuple[str, int], int],
    hosts: dict[str, int],
    stack_ids: dict[int, int],
    now_ns: int,
) -> None:
    latest: dict[tuple[int, int], Snapshot] = {}
    for s in snapshots:
        key = (job_ids[(s.job, s.attempt)], s.rank)
        old = latest.get(key)
        if old is None or s.snapshot_time_ns >= old.snapshot_time_ns:
            latest[key] = s
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


_RANK_COLUMNS = (
    "job_id", "rank", "host_id", "pid", "local_rank", "world_size", "last_snapshot_ns", "received_ns",
    "kind", "interval_s", "exception", "wrapped", "oldest_record_id", "torch_version", "backend",
    "version", "thread_stacks", "progress",
)  # fmt: skip
#: Within SQLite's 32,766 host parameters.
_RANK_ROWS_PER_STATEMENT = 500
_RANK_KEEP = ("host_id", "pid", "local_rank", "world_size", "interval_s", "exception", "oldest_record_id",
              "torch_version", "backend", "thread_stacks", "progress")  # fmt: skip
_RANK_UPSERT = (
    f"INSERT INTO ranks ({', '.join(_RANK_COLUMNS)}) {{values}} "
    "ON CONFLICT (job_id, rank) DO UPDATE SET "
    + ", ".join(
        f"{c} = COALESCE(excluded.{c}, ranks.{c})" if c in _RANK_KEEP else f"{c} = excluded.{c}"
        for c in _RANK_COLUMNS[2:]
    )
    # A rank seen again after its process was reported gone (same pid, a later snapshot) is back.
    + ", gone_at_ns = CASE WHEN ranks.gone_at_ns < excluded.last_snapshot_ns THEN NULL "
    "ELSE ranks.gone_at_ns END"
    # A late, older snapshot (a retried batch overtaken by a newer one) must not roll back, and
    # the same snapshot again (a replay) changes nothing.
     + " WHERE ranks.last_snapshot_ns < excluded.last_snapshot_ns"
)
_SQLITE_RANK_ROW = "(" + ", ".join(["?"] * len(_RANK_COLUMNS)) + ")"
#: PostgreSQL element type of each _RANK_COLUMNS column (thread_stacks: JSON text, cast below).
_PG_RANK_TYPES = (
    "int", "int", "int", "bigint", "int", "int", "bigint", "bigint", "text", "float8", "text", "boolean",
    "bigint", "text", "text", "text", "text", "text",
)  # fmt: skip
_PG_RANK_UPSERT = _RANK_UPSERT.format(
    # Constants only: the values are the bound array parameters.
    values=f"SELECT {', '.join(_RANK_COLUMNS[:-2])}, CAST(thread_stacks AS json), CAST(progress AS json) "  # noqa: S608
    "FROM unnest(" + _pg_placeholders(_PG_RANK_TYPES) + f") AS u({', '.join(_RANK_COLUMNS)})"
)


def _upsert_rank_configs(
    session: Session, snapshots: Sequence[Snapshot], job_ids: dict[tuple[str, int], int]
) -> None:
    """Store each rank's newest configuration report; an unchanged report writes nothing."""
    latest: dict[tuple[int, int], Snapshot] = {}
    for s in snapshots:
        if s.config is None:
            continue
        key = (job_ids[(s.job, s.attempt)], s.rank)
        old = latest.get(key)
        if old is None or s.snapshot_time_ns >= old.snapshot_time_ns:
            latest[key] = s
    if not latest:
        return
    rows = []
    for (job_id, rank), s in sorted(latest.items()):
        assert s.config is not None
        doc = config_to_dict(s.config)
        rows.append(
            {
                "job_id": job_id,
                "rank": rank,
                "config_hash": _digest(doc),
                "reported_ns": s.snapshot_time_ns,
                "torch_version": (s.config.torch_version or "")[:64] or None,
                "checkpoint_dir": (s.config.checkpoint_dir or "")[:512] or None,
                "config": doc,
            }
        )
    ins = _insert(session, RankConfigRow)
    ex = ins.excluded
    stmt = ins.on_conflict_do_update(
        index_elements=["job_id", "rank"],
        set_={
            "config_hash": ex.config_hash,
            "reported_ns": ex.reported_ns,
            "torch_version": ex.torch_version,
            "checkpoint_dir": ex.checkpoint_dir,
            "config": ex.config,
        },
        # Only a changed report, and never an older one (a retried batch overtaken by a newer one).
        where=(RankConfigRow.config_hash != ex.config_hash) & (RankConfigRow.reported_ns <= ex.reported_ns),
    )
    session.execute(stmt, rows)


def rank_configs(*, session: Session, job_id: int) -> dict[int, RankConfig]:
    """rank -> its latest configuration report, for the ranks of the job that sent one."""
    q = select(RankConfigRow.rank, RankConfigRow.config).where(RankConfigRow.job_id == job_id)
    return {int(r): config_from_dict(c) for r, c in session.execute(q).tuples()}


def checkpoint_peers(*, session: Session, job_name: str, dirs: Sequence[str]) -> list[PeerJob]:
    """Other jobs (by name: attempts of this job are not peers) whose ranks report one of the
    checkpoint directories `dirs`, with the torch versions they run there."""
    if not dirs:
        return []
    q = (
        select(Job.name, RankConfigRow.checkpoint_dir, RankConfigRow.torch_version)
        .join(Job, Job.id == RankConfigRow.job_id)
        .where(RankConfigRow.checkpoint_dir.in_(list(dirs)[:_IN_CHUNK]), Job.name != job_name)
        .distinct()
    )
    found: dict[tuple[str, str], set[str]] = {}
    for name, d, version in session.execute(q).tuples():
        versions = found.setdefault((name, str(d)), set())
        if version:
            versions.add(version)
    return [PeerJob(name, tuple(sorted(v)), d) for (name, d), v in sorted(found.items())]


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


#: The history keeps at most one sample per agent per this many ns (plus the last sample of every
#: counter run), so a collector pushing every 2 s costs ~8,640 rows per agent and day, not 43,200.
#: Rates over `nixl_rates.RATE_WINDOW_S` still see several samples.
NIXL_HISTORY_STEP_NS = 10 * 1_000_000_000


def _keep_nixl_history(
    *, session: Session, agent_id: int, run: str, read_time_ns: int, wire: dict[str, Any], force: bool
) -> None:
    """Add a sample to the agent's history unless one was kept less than a step before it."""
    last = session.execute(
        select(func.max(NixlSampleRow.read_time_ns)).where(NixlSampleRow.agent_id == agent_id)
    ).scalar_one()
    if last is not None and (
        read_time_ns <= last or (not force and read_time_ns - last < NIXL_HISTORY_STEP_NS)
    ):
        return
    session.add(NixlSampleRow(agent_id=agent_id, read_time_ns=read_time_ns, run=run, sample=wire))


def upsert_nixl(*, session: Session, samples: Sequence[Any]) -> None:
    """Store the latest sample per agent and keep a thinned history of them (`nixl_samples`);
    a new counter run carries the old run's totals over."""
    for smp in samples:
        wire = smp.to_wire()
        row = session.execute(
            select(NixlAgent)
            .where(NixlAgent.host == smp.host, NixlAgent.agent == smp.agent, NixlAgent.source == smp.source)
            .with_for_update()
        ).scalar_one_or_none()
        first = row is None
        if row is None:
            row = NixlAgent(host=smp.host, agent=smp.agent, source=smp.source, carried=None)
            session.add(row)
        new_run = not first and row.run != smp.run
        if new_run:
            row.carried = _add_counters(row.carried, row.sample)
            # The old run's last sample ends its counting: keep it, so a window across the reset
            # sees everything the old run counted.
            _keep_nixl_history(
                session=session,
                agent_id=row.id,
                run=row.run,
                read_time_ns=row.read_time_ns,
                wire=row.sample,
                force=True,
            )
        elif not first and smp.read_time_ns < row.read_time_ns:
            continue  # an older sample of the same run: counters only grow, keep the newer one
        row.run = smp.run
        row.pid = smp.pid
        row.local_rank = smp.local_rank
        row.read_time_ns = smp.read_time_ns
        row.sample = wire
        if first:
            session.flush()  # the id, for the history row
        _keep_nixl_history(
            session=session,
            agent_id=row.id,
            run=smp.run,
            read_time_ns=smp.read_time_ns,
            wire=wire,
            force=first or new_run,
        )
        session.flush()  # the next sample of this batch may be the same agent's: let it see this one


def nixl_agents(*, session: Session) -> list[NixlAgent]:
    """Every NIXL agent with its latest sample and carried totals."""
    return list(session.execute(select(NixlAgent).order_by(NixlAgent.host, NixlAgent.agent)).scalars())


def nixl_totals(agent: NixlAgent) -> dict[str, Any]:
    """The agent's counters over all its runs (latest sample plus the carried totals)."""
    return _add_counters(agent.carried, agent.sample)


def nixl_history(*, session: Session, window_ns: int) -> dict[int, list[dict[str, Any]]]:
    """Per agent id: its kept samples of the `window_ns` before its latest one, oldest first
    (the latest itself is `NixlAgent.sample`, and is left out here)."""
    q = (
        select(NixlSampleRow.agent_id, NixlSampleRow.sample)
        .join(NixlAgent, NixlAgent.id == NixlSampleRow.agent_id)
        .where(
            NixlSampleRow.read_time_ns >= NixlAgent.read_time_ns - window_ns,
            NixlSampleRow.read_time_ns < NixlAgent.read_time_ns,
        )
        .order_by(NixlSampleRow.agent_id, NixlSampleRow.read_time_ns)
    )
    out: dict[int, list[dict[str, Any]]] = {}
    for agent_id, sample in session.execute(q).tuples():
        out.setdefault(agent_id, []).append(dict(sample))
    return out


# --- jobs, ranks and entries (reads) -------------------------------------------------------------


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


def _signatures(session: Session, ids: Iterable[int]) -> dict[int, Signature]:
    out: dict[int, Signature] = {}
    for chunk in _chunks(sorted(set(ids)), _IN_CHUNK):
        for row in session.execute(select(Signature).where(Signature.id.in_(chunk))).scalars():
            out[row.id] = row
    return out


def load_entries(*, session: Session, job_id: int) -> dict[int, list[Entry]]:
    """Every stored entry of a job as records, per rank, oldest (by record id) first."""
    groups = {g.id: g.name for g in job_groups(session=session, job_id=job_id)}
    rows = (
        session.connection()
        .execute(
            select(*_ENTRY_COLUMNS)
            .where(EntryRow.job_id == job_id)
            .order_by(EntryRow.rank, EntryRow.record_id)
        )
        .all()
    )
    out: dict[int, list[Entry]] = {}
    for rank, e in _entry_records(session, rows, groups):
        out.setdefault(rank, []).append(e)
    return out


def rank_entries(
    *, session: Session, job_id: int, ranks: Sequence[int], per_read: int = 16
) -> Iterator[tuple[int, list[Entry]]]:
    """Every stored entry of a job, a rank at a time (in `ranks`' order, each oldest first by
    record id; a rank without entries is skipped), read `per_read` ranks a query: what
    `load_entries` gives, without holding all of a large job's entries at once (a 1,024-rank x
    2,000-collective job's records took 1.2 GB)."""
    groups = {g.id: g.name for g in job_groups(session=session, job_id=job_id)}
    for k in range(0, len(ranks), per_read):
        chunk = list(ranks[k : k + per_read])
        rows = (
            session.connection()
            .execute(
                select(*_ENTRY_COLUMNS)
                .where(EntryRow.job_id == job_id, EntryRow.rank.in_(chunk))
                .order_by(EntryRow.rank, EntryRow.record_id)
            )
            .all()
        )
        by_rank: dict[int, list[Entry]] = {}
        for rank, e in _entry_records(session, rows, groups):
            by_rank.setdefault(rank, []).append(e)
        del rows
        for r in chunk:
            got = by_rank.pop(r, None)
            if got:
                yield r, got


def _entry_records(session: Session, raw: Sequence[Any], groups: dict[int, str]) -> list[tuple[int, Entry]]:
    """Entry rows (of `_ENTRY_COLUMNS`) as (rank, record) pairs, in the given order (signatures
    and stacks batch-loaded)."""
    # Positions of `_ENTRY_COLUMNS`: a row unpacked as a tuple costs a fraction of 17 attribute
    # lookups on a SQLAlchemy Row, which were a third of a 1,024-rank page's time.
    sigs = _signatures(session, (r[6] for r in raw))
    stacks = stacks_by_id(session=session, ids=(r[7] for r in raw if r[7] is not None))
    sig_cache: dict[int, tuple[Any, ...]] = {}
    out: list[tuple[int, Entry]] = []
    for (
        rank,
        record_id,
        group_id,
        seq,
        p2p_seq,
        op_id,
        sig_id,
        stack_id,
        state,
        retired,
        created,
        started,
        completed,
        duration_ms,
        timeout_ms,
        thread_name,
        peer,
    ) in raw:
        sv = sig_cache.get(sig_id)
        if sv is None:
            s = sigs[sig_id]
            sv = sig_cache[sig_id] = (
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
                rank,
                Entry(
                    record_id=record_id,
                    group=groups.get(group_id, str(group_id)),
                    collective_seq_id=seq,
                    p2p_seq_id=p2p_seq,
                    op_id=op_id,
                    backend=backend,
                    op=op,
                    raw_op=raw_op,
                    is_p2p=is_p2p,
                    input_sizes=isz,
                    output_sizes=osz,
                    input_dtypes=idt,
                    output_dtypes=odt,
                    state=STATE_NAMES[state],  # type: ignore[arg-type]
                    retired=bool(retired),  # SQLite rows read by `_plain_rows` hold 0/1
                    time_created_ns=created,
                    time_started_ns=started,
                    time_completed_ns=completed,
                    duration_ms=duration_ms,
                    timeout_ms=timeout_ms,
                    thread_name=thread_name,
                    peer=peer,
                    frames=stacks.get(stack_id, ()) if stack_id is not None else (),
                ),
            )
        )
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


#: The entry columns a record is built from (`_entry_records`): read as plain rows, not ORM
#: objects. Building 41,000 ORM instances for a 1,024-rank window took ~1 s of a page's time;
#: the rows of the same query take a tenth of that.
_ENTRY_COLUMNS = (
    EntryRow.rank,
    EntryRow.record_id,
    EntryRow.group_id,
    EntryRow.seq,
    EntryRow.p2p_seq,
    EntryRow.op_id,
    EntryRow.sig_id,
    EntryRow.stack_id,
    EntryRow.state,
    EntryRow.retired,
    EntryRow.time_created_ns,
    EntryRow.time_started_ns,
    EntryRow.time_completed_ns,
    EntryRow.duration_ms,
    EntryRow.timeout_ms,
    EntryRow.thread_name,
    EntryRow.peer,
)


#: The names of `_ENTRY_COLUMNS`, and the position of the signature id among them.
_ENTRY_KEYS = tuple(c.key for c in _ENTRY_COLUMNS)
_SIG = _ENTRY_KEYS.index("sig_id")


def _edge_seq(job_id: int, where: Sequence[Any], order: Any) -> Any:
    """The seq of the first collective (non-p2p) entry of the job matching `where` in `order`, as a
    correlated scalar subquery: one index seek per outer row instead of an aggregate over the job."""
    return (
        select(EntryRow.seq)
        .join(Signature, Signature.id == EntryRow.sig_id)
        .where(EntryRow.job_id == job_id, Signature.is_p2p.is_(False), *where)
        .order_by(order)
        .limit(1)
        .scalar_subquery()
    )


def group_seq_ranges(*, session: Session, job_id: int) -> dict[int, tuple[int, int]]:
    """group row id -> (min, max) collective seq of the job's collective (non-p2p) entries.

    Each bound is the first row of the (job, group, seq) index in one direction, not MIN/MAX over
    every entry of the job (1.7 s at 1,024 ranks x 2,000 entries; milliseconds this way)."""
    in_group = (EntryRow.group_id == ProcessGroup.id,)
    q = select(
        ProcessGroup.id,
        _edge_seq(job_id, in_group, EntryRow.seq.asc()),
        _edge_seq(job_id, in_group, EntryRow.seq.desc()),
    ).where(ProcessGroup.job_id == job_id)
    return {g: (int(lo), int(hi)) for g, lo, hi in session.execute(q).tuples() if lo is not None}


def rank_seq_ranges(
    *, session: Session, job_id: int, group_id: int, ranks: Sequence[int] | None = None
) -> dict[int, tuple[int, int]]:
    """rank -> (first, last) collective seq it holds of one group (non-p2p entries; `ranks`: None = all).

    A rank records a group's collectives in seq order, so its first and last are those of its
    oldest and newest record ids in the group: a walk along the (job, rank, record_id) primary
    key from each end to the rank's first entry of the group, per rank (an aggregate over the
    group's entries took 0.4 s at 1,024 ranks). Ask for the ranks that need it: for a rank
    outside the group, the walk reads its whole ring."""
    # `+ 0`: never the (job, group, seq) index here, whatever the statistics say (with none yet,
    # after a first large ingest, PostgreSQL scanned the group's entries once per rank: minutes).
    mine = (EntryRow.rank == Rank.rank, EntryRow.group_id + 0 == group_id)
    q = select(
        Rank.rank,
        _edge_seq(job_id, mine, EntryRow.record_id.asc()),
        _edge_seq(job_id, mine, EntryRow.record_id.desc()),
    ).where(Rank.job_id == job_id)
    out: dict[int, tuple[int, int]] = {}
    for chunk in [None] if ranks is None else _chunks(list(ranks), _IN_CHUNK):
        qc = q if chunk is None else q.where(Rank.rank.in_(chunk))
        out.update((r, (int(lo), int(hi))) for r, lo, hi in session.execute(qc).tuples() if lo is not None)
    return out


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
    reader = _WindowReader(session.connection())
    rows = reader.rows(job_id, group_id, ranks, seq_from, seq_to)
    out: dict[int, list[Entry]] = {}
    for rank, e in _entry_records(session, rows[:limit], {group_id: group_name}):
        if e.is_p2p:
            continue  # filtered here, from the signatures already loaded, rather than by a join
        lst = out.setdefault(rank, [])
        if lst and lst[-1].collective_seq_id == e.collective_seq_id:
            lst[-1] = e
        else:
            lst.append(e)
    return out


#: What a timeline cell shows of an entry (`window_cells`): no sizes, frames or thread.
_CELL_COLUMNS = (
    EntryRow.rank,
    EntryRow.seq,
    EntryRow.record_id,
    EntryRow.sig_id,
    EntryRow.state,
    EntryRow.retired,
)
#: ... and where it lies in time (the wall-time view).
_SPAN_COLUMNS = (
    *_CELL_COLUMNS,
    EntryRow.time_created_ns,
    EntryRow.time_started_ns,
    EntryRow.time_completed_ns,
    EntryRow.duration_ms,
)


def window_cells(
    *,
    session: Session,
    job_id: int,
    group_id: int,
    ranks: Sequence[int] | None = None,
    seq_from: int | None = None,
    seq_to: int | None = None,
    spans: bool = False,
    limit: int = 200_000,
) -> dict[int, list[dict[str, Any]]]:
    """rank -> what the timeline's cells show of each collective (non-p2p) entry of one group with
    seq in [seq_from, seq_to]: plain dicts of `collective_seq_id`, `op`, `state` and `retired`
    (and with `spans` the four times), sorted by seq; a seq held twice by a rank keeps its newest
    record.

    The incident page reads this rather than `window_entries`: building a full record (sizes,
    dtypes, frames) of each of a 1,024-rank window's 40,959 entries was two thirds of the page,
    and the four 64-bit times double what the database sends.
    """
    columns = _SPAN_COLUMNS if spans else _CELL_COLUMNS
    rows = _WindowReader(session.connection()).rows(job_id, group_id, ranks, seq_from, seq_to, columns)
    ops: dict[int, str | None] = {
        sid: None if is_p2p else canonical_op(raw_op)
        for sid, raw_op, is_p2p in _signature_ops(session, {r[3] for r in rows})
    }
    out: dict[int, list[dict[str, Any]]] = {}
    lst: list[dict[str, Any]] = []
    last_rank: int | None = None
    last_seq: int | None = None
    for row in rows[:limit]:
        rank, seq, _rid, sig_id, state, retired = row[:6]
        op = ops[sig_id]
        if op is None:
            continue  # p2p: filtered here, from the signatures already loaded, rather than by a join
        if rank != last_rank:
            lst = out[rank] = []
            last_rank, last_seq = rank, None
        cell = {"collective_seq_id": seq, "op": op, "state": STATE_NAMES[state], "retired": bool(retired)}
        if spans:
            (
                cell["time_created_ns"],
                cell["time_started_ns"],
                cell["time_completed_ns"],
                cell["duration_ms"],
            ) = row[6:]
        if seq == last_seq:
            lst[-1] = cell
        else:
            lst.append(cell)
            last_seq = seq
    return out


def _signature_ops(session: Session, ids: set[int]) -> list[tuple[int, str, bool]]:
    """(id, raw op, is p2p) of the given signatures: three columns, not the ORM objects."""
    out: list[tuple[int, str, bool]] = []
    for chunk in _chunks(sorted(ids), _IN_CHUNK):
        q = select(Signature.id, Signature.raw_op, Signature.is_p2p).where(Signature.id.in_(chunk))
        out.extend((int(i), str(op), bool(p)) for i, op, p in session.connection().execute(q))
    return out


class _WindowReader:
    """Reads the entry rows of a (group, seq) window the way each database reads them fastest.

    SQLite: the (job, group, seq) index holds each row's primary key (job, rank, record_id) but no
    other column, so reading the rows through it is one random lookup each (280 ms for a
    1,024-rank x 40-seq window, 2,000 entries per rank). The index alone answers each rank's
    record-id span in the window (17 ms), and a span is one contiguous range of the primary key
    (87 ms for the same 40,959 rows). PostgreSQL fetches the index's rows from the heap in page
    order (bitmap heap scan), so it takes the plain query.
    """

    def __init__(self, conn: Any) -> None:
        self._conn = conn

    def rows(
        self,
        job_id: int,
        group_id: int,
        ranks: Sequence[int] | None,
        seq_from: int | None,
        seq_to: int | None,
        columns: Sequence[Any] = _ENTRY_COLUMNS,
    ) -> list[tuple[Any, ...]]:
        """The `columns` (`_ENTRY_COLUMNS`) of the window's rows by rank, seq and record id (each
        of the three must be among the columns)."""
        where = self._window(EntryRow.group_id, EntryRow.seq, group_id, seq_from, seq_to)
        if ranks is not None:
            where.append(EntryRow.rank.in_(list(ranks)))
        order = (EntryRow.rank, EntryRow.seq, EntryRow.record_id)
        if self._conn.dialect.name != "sqlite":
            # Sorted by the database, in its own process: 164k rows (4,096 ranks) sorted here took
            # ~80 ms of the page's CPU.
            q = select(*columns).where(EntryRow.job_id == job_id, *where).order_by(*order)
            return _plain_rows(self._conn, q)
        spans = self._conn.execute(
            select(EntryRow.rank, func.min(EntryRow.record_id), func.max(EntryRow.record_id))
            .where(EntryRow.job_id == job_id, *where)
            .group_by(EntryRow.rank)
        ).all()
        # `+ 0`: the same filter as an expression, which keeps SQLite off the (job, group, seq)
        # index for this read; it is applied to the rows of each rank's key range instead.
        again = self._window(EntryRow.group_id + 0, EntryRow.seq + 0, group_id, seq_from, seq_to)
        out: list[tuple[Any, ...]] = []
        for chunk in _chunks(spans, _IN_CHUNK):
            q = select(*columns).where(
                EntryRow.job_id == job_id,
                EntryRow.rank.in_([r for r, _, _ in chunk]),
                EntryRow.record_id.between(min(lo for _, lo, _ in chunk), max(hi for _, _, hi in chunk)),
                *again,
            )
            out.extend(_plain_rows(self._conn, q))
        names = [c.key for c in columns]
        out.sort(key=itemgetter(*(names.index(c.key) for c in order)))
        return out

    @staticmethod
    def _window(group: Any, seq: Any, group_id: int, seq_from: int | None, seq_to: int | None) -> list[Any]:
        where = [group == group_id]
        if seq_from is not None:
            where.append(seq >= seq_from)
        if seq_to is not None:
            where.append(seq <= seq_to)
        return where


def recent_entries(*, session: Session, job_id: int, rank: int, limit: int = 50) -> list[Entry]:
    """The rank's `limit` most recently created entries across all groups, oldest first."""
    groups = {g.id: g.name for g in job_groups(session=session, job_id=job_id)}
    q = (
        select(*_ENTRY_COLUMNS)
        .where(EntryRow.job_id == job_id, EntryRow.rank == rank)
        .order_by(EntryRow.time_created_ns.desc(), EntryRow.record_id.desc())
        .limit(limit)
    )
    raw = session.connection().execute(q).all()[::-1]
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
        NixlSampleRow,
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
    """Entries of a job in a window, by (group, seq, rank), as readable dicts (bounds inclusive).

    The group is resolved to its id first, so the window is one range of the (job, group, seq)
    index (by name, through a join, SQLite scanned the job's whole index: 3.3 s at 2M entries)."""
    names = {g.id: g.name for g in job_groups(session=session, job_id=job_id)}
    q = select(*_ENTRY_COLUMNS).where(EntryRow.job_id == job_id)
    if group is not None:
        gid = next((i for i, n in names.items() if n == group), None)
        if gid is None:
            return []
        q = q.where(EntryRow.group_id == gid)
    if rank_from is not None:
        q = q.where(EntryRow.rank >= rank_from)
    if rank_to is not None:
        q = q.where(EntryRow.rank <= rank_to)
    if seq_from is not None:
        q = q.where(EntryRow.seq >= seq_from)
    if seq_to is not None:
        q = q.where(EntryRow.seq <= seq_to)
    q = q.order_by(EntryRow.group_id, EntryRow.seq, EntryRow.rank, EntryRow.record_id).limit(limit)
    rows = _plain_rows(session.connection(), q)
    # What an entry's signature says, made once per signature: a window repeats a few of them.
    said: dict[int, dict[str, Any]] = {}
    for sid, sig in _signatures(session, (r[_SIG] for r in rows)).items():
        said[sid] = {
            "op": canonical_op(sig.raw_op),
            "profiling_name": sig.raw_op,
            "is_p2p": sig.is_p2p,
            "input_sizes": sig.input_sizes,
            "output_sizes": sig.output_sizes,
            "input_dtypes": sig.input_dtypes,
            "output_dtypes": sig.output_dtypes,
        }
    out = []
    for row in rows:
        e = dict(zip(_ENTRY_KEYS, row, strict=True))
        out.append(
            {
                "rank": e["rank"],
                "record_id": e["record_id"],
                "process_group": names.get(e["group_id"], str(e["group_id"])),
                "collective_seq_id": e["seq"],
                "p2p_seq_id": e["p2p_seq"],
                **said[e["sig_id"]],
                "state": STATE_NAMES[e["state"]],
                "retired": bool(e["retired"]),
                "time_created_ns": e["time_created_ns"],
                "time_started_ns": e["time_started_ns"],
                "time_completed_ns": e["time_completed_ns"],
                "duration_ms": e["duration_ms"],
                "peer": e["peer"],
                "stack_id": e["stack_id"],
            }
        )
    return out


# --- findings ------------------------------------------------------------------------------------

FindingKey = tuple[str, str, int, int]


def finding_key(f: Finding) -> FindingKey:
    """The identity of a finding across diagnoses: (kind, group, seq, rank).

    A configuration finding is one per job and setting (and group), whoever the culprits are: its
    group key is `<setting>` or `<setting>@<group>`.
    """
    if f.kind in CONFIG_KINDS:
        setting = str((f.expected or f.actual or {}).get("setting") or "")
        return (f.kind, (f"{setting}@{f.process_group}" if f.process_group else setting)[:128], -1, -1)
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


def open_finding_counts(*, session: Session, job_ids: Sequence[int] | None = None) -> dict[int, int]:
    """job id -> number of open findings (jobs without any are absent); of `job_ids` only when
    given."""
    q = (
        select(FindingRow.job_id, func.count())
        .where(FindingRow.resolved_at_ns.is_(None))
        .group_by(FindingRow.job_id)
    )
    if job_ids is not None:
        q = q.where(FindingRow.job_id.in_(list(job_ids)))
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
    last_seen_ns: int | None = None,
    ended_at_ns: int | None = None,
) -> list[FindingEvent]:
    """Reconcile a diagnosis with the stored findings: open new ones, update the ones still seen,
    resolve the ones that disappeared; store the report and the job status.

    `last_seen_ns`: the newest snapshot time the diagnosis holds (the job row's never moves back).
    With `ended_at_ns` the job has ended: every open finding this diagnosis (made as of the end)
    still sees is closed at that time with resolution `ended`, its data (elapsed times) as of the
    end; the others resolve as usual; one it sees for the first time is stored closed (`ended`)
    at once, without an event (nothing pages for a job that is over). Without it, a job that had
    ended is running again (a newer snapshot)."""
    current: dict[FindingKey, Finding] = {}
    for f in findings:
        current.setdefault(finding_key(f), f)  # identical identities in one report: keep the first
    existing = {
        (r.kind, r.group_key, r.seq_key, r.rank_key): r for r in open_findings(session=session, job_id=job_id)
    }
    events: list[FindingEvent] = []
    for key, row in existing.items():
        seen = current.get(key)
        if ended_at_ns is not None and seen is not None:
            row.data = seen.to_json()
            row.resolved_at_ns = max(ended_at_ns, row.opened_at_ns)
            row.updated_at_ns = now_ns
            row.resolution = RESOLUTION_ENDED
            events.append(FindingEvent("finding.resolved", row.id, row.kind, row.data))
        elif seen is None:
            row.resolved_at_ns = now_ns
            row.updated_at_ns = now_ns
            events.append(FindingEvent("finding.resolved", row.id, row.kind, row.data))
        else:
            row.data = seen.to_json()
            row.updated_at_ns = now_ns
    new_rows = []
    closed: set[FindingKey] = set()
    if ended_at_ns is not None:
        q = select(FindingRow.kind, FindingRow.group_key, FindingRow.seq_key, FindingRow.rank_key).where(
            FindingRow.job_id == job_id, FindingRow.resolution == RESOLUTION_ENDED
        )
        closed = {(k, g, sq, r) for k, g, sq, r in session.execute(q).tuples()}
    for key, f in current.items():
        if key in existing or key in closed:
            continue
        kind, group_key, seq_key, rank_key = key
        # What only the end's diagnosis saw (a job whose whole history arrived after it ended)
        # is kept, closed as ended at once, and pages nobody (no event).
        row = FindingRow(
            job_id=job_id,
            kind=kind,
            group_key=group_key,
            seq_key=seq_key,
            rank_key=rank_key,
            opened_at_ns=now_ns,
            updated_at_ns=now_ns,
            resolved_at_ns=None if ended_at_ns is None else now_ns,
            resolution=None if ended_at_ns is None else RESOLUTION_ENDED,
            data=f.to_json(),
        )
        session.add(row)
        if ended_at_ns is None:
            new_rows.append(row)
    session.flush()
    events.extend(FindingEvent("finding.opened", r.id, r.kind, r.data) for r in new_rows)
    values: dict[str, Any] = {
        "report": report,
        "status": status,
        "diagnosed_at_ns": now_ns,
        "ended_at_ns": ended_at_ns,
    }
    session.execute(update(Job).where(Job.id == job_id).values(**values))
    if last_seen_ns is not None:
        session.execute(
            update(Job)
            .where(Job.id == job_id, Job.last_seen_ns < last_seen_ns)
            .values(last_seen_ns=last_seen_ns)
        )
    return events


# --- collector tokens ----------------------------------------------------------------------------


def create_token(
    *,
    session: Session,
    name: str,
    token_hash: str,
    now_ns: int,
    host: str | None = None,
    job_patterns: Sequence[str] | None = None,
) -> CollectorToken:
    """Store a new collector token (its hash only), bound to `host` and `job_patterns` when
    given (None: any); raises IntegrityError when the name exists."""
    tok = CollectorToken(
        name=name,
        token_hash=token_hash,
        created_at_ns=now_ns,
        host=host,
        job_patterns=None if job_patterns is None else list(job_patterns),
    )
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


# --- several servers on one PostgreSQL ----------------------------------------------------------

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

    Call last in the batch's transaction: `received_ns` is then within a commit of being visible,
    which is what lets `feed_ids` look back only a few seconds.
    """
    out = {}
    for job_id in sorted(set(job_ids)):
        stmt = (
            _insert(session, FeedRow)
            .values(job_id=job_id, received_ns=received_ns, body=body)
            .returning(FeedRow.id)
        )
        out[job_id] = int(session.execute(stmt).scalar_one())
    return out


def feed_ids(*, session: Session, job_ids: Sequence[int], since_ns: int) -> list[tuple[int, int]]:
    """(feed id, job id) of the visible feed rows of these jobs received after `since_ns`, by id."""
    if not job_ids:
        return []
    q = (
        select(FeedRow.id, FeedRow.job_id)
        .where(FeedRow.received_ns > since_ns, FeedRow.job_id.in_(list(job_ids)))
        .order_by(FeedRow.id)
    )
    return [(int(i), int(j)) for i, j in session.execute(q).tuples()]


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


# --- webhook outbox ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ClaimedDelivery:
    """A webhook delivery a sender holds (leased) until it settles it."""

    row_id: int
    event_id: str
    url: str
    payload: dict[str, Any]
    #: Attempts so far, the one about to be made included.
    attempts: int
    deadline_ns: int


def add_webhook_deliveries(*, session: Session, deliveries: Sequence[dict[str, Any]]) -> None:
    """Put deliveries into the outbox; call in the transaction that stores what caused them.

    Each dict: event_id, url, payload, created_ns, due_ns, deadline_ns.
    """
    if deliveries:
        rows = [{**d, "attempts": 0, "state": "pending"} for d in deliveries]
        session.connection().execute(_insert(session, WebhookDelivery), rows)


def claim_webhook_deliveries(
    *, session: Session, urls: Sequence[str], now_ns: int, limit: int, lease_ns: int, claim: str
) -> list[ClaimedDelivery]:
    """Take up to `limit` due deliveries to `urls`, earliest due first, and lease them to `claim`.

    The k-th row's lease ends k * `lease_ns` from now: the sender posts them one after another.
    PostgreSQL: `FOR UPDATE SKIP LOCKED`, so a row another server process is claiming is skipped
    rather than waited for, and re-checked after its commit (its lease then makes it not due).
    SQLite: the write session's BEGIN IMMEDIATE already serializes claims.
    """
    if not urls or limit <= 0:
        return []
    w = WebhookDelivery
    q = (
        select(w.id, w.event_id, w.url, w.payload, w.attempts, w.deadline_ns)
        .where(w.state == "pending", w.due_ns <= now_ns, w.url.in_(list(urls)))
        .order_by(w.due_ns, w.id)
        .limit(limit)
    )
    if session.get_bind().dialect.name == "postgresql":
        q = q.with_for_update(skip_locked=True)
    rows = session.execute(q).tuples().all()
    if not rows:
        return []
    stmt = (
        update(w)
        .where(w.id == bindparam("rid"))
        .values(due_ns=bindparam("lease"), claim=claim, attempts=w.attempts + 1)
    )
    leases = [{"rid": r[0], "lease": now_ns + (k + 1) * lease_ns} for k, r in enumerate(rows)]
    session.connection().execute(stmt, leases)
    return [
        ClaimedDelivery(row_id=int(i), event_id=e, url=u, payload=p, attempts=int(a) + 1, deadline_ns=int(dl))
        for i, e, u, p, a, dl in rows
    ]


def settle_webhook_delivery(
    *,
    session: Session,
    row_id: int,
    claim: str,
    state: str,
    now_ns: int,
    due_ns: int | None = None,
    error: str | None = None,
) -> bool:
    """Record the outcome of an attempt on a delivery still leased to `claim`: `delivered` or
    `dropped` (done), or `pending` again at `due_ns` (a retry). False when the lease was lost."""
    values: dict[str, Any] = {"state": state, "claim": None, "last_error": error[:256] if error else None}
    if state == "pending":
        values["due_ns"] = due_ns if due_ns is not None else now_ns
    else:
        values["done_ns"] = now_ns
    w = WebhookDelivery
    res = session.execute(update(w).where(w.id == row_id, w.claim == claim).values(**values))
    return int(getattr(res, "rowcount", 0) or 0) == 1


def release_webhook_deliveries(*, session: Session, row_ids: Sequence[int], claim: str, now_ns: int) -> None:
    """Hand back leased deliveries that were not attempted (the sender stops): due now, and the
    attempt counted at the claim is taken back."""
    if not row_ids:
        return
    w = WebhookDelivery
    session.execute(
        update(w)
        .where(w.id.in_(list(row_ids)), w.claim == claim)
        .values(claim=None, due_ns=now_ns, attempts=w.attempts - 1)
    )


def webhook_outbox_status(*, session: Session, urls: Sequence[str]) -> tuple[int, int | None]:
    """(deliveries to `urls` waiting, the earliest due time among them or None)."""
    if not urls:
        return 0, None
    w = WebhookDelivery
    q = select(func.count(), func.min(w.due_ns)).where(w.state == "pending", w.url.in_(list(urls)))
    n, due = session.execute(q).tuples().one()
    return int(n), None if due is None else int(due)


def webhook_deliveries(*, session: Session, event_id: str | None = None) -> list[WebhookDelivery]:
    """The outbox's rows (of one event), oldest first."""
    q = select(WebhookDelivery).order_by(WebhookDelivery.id)
    if event_id is not None:
        q = q.where(WebhookDelivery.event_id == event_id)
    return list(session.execute(q).scalars())


def prune_webhook_outbox(*, session: Session, before_ns: int) -> int:
    """Delete deliveries done (delivered or dropped) before `before_ns`, and those whose deadline
    passed before it (left pending for a URL no longer configured); returns how many."""
    w = WebhookDelivery
    res = session.execute(
        delete(w).where(or_(and_(w.state != "pending", w.done_ns < before_ns), w.deadline_ns < before_ns))
    )
    return int(getattr(res, "rowcount", 0) or 0)
