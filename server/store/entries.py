"""Reads of entries: a job's entries as records, a (group, seq) window as records or as
timeline cells, a rank's recent entries, the seq ranges of groups and ranks, the timeline API's
rows."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from operator import itemgetter
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from flightdeck.records import Entry, Signature, canonical_op
from flightdeck.server.models import STATE_NAMES, EntryRow, ProcessGroup, Rank
from flightdeck.server.models import Signature as SignatureRow
from flightdeck.server.store.common import _IN_CHUNK, _chunks, _plain_rows
from flightdeck.server.store.jobs import job_groups, stacks_by_id


def _signatures(session: Session, ids: Iterable[int]) -> dict[int, SignatureRow]:
    out: dict[int, SignatureRow] = {}
    for chunk in _chunks(sorted(set(ids)), _IN_CHUNK):
        for row in session.execute(select(SignatureRow).where(SignatureRow.id.in_(chunk))).scalars():
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
    sig_cache: dict[int, Signature] = {}
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
            sv = sig_cache[sig_id] = Signature(
                backend=s.backend,
                op=canonical_op(s.raw_op),
                raw_op=s.raw_op,
                is_p2p=s.is_p2p,
                input_sizes=tuple(tuple(x) for x in s.input_sizes),
                output_sizes=tuple(tuple(x) for x in s.output_sizes),
                input_dtypes=tuple(s.input_dtypes),
                output_dtypes=tuple(s.output_dtypes),
            )
        backend, op, raw_op, is_p2p, isz, osz, idt, odt = sv
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
        .join(SignatureRow, SignatureRow.id == EntryRow.sig_id)
        .where(EntryRow.job_id == job_id, SignatureRow.is_p2p.is_(False), *where)
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
        q = select(SignatureRow.id, SignatureRow.raw_op, SignatureRow.is_p2p).where(
            SignatureRow.id.in_(chunk)
        )
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
