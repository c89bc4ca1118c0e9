"""Per-rank summaries: the compact view of one rank's ring buffer that the diagnosis works on.

A summary keeps, per process group, the sequence ids the rank holds, a 64-bit fingerprint of each
collective's comparable signature (op, sizes, dtypes) and its enqueue time, plus the last few
entries in full (with frames). That is a few bytes per entry instead of a few hundred, so 1,024
ranks x 2,000 entries fit in memory, compare fast (identical windows compare as one hash), and
can be built next to the file (in a worker process, in the collector) and shipped as plain data.

One module over 500 lines: the summary's shape and the three ways it is built (from records,
from the reader's columns, from signature columns) and folded into (`add_entries`), which must
agree value for value (tests/test_reader_columns.py compares them); apart, each would need the
others' private invariants.
"""

from __future__ import annotations

import hashlib
from array import array
from bisect import bisect_left
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from itertools import compress, islice
from operator import lt, not_
from typing import Protocol

from flightdeck.analysis.packed import Column
from flightdeck.records import (
    COALESCED_END_OPS,
    Entry,
    GroupInfo,
    Progress,
    RankConfig,
    RankDump,
    Stack,
    ThreadStack,
    meta_kwargs,
    with_progress_of,
)

#: Entries kept in full per group (the frontier: where each rank is and what it waits on).
TAIL = 4
#: all_to_all element totals kept per group (the most recent ones), for the balance check.
TOTALS_KEPT = 64
_INT64 = 1 << 63
_BAD_VALUES = "entries with a sequence id or time outside 64 bits were skipped"

#: Canonical ops whose per-rank sizes may legitimately differ (uneven splits, root-only buffers).
_SIZES_FREE = frozenset({"all_to_all", "all_to_allv"})
_INPUT_ONLY = frozenset({"gather"})
_OUTPUT_ONLY = frozenset({"scatter"})

#: The part of an entry's `flightdeck.records.Signature` that must agree across the ranks of one
#: collective: (canonical op, input sizes, output sizes, input dtypes, output dtypes), the sizes
#: an op may legitimately vary left out (see `signature_of`). A plain tuple: its repr is what
#: `fingerprint` hashes.
Comparable = tuple[
    str, tuple[tuple[int, ...], ...], tuple[tuple[int, ...], ...], tuple[str, ...], tuple[str, ...]
]


def signature(e: Entry) -> Comparable:
    """The part of an entry that must agree across the ranks of one collective."""
    return signature_of(e.op, e.input_sizes, e.output_sizes, e.input_dtypes, e.output_dtypes)


def signature_of(
    op: str,
    ins: tuple[tuple[int, ...], ...],
    outs: tuple[tuple[int, ...], ...],
    in_dtypes: tuple[str, ...],
    out_dtypes: tuple[str, ...],
) -> Comparable:
    """`signature` of the entry with this canonical op, these sizes and these dtypes."""
    if op in _SIZES_FREE:
        ins, outs = (), ()
    elif op in _INPUT_ONLY:
        outs = ()
    elif op in _OUTPUT_ONLY:
        ins = ()
    return (op, ins, outs, in_dtypes, out_dtypes)


_fp_cache: dict[Comparable, int] = {}


def fingerprint(sig: Comparable) -> int:
    """A stable 63-bit fingerprint of a signature (same value in every process, unlike hash())."""
    fp = _fp_cache.get(sig)
    if fp is None:
        fp = int.from_bytes(hashlib.blake2b(repr(sig).encode(), digest_size=8).digest(), "big") >> 1
        if len(_fp_cache) < 100_000:
            _fp_cache[sig] = fp
    return fp


@dataclass(slots=True)
class GroupTrack:
    """What one rank holds of one process group's collectives, oldest first."""

    # Machine-integer arrays, not lists: 8 bytes a value instead of ~36 (a pointer and an int
    # object), and nothing for the cyclic garbage collector to walk. A live server holds these
    # for every rank and group of every job, thousands of collectives deep, packed further
    # (`flightdeck.analysis.packed.pack_track`: the same values, about 5 bytes a collective).
    seqs: array[int] | Column = field(default_factory=lambda: array("q"))
    fps: array[int] | Column = field(default_factory=lambda: array("q"))
    #: Enqueue times of the newest `len(created_ns)` collectives held, aligned with the END of
    #: `seqs`: `created_ns[k]` is the time of `seqs[len(seqs) - len(created_ns) + k]`. A summary
    #: built from files holds every one; a live server keeps only the newest few hundred (they
    #: were half of a job's memory, and the diagnosis compares times only over the newest
    #: collectives: `flightdeck.server.live.fold.bound_track`). Read them with `created_at`,
    #: `created_between` and `timed_from`, which do the alignment.
    created_ns: array[int] | Column = field(default_factory=lambda: array("q"))
    #: The last TAIL collective entries in full, oldest first.
    tail: list[Entry] = field(default_factory=list)
    #: Point-to-point entries (NCCL records them; gloo does not), oldest first.
    p2p: list[Entry] = field(default_factory=list)
    #: Each collective's `op_id` (the group's work counter, which p2p ops advance too, recorded
    #: or not), aligned with `seqs` while as long as it; readers check the lengths match.
    op_ids: array[int] | Column = field(default_factory=lambda: array("q"))
    #: seq -> (input elements, output elements) of the recent all_to_all entries, whose splits
    #: may differ per rank (so their sizes are left out of the fingerprint).
    totals: dict[int, tuple[int, int]] = field(default_factory=dict)

    @property
    def last_seq(self) -> int:
        """Highest collective sequence id held (0 when none)."""
        seqs = self.seqs
        if isinstance(seqs, Column):
            return seqs.last(0)
        return seqs[-1] if seqs else 0

    @property
    def first_seq(self) -> int:
        """Lowest collective sequence id held (0 when none)."""
        seqs = self.seqs
        if isinstance(seqs, Column):
            return seqs.first(0)
        return seqs[0] if seqs else 0

    def created_at(self, i: int) -> int | None:
        """Enqueue time of the collective at position `i` of `seqs` (0 <= i < len(seqs)), None when
        its time is not kept."""
        k = i - (len(self.seqs) - len(self.created_ns))
        return self.created_ns[k] if k >= 0 else None

    def created_between(self, i: int, j: int) -> array[int] | None:
        """Enqueue times of the collectives at positions i..j-1 of `seqs` (0 <= i <= j <=
        len(seqs)), None when any of them is not kept."""
        off = len(self.seqs) - len(self.created_ns)
        if i < off:
            return None
        return self.created_ns[i - off : j - off]

    @property
    def timed_from(self) -> int | None:
        """The oldest sequence id whose enqueue time is kept (None when none is)."""
        kept = len(self.created_ns)
        return self.seqs[len(self.seqs) - kept] if kept else None

    def index_of(self, seq: int) -> int | None:
        """Position of `seq` in this track, or None when the rank does not hold it."""
        if isinstance(self.seqs, Column):
            return self.seqs.find(seq)  # a packed track (a live server's): one call
        if not self.seqs or seq < self.seqs[0] or seq > self.seqs[-1]:
            return None
        # Sequence ids are contiguous within a group unless the ring dropped some; try the fast path.
        guess = seq - self.seqs[0]
        if guess < len(self.seqs) and self.seqs[guess] == seq:
            return guess
        lo, hi = 0, len(self.seqs)
        while lo < hi:
            mid = (lo + hi) // 2
            if self.seqs[mid] < seq:
                lo = mid + 1
            else:
                hi = mid
        return lo if lo < len(self.seqs) and self.seqs[lo] == seq else None


@dataclass(slots=True)
class RankSummary:
    """Everything the diagnosis needs from one rank: its metadata (the fields of
    `flightdeck.records.RankMeta`, copied in and out with `meta_kwargs`, `meta_of` and
    `set_meta`), its groups, and per group the track of what it recorded."""

    rank: int
    source: str
    job: str | None = None
    attempt: int = 0
    world_size: int | None = None
    local_rank: int | None = None
    host: str | None = None
    pid: int | None = None
    torch_version: str | None = None
    backend: str | None = None
    version: str = ""
    snapshot_time_ns: int | None = None
    #: Whether `snapshot_time_ns` is only a file's mtime (see `RankDump`).
    snapshot_time_from_file: bool = False
    kind: str = "dump"
    interval_s: float | None = None
    exception: str | None = None
    wrapped: bool = False
    groups: dict[str, GroupInfo] = field(default_factory=dict)
    tracks: dict[str, GroupTrack] = field(default_factory=dict)
    #: fingerprint -> signature, for the fingerprints this rank uses.
    sigs: dict[int, Comparable] = field(default_factory=dict)
    #: fingerprint -> the most recent stack seen for it (where in the code this kind of call is).
    sig_frames: dict[int, Stack] = field(default_factory=dict)
    thread_stacks: tuple[ThreadStack, ...] = ()
    warnings: tuple[str, ...] = ()
    #: The rank's configuration report, when its agent wrote one.
    config: RankConfig | None = None
    #: The dump's `pg_status` by group name (see `RankDump.pg_status`).
    pg_status: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    #: Whether its main thread is working (CPU time, stack), from its newest snapshot that said.
    progress: Progress | None = None

    def group_desc(self, group: str) -> str:
        """The group's description as this rank knows it ("" when unknown)."""
        info = self.groups.get(group)
        return info.desc if info else ""

    def entry_at(self, group: str, seq: int) -> Entry | None:
        """The full entry at (group, seq) when it is among the kept tail entries."""
        track = self.tracks.get(group)
        if track is None:
            return None
        for e in track.tail:
            if e.collective_seq_id == seq:
                return e
        return None


class EntryColumns(Protocol):
    """A run of entries as columns, for `add_columns`: positions in record-id order (record ids
    strictly increase), each column holding what the `Entry` at that position holds. The reader's
    `flightdeck.readers.fr.columns.EntryColumns` is one."""

    @property
    def record_id(self) -> Sequence[int]: ...
    @property
    def group(self) -> Sequence[str]: ...
    @property
    def collective_seq_id(self) -> Sequence[int]: ...
    @property
    def op_id(self) -> Sequence[int]: ...
    @property
    def op(self) -> Sequence[str]: ...
    @property
    def is_p2p(self) -> Sequence[bool]: ...
    @property
    def time_created_ns(self) -> Sequence[int]: ...
    @property
    def input_sizes(self) -> Sequence[tuple[tuple[int, ...], ...]]: ...
    @property
    def output_sizes(self) -> Sequence[tuple[tuple[int, ...], ...]]: ...
    @property
    def input_dtypes(self) -> Sequence[tuple[str, ...]]: ...
    @property
    def output_dtypes(self) -> Sequence[tuple[str, ...]]: ...
    @property
    def has_frames(self) -> Sequence[bool]: ...

    def entry(self, i: int) -> Entry:
        """The whole entry at position `i`."""
        ...

    def frames(self, i: int) -> Stack:
        """The stack of the entry at position `i`."""
        ...


class SignatureColumns(Protocol):
    """A run of entries as the reader's `flightdeck.readers.fr.signatures.SignatureColumns` gives them,
    for `add_signatures`: positions in record-id order (record ids strictly increase), 64-bit
    columns, each entry's signature as the position of the first entry with the same one."""

    @property
    def collective_seq_id(self) -> array[int]: ...
    @property
    def time_created_ns(self) -> array[int]: ...
    @property
    def op_id(self) -> array[int]: ...
    @property
    def groups(self) -> Sequence[str]: ...
    @property
    def group_of(self) -> Sequence[int] | None: ...
    @property
    def is_p2p(self) -> Sequence[bool] | None: ...
    @property
    def key_of(self) -> Sequence[int]: ...
    @property
    def keys(self) -> Mapping[int, Comparable]: ...
    @property
    def framed(self) -> Sequence[int]: ...
    @property
    def seq_increasing(self) -> bool: ...
    def by_key(self, values: dict[int, int]) -> array[int]:
        """`values[k]` of each entry's signature key `k`, as a 64-bit array."""
        ...

    def __len__(self) -> int: ...

    def entry(self, i: int) -> Entry:
        """The whole entry at position `i`."""
        ...

    def frames(self, i: int) -> Stack:
        """The stack of the entry at position `i`."""
        ...


def summarize(
    dump: RankDump, columns: EntryColumns | None = None, *, signatures: SignatureColumns | None = None
) -> RankSummary:
    """Build the summary of one rank's (merged) dump; with `columns` or `signatures`, of the dump
    whose entries are those columns (`dump.entries` is then not read)."""
    s = RankSummary(
        **meta_kwargs(dump),
        snapshot_time_from_file=dump.snapshot_time_from_file,
        wrapped=dump.wrapped,
        groups=dict(dump.groups),
        thread_stacks=dump.thread_stacks,
        warnings=dump.warnings,
        config=dump.config,
        pg_status=dict(dump.pg_status),
        progress=dump.progress,
    )
    if signatures is not None:
        add_signatures(s, signatures)
    elif columns is not None:
        add_columns(s, columns)
    else:
        add_entries(s, dump.entries)
    return s


def _first_of_each(positions: Iterable[int], fps: Sequence[int], distinct: int) -> dict[int, int]:
    """fingerprint -> the first of `positions` that has it, in the order they come; the scan stops
    once `distinct` fingerprints are found (a ring cycles through a few signatures, so the first
    and the last few entries usually hold them all)."""
    out: dict[int, int] = {}
    for i in positions:
        fp = fps[i]
        if fp not in out:
            out[fp] = i
            if len(out) == distinct:
                break
    return out


def _increasing(a: array[int]) -> bool:
    """Whether the values strictly increase."""
    return all(map(lt, a, islice(a, 1, None)))


def add_signatures(s: RankSummary, c: SignatureColumns) -> None:
    """Fold entries given as `SignatureColumns` into a summary that holds no tracks yet: the
    summary `add_entries` makes of the same entries, with each fingerprint computed once per
    distinct signature, each group's arrays taken from the 64-bit columns, and whole entries built
    only for what it keeps in full (each group's tail and point-to-point entries, one stack per
    signature). Anything but the common shape (a sequence id that does not increase within its
    group or is negative, a stack that normalizes to none) goes to `add_entries` with every entry
    built."""
    n = len(c)
    key_of, keys, is_p2p = c.key_of, c.keys, c.is_p2p
    positions: list[Sequence[int]]
    if c.group_of is None:
        positions = [range(n)]
    else:
        lists: list[list[int]] = [[] for _ in c.groups]
        for i, gi in enumerate(c.group_of):
            lists[gi].append(i)
        positions = list(lists)
    fp_at = {at: fingerprint(signature_of(*k)) for at, k in keys.items()}
    fps_all = c.by_key(fp_at)
    plans = []
    ok = not (s.tracks or s.sigs or s.sig_frames)
    for g, idx in zip(c.groups, positions, strict=True):
        mine = idx if is_p2p is None else [i for i in idx if not is_p2p[i]]
        if isinstance(mine, range):
            seqs, created, op_ids, fps = c.collective_seq_id, c.time_created_ns, c.op_id, fps_all
            increasing = c.seq_increasing
        else:
            seqs = array("q", map(c.collective_seq_id.__getitem__, mine))
            created = array("q", map(c.time_created_ns.__getitem__, mine))
            op_ids = array("q", map(c.op_id.__getitem__, mine))
            fps = array("q", map(fps_all.__getitem__, mine))
            increasing = _increasing(seqs)
        if seqs and not (seqs[0] >= 0 and increasing):
            ok = False
            break
        plans.append((g, idx, mine, seqs, created, op_ids, fps))
    coll: Sequence[int] = range(n) if is_p2p is None else list(compress(range(n), map(not_, is_p2p)))
    framed = c.framed if is_p2p is None else [i for i in c.framed if not is_p2p[i]]
    # The newest stack per fingerprint, in the order the fingerprints first had one; declined
    # where the first or the newest entry's frames normalize to no stack (the fold skips those).
    oldest = _first_of_each(framed, fps_all, len(set(fp_at.values())))
    newest = _first_of_each(reversed(framed), fps_all, len(oldest))
    stacks = {fp: c.frames(newest[fp]) for fp in oldest}
    if not (ok and all(stacks.values()) and all(map(c.frames, oldest.values()))):
        add_entries(s, [c.entry(i) for i in range(n)])
        return
    sigs = s.sigs
    # Each fingerprint's signature is its first collective's.
    firsts = keys if is_p2p is None else dict.fromkeys(map(key_of.__getitem__, coll))
    for at in firsts:
        fp = fp_at[at]
        if fp not in sigs:
            sigs[fp] = signature_of(*keys[at])
    s.sig_frames.update(stacks)
    free = {at for at, k in keys.items() if k[0] in _SIZES_FREE}
    for g, idx, mine, seqs, created, op_ids, fps in plans:
        track = s.tracks[g] = GroupTrack(seqs=seqs, fps=fps, created_ns=created, op_ids=op_ids)
        track.tail = [c.entry(i) for i in mine[-TAIL:]]
        if is_p2p is not None and len(mine) < len(idx):
            track.p2p = [c.entry(i) for i in idx if is_p2p[i]]
        if free:
            recent = [i for i in mine if key_of[i] in free][-TOTALS_KEPT:]
            track.totals = {
                c.collective_seq_id[i]: (_elements(keys[key_of[i]][1]), _elements(keys[key_of[i]][2]))
                for i in recent
            }


def add_columns(s: RankSummary, c: EntryColumns) -> None:
    """Fold entries given as columns into a summary that holds no tracks yet: the summary
    `add_entries` makes of the same entries, building whole entries only for what it keeps in
    full (each group's tail and point-to-point entries, one stack per signature).

    The fold works a column at a time (fingerprints once per distinct signature, each group's
    arrays straight from the columns) where `add_entries` works an entry at a time; anything but
    the common shape (coalesced end entries, a sequence id that does not increase within its group
    or a value outside 64 bits) goes to `add_entries` with every entry built. With the reader's
    columns (`flightdeck.readers.fr.parse.parse_columns`) a 2,000-entry file of
    bench/analyze_scale.py is read and summarized in 128 million instructions instead of 162
    (callgrind).
    """
    n = len(c.record_id)
    coll = range(n) if not any(c.is_p2p) else list(compress(range(n), map(not_, c.is_p2p)))
    seqs_all = c.collective_seq_id
    created_all = c.time_created_ns
    by_group: dict[str, list[int]] = {}
    if len(set(c.group)) == 1:
        by_group[c.group[0]] = list(range(n))
    else:
        for i, g in enumerate(c.group):
            by_group.setdefault(g, []).append(i)
    coll_set = None if isinstance(coll, range) else set(coll)
    plans = []
    ok = (
        not (s.tracks or s.sigs or s.sig_frames)
        and COALESCED_END_OPS.isdisjoint(c.op)
        and all(map(lt, c.record_id, islice(c.record_id, 1, None)))
    )
    for g, idx in by_group.items():
        if not ok:
            break
        mine = idx if coll_set is None else [i for i in idx if i in coll_set]
        seqs = list(map(seqs_all.__getitem__, mine))
        created = list(map(created_all.__getitem__, mine))
        if seqs and not (
            seqs[0] >= 0
            and seqs[-1] < _INT64
            and all(map(lt, seqs, islice(seqs, 1, None)))
            and min(created) >= -_INT64
            and max(created) < _INT64
        ):
            ok = False
        plans.append((g, idx, mine, seqs, created))
    if not ok:
        add_entries(s, [c.entry(i) for i in range(n)])
        return
    keys = list(zip(c.op, c.input_sizes, c.output_sizes, c.input_dtypes, c.output_dtypes, strict=True))
    distinct = dict.fromkeys(keys)
    fp_of = {k: fingerprint(signature_of(*k)) for k in distinct}
    fps = list(map(fp_of.__getitem__, keys))
    sigs, sig_frames = s.sigs, s.sig_frames
    # Each fingerprint's signature is its first collective's: distinct keys in the order they
    # first appear, the first key of each fingerprint.
    for k in distinct if coll_set is None else dict.fromkeys(map(keys.__getitem__, coll)):
        fp = fp_of[k]
        if fp not in sigs:
            sigs[fp] = signature_of(*k)
    # The newest stack per fingerprint, in the order the fingerprints first had one.
    framed = list(compress(coll, map(c.has_frames.__getitem__, coll)))
    for fp, i in dict(zip(map(fps.__getitem__, framed), framed, strict=True)).items():
        sig_frames[fp] = c.frames(i)
    op_ids_all = c.op_id
    any_free = not _SIZES_FREE.isdisjoint(c.op)
    for g, idx, mine, seqs, created in plans:
        track = s.tracks[g] = GroupTrack()
        op_ids = list(map(op_ids_all.__getitem__, mine))
        if op_ids and not (min(op_ids) >= -_INT64 and max(op_ids) < _INT64):
            op_ids = [o if -_INT64 <= o < _INT64 else 0 for o in op_ids]
        track.seqs = array("q", seqs)
        track.fps = array("q", map(fps.__getitem__, mine))
        track.created_ns = array("q", created)
        track.op_ids = array("q", op_ids)
        track.tail = [c.entry(i) for i in mine[-TAIL:]]
        if len(mine) < len(idx):
            track.p2p = [c.entry(i) for i in idx if c.is_p2p[i]]
        free = [i for i in mine if c.op[i] in _SIZES_FREE][-TOTALS_KEPT:] if any_free else []
        track.totals = {
            seqs_all[i]: (_elements(c.input_sizes[i]), _elements(c.output_sizes[i])) for i in free
        }


def add_entries(s: RankSummary, entries: Sequence[Entry], fps: Iterable[int] | None = None) -> None:
    """Fold entries (oldest first, by record id) into the summary's tracks.

    `fps`, when the caller has them, are the entries' signature fingerprints, one per entry (a
    batch repeats a few signatures: the server takes each fingerprint once per signature table).
    """
    tracks = s.tracks
    sigs = s.sigs
    sig_frames = s.sig_frames
    if fps is None:
        fps = map(fingerprint, map(signature, entries))
    for e, fp in zip(entries, fps, strict=True):
        track = tracks.get(e.group)
        if track is None:
            track = tracks[e.group] = GroupTrack()
        if e.op in COALESCED_END_OPS and not e.input_sizes and _apply_end(track, e):
            continue
        if e.is_p2p:
            # Re-sent entries (state changes) replace the earlier copy rather than adding one,
            # unless the copy held is further along (an older snapshot that arrived late).
            for k in range(len(track.p2p) - 1, -1, -1):
                if track.p2p[k].record_id == e.record_id:
                    track.p2p[k] = merged_entry(track.p2p[k], e)
                    break
            else:
                track.p2p.append(e)
            continue
        if fp not in sigs:
            sigs[fp] = signature(e)
        if e.frames:
            sig_frames[fp] = e.frames
        seq = e.collective_seq_id
        if not (0 <= seq < _INT64 and -_INT64 <= e.time_created_ns < _INT64):
            # Not a value torch writes (a corrupt or hostile file): kept out of the int64 arrays.
            if _BAD_VALUES not in s.warnings:
                s.warnings = (*s.warnings, _BAD_VALUES)
            continue
        if e.op in _SIZES_FREE:
            track.totals[seq] = (_elements(e.input_sizes), _elements(e.output_sizes))
            if len(track.totals) > TOTALS_KEPT:
                del track.totals[min(track.totals)]
        aligned = len(track.op_ids) == len(track.seqs)
        op_id = e.op_id if -_INT64 <= e.op_id < _INT64 else 0
        if track.seqs and seq <= track.seqs[-1]:
            # Out of order or repeated (merged snapshots, a late older batch): replace in place,
            # or insert where it belongs, so the track stays in sequence order.
            i = track.index_of(seq)
            if i is not None:
                track.fps[i] = fp
                k = i - (len(track.seqs) - len(track.created_ns))
                if k >= 0:  # its time is kept (see `GroupTrack.created_ns`)
                    track.created_ns[k] = e.time_created_ns
                if aligned:
                    track.op_ids[i] = op_id
                _replace_tail(track, e)
            else:
                _insert_older(track, seq, fp, e)
            continue
        track.seqs.append(seq)
        track.fps.append(fp)
        track.created_ns.append(e.time_created_ns)
        if aligned:
            track.op_ids.append(op_id)
        track.tail.append(e)
        if len(track.tail) > TAIL:
            del track.tail[0]


def _elements(sizes: tuple[tuple[int, ...], ...]) -> int:
    total = 0
    for shape in sizes:
        n = 1
        for d in shape:
            n *= d
        total += n
    return total


def _apply_end(track: GroupTrack, end: Entry) -> bool:
    """Apply a coalesced group's end entry that arrived without its ops (the reader folds the two
    when it reads them together, `flightdeck.readers.coalesced`) to what the track holds of the
    group: its state and times, keeping the ops' signature. False when the track holds none of it."""
    if end.is_p2p:
        hit = False
        for k, old in enumerate(track.p2p):
            if old.p2p_seq_id == end.p2p_seq_id and old.record_id < end.record_id:
                track.p2p[k] = with_progress_of(old, end)
                hit = True
        return hit
    for k, old in enumerate(track.tail):
        if old.collective_seq_id == end.collective_seq_id:
            if old.op in COALESCED_END_OPS and not old.input_sizes:
                return False  # held unfolded too: replaced as any re-sent entry
            track.tail[k] = replace(with_progress_of(old, end), record_id=max(old.record_id, end.record_id))
            return True
    # Older than the tail: the fingerprint already held stays (the state of an old group matters not).
    return track.index_of(end.collective_seq_id) is not None


#: Order of the entry states: an entry only ever moves forward along it.
_STATE_ORDER = {"scheduled": 0, "started": 1, "completed": 2}


def behind(new: Entry, held: Entry) -> bool:
    """Whether `new` is an earlier view of the entry `held` (a lower state, or no longer
    retired): a snapshot taken before the one `held` came from."""
    a, b = _STATE_ORDER.get(new.state, 0), _STATE_ORDER.get(held.state, 0)
    return a < b or (a == b and held.retired and not new.retired)


def merged_entry(held: Entry, new: Entry) -> Entry:
    """The copy of an entry kept when a snapshot brings `new` of the entry `held`: the one further
    along (`new`, unless it is `behind`: a re-sent older view changes nothing), with the other's
    frames when it has none (frames are never taken away)."""
    keep, other = (held, new) if behind(new, held) else (new, held)
    if not keep.frames and other.frames:
        return replace(keep, frames=other.frames)
    return keep


def _replace_tail(track: GroupTrack, e: Entry) -> None:
    for i, old in enumerate(track.tail):
        if old.collective_seq_id == e.collective_seq_id:
            track.tail[i] = merged_entry(old, e)
            return


def _insert_older(track: GroupTrack, seq: int, fp: int, e: Entry) -> None:
    """Put a collective older than the track's newest, and not held, in its place (the
    arrays stay sorted; the tail takes it only when it is among the newest TAIL)."""
    i = bisect_left(track.seqs, seq)
    # The times are aligned with the end of `seqs`: where some are not kept, the time of one
    # older than every time kept stays out too (those kept remain the newest collectives').
    off = len(track.seqs) - len(track.created_ns)
    track.seqs.insert(i, seq)
    track.fps.insert(i, fp)
    if off == 0 or i > off:
        track.created_ns.insert(i - off, e.time_created_ns)
    tail = track.tail
    if len(tail) < TAIL or seq > tail[0].collective_seq_id:
        k = len(tail)
        while k > 0 and tail[k - 1].collective_seq_id > seq:
            k -= 1
        tail.insert(k, e)
        if len(tail) > TAIL:
            del tail[0]
