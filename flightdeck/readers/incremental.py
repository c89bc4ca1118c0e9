"""Read a rank's dump normalizing only the entries that changed since the last push.

A periodic snapshot rewrites the whole ring (2,000 entries) every couple of seconds, while only the
few dozen collectives enqueued or finished since the previous one changed. Normalizing every entry
(`fr.parse.parse_dump`) costs ~4 µs each, which for 8 ranks every 2 s is several % of a core; so
this module decodes the file with the safe reader (`fr.files.load_dump_file`), takes each entry's
identity and progress from the reader's light-weight scanner (`fr.scan.scan_entries`), asks
`delta.plan` which ones to ship, and has the reader normalize only those (`LoadedDump.parse`).
A ring read before is not even scanned in full: its entry rows (`fr.scan.entry_rows`, built in C)
are compared with the previous version's, and only the rows that differ are scanned and planned
(`_ring_update`). The raw format stays known in the reader (`fr`) alone: this module compares opaque rows and
sees scan tuples and `RankDump`s.

An unchanged ring rewritten by the agent (an idle rank, or one stuck in a hang: exactly when the
snapshots matter) is not decoded at all: when a file's bytes are those of the version this reader
saw last (kept for periodic rings: ~0.25 MB each; one comparison, against several ms of decoding),
and the rank's shipped state is still the one that read produced, nothing can have changed in its
entries; only the sidecar (snapshot time) is read again.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from itertools import compress, count
from operator import itemgetter, ne
from pathlib import Path

from flightdeck.readers.delta import RankState, apply, diff, plan, plan_ring_update, progress
from flightdeck.readers.fr.decode import DEFAULT_BUDGET, DumpBudget
from flightdeck.readers.fr.errors import DumpError, NotADumpError
from flightdeck.readers.fr.files import LoadedDump, load_dump_file, read_dump_bytes
from flightdeck.readers.fr.parse import VALUE_ERRORS, ring_extent
from flightdeck.readers.fr.scan import EntryRow, EntryScan, row_scan
from flightdeck.records import Entry, RankDump


@dataclasses.dataclass(slots=True)
class ChangedRead:
    """A dump as far as it is to be shipped."""

    #: Every field of the parsed dump except `entries`, which holds only the entries to ship.
    dump: RankDump
    #: Record id of the oldest entry the ring holds (None: empty ring).
    oldest_record_id: int | None
    #: Entries in the file.
    total_entries: int
    #: Shipped state once these entries are shipped.
    state: RankState


@dataclasses.dataclass(slots=True)
class _Seen:
    """What the last read of a path found, to recognize the same content rewritten."""

    #: The file's bytes, kept with `rows` (periodic rings); None otherwise.
    data: bytes | None
    #: The decoded dump without its entries.
    head: LoadedDump
    oldest: int | None
    total: int
    #: The state that read produced, when it was the rank's newest snapshot.
    state: RankState
    #: The entries' rows (`fr.scan.entry_rows`) when none had frames, all were valid and their
    #: record ids consecutive; else None.
    rows: list[EntryRow] | None


class IncrementalReader:
    """`read` is `read_changed` plus the memory of each path's last content (see the module doc)."""

    def __init__(self) -> None:
        self._seen: dict[Path, _Seen] = {}

    def forget(self, path: Path) -> None:
        """Drop what is remembered of `path` (deleted, moved to quarantine)."""
        self._seen.pop(path, None)

    def read(
        self,
        path: Path,
        *,
        identify: Callable[[RankDump], RankState | None],
        max_bytes: int,
        budget: DumpBudget = DEFAULT_BUDGET,
    ) -> ChangedRead:
        """Like `read_changed`, doing less work for content this reader has seen (or nearly).

        Raises a DumpError (NotADumpError for values of a kind it cannot make sense of), never
        anything else: one odd file must not stop the reading of the others.
        """
        try:
            return self._read(path, identify=identify, max_bytes=max_bytes, budget=budget)
        except DumpError:
            self._seen.pop(path, None)
            raise
        except VALUE_ERRORS as exc:
            self._seen.pop(path, None)
            raise NotADumpError(f"unusable values ({type(exc).__name__}: {str(exc)[:200]})") from None

    def _read(
        self,
        path: Path,
        *,
        identify: Callable[[RankDump], RankState | None],
        max_bytes: int,
        budget: DumpBudget,
    ) -> ChangedRead:
        data, st = read_dump_bytes(path, max_bytes=max_bytes)
        seen = self._seen.get(path)
        if seen is not None and seen.data == data:  # compares lengths first, then one memcmp
            got = self._unchanged(path, seen, st.st_mtime_ns, st.st_size, identify)
            if got is not None:
                return got
        loaded = load_dump_file(path, max_bytes=max_bytes, data=data, st=st, budget=budget)
        head = loaded.parse(only=())  # metadata only: snapshot time, kind, job, groups of pg_config
        prev = identify(head)
        t = head.snapshot_time_ns or 0
        if head.ring_first is not None:
            got, valid = _plan_recent(loaded, head, prev, head.ring_first)
            # Kept to recognize it rewritten unchanged (a hung rank); its rows serve nothing.
            self._remember(path, data if valid else None, loaded, got, None, t)
            return got
        rows = loaded.rows()
        got = None
        if (
            rows is not None
            and not rows[1]
            and seen is not None
            and seen.rows is not None
            and prev is seen.state
            and t >= prev.last_time_ns
        ):
            got = _ring_update(loaded, head, prev, rows[0], seen.rows)
        # Rows are kept for the next read when every entry was trusted, none had frames and the
        # record ids are consecutive (always so after `_ring_update`).
        keep = got is not None
        if got is None:
            got, valid = _plan_all(loaded, head, prev)
            keep = valid and rows is not None and not rows[1] and _consecutive(rows[0])
        kept_rows = rows[0] if keep and rows is not None else None
        self._remember(path, data if keep else None, loaded, got, kept_rows, t)
        return got

    def _remember(
        self,
        path: Path,
        data: bytes | None,
        loaded: LoadedDump,
        got: ChangedRead,
        rows: list[EntryRow] | None,
        t: int,
    ) -> None:
        """Keep what this read found, when it was the rank's newest snapshot."""
        if t and got.state.last_time_ns == t:
            self._seen[path] = _Seen(
                data, loaded.without_entries(), got.oldest_record_id, got.total_entries, got.state, rows
            )
        else:
            self._seen.pop(path, None)

    def _unchanged(
        self,
        path: Path,
        seen: _Seen,
        mtime_ns: int,
        size: int,
        identify: Callable[[RankDump], RankState | None],
    ) -> ChangedRead | None:
        """The read of a file whose bytes did not change; None when it must be decoded after all."""
        loaded = seen.head.with_sidecar_of(path, mtime_ns=mtime_ns, size=size)
        if loaded is None:
            return None
        head = loaded.parse()
        prev = identify(head)
        # Only when nothing else changed the rank's shipped state since that read: then its entries
        # were shipped with at least the progress they have now, and there is nothing to ship.
        if prev is not seen.state:
            return None
        t = head.snapshot_time_ns or 0
        state = RankState(t, prev.floor, prev.entries) if t >= prev.last_time_ns else prev
        seen.state = state
        return _result(head, head, {}, seen.oldest, seen.total, state)


def read_changed(
    path: Path, *, identify: Callable[[RankDump], RankState | None], max_bytes: int
) -> ChangedRead:
    """Read `path` (same checks and errors as `fr.files.read_dump_file`) keeping the entries to ship.

    `identify` gets the parsed metadata (entries not yet parsed), may fill in `job` and `attempt`
    (they are kept), and returns what was shipped for that rank so far.
    """
    loaded = load_dump_file(path, max_bytes=max_bytes)
    head = loaded.parse(only=())
    return _plan_all(loaded, head, identify(head))[0]


def _plan_all(loaded: LoadedDump, head: RankDump, prev: RankState | None) -> tuple[ChangedRead, bool]:
    """Every entry scanned and planned; and whether the fast path could trust every entry."""
    keys = loaded.scan()
    if keys is None:  # unusual entries: let the reader normalize (or refuse) them all
        full = dataclasses.replace(loaded.parse(), job=head.job, attempt=head.attempt)
        changed, state = diff(prev, full)
        oldest = full.entries[0].record_id if full.entries else None
        return ChangedRead(
            dataclasses.replace(full, entries=changed), oldest, len(full.entries), state
        ), False
    ship, state = plan(prev, keys, head.snapshot_time_ns or 0)
    part = loaded.parse(only=ship, scan=keys) if ship else head
    oldest = min(map(itemgetter(0), keys), default=None)
    return _result(head, part, ship, oldest, len(keys), state), True


def _plan_recent(
    loaded: LoadedDump, head: RankDump, prev: RankState | None, first: int
) -> tuple[ChangedRead, bool]:
    """The plan of an agent's recent-changes file (`flightdeck.spool`): its entries are the
    ring's new and unfinished ones, the rest of the ring is as the rank's last whole ring had it.

    As the newest snapshot, the shipped state keeps what it holds for the rest of the ring and drops
    what left it (below `first`); an older one only adds, as any older snapshot. Also whether every
    entry could be trusted (else the reader normalized them all).
    """
    t = head.snapshot_time_ns or 0
    keys = loaded.scan()
    full = None
    if keys is None:  # unusual entries: let the reader normalize (or refuse) them all
        full = dataclasses.replace(loaded.parse(), job=head.job, attempt=head.attempt)
        keys = [(e.record_id, e.time_created_ns, progress(e)) for e in full.entries]
    if prev is not None and t < prev.last_time_ns:
        ship, state = plan(prev, keys, t)
    else:
        base = prev or RankState(floor=first)
        changed = [k for k in keys if k[0] >= first]
        ship, state = plan_ring_update(
            base, gone=_below(base, first), changed=changed, snapshot_time_ns=t, floor=first
        )
    if full is not None:
        part = dataclasses.replace(full, entries=[e for e in full.entries if e.record_id in ship])
    else:
        part = loaded.parse(only=ship, scan=keys) if ship else head
    extent = ring_extent(loaded.meta)
    total = extent[1] if extent is not None and extent[1] is not None else loaded.entry_count
    return _result(head, part, ship, first, total, state), full is None


def _below(state: RankState, first: int) -> list[int]:
    """The record ids `state` holds below `first` (they left the ring)."""
    if first - state.floor <= len(state.entries):  # the usual case: a few dozen ids moved on
        return [rid for rid in range(state.floor, first) if rid in state.entries]
    return [rid for rid in state.entries if rid < first]


def _ring_update(
    loaded: LoadedDump, head: RankDump, prev: RankState, rows: list[EntryRow], old_rows: list[EntryRow]
) -> ChangedRead | None:
    """The plan of a ring against the rows of its previous version (whose plan gave `prev`).

    Both versions hold consecutive record ids (the old one was checked when it was kept). The ring
    moved on by a few dozen entries: those that left are at the start of the old rows, the new
    ones at the end of the new rows, and the rest line up by position; a row equal to the old row
    at its position is an unchanged entry (compared in C, ~2,000 rows in well under a millisecond).
    Only the other rows are scanned, checked to continue the sequence of record ids, and planned
    (`delta.plan_ring_update`). None, for the full plan, when a row breaks the sequence or cannot
    be trusted.
    """
    first = rows[0][0] if rows else None
    if type(first) is not int or not old_rows:
        return None
    old_first: int = old_rows[0][0]
    idx = first - old_first
    if not 0 <= idx <= len(old_rows):
        return None
    overlap = min(len(old_rows) - idx, len(rows))
    at = list(compress(count(), map(ne, rows, old_rows[idx:])))
    at.extend(range(overlap, len(rows)))
    keys: list[EntryScan] = []
    for i in at:
        k = row_scan(rows[i])
        if k is None or k[0] != first + i:
            return None
        keys.append(k)
    t = head.snapshot_time_ns or 0
    gone = list(range(old_first, first))
    ship, state = plan_ring_update(prev, gone=gone, changed=keys, snapshot_time_ns=t, floor=first)
    if len(state.entries) != len(rows):  # the old ring reached further than the new one
        return None
    part = loaded.parse(only=ship, at=at) if ship else head
    return _result(head, part, ship, first, len(rows), state)


def _consecutive(rows: list[EntryRow]) -> bool:
    """Whether the rows' record ids are consecutive integers (a ring as PyTorch records it)."""
    if not rows or type(rows[0][0]) is not int:
        return False
    first: int = rows[0][0]
    return list(map(itemgetter(0), rows)) == list(range(first, first + len(rows)))


def _result(
    head: RankDump, part: RankDump, ship: dict[int, int], oldest: int | None, total: int, state: RankState
) -> ChangedRead:
    """The ChangedRead of the entries of `part` (normalized, to ship) with the metadata of `head`."""
    entries: list[Entry] = [apply(e, ship[e.record_id]) for e in part.entries]
    dump = dataclasses.replace(
        part,
        entries=entries,
        job=head.job,
        attempt=head.attempt,
        wrapped=oldest is not None and oldest > 0,
        backend=part.backend or head.backend,
    )
    return ChangedRead(dump, oldest, total, state)
