"""A dump's entries a column at a time: checked in C, then normalized or kept as columns.

`_checked_columns` vouches for every value of every entry at once (or declines); what it accepts is
normalized column by column (`_columnar_entries`, equal to `_entry` of each entry) or kept as
`EntryColumns` for the summary's fold (`_entry_columns`). Where it declines, the entries are
normalized one by one (`flightdeck.readers.fr.normalize`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import chain, islice, repeat
from operator import itemgetter, lt
from typing import Any

from flightdeck.readers.fr.normalize import _STATES, _Ctx, _entry, _frames_fast, _op_info
from flightdeck.records import COALESCED_END_OPS, Entry, Stack, entries_from_columns

#: The fields every entry of a well-formed dump has, fetched in one C call per entry.
_COLUMN_FIELDS = itemgetter(
    "record_id",
    "collective_seq_id",
    "time_created_ns",
    "p2p_seq_id",
    "op_id",
    "profiling_name",
    "process_group",
    "input_sizes",
    "output_sizes",
    "input_dtypes",
    "output_dtypes",
    "state",
    "retired",
    "is_p2p",
)
#: The fields an entry may lack (`dict.get`), in the order `_checked_columns` unpacks them.
_OPTIONAL_FIELDS = (
    "time_discovered_started_ns",
    "time_discovered_completed_ns",
    "duration_ms",
    "timeout_ms",
    "thread_name",
    "frames",
)
_FRAME_FIELDS = itemgetter("name", "filename", "line")
_NONE = type(None)
_INTS = {int}
_STRS = {str}
_BOOLS = {bool}
_OPT_INTS = {int, _NONE}
_LISTS = {list}
_SEQS = {list, tuple}


def _types(values: Iterable[object]) -> set[type]:
    return set(map(type, values))


def _checked_columns(raw_entries: list[Any]) -> list[Sequence[Any]] | None:
    """The raw entries' fields as columns (`_COLUMN_FIELDS` then `_OPTIONAL_FIELDS`), or None
    unless every value is of the exact type `_entry`'s fast path takes as it is.

    Checked a column at a time in C (`set(map(type, column))`), never per entry in Python; frames
    once per distinct list and per distinct frame dict (a pickle memoizes a list or dict shared by
    entries; `id()` of an object that `raw_entries` holds is stable while this runs). What it
    accepts `_entry` turns into an `Entry` without converting, refusing or warning about anything
    (its unknown-backend warning aside, which depends on the op name only): so the columns say
    exactly what the normalized entries will hold.
    """
    if not raw_entries:
        return None
    try:
        if _types(raw_entries) != {dict}:
            return None
        cols: list[Sequence[Any]] = list(zip(*map(_COLUMN_FIELDS, raw_entries), strict=True))
    except (KeyError, TypeError):
        return None
    rid, seq, created, p2p_seq, op_id, prof, pg, isz, osz, idt, odt, state, retired, is_p2p = cols
    if not (
        _types(chain(rid, seq, created, p2p_seq, op_id)) == _INTS
        and _types(prof) == _STRS
        and _types(chain(retired, is_p2p)) == _BOOLS
        and _types(state) == _STRS
        and set(state) <= _STATES.keys()
        and _types(pg) <= _SEQS
        and set(map(len, pg)) == {2}
        and _types(chain.from_iterable(pg)) == _STRS
        and _types(chain(isz, osz)) == _LISTS
        and _types(chain.from_iterable(chain(isz, osz))) <= _SEQS
        and _types(chain.from_iterable(chain.from_iterable(chain(isz, osz)))) <= _INTS
        and _types(chain(idt, odt)) <= _SEQS
        and _types(chain.from_iterable(chain(idt, odt))) <= _STRS
    ):
        return None
    optional = [list(map(dict.get, raw_entries, repeat(k))) for k in _OPTIONAL_FIELDS]
    started, completed, duration, timeout, thread, frames = optional
    if not (
        _types(chain(started, completed, timeout)) <= _OPT_INTS
        and _types(duration) <= {float, _NONE}
        and _types(thread) <= {str, _NONE}
        and _types(frames) <= {list, _NONE}
        and _frames_ok(frames)
    ):
        return None
    return cols + optional


def _frames_ok(frames: list[list[Any] | None]) -> bool:
    """Whether every frame of these frames lists is a dict with a str name and filename and an
    int line (what `_frames_fast` takes as it is)."""
    distinct = {id(f): f for f in frames if f}.values()
    try:
        dicts = {id(d): d for d in chain.from_iterable(distinct)}.values()
        if not _types(dicts) <= {dict}:
            return False
        name, filename, line = zip(*map(_FRAME_FIELDS, dicts), strict=True) if dicts else ((), (), ())
    except (KeyError, TypeError):
        return False
    return _types(chain(name, filename)) <= _STRS and _types(line) <= _INTS


def _columnar_entries(raw_entries: list[Any], ctx: _Ctx) -> list[Entry] | None:
    """Every entry of a well-formed dump, normalized column by column; None when `_checked_columns`
    does not vouch for every value (then `_entry` normalizes each entry as it always did,
    refusing or converting the odd values with the same messages).

    The `Entry` objects are built by `map` straight from the columns, and each distinct frames
    list is normalized once. The result is equal to `[_entry(e, ctx, rank) for e in raw_entries]`
    (tests/test_reader_columns.py compares the two on every fixture). It saves ~13% of the instructions
    of reading, normalizing and summarizing a 2,000-entry file (callgrind, bench/analyze_scale.py's
    files: 186 -> 162 million per file), whoever normalizes the entries in full (the collector,
    ranks with several snapshots).
    """
    if not raw_entries:
        return []
    cols = _checked_columns(raw_entries)
    if cols is None:
        return None
    rid, seq, created, p2p_seq, op_id, prof, pg, isz, osz, idt, odt, state, retired, is_p2p = cols[:14]
    started, completed, duration, timeout, thread, frames = cols[14:]
    by_id = {id(f): _frames_fast(f, ctx) for f in frames if f}
    infos = _op_infos(prof, ctx)
    peer = [p if x else None for (_b, _o, p), x in zip(infos, is_p2p, strict=True)]
    return entries_from_columns(
        record_id=rid,
        group=map(itemgetter(0), pg),
        collective_seq_id=seq,
        p2p_seq_id=p2p_seq,
        op_id=op_id,
        backend=map(itemgetter(0), infos),
        op=map(itemgetter(1), infos),
        raw_op=prof,
        is_p2p=is_p2p,
        input_sizes=_tuples_of_tuples(isz),
        output_sizes=_tuples_of_tuples(osz),
        input_dtypes=map(tuple, idt),
        output_dtypes=map(tuple, odt),
        state=state,
        retired=retired,
        time_created_ns=created,
        time_started_ns=[t or None for t in started],
        time_completed_ns=[t or None for t in completed],
        duration_ms=duration,
        timeout_ms=timeout,
        thread_name=[t or "" for t in thread],
        peer=peer,
        frames=[by_id[id(f)] if f else () for f in frames],
    )


def _op_infos(prof: Sequence[str], ctx: _Ctx) -> list[tuple[str, str, int | None]]:
    """`_op_info` of each profiling name: looked up once per distinct name, in the order the
    names first appear (so its warnings come in the order `_entry` gives them)."""
    infos = {p: _op_info(p, ctx) for p in dict.fromkeys(prof)}
    return list(map(infos.__getitem__, prof))


def _tuples_of_tuples(sizes: Iterable[list[list[int]]]) -> list[tuple[tuple[int, ...], ...]]:
    """Each entry's sizes as tuples, converted in C."""
    return list(map(tuple, map(map, repeat(tuple), sizes)))


@dataclass(slots=True)
class EntryColumns:
    """A dump's entries as columns, for a fold that needs a few fields of every entry and whole
    entries only for a few (`flightdeck.analysis.summary.add_columns`).

    Positions are file order, which is record-id order (record ids strictly increase; a dump
    whose do not is normalized entry by entry instead). Every value is what the normalized `Entry`
    at that position holds; `entry(i)` builds that whole entry, frames included.
    """

    record_id: Sequence[int]
    group: list[str]
    collective_seq_id: Sequence[int]
    op_id: Sequence[int]
    #: Canonical op names (see `flightdeck.records.canonical_op`).
    op: list[str]
    is_p2p: Sequence[bool]
    time_created_ns: Sequence[int]
    input_sizes: list[tuple[tuple[int, ...], ...]]
    output_sizes: list[tuple[tuple[int, ...], ...]]
    input_dtypes: list[tuple[str, ...]]
    output_dtypes: list[tuple[str, ...]]
    timeout_ms: list[int | None]
    #: Whether the entry has a stack (its frames are not empty).
    has_frames: list[bool]
    raw: list[dict[str, Any]] = field(repr=False)
    ctx: _Ctx = field(repr=False)
    rank: int = 0

    def entry(self, i: int) -> Entry:
        """The whole normalized entry at position `i`."""
        return _entry(self.raw[i], self.ctx, self.rank)

    def frames(self, i: int) -> Stack:
        """The normalized stack of the entry at position `i`."""
        fr = self.raw[i].get("frames")
        return _frames_fast(fr, self.ctx) if fr else ()


def _entry_columns(
    raw_entries: list[Any], ctx: _Ctx, rank: int
) -> tuple[EntryColumns, dict[str, str]] | None:
    """`EntryColumns` of a dump's entries and each group's description as its first entry gives
    it, or None where they must be normalized one by one: a value `_checked_columns` does not
    vouch for, record ids that do not strictly increase, or coalesced groups (NCCL's `coalesced`
    end entries, which the reader folds)."""
    cols = _checked_columns(raw_entries)
    if cols is None:
        return None
    rid, seq, created, _p2p, op_id, prof, pg, isz, osz, idt, odt, _st, _ret, is_p2p = cols[:14]
    timeout, frames = cols[17], cols[19]
    if not all(map(lt, rid, islice(rid, 1, None))):
        return None
    infos = _op_infos(prof, ctx)
    op = list(map(itemgetter(1), infos))
    if not COALESCED_END_OPS.isdisjoint(op):
        return None
    descs: dict[str, str] = {}
    for name, desc in dict.fromkeys(map(tuple, pg)):
        descs.setdefault(name, desc)
    columns = EntryColumns(
        record_id=rid,
        group=list(map(itemgetter(0), pg)),
        collective_seq_id=seq,
        op_id=op_id,
        op=op,
        is_p2p=is_p2p,
        time_created_ns=created,
        input_sizes=_tuples_of_tuples(isz),
        output_sizes=_tuples_of_tuples(osz),
        input_dtypes=list(map(tuple, idt)),
        output_dtypes=list(map(tuple, odt)),
        timeout_ms=list(timeout),
        has_frames=list(map(bool, frames)),
        raw=raw_entries,
        ctx=ctx,
        rank=rank,
    )
    return columns, descs
