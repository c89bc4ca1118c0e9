"""What the server takes from a collector: every decoded value checked against what the store holds.

`flightdeck.wire` checks a batch's shape (types, lengths, indexes); this module checks its values
by the rules of the database columns and the analysis, before anything is written, so a value the
store cannot hold is a 422 with the reason instead of a 500 from the database. The limits and the
rules for names and free text are `flightdeck.limits`' (shared with the collector's own check of
each dump); `docs/input-limits.md` lists them for users.

A refused snapshot is refused alone: `decode_checked` decodes a batch, leaves the snapshots (and
NIXL samples) that break a rule out of it, and returns why each one was left out; the rest of the
batch is applied as usual (`flightdeck.server.ingest`). Checks run column by column on the wire
v2 entry columns (`min`, `max`, `set` over a list: one pass in C each), not entry by entry.

Names (job, host, group, op, backend, dtype, versions, thread names, frames) with a control
character (C0, DEL, C1: NUL, ESC of an ANSI escape sequence, ...) are refused: they are identities,
and an altered one would be another job or group. Free text (the exception message, the dump's
source path, a group's description) is neutralized instead: each control character except tab
and newline becomes U+FFFD, and over-long text is cut; the snapshot is kept.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence
from functools import partial
from itertools import chain
from operator import is_not
from typing import Any, cast

from flightdeck.limits import (
    CONTROL,
    CONTROL_TEXT,
    INT32_MAX,
    INT64_MAX,
    MAX_BACKEND,
    MAX_BATCH_ID,
    MAX_DIMS,
    MAX_DTYPE,
    MAX_EXCEPTION,
    MAX_FRAME_LINE,
    MAX_FRAME_TEXT,
    MAX_GROUP,
    MAX_GROUP_DESC,
    MAX_HOST,
    MAX_INTERVAL_S,
    MAX_JOB,
    MAX_OP,
    MAX_SOURCE,
    MAX_TENSORS,
    MAX_VERSION,
    MAX_WORLD_SIZE,
    name_problem,
    neutralize,
)
from flightdeck.records import RankConfig, Signature, Stack
from flightdeck.snapshot_check import nixl_problem
from flightdeck.wire import (
    MEMBER_LISTS,
    Batch,
    EntryColumns,
    Refusal,
    Snapshot,
    WireError,
    decode_batch,
)

_not_none = partial(is_not, None)


def _name(v: str | None, what: str, limit: int, *, empty: bool = True) -> None:
    """Refuse a name that is too long, empty where it may not be, or holds a control character."""
    if v is not None:
        problem = name_problem(v, limit, empty=empty)
        if problem is not None:
            raise WireError(f"{what}: {problem}")


def _names(values: Iterable[str], what: str, limit: int) -> None:
    """`_name` on distinct values (a column repeats a few names): one regex search over all of
    them in C, the names looked at one by one only when one is bad."""
    distinct = set(values)
    if not distinct:
        return
    if max(map(len, distinct)) > limit or CONTROL.search("".join(distinct)):
        for v in sorted(distinct):
            _name(v, what, limit)


def _int(v: int | None, what: str, lo: int, hi: int) -> None:
    if v is not None and not lo <= v <= hi:
        raise WireError(f"{what}: {v} is out of range ({lo}..{hi})")


def _int_column(col: Sequence[int | None] | None, what: str, lo: int, hi: int, *, nulls: bool) -> None:
    """Every value of an int column in lo..hi (two passes in C)."""
    if not col:
        return
    vals = cast("Sequence[int]", list(filter(_not_none, col)) if nulls else col)
    if not vals:
        return
    low, high = min(vals), max(vals)
    if low < lo or high > hi:
        raise WireError(f"{what}: {low if low < lo else high} is out of range ({lo}..{hi})")


def _frames_reason(st: Stack) -> str | None:
    for f in st:
        if len(f.name) > MAX_FRAME_TEXT or len(f.filename) > MAX_FRAME_TEXT:
            return f"a frame's name or file name is longer than {MAX_FRAME_TEXT} characters"
        if CONTROL.search(f.name) or CONTROL.search(f.filename):
            return "a frame's name or file name holds a control character"
        if not 0 <= f.line <= MAX_FRAME_LINE:
            return f"a frame's line {f.line} is out of range (0..{MAX_FRAME_LINE})"
    return None


def _sig_reason(sig: Signature) -> str | None:
    be, _op, raw_op, _p2p, isz, osz, idt, odt = sig
    try:
        _name(raw_op, "op", MAX_OP)
        _name(be, "backend", MAX_BACKEND)
        for sizes in (isz, osz):
            if len(sizes) > MAX_TENSORS:
                return f"more than {MAX_TENSORS} tensors"
            for dims in sizes:
                if len(dims) > MAX_DIMS:
                    return f"a tensor with more than {MAX_DIMS} dimensions"
                if dims and (min(dims) < 0 or max(dims) > INT64_MAX):
                    return f"a tensor size out of range (0..{INT64_MAX})"
        for dtypes in (idt, odt):
            if len(dtypes) > MAX_TENSORS:
                return f"more than {MAX_TENSORS} tensors"
            _names(dtypes, "dtype", MAX_DTYPE)
    except WireError as exc:
        return str(exc)
    return None


class BatchChecks:
    """The checks of one batch's snapshots, with what its shared tables (stacks, signatures) hold:
    a bad table item refuses the snapshots that use it, not the batch."""

    def __init__(self, stacks: list[Stack], sigs: list[Signature] | None) -> None:
        #: id(stack) -> why it is refused, for the bad ones (a stack is shared by identity).
        self.bad_stacks: dict[int, str] = {}
        for i, st in enumerate(stacks):
            why = _frames_reason(st)
            if why is not None:
                self.bad_stacks[id(st)] = f"batch.stacks[{i}]: {why}"
        #: index into the batch's sigs -> why it is refused.
        self.bad_sigs: dict[int, str] = {}
        for i, sig in enumerate(sigs or ()):
            why = _sig_reason(sig)
            if why is not None:
                self.bad_sigs[i] = f"batch.sigs[{i}]: {why}"
        self._sigs = sigs
        #: id(member tuple) -> (the tuple, its min, its max)
        self._member_bounds: dict[int, tuple[tuple[int, ...], int, int]] = {}

    def drop_bad_signatures(self) -> None:
        """After the snapshots are checked: the store writes a batch's whole signature table, so
        each bad signature is replaced by a good one (no snapshot left in the batch refers to it
        by index), or the table emptied when none is good (no snapshot left has entries)."""
        sigs = self._sigs
        if not self.bad_sigs or sigs is None:
            return
        good = next((sig for i, sig in enumerate(sigs) if i not in self.bad_sigs), None)
        if good is None:
            sigs.clear()
            return
        for i in self.bad_sigs:
            sigs[i] = good

    def __call__(self, s: Snapshot, where: str) -> None:
        """Check (and neutralize the free text of) one decoded snapshot; WireError says why not.

        The common case, a valid snapshot, is told by `_valid` in a few C passes; only a snapshot
        it doubts goes through `_explain`, the check field by field that names the bad value."""
        if not self._valid(s):
            self._explain(s, where)
        if s.exception is not None:
            s.exception = neutralize(s.exception, MAX_EXCEPTION)
        if s.source:
            s.source = neutralize(s.source, MAX_SOURCE)
        groups = s.groups
        descs = [g.desc for g in groups.values()]
        if descs and (CONTROL_TEXT.search("".join(descs)) or max(map(len, descs)) > MAX_GROUP_DESC):
            for name, g in groups.items():
                groups[name] = dataclasses.replace(g, desc=neutralize(g.desc, MAX_GROUP_DESC))
        if s.config is not None:
            s.config = _clean_config(s.config)

    def _valid(self, s: Snapshot) -> bool:
        """Whether every rule holds (False: maybe not; `_explain` decides and says why)."""
        ws = s.world_size
        top = MAX_WORLD_SIZE - 1 if ws is None else ws - 1
        if not (
            0 <= s.rank <= top
            and (ws is None or 1 <= ws <= MAX_WORLD_SIZE)
            and 0 <= s.attempt <= INT32_MAX
            and 0 <= s.snapshot_time_ns <= INT64_MAX
            and (s.local_rank is None or 0 <= s.local_rank < MAX_WORLD_SIZE)
            and (s.pid is None or 0 <= s.pid <= INT64_MAX)
            and (s.oldest_record_id is None or 0 <= s.oldest_record_id <= INT64_MAX)
            # NaN fails every comparison; infinity the upper bound.
            and (s.interval_s is None or 0 <= s.interval_s <= MAX_INTERVAL_S)
        ):
            return False
        job, host, tv, be = s.job, s.host or "", s.torch_version or "", s.backend or ""
        if not (
            0 < len(job) <= MAX_JOB
            and len(host) <= MAX_HOST
            and len(tv) <= MAX_VERSION
            and len(be) <= MAX_BACKEND
            and len(s.version) <= MAX_VERSION
        ):
            return False
        names = [job, host, tv, be, s.version]
        groups = s.groups
        if groups:
            if "" in groups or max(map(len, groups)) > MAX_GROUP:
                return False
            names.extend(groups)
            bounds = self._member_bounds
            for g in groups.values():
                r = g.ranks
                if r:
                    # The snapshots of a batch share one tuple per distinct member list (the
                    # decoder's memo, or `MEMBER_LISTS` for runs, which knows its bounds), so
                    # its bounds are taken once per batch at most. The entry holds the tuple:
                    # its id is not reused while this batch is checked.
                    b = bounds.get(id(r))
                    if b is None:
                        lo_hi = MEMBER_LISTS.bounds(r) or (min(r), max(r))
                        b = bounds[id(r)] = (r, *lo_hi)
                    if len(r) > MAX_WORLD_SIZE or b[1] < 0 or b[2] > top:
                        return False
        for t in s.thread_stacks:
            if not 0 <= t.thread_id <= INT64_MAX or len(t.thread_name) > MAX_FRAME_TEXT:
                return False
            if t.frames and id(t.frames) in self.bad_stacks:
                return False
            names.append(t.thread_name)
        c = s.columns
        if c is None:
            if s.entries:
                return False  # wire v1: checked the slow way
        elif c.n:
            cols = c.cols
            rid = cols["rid"]
            wide = (rid, cols["seq"], cols["p2p"], cols["opid"], cols["tc"])
            if min(map(min, wide)) < 0 or max(map(max, wide)) > INT64_MAX or len(set(rid)) != c.n:
                return False
            opt = [col for key in ("ts", "td", "to") if (col := cols.get(key))]
            if opt:
                vals = list(filter(_not_none, chain.from_iterable(opt)))
                if vals and (min(vals) < 0 or max(vals) > INT64_MAX):
                    return False
            peer = cols.get("peer")
            if peer:
                vals = list(filter(_not_none, peer))
                if vals and (min(vals) < 0 or max(vals) >= MAX_WORLD_SIZE):
                    return False
            dur = cols.get("dur")
            if dur:
                fvals = list(filter(_not_none, dur))
                if fvals and not (min(fvals) >= 0 and max(fvals) < math.inf):
                    return False
            distinct = set(cols["g"])
            if max(map(len, distinct)) > MAX_GROUP:
                return False
            names.extend(distinct)
            thr = cols.get("thr")
            if thr:
                distinct = set(thr)
                if max(map(len, distinct)) > MAX_FRAME_TEXT:
                    return False
                names.extend(distinct)
            if self.bad_sigs and not self.bad_sigs.keys().isdisjoint(c.sig):
                return False
            if self.bad_stacks and c.stk is not None:
                bad = self.bad_stacks
                if any(st and id(st) in bad for st in c.frames()):
                    return False
        return CONTROL.search("".join(names)) is None

    def _explain(self, s: Snapshot, where: str) -> None:
        """The rules one by one: raises WireError naming the first bad value."""
        _name(s.job, f"{where}.job", MAX_JOB, empty=False)
        _int(s.attempt, f"{where}.attempt", 0, INT32_MAX)
        _int(s.world_size, f"{where}.world_size", 1, MAX_WORLD_SIZE)
        top = (s.world_size or MAX_WORLD_SIZE) - 1
        if s.world_size is not None and s.rank > top:
            raise WireError(f"{where}.rank: {s.rank} is not below world_size {s.world_size}")
        _int(s.rank, f"{where}.rank", 0, MAX_WORLD_SIZE - 1)
        _int(s.local_rank, f"{where}.local_rank", 0, MAX_WORLD_SIZE - 1)
        _int(s.pid, f"{where}.pid", 0, INT64_MAX)
        _int(s.snapshot_time_ns, f"{where}.snapshot_time_ns", 0, INT64_MAX)
        _int(s.oldest_record_id, f"{where}.oldest_record_id", 0, INT64_MAX)
        if s.interval_s is not None and not (
            math.isfinite(s.interval_s) and 0 <= s.interval_s <= MAX_INTERVAL_S
        ):
            raise WireError(f"{where}.interval_s: {s.interval_s} is out of range (0..{MAX_INTERVAL_S:.0f})")
        _name(s.host, f"{where}.host", MAX_HOST)
        _name(s.torch_version, f"{where}.torch_version", MAX_VERSION)
        _name(s.backend, f"{where}.backend", MAX_BACKEND)
        _name(s.version, f"{where}.version", MAX_VERSION)
        for name, g in s.groups.items():
            gw = f"{where}.groups[{name[:40]!r}]"
            _name(name, gw, MAX_GROUP, empty=False)
            if g.ranks:
                if len(g.ranks) > MAX_WORLD_SIZE:
                    raise WireError(f"{gw}.ranks: more than {MAX_WORLD_SIZE} members")
                _int_column(g.ranks, f"{gw}.ranks", 0, top, nulls=False)
        for j, t in enumerate(s.thread_stacks):
            tw = f"{where}.thread_stacks[{j}]"
            _name(t.thread_name, f"{tw}.thread_name", MAX_FRAME_TEXT)
            _int(t.thread_id, f"{tw}.thread_id", 0, INT64_MAX)
            why = self.bad_stacks.get(id(t.frames)) if t.frames else None
            if why is not None:
                raise WireError(f"{tw}.stk: {why}")
        self._entries(s, where)

    def _entries(self, s: Snapshot, where: str) -> None:
        c = s.columns
        if c is None:
            if not s.entries:
                return
            c = EntryColumns.of(s.entries)  # wire v1: built once here (v1 is the slow format)
            bad_sigs = {i: why for i, sig in enumerate(c.sigs) if (why := _sig_reason(sig)) is not None}
        else:
            bad_sigs = self.bad_sigs
        if not c.n:
            return
        ew = f"{where}.entries"
        cols = c.cols
        rid = cols["rid"]
        _int_column(rid, f"{ew}.rid", 0, INT64_MAX, nulls=False)
        if len(set(rid)) != c.n:
            seen: set[int] = set()
            dup = next(r for r in rid if r in seen or seen.add(r))  # type: ignore[func-returns-value]
            raise WireError(f"{ew}.rid: record id {dup} is repeated in the snapshot")
        for key in ("seq", "p2p", "opid", "tc"):
            _int_column(cols[key], f"{ew}.{key}", 0, INT64_MAX, nulls=False)
        for key in ("ts", "td", "to"):
            _int_column(cols.get(key), f"{ew}.{key}", 0, INT64_MAX, nulls=True)
        _int_column(cols.get("peer"), f"{ew}.peer", 0, MAX_WORLD_SIZE - 1, nulls=True)
        dur = cols.get("dur")
        if dur:
            vals = list(filter(_not_none, dur))
            if vals and not (min(vals) >= 0 and math.isfinite(max(vals))):
                raise WireError(f"{ew}.dur: durations must be finite and >= 0")
        _names(cols["g"], f"{ew}.g", MAX_GROUP)
        thr = cols.get("thr")
        if thr:
            _names(thr, f"{ew}.thr", MAX_FRAME_TEXT)
        if bad_sigs:
            used = bad_sigs.keys() & set(c.sig)
            if used:
                raise WireError(f"{ew}.sig: {bad_sigs[min(used)]}")
        if self.bad_stacks and c.stk is not None:
            for st in c.frames():
                why = self.bad_stacks.get(id(st)) if st else None
                if why is not None:
                    raise WireError(f"{ew}.stk: {why}")


def _clean_config(c: RankConfig) -> RankConfig:
    """A configuration report is read leniently (`config_from_dict` cuts, never refuses): its
    strings are neutralized here too, and what the store copies into columns is cut to them."""
    changes: dict[str, Any] = {}
    for f in dataclasses.fields(c):
        v = getattr(c, f.name)
        if isinstance(v, str):
            clean = neutralize(v, MAX_VERSION if f.name == "torch_version" else 512)
            if clean != v:
                changes[f.name] = clean
    if any(CONTROL.search(k + v) for k, v in c.env):
        changes["env"] = tuple((neutralize(k, 128), neutralize(v, 512)) for k, v in c.env)
    if any(CONTROL.search(g.name + g.desc + (g.backend or "")) for g in c.groups):
        changes["groups"] = tuple(
            dataclasses.replace(
                g,
                name=neutralize(g.name, MAX_GROUP),
                desc=neutralize(g.desc, 512),
                backend=None if g.backend is None else neutralize(g.backend, MAX_BACKEND),
            )
            for g in c.groups
        )
    return dataclasses.replace(c, **changes) if changes else c


def check_envelope(batch: Batch) -> None:
    """The batch's own fields (a bad one refuses the whole batch)."""
    _name(batch.batch_id, "batch.batch_id", MAX_BATCH_ID, empty=False)
    _name(batch.collector_host, "batch.collector.host", MAX_HOST)
    _name(batch.collector_version, "batch.collector.version", MAX_VERSION)
    _int(batch.sent_at_ns, "batch.sent_at_ns", 0, INT64_MAX)


def check_nixl(d: dict[str, Any], where: str) -> None:
    """One NIXL sample (wire dict): decodable, and its stored fields within their columns."""
    problem = nixl_problem(d)
    if problem is not None:
        raise WireError(f"{where}: {problem}")


def decode_checked(doc: object) -> tuple[Batch, list[Refusal]]:
    """Decode a batch and check its values: the batch holds the snapshots and NIXL samples that
    pass, the list says which were left out and why. WireError when the batch itself is bad."""
    refused: list[Refusal] = []
    made: list[BatchChecks] = []

    def checks(stacks: list[Stack], sigs: list[Signature] | None) -> BatchChecks:
        made.append(BatchChecks(stacks, sigs))
        return made[-1]

    batch = decode_batch(doc, checks=checks, refused=refused)
    for c in made:
        c.drop_bad_signatures()
    check_envelope(batch)
    if batch.nixl:
        kept = []
        for i, d in enumerate(batch.nixl):
            try:
                check_nixl(d, f"batch.nixl[{i}]")
            except WireError as exc:
                host = d.get("host")
                refused.append(Refusal(i, str(exc), nixl=True, host=host if isinstance(host, str) else None))
                continue
            kept.append(d)
        batch.nixl = kept
    return batch, refused
