"""What changed in a rank's ring since the collector last shipped it (pure: no files, no clock).

Per (job, attempt, rank) the collector remembers, for every record id still in the ring, the
progress it already put in a batch: state (scheduled < started < completed), retired, whether the
entry went out with frames, and the entry's `time_created_ns`. A new snapshot ships an entry when:

- the record id is new, or its `time_created_ns` differs (the dump file now comes from another
  process, e.g. a restarted job writing the same torch dump path: its record ids restart at 0);
- its progress went forward: a later state, retired, or frames it did not have (periodic
  snapshots have no frames, stall and final ones do).

Progress only moves forward. Snapshots of one rank can be read out of order (a stall file found
after a newer periodic one, at startup), so a shipped entry is never sent with less progress than
was already shipped: its state and retired flag are raised to what was shipped before. Entries
below the ring's oldest record id, in a snapshot older than the newest one seen, are skipped: the
ring has moved past them and the newer snapshot already described the ring.
"""

from __future__ import annotations

import sys
import zlib
from array import array
from dataclasses import dataclass, field, replace
from operator import itemgetter

from flightdeck.readers.fr.scan import SCAN_FRAMES, SCAN_RETIRED, SCAN_STATE_RANK, EntryScan
from flightdeck.records import Entry, RankDump, State

# One progress encoding for scanned raw entries and normalized ones: the reader's (`fr.scan`).
_STATE_RANK = SCAN_STATE_RANK
_STATES: tuple[State, ...] = ("scheduled", "started", "completed")
_RETIRED = SCAN_RETIRED
_FRAMES = SCAN_FRAMES


def progress(e: Entry) -> int:
    """An entry's progress as a small int: state rank (0-2) | 4 if retired | 8 if it has frames."""
    return _STATE_RANK[e.state] | (_RETIRED if e.retired else 0) | (_FRAMES if e.frames else 0)


def merge_progress(a: int, b: int) -> int:
    """The furthest of two progress values, per component."""
    return max(a & 3, b & 3) | ((a | b) & (_RETIRED | _FRAMES))


Key = EntryScan  # record id, time_created_ns, progress


@dataclass(slots=True)
class RankState:
    """What was shipped for one rank: record id -> (time_created_ns, progress)."""

    #: Snapshot time of the newest snapshot diffed (epoch ns).
    last_time_ns: int = 0
    #: Oldest record id of that snapshot: the ring no longer holds anything below it.
    floor: int = 0
    entries: dict[int, tuple[int, int]] = field(default_factory=dict)

    def encode(self) -> bytes:
        """Compact bytes for the durable store (written with every batch, so built in C loops).

        b"\\x02" (the encoding's version), then zlib of little-endian int64s [last_time_ns, floor,
        n, n record ids, n creation times] followed by n progress bytes.
        """
        values = list(self.entries.values())
        flat = array("q", [self.last_time_ns, self.floor, len(values)])
        flat.extend(self.entries.keys())
        flat.extend(map(itemgetter(0), values))
        if sys.byteorder != "little":
            flat.byteswap()
        return b"\x02" + zlib.compress(flat.tobytes() + bytes(map(itemgetter(1), values)), 1)

    @classmethod
    def decode(cls, data: bytes) -> RankState:
        """Inverse of `encode`; raises ValueError on corrupt data."""
        try:
            if data[:1] != b"\x02":
                raise ValueError("unknown encoding")
            raw = zlib.decompress(data[1:])
            flat = array("q")
            if len(raw) < 24:
                raise ValueError(f"{len(raw)} bytes")
            flat.frombytes(raw[:24])
            if sys.byteorder != "little":
                flat.byteswap()
            last, floor, n = flat
            if n < 0 or len(raw) != 24 + 17 * n:
                raise ValueError(f"{len(raw)} bytes for {n} entries")
            flat = array("q")
            flat.frombytes(raw[24 : 24 + 16 * n])
            if sys.byteorder != "little":
                flat.byteswap()
            rids, tcs, progs = flat[:n], flat[n:], raw[24 + 16 * n :]
            return cls(last, floor, dict(zip(rids, zip(tcs, progs, strict=True), strict=True)))
        except (zlib.error, ValueError) as exc:
            raise ValueError(f"corrupt shipped state: {exc}") from None


def plan(prev: RankState | None, keys: list[Key], snapshot_time_ns: int) -> tuple[dict[int, int], RankState]:
    """Which record ids of a snapshot to ship, with the progress to ship them with, and the new state.

    `keys` are (record_id, time_created_ns, progress) of every entry in the snapshot. The progress
    to ship is the entry's own, except when less than what was already shipped (a late older
    snapshot): then it is raised. `prev` is not modified, so a caller can drop the result when
    the batch cannot be queued.
    """
    prev = prev or RankState()
    ship: dict[int, int] = {}
    if snapshot_time_ns >= prev.last_time_ns:
        # The newest snapshot describes the whole ring: keep only its record ids.
        entries: dict[int, tuple[int, int]] = {}
        _merge_keys(prev.entries, entries, ship, keys)
        floor = min(map(itemgetter(0), keys), default=prev.floor)
        return ship, RankState(snapshot_time_ns, floor, entries)
    # An older one only adds, and nothing the ring had already dropped when the newer was taken.
    entries = dict(prev.entries)
    _merge_keys(prev.entries, entries, ship, [k for k in keys if k[0] >= prev.floor])
    return ship, RankState(prev.last_time_ns, prev.floor, entries)


def plan_ring_update(
    prev: RankState, *, gone: list[int], changed: list[Key], snapshot_time_ns: int, floor: int
) -> tuple[dict[int, int], RankState]:
    """`plan` of the newest snapshot of a ring when only some of its entries can have changed.

    For a rank whose previous snapshot was planned into `prev` (as the newest): `gone` are the
    record ids that left the ring since, `changed` the keys of the entries that are new or whose
    identity or progress fields differ from that snapshot's; every other entry is as it was, so
    what `prev` holds for it stands. Same result as `plan` over every key, for a fraction of the
    work. The caller checks that the new state holds exactly the ring's record ids.
    """
    entries = dict(prev.entries)
    for rid in gone:
        entries.pop(rid, None)
    ship: dict[int, int] = {}
    _merge_keys(prev.entries, entries, ship, changed)
    return ship, RankState(snapshot_time_ns, floor, entries)


def _merge_keys(
    old_entries: dict[int, tuple[int, int]],
    entries: dict[int, tuple[int, int]],
    ship: dict[int, int],
    keys: list[Key],
) -> None:
    """Record `keys` in `entries` merged with what was shipped (`old_entries`); what to ship in `ship`."""
    for rid, tc, p in keys:
        old = old_entries.get(rid)
        if old is None or old[0] != tc:
            ship[rid] = p
            entries[rid] = (tc, p)
            continue
        merged = merge_progress(old[1], p) if old[1] != p else p
        entries[rid] = (tc, merged)
        if merged != old[1]:
            ship[rid] = merged


def apply(entry: Entry, shipped_progress: int) -> Entry:
    """The entry as it is to be shipped: state and retired raised to `shipped_progress`."""
    own = progress(entry)
    if (own & 3) == (shipped_progress & 3) and (own & _RETIRED) == (shipped_progress & _RETIRED):
        return entry
    return replace(
        entry,
        state=_STATES[max(own & 3, shipped_progress & 3)],
        retired=entry.retired or bool(shipped_progress & _RETIRED),
    )


def diff(prev: RankState | None, dump: RankDump) -> tuple[list[Entry], RankState]:
    """The entries of a parsed dump to ship, and the shipped state once they are shipped."""
    keys = [(e.record_id, e.time_created_ns, progress(e)) for e in dump.entries]
    ship, state = plan(prev, keys, dump.snapshot_time_ns or 0)
    return [apply(e, ship[e.record_id]) for e in dump.entries if e.record_id in ship], state
