"""Flight-recorder dump reader: files as PyTorch writes them -> normalized `RankDump` records.

Formats are known here and nowhere else. Pickles are untrusted input (anyone who can write the
dump directory can write one): they are read with `SafeUnpickler`, which builds only plain data and
refuses every global, so a hostile pickle cannot run code. Everything after this module sees
`flightdeck.records` types only.

Exception tree:

    DumpError                 the file is not a usable dump; the message says why
    ├── UnsafePickleError     the pickle asks for a global/persistent object (refused)
    ├── TruncatedDumpError    empty, cut short or half-written
    ├── NotADumpError         readable data, but not a flight-recorder dump
    ├── UnsupportedVersionError  a schema version other than 2.x
    ├── DumpTooLargeError     over the configured size limit
    ├── InvalidDumpError      values the store cannot hold (`flightdeck.snapshot_check`)
    ├── DumpBudgetError       decodes to more than one file may cost (entries, frames, shared
    │                         references): refused before it is normalized
    └── NotRegularFileError   a FIFO, socket, device, directory or symlink: never opened (a FIFO
                              would block the reader until someone writes to it)
"""

from __future__ import annotations

import errno
import gc
import io
import json
import logging
import math
import os
import pickle
import re
import stat as stat_mod
import struct
from array import array
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from functools import lru_cache
from itertools import chain, compress, count, islice, repeat
from operator import attrgetter, contains, itemgetter, lt, methodcaller
from pathlib import Path
from typing import Any

from flightdeck.readers.coalesced import fold_coalesced
from flightdeck.records import (
    COALESCED_END_OPS,
    Entry,
    Frame,
    GroupInfo,
    RankDump,
    SnapshotKind,
    Stack,
    State,
    ThreadStack,
    canonical_op,
    config_from_dict,
    entries_from_columns,
    progress_from_dict,
)
from flightdeck.spool import RING_META_KEY, is_dump_name, is_sidecar, rank_from_name, sidecar_path

log = logging.getLogger(__name__)

#: Backends whose dumps have been seen; others are read with a warning.
KNOWN_BACKENDS = frozenset({"nccl", "nccl2", "nccl-legacy", "gloo", "xccl", "c10d", "ucc", "mpi"})
#: Default cap on a dump file's size: a 2,000-entry dump with frames is ~0.3-1 MB.
DEFAULT_MAX_BYTES = 256 * 1024 * 1024
#: A sidecar is a few KB (its largest part: the world group's member list); larger is not ours.
MAX_META_BYTES = 16 * 1024 * 1024

_P2P_RE = re.compile(r"(\d+)\s*(->|<-)\s*(\d+)")


class DumpError(Exception):
    """A file that is not a usable flight-recorder dump."""


class UnsafePickleError(DumpError):
    """The pickle references a global or persistent object; refused without executing anything."""


class TruncatedDumpError(DumpError):
    """The file is empty, cut short or still being written."""


class NotADumpError(DumpError):
    """The data is readable but not a flight-recorder dump."""


class UnsupportedVersionError(DumpError):
    """The dump's schema version is not a 2.x version."""


class DumpTooLargeError(DumpError):
    """The file exceeds the size limit."""


class InvalidDumpError(DumpError):
    """A dump whose values the store cannot hold (`flightdeck.snapshot_check`): set aside alone."""


class DumpBudgetError(DumpError):
    """The dump decodes to more than one file may cost to normalize (see `DumpBudget`)."""


class NotRegularFileError(DumpError):
    """The path is not a regular file; `kind` says what it is (a bounded label value)."""

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.kind = kind


#: What a path that is not a regular file is, by `stat.S_IFMT` (the `reason` of a skipped file).
_FILE_KINDS: dict[int, str] = {
    stat_mod.S_IFIFO: "fifo",
    stat_mod.S_IFSOCK: "socket",
    stat_mod.S_IFCHR: "device",
    stat_mod.S_IFBLK: "device",
    stat_mod.S_IFDIR: "directory",
    stat_mod.S_IFLNK: "symlink",
}
#: Every `NotRegularFileError.kind`.
FILE_KINDS = ("fifo", "socket", "device", "directory", "symlink", "other")


def _not_regular(st: os.stat_result) -> NotRegularFileError | None:
    if stat_mod.S_ISREG(st.st_mode):
        return None
    kind = _FILE_KINDS.get(stat_mod.S_IFMT(st.st_mode), "other")
    return NotRegularFileError(f"not a regular file (a {kind}): not opened", kind)


def read_regular(path: Path, *, max_bytes: int, head: bool = False) -> tuple[bytes, os.stat_result]:
    """The bytes of a regular file of at most `max_bytes`, and its stat (after opening), never blocking.

    The path is looked at with lstat first, so a FIFO, socket or device is never opened (opening a
    FIFO blocks until a writer comes; opening some devices has side effects), nor a symlink
    followed; then it is opened non-blocking without following a symlink, and fstat confirms a
    regular file (it could have been swapped in between). Raises NotRegularFileError for anything
    else, DumpTooLargeError over `max_bytes` (with `head`: the first max_bytes + 1 bytes instead),
    OSError when it cannot be read.
    """
    bad = _not_regular(os.lstat(path))
    if bad is not None:
        raise bad
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # became a symlink after the lstat
            raise NotRegularFileError("not a regular file (a symlink): not followed", "symlink") from None
        raise
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fd)
        bad = _not_regular(st)
        if bad is not None:
            raise bad
        if head:
            return fh.read(max_bytes + 1), st
        if st.st_size > max_bytes:
            raise DumpTooLargeError(f"{st.st_size} bytes is over the {max_bytes}-byte limit")
        # The size is known: ask for a little more than it (a file growing while we read is cut at
        # the limit), not for max_bytes, which makes the reader allocate that much up front.
        data = fh.read(min(max_bytes, st.st_size + 65536) + 1)
    if len(data) > max_bytes:
        raise DumpTooLargeError(f"more than the {max_bytes}-byte limit (the file grew while read)")
    return data, st


class SafeUnpickler(pickle.Unpickler):
    """Unpickler that builds only dict, list, tuple, str, bytes, int, float, bool and None."""

    def find_class(self, module: str, name: str) -> Any:
        """Refuse every global: FR dumps contain none, so any is hostile or not a dump."""
        raise UnsafePickleError(
            f"pickle references the global {module}.{name}; refused (dumps hold plain data)"
        )

    def persistent_load(self, pid: Any) -> Any:
        """Refuse persistent ids for the same reason."""
        raise UnsafePickleError("pickle uses a persistent id; refused (dumps hold plain data)")


@contextmanager
def gc_paused() -> Iterator[None]:
    """The cyclic garbage collector paused for the block (and on again after it, if it was on).

    Reading a dump allocates tens of thousands of small containers (the decoded pickle, then the
    columns and records made from it), and each allocation burst starts a collection that walks
    the whole young decoded dump again; none of it is cyclic garbage. With collection paused
    while one file is read and summarized, `flightdeck analyze`'s reader spent ~17% less CPU on
    bench/analyze_scale.py's 2,000-entry files (perf: gc_collect_main, visit_decref,
    visit_reachable and dict_traverse were 17% of its samples). Whatever cycles a hostile pickle
    builds are collected once the collector runs again.
    """
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()


def safe_loads(data: bytes) -> Any:
    """Unpickle untrusted bytes into plain data, or raise a `DumpError`."""
    # BufferedReader gives the C unpickler peek(), which makes it ~4x faster than a bare BytesIO.
    reader = io.BufferedReader(io.BytesIO(data), buffer_size=1 << 20)
    try:
        with gc_paused():  # the loader makes millions of small containers; no cycles to collect
            return SafeUnpickler(reader).load()
    except DumpError:
        raise
    except (
        EOFError,
        pickle.UnpicklingError,
        ValueError,
        IndexError,
        KeyError,
        TypeError,
        OverflowError,
        MemoryError,
        RecursionError,
        UnicodeDecodeError,
        AttributeError,
    ) as exc:
        msg = str(exc) or type(exc).__name__
        if isinstance(exc, EOFError) or "truncated" in msg or "ran out of input" in msg.lower():
            raise TruncatedDumpError(f"pickle is truncated ({msg})") from None
        raise NotADumpError(f"not a readable pickle ({type(exc).__name__}: {msg})") from None


@dataclass(frozen=True, slots=True)
class DumpBudget:
    """What one file may cost: the reader refuses a dump over any of these before normalizing it.

    The unpickler builds a shared object once however often it is referenced, so a small pickle can
    decode to a structure whose traversal is huge (400,000 references to one entry with a 200-frame
    stack: 0.8 MB that took 16.5 s and 311 MB to normalize). So what normalization will walk is
    counted per reference, in C where it can be: entries (an entry referenced twice counts twice),
    frames of every entry (a stack shared by entries counts at each use) and tensor sizes.
    """

    #: Entries in one file (PyTorch's ring holds TORCH_FR_BUFFER_SIZE, default 2,000).
    max_entries: int = 100_000
    #: Stack frames summed over the file's entries.
    max_frames: int = 4_000_000
    #: Tensors and dimensions in the entries' input and output sizes, summed over entries.
    max_dims: int = 4_000_000


DEFAULT_BUDGET = DumpBudget()
_INPUT_SIZES = methodcaller("get", "input_sizes")
_OUTPUT_SIZES = methodcaller("get", "output_sizes")


def check_budget(raw: dict[str, Any], budget: DumpBudget = DEFAULT_BUDGET) -> None:
    """Raise DumpBudgetError when normalizing `raw` (all its entries) would cost more than `budget`
    allows."""
    entries = raw.get("entries") or []
    n = len(entries)
    if n > budget.max_entries:
        raise DumpBudgetError(f"{n} entries, over the budget of {budget.max_entries} per file")
    if not set(map(type, entries)) <= {dict}:
        return  # not a dump's entries: normalizing refuses them at the first one, at no cost
    try:
        frames = sum(map(len, filter(None, map(_FRAMES_OF, entries))))
    except TypeError:  # frames that are not sized: the forgiving path ignores them
        frames = 0
    if frames > budget.max_frames:
        raise DumpBudgetError(
            f"{frames} stack frames over {n} entries, over the budget of {budget.max_frames} per file"
        )
    _check_dims(n, (list(map(getter, entries)) for getter in (_INPUT_SIZES, _OUTPUT_SIZES)), budget)


def _check_dims(n: int, columns: Iterable[list[Any]], budget: DumpBudget) -> None:
    """The tensor-size part of `check_budget`, on the entries' input and output sizes columns."""
    dims = 0
    for sizes in columns:
        try:
            # Tensors first (one C pass), so a huge shared list of tensors is caught before its dims.
            dims += sum(map(len, sizes))
            if dims > budget.max_dims:
                break
            dims += sum(map(len, chain.from_iterable(sizes)))
        except TypeError:  # sizes that are not lists of lists: the forgiving path reads them as ()
            continue
    if dims > budget.max_dims:
        raise DumpBudgetError(f"{dims}+ tensor sizes over {n} entries, over the budget of {budget.max_dims}")


def load_raw(data: bytes, *, budget: DumpBudget = DEFAULT_BUDGET) -> dict[str, Any]:
    """Decode dump bytes (pickle or JSON, detected from the content) into the raw dump dict, within
    `budget` (DumpBudgetError when over)."""
    if not data:
        raise TruncatedDumpError("file is empty")
    head = data[:1]
    if head == b"\x80":
        raw = safe_loads(data)
    elif data.lstrip()[:1] == b"{":
        try:
            raw = json.loads(data)
        except json.JSONDecodeError as exc:
            if exc.pos >= len(data.rstrip()) - 1:
                raise TruncatedDumpError(f"JSON is truncated at byte {exc.pos}") from None
            raise NotADumpError(f"invalid JSON at byte {exc.pos}: {exc.msg}") from None
        except UnicodeDecodeError as exc:
            raise NotADumpError(f"JSON is not UTF-8 ({exc.reason})") from None
    else:
        raise NotADumpError("neither a pickle (protocol 2+) nor a JSON object")
    if not isinstance(raw, dict):
        raise NotADumpError(f"top level is a {type(raw).__name__}, not a dump dict")
    version = raw.get("version")
    if not isinstance(version, str):
        raise NotADumpError("no 'version' string: not a flight-recorder dump")
    major = version.split(".", 1)[0]
    if major != "2":
        raise UnsupportedVersionError(f"schema version {version!r} is not supported (2.x is)")
    if "entries" in raw and not isinstance(raw["entries"], list):
        raise NotADumpError("'entries' is not a list")
    # Only the count here (one len): frames and sizes are counted on the entries a parse is about
    # to normalize (`LoadedDump.parse`), which for an incremental read are the few that changed.
    n = len(raw.get("entries") or [])
    if n > budget.max_entries:
        raise DumpBudgetError(f"{n} entries, over the budget of {budget.max_entries} per file")
    return raw


@dataclass(slots=True)
class _Ctx:
    """Per-file normalization state: stack interning and one warning per kind."""

    stacks: dict[tuple[tuple[str, str, int], ...], Stack] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    unknown_backends: set[str] = field(default_factory=set)
    ops: dict[str, tuple[str, str, int | None]] = field(default_factory=dict)

    def warn(self, msg: str) -> None:
        if msg not in self.warnings:
            self.warnings.append(msg)


def _stack(raw: object, ctx: _Ctx) -> Stack:
    if not isinstance(raw, list) or not raw:
        return ()
    key = tuple(
        (_s(f.get("name", "")), _s(f.get("filename", "")), _int(f.get("line"), 0))
        for f in raw
        if isinstance(f, dict)
    )
    st = ctx.stacks.get(key)
    if st is None:
        st = ctx.stacks[key] = tuple(Frame(n, fn, ln) for n, fn, ln in key)
    return st


def _int(v: object, default: int) -> int:
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, int):
        return v
    if isinstance(v, str):
        try:
            return int(v)
        except ValueError:
            return default
    if isinstance(v, float):
        return int(v) if math.isfinite(v) else default
    return default


def _s(v: object) -> str:
    """A raw value as text: a str as is, a number or None written out, anything else ''.

    Never `str()` of a container: a pickle can nest shared lists so that writing one out is
    exponential in the file's size; where a dump has a container instead of a name, it is not a name.
    """
    if type(v) is str:
        return v
    if v is None or isinstance(v, int | float):
        try:
            return str(v)
        except ValueError:  # an int of more than 4,300 digits
            return ""
    return ""


def _name_str(v: object) -> str:
    """The fast path's text: a str, or an int written out; anything else takes the forgiving path."""
    if type(v) is str:
        return v
    if type(v) is int:
        return str(v)
    raise TypeError("not a name")


def _opt_int(v: object) -> int | None:
    """An optional int (a number written as a string is taken); None when absent or not a number."""
    if v is None or (isinstance(v, str) and not v.strip().lstrip("-").isdigit()):
        return None
    return _int(v, 0)


def _opt_ns(v: object) -> int | None:
    """NCCL timestamps: None in pickles and 0 in JSON mean 'not recorded'."""
    n = _int(v, 0)
    return n or None


def _sizes(v: object) -> tuple[tuple[int, ...], ...]:
    if not isinstance(v, list | tuple):
        return ()
    return tuple(tuple(_int(x, 0) for x in s) if isinstance(s, list | tuple) else () for s in v)


def _strs(v: object) -> tuple[str, ...]:
    if not isinstance(v, list | tuple):
        return ()
    return tuple(_s(x) for x in v)


_STATES: dict[object, State] = {"scheduled": "scheduled", "started": "started", "completed": "completed"}


def _op_info(prof: str, ctx: _Ctx) -> tuple[str, str, int | None]:
    """(backend, canonical op, p2p peer) of a profiling name, cached per file (few distinct names)."""
    info = ctx.ops.get(prof)
    if info is None:
        backend = prof.split(":", 1)[0] if ":" in prof else ""
        if backend and backend not in KNOWN_BACKENDS and backend not in ctx.unknown_backends:
            ctx.unknown_backends.add(backend)
            ctx.warn(f"unknown backend {backend!r}: entries read as generic collectives")
        m = _P2P_RE.search(prof)
        # "send 0->1" and "recv 0<-1" both name this rank first and the peer second.
        peer = int(m.group(3)) if m else None
        info = ctx.ops[prof] = (backend, canonical_op(prof) if prof else "unknown", peer)
    return info


def _entry(raw: dict[str, Any], ctx: _Ctx, rank: int) -> Entry:
    """Normalize one raw entry: a fast path for well-formed dumps, a forgiving one for the rest."""
    try:
        prof = raw["profiling_name"]
        backend, op, peer = _op_info(prof, ctx)
        rid = raw["record_id"]
        seq = raw["collective_seq_id"]
        created = raw["time_created_ns"]
        isz = tuple(map(tuple, raw["input_sizes"]))
        osz = tuple(map(tuple, raw["output_sizes"]))
        if type(rid) is not int or type(seq) is not int or type(created) is not int:
            raise TypeError("not an int")
        for s in isz + osz:
            for d in s:
                if type(d) is not int:
                    raise TypeError("size is not an int")
        fr = raw.get("frames")
        is_p2p = raw["is_p2p"]
        dur = raw.get("duration_ms")
        to = raw.get("timeout_ms")
        ts = raw.get("time_discovered_started_ns") or None
        td = raw.get("time_discovered_completed_ns") or None
        # Anything but an int (a string, a float) takes the forgiving path, which converts or drops it.
        if (to is not None and type(to) is not int) or (ts is not None and type(ts) is not int):
            raise TypeError("not an int")
        if (td is not None and type(td) is not int) or (dur is not None and type(dur) is not float):
            raise TypeError("not an int")
        # By position: a keyword call costs about 3x building the entry (CPython packs keywords
        # into a dict for a class's `__init__`), and this builds each entry of a dump the columns
        # do not vouch for and each one the summary keeps whole (tails, point-to-point).
        # tests/test_frdump.py checks the order is `Entry`'s.
        return Entry(
            rid,
            _name_str(raw["process_group"][0]),
            seq,
            int(raw["p2p_seq_id"]),
            int(raw["op_id"]),
            backend,
            op,
            prof,
            bool(is_p2p),
            isz,
            osz,
            tuple(map(_name_str, raw["input_dtypes"])),
            tuple(map(_name_str, raw["output_dtypes"])),
            _STATES[raw["state"]],
            bool(raw["retired"]),
            created,
            ts,
            td,
            float(dur) if dur is not None else None,
            to,
            _s(raw.get("thread_name") or ""),
            peer if is_p2p else None,
            _frames_fast(fr, ctx) if fr else (),
        )
    except (KeyError, TypeError, ValueError, IndexError, AttributeError, OverflowError):
        return _entry_slow(raw, ctx, rank)


def _frames_fast(raw: list[dict[str, Any]], ctx: _Ctx) -> Stack:
    try:
        key = tuple([(f["name"], f["filename"], f["line"]) for f in raw])
        st = ctx.stacks.get(key)
        if st is None:
            for n, fn, ln in key:
                if type(n) is not str or type(fn) is not str or type(ln) is not int:
                    raise TypeError("bad frame")
            st = ctx.stacks[key] = tuple(Frame(n, fn, ln) for n, fn, ln in key)
        return st
    except (KeyError, TypeError):
        return _stack(raw, ctx)


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
    #: Positions whose entry has frames, in file order.
    framed: list[int]
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


@lru_cache(maxsize=8)
def _int64s(n: int) -> struct.Struct:
    return struct.Struct(f"{n}q")


def _int64_array(values: Sequence[Any]) -> array[int]:
    """The values as a 64-bit array, converted in C (`struct`: cheaper than `array("q", values)`,
    which parses each item as a call's argument); struct.error for anything but an int (or a
    bool, which reads as the int the forgiving path makes of it) within 64 bits."""
    out = array("q")
    out.frombytes(_int64s(len(values)).pack(*values))
    return out


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


def _signature_columns(
    raw_entries: list[Any], ctx: _Ctx, rank: int, budget: DumpBudget
) -> tuple[SignatureColumns, dict[str, str]] | None:
    """`SignatureColumns` of a dump's entries (within `budget`) and each group's description as
    its first entry gives it; None where they take `_entry_columns` instead.

    One comprehension reads, per entry, the fields the summary keeps of every entry (and the two
    it checks: state, duration); the columns are checked and converted in C. The other fields are
    read only for the entries built whole (`SignatureColumns.entry`: each group's last entries,
    point-to-point ones), by `_entry` as always: their odd values change only those entries (no
    warning, no refusal), except a state (a warning) and a duration too large for a float (a
    refusal), which are checked for every entry. Nothing is checked that the unpickler's type set
    (`SafeUnpickler`: plain data only) already answers: an entry that is not a dict fails its
    first subscript, and an int column packed into 64 bits has no other type than int or bool
    to tell apart (a bool reads as the int the forgiving path makes of it). Sizes and dtypes are
    read per distinct object (the unpickler shares an object the pickle memoizes), their types
    checked and converted once per distinct signature.
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
    try:
        _int64s(n).pack(*rid)  # ints within 64 bits (struct.error else), as the arrays below
        if not (_increasing(rid) and set(state) <= _STATES.keys()):
            return None
        seq_a, created_a, op_id_a = _int64_array(seq), _int64_array(created), _int64_array(op_id)
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
    got = _signature_keys(raw_entries, first, ctx, budget)
    if got is None:
        return None
    keys, remap = got
    if remap:
        key_of = [remap.get(k, k) for k in key_of]
    is_p2p = list(map(bool, p2p)) if any(p2p) else None
    columns = SignatureColumns(
        collective_seq_id=seq_a,
        time_created_ns=created_a,
        op_id=op_id_a,
        groups=groups,
        group_of=group_of,
        is_p2p=is_p2p,
        key_of=key_of,
        keys=keys,
        framed=list(compress(range(n), frames)),
        seq_increasing=_increasing(seq),
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


def _entry_slow(raw: dict[str, Any], ctx: _Ctx, rank: int) -> Entry:
    pg = raw.get("process_group")
    if isinstance(pg, list | tuple) and pg:
        group = _s(pg[0])
    else:
        group = _s(raw.get("pg_id", "?"))
        ctx.warn("entries without process_group: group identity falls back to the per-process pg_id")
    prof = _s(raw.get("profiling_name") or "")
    backend, op, peer = _op_info(prof, ctx)
    st = raw.get("state")
    state = _STATES.get(st) if isinstance(st, str) else None
    if state is None:
        ctx.warn(f"unknown entry state {raw.get('state')!r}: treated as scheduled")
        state = "scheduled"
    is_p2p = bool(raw.get("is_p2p", False))
    dur = raw.get("duration_ms")
    timeout = raw.get("timeout_ms")
    return Entry(
        record_id=_int(raw.get("record_id"), -1),
        group=group,
        collective_seq_id=_int(raw.get("collective_seq_id"), 0),
        p2p_seq_id=_int(raw.get("p2p_seq_id"), 0),
        op_id=_int(raw.get("op_id"), 0),
        backend=backend,
        op=op,
        raw_op=prof,
        is_p2p=is_p2p,
        input_sizes=_sizes(raw.get("input_sizes")),
        output_sizes=_sizes(raw.get("output_sizes")),
        input_dtypes=_strs(raw.get("input_dtypes")),
        output_dtypes=_strs(raw.get("output_dtypes")),
        state=state,
        retired=bool(raw.get("retired", False)),
        time_created_ns=_int(raw.get("time_created_ns"), 0),
        time_started_ns=_opt_ns(raw.get("time_discovered_started_ns")),
        time_completed_ns=_opt_ns(raw.get("time_discovered_completed_ns")),
        duration_ms=float(dur) if isinstance(dur, int | float) and not isinstance(dur, bool) else None,
        timeout_ms=_opt_int(timeout),
        thread_name=_s(raw.get("thread_name") or ""),
        peer=peer if is_p2p else None,
        frames=_stack(raw.get("frames"), ctx),
    )


def _pg_config_groups(raw: dict[str, Any]) -> dict[str, GroupInfo]:
    """Groups from pg_config, skipping gloo's placeholder entries (empty name, '[]' ranks)."""
    out: dict[str, GroupInfo] = {}
    cfg = raw.get("pg_config")
    if not isinstance(cfg, dict):
        return out
    for key, val in cfg.items():
        if not isinstance(val, dict):
            continue
        name = _s(val.get("name") or key or "")
        if not name:
            continue  # gloo registers the group before Python names it: nothing usable here
        out[name] = GroupInfo(name, _s(val.get("desc") or ""), _pg_ranks(val.get("ranks")))
    return out


def _pg_ranks(rr: object) -> tuple[int, ...] | None:
    """A pg_config entry's member ranks ("[0, 1]" in a dump, a list in JSON), or None if unusable."""
    if type(rr) is str:
        return _pg_ranks_text(rr)
    return _pg_ranks_of(rr)


@lru_cache(maxsize=64)
def _pg_ranks_text(rr: str) -> tuple[int, ...] | None:
    """`_pg_ranks` of the text form, remembered: every rank's dump repeats the same member lists
    (the world group's names every rank: at 4,096 ranks a 24 KB string, parsed twice per file
    without this)."""
    try:
        parsed = json.loads(rr)
    except json.JSONDecodeError:
        return None
    return _pg_ranks_of(parsed)


def _pg_ranks_of(parsed: object) -> tuple[int, ...] | None:
    if isinstance(parsed, list) and parsed and all(isinstance(x, int) for x in parsed):
        return tuple(sorted(parsed))
    return None


def _outside_pg_config(raw: dict[str, Any], rank: int) -> str | None:
    """Why `rank` cannot be this dump's, by its pg_config (a member of none of the groups listed,
    the unnamed ones gloo registers included: every rank is a member of the default group), or
    None when it can be or pg_config lists no members."""
    cfg = raw.get("pg_config")
    if not isinstance(cfg, dict):
        return None
    members = [m for v in cfg.values() if isinstance(v, dict) and (m := _pg_ranks(v.get("ranks")))]
    if not members or any(rank in m for m in members):
        return None
    return (
        f"rank {rank} (from the file name) is a member of none of its pg_config's process groups "
        f"(ranks {min(map(min, members))}..{max(map(max, members))}): a dump copied under another rank's name?"
    )


#: What a value of an unexpected type can raise while a dump is normalized: the file is refused.
VALUE_ERRORS = (TypeError, ValueError, OverflowError, AttributeError, KeyError, IndexError, RecursionError)


_RECORD_ID = attrgetter("record_id")
_GROUP = attrgetter("group")
_BACKEND = attrgetter("backend")
_STATUS_FIELDS = ("last_enqueued_collective", "last_started_collective", "last_completed_collective")


def _pg_status(raw: dict[str, Any], raw_entries: list[Any]) -> dict[str, tuple[int, int, int]]:
    """`pg_status` by group name. It is keyed by the per-process `pg_id` (ints in pickles, strings in
    JSON, as are its values); the entries say which group each pg_id is. A pg_id no entry names
    keeps its key (prefixed `pg_id:`), and an unreadable value reads as -1."""
    status = raw.get("pg_status")
    if not isinstance(status, dict) or not status:
        return {}
    wanted = {str(k) for k in status}
    names: dict[str, str] = {}
    for e in raw_entries:
        if len(names) == len(wanted):
            break
        pg, pid = e.get("process_group"), e.get("pg_id")
        if pid is not None and isinstance(pg, list | tuple) and pg and str(pid) not in names:
            names[str(pid)] = str(pg[0])
    out: dict[str, tuple[int, int, int]] = {}
    for key, val in status.items():
        if not isinstance(val, dict):
            continue
        a, b, c = (_int(val.get(f), -1) for f in _STATUS_FIELDS)
        out[names.get(str(key), f"pg_id:{key}")] = (a, b, c)
    return out


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


def read_meta(path: Path) -> dict[str, Any] | None:
    """The agent's sidecar for a dump file, or None when there is none or it is unreadable."""
    mp = sidecar_path(path)
    try:
        data, _st = read_regular(mp, max_bytes=MAX_META_BYTES)
    except (NotRegularFileError, DumpTooLargeError) as exc:
        log.warning("%s: metadata sidecar ignored: %s", mp, exc)
        return None
    except OSError:
        return None
    try:
        meta = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError):
        log.warning("%s: metadata sidecar is not valid JSON; ignored", mp)
        return None
    return meta if is_sidecar(meta) else None


#: What `scan_entries` reports of an entry: (record_id, time_created_ns, progress), where progress
#: is the state's rank (`SCAN_STATE_RANK`) | `SCAN_RETIRED` if retired | `SCAN_FRAMES` if it has frames.
EntryScan = tuple[int, int, int]
SCAN_STATE_RANK: dict[object, int] = {"scheduled": 0, "started": 1, "completed": 2}
SCAN_RETIRED = 4
SCAN_FRAMES = 8
_SCAN_FIELDS = itemgetter("record_id", "time_created_ns", "state", "retired")
_SCAN_PROGRESS: dict[tuple[object, object], int] = {
    (state, retired): rank | (SCAN_RETIRED if retired else 0)
    for state, rank in SCAN_STATE_RANK.items()
    for retired in (False, True)
}
_FRAMES_OF = methodcaller("get", "frames")
#: An entry's raw identity and progress fields, opaque to callers except that equal rows mean an
#: unchanged entry and `row[0]` is the record id (see `entry_rows`).
EntryRow = tuple[Any, ...]


def entry_rows(raw: dict[str, Any]) -> tuple[list[EntryRow], bool] | None:
    """Every raw entry's identity and progress fields (one row each, in file order), built in C, and
    whether any entry has frames; None when an entry is not a dict or lacks one of the fields.

    A caller that kept the rows of an earlier version of the file compares them (equal rows:
    unchanged entries) and turns only the rows that differ into `EntryScan`s with `row_scan`.
    """
    entries = raw.get("entries") or []
    try:
        rows = list(map(_SCAN_FIELDS, entries))
        # Periodic snapshots have no `frames` key at all: a membership test (in C) settles that;
        # only when some entry has the key are the lists themselves looked at.
        frames = any(map(contains, entries, repeat("frames"))) and any(map(_FRAMES_OF, entries))
    except (KeyError, TypeError, AttributeError):  # not a dict, or a field missing
        return None
    return rows, frames


def row_scan(row: EntryRow, *, frames: bool = False) -> EntryScan | None:
    """One row's `EntryScan` (`frames`: whether the entry has frames), or None when the fast path
    cannot trust it (a record id or creation time that is not an int, an unknown state)."""
    rid, tc, state, retired = row
    if type(rid) is not int or type(tc) is not int:
        return None
    try:
        p = _SCAN_PROGRESS[state, bool(retired)]
    except (KeyError, TypeError):
        return None
    return rid, tc, p | SCAN_FRAMES if frames else p


def scan_entries(raw: dict[str, Any]) -> list[EntryScan] | None:
    """Identity and progress of every raw entry, in file order, without normalizing any.

    The light-weight scanner behind incremental reads: a ring rewritten every couple of seconds
    changes in a few dozen entries, so a caller scans all of them and normalizes (`parse_dump`
    with `only`) just the ones it needs. None when an entry is not what the fast path trusts (a
    field missing, a record id or creation time that is not an int, an unknown state): then the
    caller normalizes every entry and `parse_dump`'s forgiving path decides what they mean.
    """
    got = entry_rows(raw)
    if got is None:
        return None
    rows, any_frames = got
    prog = _SCAN_PROGRESS
    try:
        # One comprehension, no call per entry: this runs over every entry of a changed ring.
        keys = [(rid, tc, prog[state, bool(ret)]) for rid, tc, state, ret in rows]
    except (KeyError, TypeError):  # unknown or unhashable state
        return None
    # map/set run in C: checking 2,000 entries this way costs ~20 µs.
    if not set(map(type, map(itemgetter(0), keys))) | set(map(type, map(itemgetter(1), keys))) <= {int}:
        return None
    if any_frames:  # stall and final snapshots; periodic ones are taken without stacks
        entries = raw.get("entries") or []
        keys = [
            (r, t, p | SCAN_FRAMES) if f else (r, t, p)
            for (r, t, p), f in zip(keys, map(_FRAMES_OF, entries), strict=True)
        ]
    return keys


@dataclass(slots=True)
class LoadedDump:
    """A dump file decoded (safely) but not normalized yet, with what identifies its rank.

    `read_dump_file` is `load_dump_file(...).parse()`; the collector scans the entries
    (`scan`) and normalizes only those it ships (`parse(only=...)`).
    """

    raw: dict[str, Any]
    rank: int
    source: str
    meta: dict[str, Any] | None
    mtime_ns: int
    #: Size of the dump file in bytes.
    size: int
    #: What normalizing it may cost (checked by `parse` on the entries it normalizes).
    budget: DumpBudget = DEFAULT_BUDGET

    @property
    def entry_count(self) -> int:
        """Entries in the file."""
        return len(self.raw.get("entries") or [])

    def scan(self) -> list[EntryScan] | None:
        """`scan_entries` of this dump."""
        return scan_entries(self.raw)

    def rows(self) -> tuple[list[EntryRow], bool] | None:
        """`entry_rows` of this dump."""
        return entry_rows(self.raw)

    def without_entries(self) -> LoadedDump:
        """This dump without its entries: what stays true of the file while its bytes do not change."""
        return replace(self, raw={k: v for k, v in self.raw.items() if k != "entries"})

    def with_sidecar_of(self, path: Path, *, mtime_ns: int, size: int) -> LoadedDump | None:
        """This dump with `path`'s sidecar read again (the same bytes rewritten with a new sidecar);
        None when the sidecar now names another rank."""
        meta = read_meta(path)
        if _rank_of(path, meta) != self.rank:
            return None
        return replace(self, source=str(path), meta=meta, mtime_ns=mtime_ns, size=size)

    def parse(
        self,
        *,
        only: Collection[int] | None = None,
        scan: list[EntryScan] | None = None,
        at: Iterable[int] | None = None,
    ) -> RankDump:
        """Normalize the dump; with `only`, just the entries whose record id is in it.

        `scan` (this dump's `scan()`) saves looking the record ids up again when `only` is given;
        `at` narrows the look to those entry positions (file order). Metadata (groups of
        pg_config, sidecar, times) is the whole file's either way.
        """
        raw = self.raw
        if only is not None:
            entries = raw.get("entries") or []
            if not only:
                picked = []
            elif at is not None:
                picked = [e for e in map(entries.__getitem__, at) if e.get("record_id") in only]
            elif scan is not None:
                picked = [e for e, k in zip(entries, scan, strict=True) if k[0] in only]
            else:
                picked = [e for e in entries if isinstance(e, dict) and e.get("record_id") in only]
            raw = dict(raw, entries=picked)
        check_budget(raw, self.budget)
        return parse_dump(raw, rank=self.rank, source=self.source, meta=self.meta, mtime_ns=self.mtime_ns)

    def parse_signatures(self) -> tuple[RankDump, SignatureColumns] | None:
        """`parse_signatures` of the whole dump, within its budget; None where `parse_columns`
        or `parse` must do it."""
        return parse_signatures(
            self.raw,
            rank=self.rank,
            source=self.source,
            meta=self.meta,
            mtime_ns=self.mtime_ns,
            budget=self.budget,
        )

    def parse_columns(self) -> tuple[RankDump, EntryColumns] | None:
        """`parse_columns` of the whole dump, within its budget; None where `parse` must do it."""
        check_budget(self.raw, self.budget)
        return parse_columns(
            self.raw, rank=self.rank, source=self.source, meta=self.meta, mtime_ns=self.mtime_ns
        )


def read_dump_bytes(path: Path, *, max_bytes: int = DEFAULT_MAX_BYTES) -> tuple[bytes, os.stat_result]:
    """A dump file's bytes and its stat, within `max_bytes`, or a DumpError saying why not."""
    try:
        return read_regular(path, max_bytes=max_bytes)
    except OSError as exc:
        raise DumpError(f"cannot read: {exc.strerror}") from None


def load_dump_file(
    path: Path,
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
    data: bytes | None = None,
    st: os.stat_result | None = None,
    budget: DumpBudget = DEFAULT_BUDGET,
) -> LoadedDump:
    """Decode one dump file and its sidecar without normalizing, or raise a DumpError saying why.

    `data` and `st` are the file's bytes and stat when the caller has read them already
    (`read_dump_bytes`).
    """
    if data is None or st is None:
        data, st = read_dump_bytes(path, max_bytes=max_bytes)
    raw = load_raw(data, budget=budget)
    meta = read_meta(path)
    rank = _rank_of(path, meta)
    if rank is None:
        raise NotADumpError("no rank: the name has no rank_<N> suffix and there is no metadata sidecar")
    if not (meta and isinstance(meta.get("rank"), int)):
        why = _outside_pg_config(raw, rank)
        if why is not None:
            raise NotADumpError(why)
    return LoadedDump(raw, rank, str(path), meta, st.st_mtime_ns, st.st_size, budget)


def _rank_of(path: Path, meta: dict[str, Any] | None) -> int | None:
    """The rank of a dump file: its sidecar's, else the one in its name."""
    rank = meta.get("rank") if meta else None
    return rank if isinstance(rank, int) else rank_from_name(path.name)


def read_dump_file(
    path: Path, *, max_bytes: int = DEFAULT_MAX_BYTES, budget: DumpBudget = DEFAULT_BUDGET
) -> RankDump:
    """Read one dump file (and its sidecar) into a RankDump, or raise a DumpError saying why."""
    return load_dump_file(path, max_bytes=max_bytes, budget=budget).parse()


def discover(paths: Iterable[Path]) -> Iterator[Path]:
    """Candidate dump files under the given files/directories (recursively), in a stable order."""
    for p in paths:
        if p.is_dir():
            for root, dirs, files in os.walk(p):
                dirs.sort()
                for name in sorted(files):
                    if is_dump_name(name):
                        yield Path(root) / name
        elif p.exists():
            yield p
        else:
            raise FileNotFoundError(str(p))


def merge(dumps: list[RankDump]) -> RankDump:
    """Merge snapshots of one rank: union of entries by record id, each as far along as a snapshot
    saw it, the newest snapshot's metadata but for what it left empty, frames and thread stacks
    kept from whichever snapshot had them (the rules the live server's fold shares:
    `flightdeck.analysis.merge`)."""
    # Imported here: the collector daemon reads dumps but never merges them, and importing
    # `flightdeck.analysis` loads the whole diagnosis.
    from flightdeck.analysis.merge import (
        later_progress,
        merged_entry,
        merged_group,
        merged_meta,
        newest_of,
        snapshot_order,
    )
    from flightdeck.records import meta_kwargs, meta_of

    if len(dumps) == 1:
        return dumps[0]
    ordered = sorted(dumps, key=lambda d: snapshot_order(d.snapshot_time_ns, d.kind))
    latest = ordered[-1]
    by_id: dict[int, Entry] = {}
    for d in ordered:
        for e in d.entries:
            held = by_id.get(e.record_id)
            by_id[e.record_id] = e if held is None else merged_entry(held, e)
    entries = [by_id[k] for k in sorted(by_id)]
    groups: dict[str, GroupInfo] = {}
    meta = meta_of(ordered[0])
    progress = None
    for d in ordered:
        meta = merged_meta(meta, d)
        progress = later_progress(progress, d.progress)
        for name, g in d.groups.items():
            groups[name] = merged_group(name, groups.get(name), g)
    stacks = newest_of((d.thread_stacks for d in ordered), ())
    config = newest_of((d.config for d in ordered), None)
    warnings = tuple(dict.fromkeys(w for d in ordered for w in d.warnings))
    return replace(
        latest,
        **meta_kwargs(meta),
        entries=entries,
        groups=groups,
        thread_stacks=stacks,
        config=config,
        comm_lib_version=newest_of((d.comm_lib_version for d in ordered), None),
        pg_status=newest_of((d.pg_status for d in ordered), {}),
        progress=progress,
        wrapped=bool(entries) and entries[0].record_id > 0,
        warnings=warnings,
        ring_first=None,  # the union is the whole ring again (and older entries it had)
    )
