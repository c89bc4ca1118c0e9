"""Compact integer columns for the summaries a server holds for every rank of every open job.

A `GroupTrack` keeps four int64 columns per rank and group (sequence ids, fingerprints, enqueue
times, op ids): as `array('q')` that is 32 bytes a collective, 62.5 MiB for a job of 1,024 ranks x
2,000 collectives. The values are far from random: sequence ids and op ids count up by one,
a group repeats a handful of signatures, and enqueue times are close to each other. The columns
here store them that way and read back as the same sequences of ints (an index gives an int, a
slice an `array('q')`, as the readers of `array` expect), so the diagnosis sees identical data:

* `Steps`: runs of consecutive values (sequence ids, op ids): 16 bytes a run, one run per track
  unless the ring dropped collectives or p2p ops advanced the op ids;
* `Coded`: each value a 1-byte code into a table of the distinct values (fingerprints; 2 or 4
  bytes once a track holds more than 255 or 65,535 of them);
* `Split`: the low 32 bits of each value in 4 bytes, the high ones as runs (enqueue times: the
  high part changes every 4.3 s).

About 5 bytes a collective (`pack_track`). Appends (what folding snapshots in does) cost O(1);
replacing a value by a different one or inserting one (an older snapshot arriving late) rebuilds
the column, which is rare.
"""

from __future__ import annotations

import struct
import sys
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import chain, compress, count, islice, repeat
from operator import mul, ne, sub
from typing import TYPE_CHECKING, Any, SupportsIndex, overload

if TYPE_CHECKING:
    from flightdeck.analysis.summary import GroupTrack

_LOW = 0xFFFFFFFF
#: Whether an int64 is two 32-bit words, the low one first (`Split` decodes in bulk then).
_WORDS = sys.byteorder == "little" and array("I").itemsize == 4 and array("q").itemsize == 8
#: A high word's 4 bytes (a signed 32-bit int: the high half of an int64), in the machine's order.
_WORD = struct.Struct("=i").pack
#: Largest code of each code width, and the width after it.
_WIDER = {"B": ("H", 0xFF), "H": ("I", 0xFFFF)}


#: Values `pack_track` leaves unpacked at the end of each column: the next snapshot re-sends
#: the entries in flight (their state changed), and a write to a recent position is one C call.
KEEP_RECENT = 16
#: `pack_track` packs a column's recent values once this many have built up (in bulk: the
#: packing's loops run in C over the run of values, not once per snapshot of a few entries).
FLUSH_AT = 80


class Column:
    """What the packed columns share: the read side of `array('q')` and the writes that
    `add_entries` and the server's trimming use (append, insert, item assignment, `del c[:n]`).

    The first `_n` values are packed (the subclass's `_get`, `_slice`, `_extend`, `_pack`); the
    values appended since the last `flush` wait in `_recent`, a plain `array('q')`: `append` is
    that array's own (a C call, as on an unpacked track), and so are the writes to recent
    positions (a re-sent entry whose state changed)."""

    __slots__ = ("_n", "_recent", "append")

    #: Add a value at the end (`_recent`'s append).
    append: Callable[[int], None]

    def __init__(self, values: Iterable[int] = ()) -> None:
        self._set(values if isinstance(values, (list, array)) else list(values))

    def _set(self, values: Sequence[int]) -> None:
        self._recent = array("q")
        self.append = self._recent.append
        self._n = len(values)
        self._pack(values)

    def flush(self, keep: int = 0) -> None:
        """Pack the values appended since the last flush but the newest `keep`."""
        recent = self._recent
        if len(recent) > keep:
            cut = len(recent) - keep
            self._extend(recent[:cut] if keep else recent)
            self._n += cut
            self._recent = recent[cut:]
            self.append = self._recent.append

    def _get(self, i: int) -> int:
        raise NotImplementedError

    def _slice(self, i: int, j: int) -> array[int]:
        raise NotImplementedError

    def _pack(self, values: Sequence[int]) -> None:
        """Hold exactly `values`, packed."""
        raise NotImplementedError

    def _extend(self, values: array[int]) -> None:
        """Add packed values at the end."""
        raise NotImplementedError

    def _cut(self, cut: int) -> None:
        """Drop the first `cut` packed values (0 < cut < `_n`)."""
        self._pack(self._slice(cut, self._n))

    def __len__(self) -> int:
        return self._n + len(self._recent)

    # One call each for what the diagnosis reads of every rank's every track (`c[-1] if c else d`
    # is two calls through `__len__` and `__getitem__`, and a search through `__getitem__` one a
    # probe): thousands of ranks x groups per diagnosis.
    def first(self, default: int) -> int:
        """The first value, `default` when the column is empty."""
        if self._n:
            return self._get(0)
        recent = self._recent
        return recent[0] if recent else default

    def last(self, default: int) -> int:
        """The last value, `default` when the column is empty."""
        recent = self._recent
        if recent:
            return recent[-1]
        n = self._n
        return self._get(n - 1) if n else default

    def find(self, x: int) -> int | None:
        """The position of `x`, the values strictly increasing (sequence ids); None when not held."""
        recent = self._recent
        if recent and x >= recent[0]:
            return _find_in(recent, x, self._n)
        i = bisect_left(self, x, 0, self._n)
        return i if i < self._n and self._get(i) == x else None

    @overload
    def __getitem__(self, key: SupportsIndex) -> int: ...
    @overload
    def __getitem__(self, key: slice) -> array[int]: ...
    def __getitem__(self, key: SupportsIndex | slice) -> int | array[int]:
        if key.__class__ is int:  # the common case first: the diagnosis reads single values a lot
            n = self._n
            if key >= n:
                return self._recent[key - n]
            if key >= 0:
                return self._get(key)
            recent = self._recent
            if -key <= len(recent):
                return recent[key]
        if isinstance(key, slice):
            n = self._n
            i, j, step = key.indices(n + len(self._recent))
            if step != 1:
                return self[:][key]
            if i >= j:
                return array("q")
            if i >= n:
                return self._recent[i - n : j - n]
            out = self._slice(i, min(j, n))
            if j > n:
                out.extend(self._recent[: j - n])
            return out
        i = key.__index__()
        n = self._n
        if i < 0:
            i += n + len(self._recent)
            if i < 0:
                raise IndexError("column index out of range")
        if i >= n:
            return self._recent[i - n]
        return self._get(i)

    def __setitem__(self, key: SupportsIndex, x: int) -> None:
        n = self._n
        if key.__class__ is int and key >= n:
            self._recent[key - n] = x
            return
        i = key.__index__()
        if i < 0:
            i += n + len(self._recent)
        if i >= n:
            self._recent[i - n] = x
        elif not 0 <= i < n:
            raise IndexError("column assignment index out of range")
        elif self._get(i) != x:  # equal: a re-sent entry with the values already held
            values = self.tolist()
            values[i] = x
            self._set(values)

    def __delitem__(self, key: slice) -> None:
        if key.start is None and key.step is None and key.stop is not None and key.stop >= 0:
            # `del c[:cut]` (the server's cap on what it keeps).
            cut, n = key.stop, self._n
            if cut >= n:
                del self._recent[: cut - n]
                self._pack(())
                self._n = 0
            elif cut > 0:
                self._cut(cut)
                self._n = n - cut
            return
        values = self.tolist()
        del values[key]
        self._set(values)

    def insert(self, i: int, x: int) -> None:
        """Put a value before position `i`."""
        n = self._n
        if i < 0:
            i = max(0, i + len(self))
        if i >= n:
            self._recent.insert(i - n, x)
            return
        values = self.tolist()
        values.insert(i, x)
        self._set(values)

    def tolist(self) -> list[int]:
        """The values as a list."""
        return self[:].tolist()

    def __iter__(self) -> Iterator[int]:
        return iter(self[:])

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, (Column, array, list, tuple)):
            return NotImplemented
        return len(self) == len(other) and self.tolist() == list(other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.tolist()!r})"


class Steps(Column):
    """Runs of values that each differ from the one before by `step` (1: counters; 0: repeats)."""

    __slots__ = ("_at", "_step", "_v")

    def __init__(self, values: Iterable[int] = (), step: int = 1) -> None:
        self._step = step
        super().__init__(values)

    def _pack(self, values: Sequence[int]) -> None:
        self._at, self._v = array("q"), array("q")
        if not values:
            return
        array("q", values[:1])  # the range check of array('q')
        # Where a run breaks: values[i] != values[i - 1] + step (the loops in C).
        breaks = compress(count(1), map(ne, islice(values, 1, None), map(self._step.__add__, values)))
        self._at = array("q", chain((0,), breaks))
        self._v = array("q", map(values.__getitem__, self._at))

    def _extend(self, values: array[int]) -> None:
        at, v, step = self._at, self._v, self._step
        n = self._n
        if not at or values[0] != v[-1] + (n - at[-1]) * step:
            at.append(n)
            v.append(values[0])
        for b in compress(count(1), map(ne, islice(values, 1, None), map(step.__add__, values))):
            at.append(n + b)
            v.append(values[b])

    def _get(self, i: int) -> int:
        at = self._at
        k = len(at) - 1
        if i < at[k]:
            k = bisect_right(at, i) - 1
        return self._v[k] + (i - at[k]) * self._step

    def _run(self, i: int, j: int) -> Iterator[tuple[int, int, int]]:
        """(start, end, value at start) of each run's part within packed positions i..j-1."""
        at, v, step = self._at, self._v, self._step
        k = bisect_right(at, i) - 1
        last = len(at) - 1
        while i < j:
            end = min(at[k + 1] if k < last else self._n, j)
            yield i, end, v[k] + (i - at[k]) * step
            i = end
            k += 1

    def find(self, x: int) -> int | None:
        """The position of `x`, the values strictly increasing (sequence ids); None when not held.
        The run that may hold it is looked up by its first value (a counter's runs start higher
        and higher), the position worked out from there."""
        recent = self._recent
        if recent and x >= recent[0]:
            return _find_in(recent, x, self._n)
        if self._step != 1:
            return Column.find(self, x)
        v = self._v
        k = bisect_right(v, x) - 1
        if k < 0:
            return None
        at = self._at
        i = at[k] + x - v[k]
        return i if i < (at[k + 1] if k + 1 < len(at) else self._n) else None

    def _slice(self, i: int, j: int) -> array[int]:
        out = array("q")
        step = self._step
        for a, b, first in self._run(i, j):
            out.extend(range(first, first + (b - a) * step, step) if step else repeat(first, b - a))
        return out

    def _cut(self, cut: int) -> None:
        # The runs before `cut` go, the rest shift.
        k = bisect_right(self._at, cut) - 1
        first = self._v[k] + (cut - self._at[k]) * self._step
        at = array("q", (0,))
        at.extend(map(cut.__rsub__, self._at[k + 1 :]))
        v = array("q", (first,))
        v.extend(self._v[k + 1 :])
        self._at, self._v = at, v

    def runs(self) -> int:
        """How many runs hold the packed values."""
        return len(self._at)


class Coded(Column):
    """Each value a code (1 byte, wider when needed) into a table of the distinct values."""

    __slots__ = ("_code", "_codes", "_table")

    def _pack(self, values: Sequence[int]) -> None:
        table = list(dict.fromkeys(values))
        array("q", table)  # the range check of array('q')
        self._table = table
        self._code = {v: c for c, v in enumerate(table)}
        tc = "B" if len(table) <= 0x100 else "H" if len(table) <= 0x10000 else "I"
        self._codes = array(tc, map(self._code.__getitem__, values))

    def _code_of(self, x: int) -> int:
        c = self._code.get(x)
        if c is None:
            c = self._code[x] = len(self._table)
            self._table.append(x)
            wider = _WIDER.get(self._codes.typecode)
            if wider is not None and c > wider[1]:
                self._codes = array(wider[0], self._codes)
        return c

    def _extend(self, values: array[int]) -> None:
        code = self._code
        for x in dict.fromkeys(values):
            if x not in code:
                self._code_of(x)
        self._codes.extend(map(code.__getitem__, values))

    def _get(self, i: int) -> int:
        return self._table[self._codes[i]]

    def _slice(self, i: int, j: int) -> array[int]:
        if len(self._table) == 1:
            return array("q", self._table) * (j - i)
        return array("q", map(self._table.__getitem__, self._codes[i:j]))

    def _cut(self, cut: int) -> None:
        del self._codes[:cut]
        if len(self._table) > 64 and len(self._table) > len(self._codes) // 4:
            # Values no longer held stay in the table until it is this large: then it is redone.
            self._pack(self._slice(0, len(self._codes)))


class Split(Column):
    """The low 32 bits of each value in an array, the high ones as runs of repeats."""

    __slots__ = ("_hi", "_lo")

    def _pack(self, values: Sequence[int]) -> None:
        array("q", values)  # the range check of array('q')
        self._hi = Steps(list(map((32).__rrshift__, values)), step=0)
        self._lo = array("I", map(_LOW.__and__, values))

    def _extend(self, values: array[int]) -> None:
        hi = self._hi
        hi._recent.extend(map((32).__rrshift__, values))
        hi.flush()
        self._lo.extend(map(_LOW.__and__, values))

    def _get(self, i: int) -> int:
        return (self._hi[i] << 32) + self._lo[i]

    def _slice(self, i: int, j: int) -> array[int]:
        hi = self._hi
        hi.flush()  # its runs hold every packed value (`_get` reads through its recent ones)
        if not _WORDS:
            out = array("q")
            for a, b, h in hi._run(i, j):
                out.extend(map((h << 32).__add__, self._lo[a:b]) if h else iter(self._lo[a:b]))
            return out
        # In bulk, no int object per value: an int64 is its low 32-bit word then its high one
        # (little-endian), so the low words are copied into the even words of the result and
        # the runs' high words (signed: each fits 32 bits, the values being int64) into the odd
        # ones: strided buffer copies, and loops in C (the arrival-skew analysis
        # slices 256 times of every rank of every group per diagnosis). The runs of high words
        # within i..j-1: their starts and values, from the run that holds i to the last one
        # starting before j.
        at, v = hi._at, hi._v
        k = bisect_right(at, i) - 1
        m = bisect_left(at, j, k + 1)
        starts = at[k:m]
        starts[0] = i
        lengths = map(sub, chain(islice(starts, 1, None), (j,)), starts)
        high = b"".join(map(mul, map(_WORD, v[k:m]), lengths))
        out = array("q", bytes(8 * (j - i)))
        with memoryview(out) as raw, raw.cast("B") as octets, octets.cast("I") as words:
            words[0::2] = self._lo[i:j]
            with memoryview(high) as hb, hb.cast("I") as hw:
                words[1::2] = hw
        return out

    def _cut(self, cut: int) -> None:
        del self._hi[:cut]
        del self._lo[:cut]


def _find_in(values: array[int], x: int, offset: int) -> int | None:
    """`offset` + the position of `x` in `values` (strictly increasing), None when not there."""
    i = x - values[0]  # consecutive values (no dropped seqs): the common case
    if i < len(values) and values[i] == x:
        return offset + i
    i = bisect_left(values, x)
    return offset + i if i < len(values) and values[i] == x else None


def pack_track(t: GroupTrack) -> None:
    """Hold the track's columns packed (`Steps`, `Coded`, `Split`), and pack the values appended
    since once `FLUSH_AT` have built up (but the newest `KEEP_RECENT`): the server calls it after
    each snapshot it folds in."""
    for name, make in _PACKED:
        col = getattr(t, name)
        if isinstance(col, Column):
            if len(col._recent) >= FLUSH_AT:
                col.flush(KEEP_RECENT)
        else:
            setattr(t, name, make(col))


_PACKED: tuple[tuple[str, Callable[[array[int]], Column]], ...] = (
    ("seqs", Steps),
    ("fps", Coded),
    ("created_ns", Split),
    ("op_ids", Steps),
)


def nbytes(obj: Any) -> int:
    """Bytes a column holds (its arrays and tables), for tests and benchmarks."""
    if isinstance(obj, array):
        return sys.getsizeof(obj)
    if isinstance(obj, Column):
        return sys.getsizeof(obj._recent) + _packed_bytes(obj)
    raise TypeError(type(obj))


def _packed_bytes(obj: Column) -> int:
    if isinstance(obj, Steps):
        return sys.getsizeof(obj) + sys.getsizeof(obj._at) + sys.getsizeof(obj._v)
    if isinstance(obj, Coded):
        table = sys.getsizeof(obj._table) + sum(map(sys.getsizeof, obj._table))
        return sys.getsizeof(obj) + table + sys.getsizeof(obj._code) + sys.getsizeof(obj._codes)
    if isinstance(obj, Split):
        return sys.getsizeof(obj) + nbytes(obj._hi) + sys.getsizeof(obj._lo)
    raise TypeError(type(obj))
