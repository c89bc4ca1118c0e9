"""Read a rank's dump normalizing only the entries that changed since the last push.

A periodic snapshot rewrites the whole ring (2,000 entries) every couple of seconds, while only the
few dozen collectives enqueued or finished since the previous one changed. Normalizing every entry
(`frdump.parse_dump`) costs ~4 µs each, which for 8 ranks every 2 s is several % of a core; so
this module decodes the file with the safe reader (`frdump.load_raw`), takes each raw entry's
identity and progress (record id, creation time, state, retired, has frames), asks
`delta.plan` which ones to ship, and hands only those to `frdump.parse_dump`. Metadata (sidecar,
groups, times) comes from `parse_dump` as well, so the normalization rules stay in frdump.

The one thing this module knows of the raw format is those five fields (see `raw_keys`); any entry
that does not have them in the expected types makes it fall back to the full `parse_dump` of
every entry, whose errors then say what is wrong. (Better placed in frdump as an entry filter of
`parse_dump`; kept here until the reader's owners agree, see the collector's report.)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from operator import itemgetter
from pathlib import Path
from typing import Any

from flightdeck.collector.delta import RankState, apply, diff, plan
from flightdeck.collector.frdump import (
    DumpError,
    DumpTooLargeError,
    NotADumpError,
    load_raw,
    parse_dump,
    rank_from_name,
    read_meta,
)
from flightdeck.records import Entry, RankDump

_STATE_RANK: dict[object, int] = {"scheduled": 0, "started": 1, "completed": 2}


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


def raw_keys(entries: list[Any]) -> list[tuple[int, int, int]] | None:
    """(record_id, time_created_ns, progress) of every raw entry; None when one lacks them.

    One comprehension over the ring, no call per entry: this runs on every entry of every
    snapshot, so it is most of what reading an unchanged ring costs after the unpickling.
    """
    rank = _STATE_RANK.get
    try:
        keys = [
            (
                e["record_id"],
                e["time_created_ns"],
                rank(e["state"], 0) | (4 if e["retired"] else 0) | (8 if e.get("frames") else 0),
            )
            for e in entries
        ]
    except (KeyError, TypeError, AttributeError):  # not a dict, or a field missing
        return None
    # map/set run in C: checking 2,000 entries this way costs ~20 µs.
    if not set(map(type, map(itemgetter(0), keys))) | set(map(type, map(itemgetter(1), keys))) <= {int}:
        return None
    return keys


def read_changed(
    path: Path, *, identify: Callable[[RankDump], RankState | None], max_bytes: int
) -> ChangedRead:
    """Read `path` (same checks and errors as `frdump.read_dump_file`) keeping the entries to ship.

    `identify` gets the parsed metadata (entries not yet parsed), may fill in `job` and `attempt`
    (they are kept), and returns what was shipped for that rank so far.
    """
    try:
        st = path.stat()
    except OSError as exc:
        raise DumpError(f"cannot read: {exc.strerror}") from None
    if st.st_size > max_bytes:
        raise DumpTooLargeError(f"{st.st_size} bytes is over the {max_bytes}-byte limit")
    try:
        with open(path, "rb") as fh:
            data = fh.read(max_bytes + 1)
    except OSError as exc:
        raise DumpError(f"cannot read: {exc.strerror}") from None
    raw = load_raw(data)
    del data
    meta = read_meta(path)
    rank = meta.get("rank") if meta else None
    if not isinstance(rank, int):
        rank = rank_from_name(path.name)
    if rank is None:
        raise NotADumpError("no rank: the name has no rank_<N> suffix and there is no metadata sidecar")
    entries_raw: list[Any] = raw.get("entries") or []
    keys = raw_keys(entries_raw)

    def parse(entries: list[Any]) -> RankDump:
        return parse_dump(
            dict(raw, entries=entries), rank=rank, source=str(path), meta=meta, mtime_ns=st.st_mtime_ns
        )

    if keys is None:  # unusual entries: let the reader normalize (or refuse) them all
        full = parse(entries_raw)
        changed, state = diff(identify(full), full)
        oldest = full.entries[0].record_id if full.entries else None
        return ChangedRead(dataclasses.replace(full, entries=changed), oldest, len(full.entries), state)
    good = keys
    head = parse([])  # metadata only: snapshot time, kind, job, groups of pg_config
    ship, state = plan(identify(head), good, head.snapshot_time_ns or 0)
    picked = [e for e, k in zip(entries_raw, good, strict=True) if k[0] in ship]
    part = parse(picked)
    entries: list[Entry] = [apply(e, ship[e.record_id]) for e in part.entries]
    oldest = min(map(itemgetter(0), good), default=None)
    dump = dataclasses.replace(
        part,
        entries=entries,
        job=head.job,
        attempt=head.attempt,
        wrapped=oldest is not None and oldest > 0,
        backend=part.backend or head.backend,
    )
    return ChangedRead(dump, oldest, len(entries_raw), state)
