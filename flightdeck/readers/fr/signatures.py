"""The summary's cheapest read of a dump: `SignatureColumns`.

Machine-integer columns of the fields the summary keeps of every entry, each entry's signature as
an index into the few distinct ones, whole entries built only on demand; made by
`_signature_columns` (and `_signature_keys`) within the file's budget, or declined (then
`flightdeck.readers.fr.columns` reads the dump).
"""

from __future__ import annotations

import os
import struct
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import chain, compress, count, islice
from operator import itemgetter, lt
from typing import Any

from flightdeck.env_names import READER_PURE_PYTHON
from flightdeck.readers.fr.columns import _INTS, _NONE, _SEQS, _STRS, _types
from flightdeck.readers.fr.decode import DumpBudget
from flightdeck.readers.fr.errors import DumpBudgetError
from flightdeck.readers.fr.normalize import _STATES, _Ctx, _entry, _frames_fast, _op_info
from flightdeck.records import Entry, Stack

#: A collective's comparable fields as a dump gives them: (canonical op, input sizes, output
#: sizes, input dtypes, output dtypes), sizes and dtypes as tuples.
SigKey = tuple[
    str, tuple[tuple[int, ...], ...], tuple[tuple[int, ...], ...], tuple[str, ...], tuple[str, ...]
]


@dataclass(slots=True)
class SignatureColumns:
    """A dump's entries as the summary's fold needs them (`flightdeck.analysis.summary.add_signatures`):
    machine-integer columns, each entry's signature as an index into the few distinct ones, and
    whole entries built only on demand (`entry`, `frames`).

    Positions are file order, which is record-id order (record ids strictly increase). Every value
    is what the normalized `Entry` at that position holds (tests/test_reader_columns.py compares
    the summaries on every fixture and on odd values).
    """

    collective_seq_id: array[int]
    time_created_ns: array[int]
    op_id: array[int]
    #: Each group's name (distinct, in the order entries first name them).
    groups: list[str]
    #: Each entry's group (an index into `groups`); None when there is one group.
    group_of: list[int] | None
    #: Each entry's is_p2p; None when no entry is point-to-point.
    is_p2p: list[bool] | None
    #: Each entry's signature key, as the position of the first entry that has it.
    key_of: list[int]
    #: The first position of each distinct signature key -> the key (canonical op first).
    keys: dict[int, SigKey]
    #: Positions whose entry has frames, in file order (a range when every entry has).
    framed: Sequence[int]
    #: Whether the sequence ids strictly increase over all entries.
    seq_increasing: bool
    raw: list[dict[str, Any]] = field(repr=False)
    ctx: _Ctx = field(repr=False)
    rank: int = 0

    def __len__(self) -> int:
        return len(self.collective_seq_id)

    def entry(self, i: int) -> Entry:
        """The whole normalized entry at position `i`."""
        return _entry(self.raw[i], self.ctx, self.rank)

    def frames(self, i: int) -> Stack:
        """The normalized stack of the entry at position `i`."""
        fr = self.raw[i].get("frames")
        return _frames_fast(fr, self.ctx) if fr else ()

    def by_key(self, values: dict[int, int]) -> array[int]:
        """`values[k]` of each entry's signature key `k` (`key_of`), as a 64-bit array: gathered
        in C where the C pass is built (`take_int64`: 0.7 million instructions less per
        2,000-entry file than joining or packing them in Python), else packed by `struct`."""
        packed = _C_PASS[1](self.key_of, values) if _C_PASS is not None else None
        if packed is None:
            packed = _int64s(len(self.key_of)).pack(*map(values.__getitem__, self.key_of))
        return _int64_column(packed)


@lru_cache(maxsize=8)
def _int64s(n: int) -> struct.Struct:
    return struct.Struct(f"{n}q")


def _increasing(values: tuple[int, ...]) -> bool:
    """Whether the ints strictly increase: one compare in C when they count up by one (the usual
    record and sequence ids), else a pass."""
    n = len(values)
    if n < 2:
        return True
    first = values[0]
    if values[-1] - first == n - 1 and values == tuple(range(first, first + n)):
        return True
    return all(map(lt, values, islice(values, 1, None)))


#: A dump's per-entry columns before their signatures are keyed, as `_signature_rows` gives
#: them: the sequence ids, creation times and op ids packed as 64-bit ints (native order), whether
#: the sequence ids strictly increase, the groups' names (first-named first), each group's
#: description, each entry's group (None: one group), each entry's is_p2p (None: none is), each
#: distinct (profiling name, id() of the sizes and dtypes objects) -> its first position, each
#: entry's position of that first, and the positions of the entries with frames (a range when
#: every entry has).
_Rows = tuple[
    bytes,
    bytes,
    bytes,
    bool,
    list[str],
    dict[str, str],
    list[int] | None,
    list[bool] | None,
    dict[tuple[Any, ...], int],
    list[int],
    Sequence[int],
]


_RowsPass = Callable[[list[Any], dict[object, Any], int], _Rows | None]
_Take = Callable[[list[int], dict[int, int]], bytes | None]


def _c_pass() -> tuple[_RowsPass, _Take] | None:
    """The C pass (`flightdeck.readers.fr._rows`: `signature_rows`, `take_int64`), or None
    where it is not built or `FLIGHTDECK_READER_PURE_PYTHON` is set (non-empty)."""
    if os.environ.get(READER_PURE_PYTHON):
        return None
    try:
        from flightdeck.readers.fr import _rows
    except ImportError:  # installed without a compiler: the Python pass does it all
        return None
    return _rows.signature_rows, _rows.take_int64


_C_PASS = _c_pass()
#: Which pass reads the entries in this process: "C" or "Python".
ROWS_PASS = "Python" if _C_PASS is None else "C"


def _signature_rows(raw_entries: list[Any], budget: DumpBudget) -> _Rows | None:
    """The per-entry columns of a dump (`_Rows`), within `budget`; None where they take
    `_entry_columns` instead. The speed-up of `flightdeck analyze`'s reader has its one owner here.

    The C pass (`_rows.c`) reads every entry's fields in one loop and takes only the common shape
    of exact types (ints within 64 bits, record ids strictly increasing, a known state...); on
    anything else it declines and the Python pass (`_signature_rows_py`) reads the same entries
    and decides, so the two give the same columns, the same None and the same budget refusals
    (tests/test_reader_rows.py compares them on every fixture and on odd entries). Measured with
    callgrind on bench/analyze_scale.py's 2,000-entry files (`_load_rank` with the summary's
    pickle there and back, per file): 48.4 million instructions with the Python pass, 30.6
    million with the C pass (and `SignatureColumns.by_key`; 32.4 million before it read the
    entries' key tables, `_rows.c`'s `fields_by_peek`), against 25.2 million for reading and
    restrictedly unpickling the file (docs/performance.md, "Against the unpickling floor").
    """
    if _C_PASS is not None:
        got = _C_PASS[0](raw_entries, _STATES, budget.max_frames)
        if got is not None:
            return got
    return _signature_rows_py(raw_entries, budget)


def _signature_rows_py(raw_entries: list[Any], budget: DumpBudget) -> _Rows | None:
    """`_signature_rows` in Python: one comprehension reads, per entry, the fields the summary
    keeps of every entry (and the two it checks: state, duration); the columns are checked and
    converted in C (`struct`, `set`, `map`).

    Nothing is checked that the unpickler's type set (`SafeUnpickler`: plain data only) already
    answers: an entry that is not a dict fails its first subscript, and an int column packed into
    64 bits has no other type than int or bool to tell apart (a bool reads as the int the
    forgiving path makes of it). Raises DumpBudgetError for frames over `budget`.
    """
    n = len(raw_entries)
    if not n:
        return None
    try:
        rows = [
            (
                e["record_id"],
                e["collective_seq_id"],
                e["time_created_ns"],
                e["op_id"],
                e["state"],
                e.get("duration_ms"),
                e.get("frames"),
                e["is_p2p"],
                e["process_group"],
                (
                    e["profiling_name"],
                    id(e["input_sizes"]),
                    id(e["output_sizes"]),
                    id(e["input_dtypes"]),
                    id(e["output_dtypes"]),
                ),
            )
            for e in raw_entries
        ]
    except (KeyError, TypeError, AttributeError):  # not a dict, or a field missing
        return None
    rid, seq, created, op_id, state, duration, frames, p2p, pg, ids = zip(*rows, strict=True)
    del rows
    try:
        n_frames = sum(map(len, filter(None, frames)))
    except TypeError:  # frames that are not sized: the forgiving path ignores them
        n_frames = 0
    if n_frames > budget.max_frames:
        raise DumpBudgetError(
            f"{n_frames} stack frames over {n} entries, over the budget of {budget.max_frames} per file"
        )
    pack = _int64s(n).pack
    try:
        pack(*rid)  # ints within 64 bits (struct.error else), as the columns below
        if not (_increasing(rid) and set(state) <= _STATES.keys()):
            return None
        seq_b, created_b, op_id_b = pack(*seq), pack(*created), pack(*op_id)
        p0 = pg[0]
        distinct_pg = {p0: None} if pg.count(p0) == n else dict.fromkeys(pg)
        first: dict[tuple[Any, ...], int] = {}
        key_of = list(map(first.setdefault, ids, count()))
    except (TypeError, struct.error):
        return None
    if not (
        (duration.count(None) == n or _types(duration) <= {float, _NONE})
        and _types(distinct_pg) <= {tuple}
        and set(map(len, distinct_pg)) == {2}
        and _types(chain.from_iterable(distinct_pg)) == _STRS
    ):
        return None
    descs: dict[str, str] = {}
    for name, desc in distinct_pg:
        descs.setdefault(name, desc)
    groups = list(descs)
    group_of = None
    if len(groups) > 1:
        index = {g: i for i, g in enumerate(groups)}
        group_of = list(map(index.__getitem__, map(itemgetter(0), pg)))
    is_p2p = list(map(bool, p2p)) if any(p2p) else None
    framed: Sequence[int] = list(compress(range(n), frames))
    if len(framed) == n:
        framed = range(n)  # as the C pass gives it (no int object per entry)
    return seq_b, created_b, op_id_b, _increasing(seq), groups, descs, group_of, is_p2p, first, key_of, framed


def _int64_column(packed: bytes) -> array[int]:
    out = array("q")
    out.frombytes(packed)
    return out


def _signature_columns(
    raw_entries: list[Any], ctx: _Ctx, rank: int, budget: DumpBudget
) -> tuple[SignatureColumns, dict[str, str]] | None:
    """`SignatureColumns` of a dump's entries (within `budget`) and each group's description as
    its first entry gives it; None where they take `_entry_columns` instead.

    The fields the summary keeps of every entry are read by `_signature_rows`. The other fields
    are read only for the entries built whole (`SignatureColumns.entry`: each group's last
    entries, point-to-point ones), by `_entry` as always: their odd values change only those
    entries (no warning, no refusal), except a state (a warning) and a duration too large for a
    float (a refusal), which are checked for every entry. Sizes and dtypes are read per distinct
    object (the unpickler shares an object the pickle memoizes), their types checked and
    converted once per distinct signature.
    """
    rows = _signature_rows(raw_entries, budget)
    if rows is None:
        return None
    seq_b, created_b, op_id_b, seq_increasing, groups, descs, group_of, is_p2p, first, key_of, framed = rows
    got = _signature_keys(raw_entries, first, ctx, budget)
    if got is None:
        return None
    keys, remap = got
    if remap:
        key_of = list(map(remap.get, key_of, key_of))  # remap.get(k, k) of each, in C
    columns = SignatureColumns(
        collective_seq_id=_int64_column(seq_b),
        time_created_ns=_int64_column(created_b),
        op_id=_int64_column(op_id_b),
        groups=groups,
        group_of=group_of,
        is_p2p=is_p2p,
        key_of=key_of,
        keys=keys,
        framed=framed,
        seq_increasing=seq_increasing,
        raw=raw_entries,
        ctx=ctx,
        rank=rank,
    )
    return columns, descs


def _signature_keys(
    raw_entries: list[dict[str, Any]], first: dict[tuple[Any, ...], int], ctx: _Ctx, budget: DumpBudget
) -> tuple[dict[int, SigKey], dict[int, int]] | None:
    """The signature key of each distinct (profiling name, sizes and dtypes objects) at its first
    position, and where two of them are equal the later position -> the first; None where a value
    is not what `_entry`'s fast path takes as it is or the sizes may be over `budget` (then
    `check_budget` counts them exactly)."""
    keys: dict[int, SigKey] = {}
    canon: dict[SigKey, int] = {}
    remap: dict[int, int] = {}
    most = 0
    for (prof, *_ids), at in first.items():
        e = raw_entries[at]
        ins, outs, in_dt, out_dt = e["input_sizes"], e["output_sizes"], e["input_dtypes"], e["output_dtypes"]
        if type(prof) is not str or not _types((ins, outs, in_dt, out_dt)) <= _SEQS:
            return None
        if not _types(chain(ins, outs)) <= _SEQS:
            return None
        # An upper bound of what `check_budget` counts (every entry as large as the largest).
        most = max(most, len(ins) + sum(map(len, ins)) + len(outs) + sum(map(len, outs)))
        if most * len(raw_entries) > budget.max_dims:
            return None
        if not (
            _types(chain.from_iterable(chain(ins, outs))) <= _INTS and _types(chain(in_dt, out_dt)) <= _STRS
        ):
            return None
        key: SigKey = (
            _op_info(prof, ctx)[1],
            tuple(map(tuple, ins)),
            tuple(map(tuple, outs)),
            tuple(in_dt),
            tuple(out_dt),
        )
        was = canon.setdefault(key, at)
        if was == at:
            keys[at] = key
        else:
            remap[at] = was
    return keys, remap
