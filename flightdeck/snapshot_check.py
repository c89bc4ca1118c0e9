"""Check one snapshot against `flightdeck.limits` before it joins a batch (or is stored).

`check_snapshot` refuses what the server's validation would refuse, by the same rules
(`flightdeck.limits`, shared with `flightdeck.server.validation`): an integer outside its column, a
negative id or time, a rank outside its world or outside every process group its dump lists, a world
larger than MAX_WORLD_SIZE, a record id twice, a name (job, host, group, op, backend, dtype, version,
thread or frame) with a control character or too long. It raises a `SnapshotError` that names the
field, and normalizes in place what is shown but identifies nothing: free text (exception, source,
group description) neutralized and cut, thread names cut to the stored width, frame text cut to its
limit. The collector runs it per file, so one bad file is set aside alone and never takes the rest of
a batch down with it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from itertools import chain
from operator import attrgetter
from typing import Any

from flightdeck import limits as lim
from flightdeck.records import Entry, Frame, Stack, ThreadStack
from flightdeck.wire import Snapshot


class SnapshotError(ValueError):
    """A snapshot the store cannot hold; the message names the field and why."""


_STATES = frozenset({"scheduled", "started", "completed"})
#: Entry fields that are ids, counts or times: ints in [0, lim.INT64_MAX] (None allowed: `_OPT`).
_REQUIRED_INTS = ("record_id", "collective_seq_id", "p2p_seq_id", "op_id", "time_created_ns")
_OPT_INTS = ("time_started_ns", "time_completed_ns", "timeout_ms")


def _ints_ok(values: Iterable[object], *, nullable: bool) -> bool:
    """Whether every value is an int in [0, lim.INT64_MAX] (or None when `nullable`); a few C passes."""
    vals = [v for v in values if v is not None] if nullable else list(values)
    if not vals:
        return True
    if not set(map(type, vals)) <= {int}:
        return False
    ints: list[int] = vals  # type: ignore[assignment]
    return min(ints) >= 0 and max(ints) <= lim.INT64_MAX


def _bad_int(entries: list[Entry], attr: str) -> object:
    get = attrgetter(attr)
    return next(
        v for v in map(get, entries) if v is not None and not lim.int_ok(v)
    )  # called only when one is bad


def check_snapshot(snap: Snapshot) -> None:
    """Refuse (SnapshotError) or normalize `snap` in place; see the module docstring."""
    _name("job", snap.job, lim.MAX_JOB)
    if not lim.int_ok(snap.attempt, 0, lim.INT32_MAX):
        raise SnapshotError(f"attempt: {snap.attempt!r} is not an int in [0, 2^31)")
    if snap.world_size is not None and not lim.int_ok(snap.world_size, 1, lim.MAX_WORLD_SIZE):
        raise SnapshotError(f"world_size: {snap.world_size!r} is not in [1, {lim.MAX_WORLD_SIZE}]")
    limit = snap.world_size or lim.MAX_WORLD_SIZE
    if not lim.int_ok(snap.rank, 0, limit - 1):
        raise SnapshotError(f"rank: {snap.rank!r} is not in [0, {limit})")
    if not lim.opt_int_ok(snap.local_rank, 0, lim.MAX_WORLD_SIZE - 1):
        raise SnapshotError(f"local_rank: {snap.local_rank!r} is not in [0, {lim.MAX_WORLD_SIZE})")
    if not lim.int_ok(snap.snapshot_time_ns):
        raise SnapshotError(f"snapshot_time_ns: {snap.snapshot_time_ns!r} is not an int in [0, 2^63)")
    for attr in ("pid", "oldest_record_id"):
        if not lim.opt_int_ok(getattr(snap, attr)):
            raise SnapshotError(f"{attr}: {getattr(snap, attr)!r} is not an int in [0, 2^63) or null")
    if snap.host is not None:
        _name("host", snap.host, lim.MAX_HOST, empty=True)
    _name("kind", snap.kind, lim.MAX_KIND)
    for attr, n in (
        ("torch_version", lim.MAX_VERSION),
        ("backend", lim.MAX_BACKEND),
        ("version", lim.MAX_VERSION),
    ):
        v = getattr(snap, attr)
        if v is not None:
            _name(attr, v, n, empty=True)
    if not lim.interval_ok(snap.interval_s):
        raise SnapshotError(f"interval_s: {snap.interval_s!r} is not a number in [0, a year]")
    if snap.exception is not None:
        snap.exception = lim.neutralize(_text("exception", snap.exception), lim.MAX_EXCEPTION)
    snap.source = lim.neutralize(_text("source", snap.source), lim.MAX_SOURCE)
    members = []
    for name, g in snap.groups.items():
        _name(f"groups[{name[:40]!r}]", name, lim.MAX_GROUP)
        if g.ranks is not None:
            if len(g.ranks) > lim.MAX_WORLD_SIZE or not set(map(type, g.ranks)) <= {int}:
                raise SnapshotError(
                    f"groups[{name!r}].ranks: not a list of at most {lim.MAX_WORLD_SIZE} ints"
                )
            if g.ranks and (min(g.ranks) < 0 or max(g.ranks) >= limit):
                raise SnapshotError(f"groups[{name!r}].ranks: a member is not in [0, {limit})")
            if g.ranks:
                members.append(g.ranks)
        desc = lim.neutralize(_text(f"groups[{name!r}].desc", g.desc), lim.MAX_GROUP_DESC)
        if desc != g.desc:
            snap.groups[name] = replace(g, desc=desc)
    stacks: dict[int, Stack] = {}
    threads = []
    for t in snap.thread_stacks:
        if not lim.int_ok(t.thread_id):
            raise SnapshotError(f"thread_stacks: thread_id {t.thread_id!r} is not an int in [0, 2^63)")
        threads.append(
            ThreadStack(_thread_name("thread_stacks", t.thread_name), t.thread_id, _stack(t.frames, stacks))
        )
    snap.thread_stacks = tuple(threads)
    _check_entries(snap.entries, limit, stacks)
    # Last, once every value is known storable. Every rank is a member of the default group, which
    # its dump lists: a rank in none of the groups whose members are known is a dump copied under
    # another rank's file name.
    if members and not any(snap.rank in m for m in members):
        raise SnapshotError(
            f"rank: {snap.rank} is a member of none of its dump's process groups "
            "(a dump copied under another rank's file name?)"
        )


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
    if not all(lim.duration_ok(e.duration_ms) for e in entries):
        raise SnapshotError("entries.duration_ms: not a finite number >= 0")
    # What repeats (groups, ops, dtypes, sizes) is checked once per distinct value.
    for g in {e.group for e in entries}:
        _name("entries.group", g, lim.MAX_GROUP)
    for op in {e.raw_op for e in entries}:
        _name("entries.op", op, lim.MAX_OP, empty=True)
    for be in {e.backend for e in entries}:
        _name("entries.backend", be, lim.MAX_BACKEND, empty=True)
    for dt in set(
        chain.from_iterable(chain((e.input_dtypes for e in entries), (e.output_dtypes for e in entries)))
    ):
        _name("entries.dtypes", dt, lim.MAX_DTYPE, empty=True)
    tensor_lists = chain.from_iterable(
        map(len, map(attrgetter(attr), entries))
        for attr in ("input_sizes", "output_sizes", "input_dtypes", "output_dtypes")
    )
    if max(tensor_lists) > lim.MAX_TENSORS:
        raise SnapshotError(f"entries.sizes: more than {lim.MAX_TENSORS} tensors in an entry")
    sizes = {s for e in entries for s in chain(e.input_sizes, e.output_sizes)}
    if sizes and max(map(len, sizes)) > lim.MAX_DIMS:
        raise SnapshotError(f"entries.sizes: a tensor with more than {lim.MAX_DIMS} dimensions")
    dims = list(chain.from_iterable(sizes))
    if dims and (not set(map(type, dims)) <= {int} or min(dims) < 0 or max(dims) > lim.INT64_MAX):
        raise SnapshotError("entries.sizes: a dimension is not an int in [0, 2^63)")
    # Thread names repeat (a few threads per rank): checked once per distinct name.
    names = {e.thread_name for e in entries}
    if max(map(len, names)) > lim.MAX_THREAD or lim.CONTROL.search("".join(names)):
        stored = {n: _thread_name("entries", n) for n in names}
        for e in entries:
            e.thread_name = stored[e.thread_name]
    for e in entries:
        if e.frames:
            e.frames = _stack(e.frames, stacks)


def _thread_name(where: str, v: object) -> str:
    """A thread name as stored: no control character (refused), cut to lim.MAX_THREAD (the column)."""
    _name(f"{where}.thread_name", v, lim.MAX_FRAME_TEXT, empty=True)
    name: str = v  # type: ignore[assignment]
    return name[: lim.MAX_THREAD]


def _stack(frames: Stack, done: dict[int, Stack]) -> Stack:
    """A stack with storable frames (checked once per distinct stack object): a control character
    is refused, text over lim.MAX_FRAME_TEXT cut."""
    got = done.get(id(frames))
    if got is not None:
        return got
    out = frames
    for f in frames:
        if (
            not lim.int_ok(f.line, 0, lim.MAX_FRAME_LINE)
            or type(f.name) is not str
            or type(f.filename) is not str
        ):
            raise SnapshotError(f"frames: {f!r} is not (name, filename, line in [0, 2^31))")
        if lim.CONTROL.search(f.name) or lim.CONTROL.search(f.filename):
            raise SnapshotError(f"frames: {f.name[:80]!r} holds a control character")
        if len(f.name) > lim.MAX_FRAME_TEXT or len(f.filename) > lim.MAX_FRAME_TEXT:
            out = tuple(
                Frame(x.name[: lim.MAX_FRAME_TEXT], x.filename[: lim.MAX_FRAME_TEXT], x.line) for x in frames
            )
    done[id(frames)] = out
    return out


def _name(field: str, v: object, max_chars: int, *, empty: bool = False) -> None:
    problem = lim.name_problem(v, max_chars, empty=empty)
    if problem is not None:
        raise SnapshotError(f"{field}: {problem}")


def _text(field: str, v: object) -> str:
    if type(v) is not str:
        raise SnapshotError(f"{field}: expected a string, got {type(v).__name__}")
    return v


def nixl_problem(wire: dict[str, Any]) -> str | None:
    """Why a NIXL wire sample cannot be stored, or None when it can: the rules the server's
    validation applies to it (decodable; its names and stored integers within their columns)."""
    from flightdeck.nixl_records import NixlSample

    try:
        smp = NixlSample.from_wire(wire)
    except ValueError as exc:
        return str(exc)
    for field, v, n, empty in (
        ("host", smp.host, lim.MAX_HOST, False),
        ("agent", smp.agent, lim.MAX_AGENT, False),
        ("run", smp.run, lim.MAX_RUN, True),
    ):
        problem = lim.name_problem(v, n, empty=empty)
        if problem is not None:
            return f"{field}: {problem}"
    for field, iv, high in (
        ("pid", smp.pid, lim.INT64_MAX),
        ("local_rank", smp.local_rank, lim.MAX_WORLD_SIZE - 1),
        ("read_time_ns", smp.read_time_ns, lim.INT64_MAX),
    ):
        if not lim.opt_int_ok(iv, 0, high):
            return f"{field}: {iv} is out of range (0..{high})"
    return None


def nixl_wire_problem(wire: dict[str, object]) -> str | None:
    """Why the collector cannot send a NIXL wire sample: what `nixl_problem` says, or any integer in
    it outside 64 bits, a non-finite number, a string with a control character or over lim.MAX_HOST."""

    def walk(v: object, where: str) -> str | None:
        if type(v) is int:
            return None if lim.INT64_MIN <= v <= lim.INT64_MAX else f"{where}: {v} is not a 64-bit int"
        if type(v) is float:
            return None if lim.duration_ok(abs(v)) else f"{where}: {v} is not finite"
        if type(v) is str:
            problem = lim.name_problem(v, lim.MAX_HOST, empty=True)
            return None if problem is None else f"{where}: {problem}"
        if isinstance(v, dict):
            return next((p for k, x in v.items() if (p := walk(x, f"{where}.{k}"))), None)
        if isinstance(v, list | tuple):
            return next((p for i, x in enumerate(v) if (p := walk(x, f"{where}[{i}]"))), None)
        return None

    problem = walk(wire, "nixl")
    if problem is None:
        why = nixl_problem(wire)
        problem = None if why is None else f"nixl: {why}"
    return problem
