"""Check one snapshot against `flightdeck.limits` before it joins a batch (or is stored).

`check_snapshot` refuses what would break the store or the analysis (an integer outside 64 bits, a
negative id or time, a rank outside its world, a world larger than MAX_WORLD_SIZE, a record id twice,
a name with a control character or too long) with a `SnapshotError` that names the field, and
normalizes free text in place (NUL removed, cut to its limit: exception, thread and file names), which
is shown but identifies nothing. The collector runs it per file, so one bad file is set aside alone
and never takes the rest of a batch down with it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from itertools import chain
from operator import attrgetter

from flightdeck.limits import (
    INT64_MAX,
    INT64_MIN,
    MAX_BACKEND_CHARS,
    MAX_DTYPE_CHARS,
    MAX_EXCEPTION_CHARS,
    MAX_FRAME_TEXT_CHARS,
    MAX_GROUP_DESC_CHARS,
    MAX_GROUP_NAME_CHARS,
    MAX_HOST_CHARS,
    MAX_JOB_CHARS,
    MAX_KIND_CHARS,
    MAX_OP_CHARS,
    MAX_SOURCE_CHARS,
    MAX_THREAD_NAME_CHARS,
    MAX_VERSION_CHARS,
    MAX_WORLD_SIZE,
    clean_text,
    finite_ok,
    int64_ok,
    name_problem,
    opt_int64_ok,
)
from flightdeck.records import Entry, Frame, Stack, ThreadStack
from flightdeck.wire import Snapshot


class SnapshotError(ValueError):
    """A snapshot the store cannot hold; the message names the field and why."""


_STATES = frozenset({"scheduled", "started", "completed"})
#: Entry fields that are ids, counts or times: ints in [0, INT64_MAX] (None allowed: `_OPT`).
_REQUIRED_INTS = ("record_id", "collective_seq_id", "p2p_seq_id", "op_id", "time_created_ns")
_OPT_INTS = ("time_started_ns", "time_completed_ns", "timeout_ms")


def _ints_ok(values: Iterable[object], *, nullable: bool) -> bool:
    """Whether every value is an int in [0, INT64_MAX] (or None when `nullable`); a few C passes."""
    vals = [v for v in values if v is not None] if nullable else list(values)
    if not vals:
        return True
    if not set(map(type, vals)) <= {int}:
        return False
    ints: list[int] = vals  # type: ignore[assignment]
    return min(ints) >= 0 and max(ints) <= INT64_MAX


def _bad_int(entries: list[Entry], attr: str) -> object:
    get = attrgetter(attr)
    return next(
        v for v in map(get, entries) if v is not None and not int64_ok(v)
    )  # called only when one is bad


def check_snapshot(snap: Snapshot) -> None:
    """Refuse (SnapshotError) or normalize `snap` in place; see the module docstring."""
    _name("job", snap.job, MAX_JOB_CHARS)
    if not int64_ok(snap.attempt):
        raise SnapshotError(f"attempt: {snap.attempt!r} is not an int in [0, 2^63)")
    if snap.world_size is not None and (
        type(snap.world_size) is not int or not 1 <= snap.world_size <= MAX_WORLD_SIZE
    ):
        raise SnapshotError(f"world_size: {snap.world_size!r} is not in [1, {MAX_WORLD_SIZE}]")
    limit = snap.world_size or MAX_WORLD_SIZE
    if type(snap.rank) is not int or not 0 <= snap.rank < limit:
        raise SnapshotError(f"rank: {snap.rank!r} is not in [0, {limit})")
    if snap.local_rank is not None and (type(snap.local_rank) is not int or not 0 <= snap.local_rank < limit):
        raise SnapshotError(f"local_rank: {snap.local_rank!r} is not in [0, {limit})")
    for attr in ("snapshot_time_ns",):
        if not int64_ok(getattr(snap, attr)):
            raise SnapshotError(f"{attr}: {getattr(snap, attr)!r} is not an int in [0, 2^63)")
    for attr in ("pid", "oldest_record_id"):
        if not opt_int64_ok(getattr(snap, attr)):
            raise SnapshotError(f"{attr}: {getattr(snap, attr)!r} is not an int in [0, 2^63) or null")
    if snap.host is not None:
        _name("host", snap.host, MAX_HOST_CHARS)
    _name("kind", snap.kind, MAX_KIND_CHARS)
    for attr, n in (("torch_version", MAX_VERSION_CHARS), ("backend", MAX_BACKEND_CHARS)):
        v = getattr(snap, attr)
        if v is not None:
            _text(attr, v)
            setattr(snap, attr, clean_text(v, n))
    _text("version", snap.version)
    snap.version = clean_text(snap.version, MAX_VERSION_CHARS)
    if not finite_ok(snap.interval_s):
        raise SnapshotError(f"interval_s: {snap.interval_s!r} is not a finite number >= 0")
    if snap.exception is not None:
        _text("exception", snap.exception)
        snap.exception = clean_text(snap.exception, MAX_EXCEPTION_CHARS)
    _text("source", snap.source)
    snap.source = clean_text(snap.source, MAX_SOURCE_CHARS)
    for name, g in snap.groups.items():
        _name(f"groups[{name[:40]!r}]", name, MAX_GROUP_NAME_CHARS)
        _text(f"groups[{name!r}].desc", g.desc)
        if g.ranks is not None:
            if len(g.ranks) > MAX_WORLD_SIZE or not set(map(type, g.ranks)) <= {int}:
                raise SnapshotError(f"groups[{name!r}].ranks: not a list of at most {MAX_WORLD_SIZE} ints")
            if g.ranks and (min(g.ranks) < 0 or max(g.ranks) >= limit):
                raise SnapshotError(f"groups[{name!r}].ranks: a member is not in [0, {limit})")
        if len(g.desc) > MAX_GROUP_DESC_CHARS or "\x00" in g.desc:
            snap.groups[name] = replace(g, desc=clean_text(g.desc, MAX_GROUP_DESC_CHARS))
    stacks: dict[int, Stack] = {}
    threads = []
    for t in snap.thread_stacks:
        if type(t.thread_id) is not int or not INT64_MIN <= t.thread_id <= INT64_MAX:
            raise SnapshotError(f"thread_stacks: thread_id {t.thread_id!r} is not a 64-bit int")
        threads.append(
            ThreadStack(
                clean_text(_text("thread_stacks.thread_name", t.thread_name), MAX_THREAD_NAME_CHARS),
                t.thread_id,
                _stack(t.frames, stacks),
            )
        )
    snap.thread_stacks = tuple(threads)
    _check_entries(snap.entries, limit, stacks)


def _check_entries(entries: list[Entry], limit: int, stacks: dict[int, Stack]) -> None:
    if not entries:
        return
    for attr in _REQUIRED_INTS:
        if not _ints_ok(map(attrgetter(attr), entries), nullable=False):
            raise SnapshotError(f"entries.{attr}: {_bad_int(entries, attr)!r} is not an int in [0, 2^63)")
    for attr in _OPT_INTS:
        if not _ints_ok(map(attrgetter(attr), entries), nullable=True):
            raise SnapshotError(
                f"entries.{attr}: {_bad_int(entries, attr)!r} is not an int in [0, 2^63) or null"
            )
    rids = [e.record_id for e in entries]
    if len(set(rids)) != len(rids):
        seen: set[int] = set()
        dup = next(r for r in rids if r in seen or seen.add(r))  # type: ignore[func-returns-value]
        raise SnapshotError(f"entries.record_id: {dup} appears twice")
    peers = [e.peer for e in entries if e.peer is not None]
    if peers and (not set(map(type, peers)) <= {int} or min(peers) < 0 or max(peers) >= limit):
        raise SnapshotError(f"entries.peer: a peer is not in [0, {limit})")
    if not set(e.state for e in entries) <= _STATES:
        raise SnapshotError("entries.state: an unknown state")
    if not all(finite_ok(e.duration_ms) for e in entries):
        raise SnapshotError("entries.duration_ms: not a finite number >= 0")
    # What repeats (groups, ops, dtypes, sizes) is checked once per distinct value.
    for g in {e.group for e in entries}:
        _name("entries.group", g, MAX_GROUP_NAME_CHARS)
    for op in {e.raw_op for e in entries}:
        _name("entries.op", op, MAX_OP_CHARS, empty=True)
    for be in {e.backend for e in entries}:
        _name("entries.backend", be, MAX_BACKEND_CHARS, empty=True)
    for dt in set(
        chain.from_iterable(chain((e.input_dtypes for e in entries), (e.output_dtypes for e in entries)))
    ):
        _name("entries.dtypes", dt, MAX_DTYPE_CHARS, empty=True)
    sizes = {s for e in entries for s in chain(e.input_sizes, e.output_sizes)}
    dims = list(chain.from_iterable(sizes))
    if dims and (not set(map(type, dims)) <= {int} or min(dims) < INT64_MIN or max(dims) > INT64_MAX):
        raise SnapshotError("entries.sizes: a dimension is not a 64-bit int")
    for e in entries:
        if len(e.thread_name) > MAX_THREAD_NAME_CHARS or "\x00" in e.thread_name:
            e.thread_name = clean_text(_text("entries.thread_name", e.thread_name), MAX_THREAD_NAME_CHARS)
        if e.frames:
            e.frames = _stack(e.frames, stacks)


def _stack(frames: Stack, done: dict[int, Stack]) -> Stack:
    """A stack with storable frames (checked once per distinct stack object)."""
    got = done.get(id(frames))
    if got is not None:
        return got
    out = frames
    for f in frames:
        if (
            type(f.line) is not int
            or not INT64_MIN <= f.line <= INT64_MAX
            or type(f.name) is not str
            or type(f.filename) is not str
        ):
            raise SnapshotError(f"frames: {f!r} is not (name, filename, 64-bit line)")
        if (
            len(f.name) > MAX_FRAME_TEXT_CHARS
            or len(f.filename) > MAX_FRAME_TEXT_CHARS
            or "\x00" in f.name
            or "\x00" in f.filename
        ):
            out = tuple(
                Frame(
                    clean_text(x.name, MAX_FRAME_TEXT_CHARS),
                    clean_text(x.filename, MAX_FRAME_TEXT_CHARS),
                    x.line,
                )
                for x in frames
            )
            break
    done[id(frames)] = out
    return out


def _name(field: str, v: object, max_chars: int, *, empty: bool = False) -> None:
    problem = name_problem(v, max_chars, empty=empty)
    if problem is not None:
        raise SnapshotError(f"{field}: {problem}")


def _text(field: str, v: object) -> str:
    if type(v) is not str:
        raise SnapshotError(f"{field}: expected a string, got {type(v).__name__}")
    return v


def nixl_wire_problem(wire: dict[str, object]) -> str | None:
    """Why a NIXL wire sample cannot be stored (an integer outside 64 bits, a non-finite number, a
    name with a control character or over MAX_HOST_CHARS), or None when it can."""

    def walk(v: object, where: str) -> str | None:
        if type(v) is int:
            return None if INT64_MIN <= v <= INT64_MAX else f"{where}: {v} is not a 64-bit int"
        if type(v) is float:
            return None if finite_ok(abs(v)) else f"{where}: {v} is not finite"
        if type(v) is str:
            problem = name_problem(v, MAX_HOST_CHARS, empty=True)
            return None if problem is None else f"{where}: {problem}"
        if isinstance(v, dict):
            return next((p for k, x in v.items() if (p := walk(x, f"{where}.{k}"))), None)
        if isinstance(v, list | tuple):
            return next((p for i, x in enumerate(v) if (p := walk(x, f"{where}[{i}]"))), None)
        return None

    return walk(wire, "nixl")
