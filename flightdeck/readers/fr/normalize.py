"""One raw entry -> one `flightdeck.records.Entry`.

The per-file normalization state (`_Ctx`: stacks interned, each warning once), the fast path for
well-formed entries (`_entry`, `_frames_fast`), the forgiving one for the rest (`_entry_slow`:
converts or drops odd values, with a warning where it guesses), and the value converters both use.
The names are the reader's own (private to `flightdeck.readers.fr`): its other modules import them
from here.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from flightdeck.records import Entry, Frame, Stack, State, canonical_op

#: Backends whose dumps have been seen; others are read with a warning.
KNOWN_BACKENDS = frozenset({"nccl", "nccl2", "nccl-legacy", "gloo", "xccl", "c10d", "ucc", "mpi"})

_P2P_RE = re.compile(r"(\d+)\s*(->|<-)\s*(\d+)")


_StackTable = dict[tuple[tuple[str, str, int], ...], Stack]


class SharedStacks:
    """One stack table for every file a process reads while it is entered (`with`), where each
    file's `_Ctx` would otherwise start an empty one: the one owner of sharing stacks across files.

    The ranks of a job call their collectives from the same code, so their dumps hold the same
    stacks. `flightdeck analyze`'s reader processes enter it around each rank (`_load_rank`), so
    that the summaries of one chunk of ranks hold one `Stack` object per distinct stack and the
    chunk's pickle to the parent writes each once (a memo reference for the rest), where each rank
    had its own copy, pickled and unpickled one `Frame` at a time. Measured with callgrind on
    bench/analyze_scale.py's 2,000-entry files (`_load_rank` on each of 64 files, their results
    pickled there and back as one list as the pool sends a chunk, minus the same on 16 files):
    28.92 million instructions per file without it, 28.41 million with it. A table over
    `max_stacks` is emptied when the next file starts (memory: at most that many stacks plus one
    file's).
    """

    __slots__ = ("max_stacks", "table")

    def __init__(self, max_stacks: int = 4096) -> None:
        self.max_stacks = max_stacks
        self.table: _StackTable = {}

    def __enter__(self) -> SharedStacks:
        global _SHARED
        if len(self.table) > self.max_stacks:
            self.table.clear()
        _SHARED = self.table
        return self

    def __exit__(self, *exc: object) -> None:
        global _SHARED
        _SHARED = None


#: The table `SharedStacks` shares while entered; None: each `_Ctx` has its own.
_SHARED: _StackTable | None = None


def _shared_stacks() -> _StackTable:
    return _SHARED if _SHARED is not None else {}


@dataclass(slots=True)
class _Ctx:
    """Per-file normalization state: stack interning and one warning per kind."""

    #: Each stack by its frames' (name, filename, line): the file's own table, or the one the
    #: reader's process shares across files (`SharedStacks`).
    stacks: dict[tuple[tuple[str, str, int], ...], Stack] = field(default_factory=_shared_stacks)
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
