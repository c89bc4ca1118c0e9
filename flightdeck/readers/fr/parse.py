"""A raw dump dict (from `load_raw`) and its sidecar -> a `RankDump`.

`parse_dump` normalizes every entry; `parse_columns` and `parse_signatures` give the dump's
metadata with its entries as columns, for the summary's folds. The dump-level fields come from
`_dump_of`, and what the agent's sidecar says is laid over them (`_apply_meta`, `ring_extent`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import replace
from operator import attrgetter
from typing import Any

from flightdeck.readers.coalesced import fold_coalesced
from flightdeck.readers.fr.columns import EntryColumns, _columnar_entries, _entry_columns
from flightdeck.readers.fr.decode import DEFAULT_BUDGET, DumpBudget
from flightdeck.readers.fr.errors import NotADumpError
from flightdeck.readers.fr.groups import _pg_config_groups, _pg_status
from flightdeck.readers.fr.normalize import _Ctx, _entry, _int, _opt_int, _s, _stack
from flightdeck.readers.fr.signatures import SignatureColumns, _signature_columns
from flightdeck.records import (
    COALESCED_END_OPS,
    Entry,
    GroupInfo,
    RankDump,
    SnapshotKind,
    ThreadStack,
    config_from_dict,
    progress_from_dict,
)
from flightdeck.spool import RING_META_KEY

#: What a value of an unexpected type can raise while a dump is normalized: the file is refused.
VALUE_ERRORS = (TypeError, ValueError, OverflowError, AttributeError, KeyError, IndexError, RecursionError)


_RECORD_ID = attrgetter("record_id")
_GROUP = attrgetter("group")
_BACKEND = attrgetter("backend")


def parse_dump(
    raw: dict[str, Any],
    *,
    rank: int,
    source: str,
    meta: dict[str, Any] | None = None,
    mtime_ns: int | None = None,
) -> RankDump:
    """Normalize a raw dump dict (from `load_raw`) and its optional agent metadata into a RankDump.

    Raises NotADumpError when a value is of a kind normalization cannot make sense of (never
    anything else: one odd file must not stop the reading of the others).
    """
    try:
        return _parse_dump(raw, rank=rank, source=source, meta=meta, mtime_ns=mtime_ns)
    except VALUE_ERRORS as exc:
        raise NotADumpError(f"unusable values ({type(exc).__name__}: {str(exc)[:200]})") from None


def _parse_dump(
    raw: dict[str, Any],
    *,
    rank: int,
    source: str,
    meta: dict[str, Any] | None,
    mtime_ns: int | None,
) -> RankDump:
    ctx = _Ctx()
    raw_entries = raw.get("entries") or []
    columnar = _columnar_entries(raw_entries, ctx)
    if columnar is not None:
        entries = columnar
    else:
        entries = []
        for i, e in enumerate(raw_entries):
            if not isinstance(e, dict):
                raise NotADumpError(f"entry {i} is a {type(e).__name__}, not a dict")
            entries.append(_entry(e, ctx, rank))
    entries.sort(key=_RECORD_ID)
    # The file's few distinct op names tell whether it has coalesced groups (NCCL) at all.
    if any(op in COALESCED_END_OPS for _backend, op, _peer in ctx.ops.values()):
        entries = fold_coalesced(entries)
    dump = _dump_of(
        raw,
        ctx,
        rank=rank,
        source=source,
        mtime_ns=mtime_ns,
        entries=entries,
        groups=dict.fromkeys(map(_GROUP, entries)),
        first_record_id=entries[0].record_id if entries else None,
        backends=set(map(_BACKEND, entries)),
    )
    if meta:
        _apply_meta(
            dump, meta, ctx, lambda: {e.group: e.timeout_ms for e in entries if e.timeout_ms is not None}
        )
    dump.warnings = tuple(ctx.warnings)
    return dump


def parse_columns(
    raw: dict[str, Any],
    *,
    rank: int,
    source: str,
    meta: dict[str, Any] | None = None,
    mtime_ns: int | None = None,
) -> tuple[RankDump, EntryColumns] | None:
    """`parse_dump` for a fold that wants columns (`EntryColumns`): the dump's metadata (with
    `entries` left empty) and its entries as columns; None when the entries must be normalized
    one by one (`_entry_columns` says when), and then `parse_dump` does it.

    With `flightdeck.analysis.summary.add_columns` it summarizes a rank that has one file with
    no `Entry` for entries the summary keeps only as sequence
    ids, fingerprints and times. Reading, normalizing and summarizing one of
    bench/analyze_scale.py's 2,000-entry files took 162 million instructions by entries, 128
    million by columns (callgrind; restricted unpickling alone: 25 million); the same summaries
    on every fixture (tests/test_reader_columns.py). `flightdeck analyze` tries
    `parse_signatures` first (fewer fields per entry read, in one pass), this where that declines.

    Raises NotADumpError where `parse_dump` does.
    """
    try:
        ctx = _Ctx()
        raw_entries = raw.get("entries") or []
        got = _entry_columns(raw_entries, ctx, rank)
        if got is None:
            return None
        cols, descs = got
        dump = _dump_of(
            raw,
            ctx,
            rank=rank,
            source=source,
            mtime_ns=mtime_ns,
            entries=[],
            groups=dict.fromkeys(cols.group),
            first_record_id=cols.record_id[0],
            backends={backend for backend, _op, _peer in ctx.ops.values()},
            descs=descs,
        )
        if meta:
            _apply_meta(
                dump,
                meta,
                ctx,
                lambda: {g: t for g, t in zip(cols.group, cols.timeout_ms, strict=True) if t is not None},
            )
        dump.warnings = tuple(ctx.warnings)
    except VALUE_ERRORS as exc:
        raise NotADumpError(f"unusable values ({type(exc).__name__}: {str(exc)[:200]})") from None
    return dump, cols


def parse_signatures(
    raw: dict[str, Any],
    *,
    rank: int,
    source: str,
    meta: dict[str, Any] | None = None,
    mtime_ns: int | None = None,
    budget: DumpBudget = DEFAULT_BUDGET,
) -> tuple[RankDump, SignatureColumns] | None:
    """`parse_columns` for `flightdeck.analysis.summary.add_signatures`: the dump's metadata (with
    `entries` left empty) and its entries as `SignatureColumns`, within `budget`; None when
    `_signature_columns` declines (then `parse_columns` or `parse_dump` read it).

    It is what `flightdeck analyze`'s workers do with a rank that has one file. Raises
    NotADumpError where `parse_dump` does, DumpBudgetError where `check_budget` does.
    """
    try:
        ctx = _Ctx()
        raw_entries = raw.get("entries") or []
        got = _signature_columns(raw_entries, ctx, rank, budget)
        if got is None:
            return None
        cols, descs = got
        if not COALESCED_END_OPS.isdisjoint(k[0] for k in cols.keys.values()):
            return None  # coalesced groups: the reader folds them entry by entry
        dump = _dump_of(
            raw,
            ctx,
            rank=rank,
            source=source,
            mtime_ns=mtime_ns,
            entries=[],
            groups=cols.groups,
            first_record_id=int(raw_entries[0]["record_id"]),
            backends={backend for backend, _op, _peer in ctx.ops.values()},
            descs=descs,
        )
        if meta:
            _apply_meta(dump, meta, ctx, lambda: _entry_timeouts(raw_entries))
        dump.warnings = tuple(ctx.warnings)
    except VALUE_ERRORS as exc:
        raise NotADumpError(f"unusable values ({type(exc).__name__}: {str(exc)[:200]})") from None
    return dump, cols


def _entry_timeouts(raw_entries: list[dict[str, Any]]) -> dict[str, int]:
    """Each group's timeout as its newest entry that records one gives it, read as `_entry`
    normalizes it (for entries whose process group is a pair of str)."""
    out: dict[str, int] = {}
    for e in raw_entries:
        t = _opt_int(e.get("timeout_ms"))
        if t is not None:
            out[e["process_group"][0]] = t
    return out


def _dump_of(
    raw: dict[str, Any],
    ctx: _Ctx,
    *,
    rank: int,
    source: str,
    mtime_ns: int | None,
    entries: list[Entry],
    groups: Iterable[str],
    first_record_id: int | None,
    backends: set[str],
    descs: dict[str, str] | None = None,
) -> RankDump:
    """The RankDump of a dump whose entries are normalized: `groups` are the entries' groups (in
    record-id order), `backends` theirs, `first_record_id` the oldest record id (None: no entry),
    `descs` each group's description by its first entry (None: read from the raw entries)."""
    raw_entries = raw.get("entries") or []
    known = _pg_config_groups(raw)
    for name in groups:
        if name not in known:
            known[name] = GroupInfo(name, "", None)
    # Descriptions come with the entries (process_group[1]); pg_config may lack them on gloo.
    if descs is None:
        descs = {}
        for e_raw in raw_entries:
            pg = e_raw.get("process_group")
            if isinstance(pg, list | tuple) and len(pg) > 1 and _s(pg[0]) not in descs:
                descs[_s(pg[0])] = _s(pg[1])
    for name, d in descs.items():
        g = known[name]
        if not g.desc or g.desc == "undefined":
            known[name] = replace(g, desc=d)
    dump = RankDump(
        rank=rank,
        source=source,
        version=_s(raw.get("version")),
        entries=entries,
        groups=known,
        comm_lib_version=_s(raw.get("comm_lib_version") or "") or None,
        wrapped=first_record_id is not None and first_record_id > 0,
        snapshot_time_ns=mtime_ns,
        pg_status=_pg_status(raw, raw_entries),
        snapshot_time_from_file=mtime_ns is not None,
    )
    dump.backend = ",".join(sorted(backends - {""})) or None
    return dump


def _apply_meta(
    dump: RankDump, meta: dict[str, Any], ctx: _Ctx, timeouts: Callable[[], dict[str, int]]
) -> None:
    """Overlay what the Flightdeck agent wrote beside the dump (job, host, real group membership);
    `timeouts` gives each group's timeout as its newest entry that has one records it."""
    dump.job = str(meta["job"]) if meta.get("job") is not None else None
    dump.attempt = _int(meta.get("attempt"), 0)
    ws = meta.get("world_size")
    dump.world_size = ws if isinstance(ws, int) and ws > 0 else None
    lr = meta.get("local_rank")
    dump.local_rank = lr if isinstance(lr, int) else None
    dump.host = str(meta["host"]) if meta.get("host") else None
    pid = meta.get("pid")
    dump.pid = pid if isinstance(pid, int) else None
    dump.torch_version = str(meta["torch_version"]) if meta.get("torch_version") else None
    if meta.get("backend"):
        dump.backend = str(meta["backend"])
    t = meta.get("snapshot_time_ns")
    if isinstance(t, int):
        dump.snapshot_time_ns = t
        dump.snapshot_time_from_file = False
    kind = meta.get("kind")
    kinds: dict[object, SnapshotKind] = {"periodic": "periodic", "stall": "stall", "final": "final"}
    dump.kind = kinds.get(kind, "dump") if isinstance(kind, str) else "dump"
    iv = meta.get("interval_s")
    dump.interval_s = float(iv) if isinstance(iv, int | float) and iv > 0 else None
    dump.exception = str(meta["exception"]) if meta.get("exception") else None
    groups = meta.get("groups")
    if isinstance(groups, dict):
        for name, g in groups.items():
            if not isinstance(g, dict):
                continue
            ranks = g.get("ranks")
            rk = (
                tuple(sorted(ranks))
                if isinstance(ranks, list) and ranks and all(type(r) is int for r in ranks)
                else None
            )
            old = dump.groups.get(str(name))
            desc = str(g.get("desc") or (old.desc if old else ""))
            dump.groups[str(name)] = GroupInfo(str(name), desc, rk or (old.ranks if old else None))
    extent = ring_extent(meta)
    if extent is not None:
        dump.ring_first = extent[0]
        dump.wrapped = extent[0] > 0  # its own entries begin where the changes begin, not the ring
    cfg = meta.get("config")
    if isinstance(cfg, dict):
        dump.config = config_from_dict(cfg)
        if dump.config.nccl_version is None and dump.comm_lib_version:
            # The dump's own `comm_lib_version` names the NCCL the process group actually loaded.
            dump.config = replace(dump.config, nccl_version=dump.comm_lib_version)
        if any(g.timeout_ms is None for g in dump.config.groups):
            # Backends whose options Python cannot read: each entry records its group's timeout.
            seen = timeouts()
            groups = tuple(
                replace(g, timeout_ms=seen.get(g.name)) if g.timeout_ms is None else g
                for g in dump.config.groups
            )
            dump.config = replace(dump.config, groups=groups)
    progress = progress_from_dict(meta.get("progress"))
    if progress is not None:
        dump.progress = progress
    stacks = meta.get("thread_stacks")
    if isinstance(stacks, list):
        dump.thread_stacks = tuple(
            ThreadStack(
                str(s.get("thread_name", "")), _int(s.get("thread_id"), 0), _stack(s.get("frames"), ctx)
            )
            for s in stacks
            if isinstance(s, dict)
        )


def ring_extent(meta: dict[str, Any] | None) -> tuple[int, int | None] | None:
    """(first record id, entries) of the ring a recent-changes snapshot belongs to, from its
    sidecar (`flightdeck.spool`); None for a snapshot of the whole ring. `entries` is None
    when the sidecar does not say."""
    ring = meta.get(RING_META_KEY) if meta else None
    if not isinstance(ring, dict):
        return None
    first, n = ring.get("first"), ring.get("entries")
    if type(first) is not int or first < 0:
        return None
    return first, n if type(n) is int and n >= 0 else None
