"""How one rank's snapshots merge into one picture of it: the rules every path shares.

Three paths merge a rank's snapshots, each for its own input:

- `flightdeck.readers.fr.merge.merge` (`flightdeck analyze`, the web pages over dump files): all of
  a rank's snapshots at once, as `RankDump`s, into one `RankDump`.
- the live server's fold (`flightdeck.server.live.fold.fold_snapshot`): each snapshot as it
  arrives into the rank's `RankSummary` (`fold_metadata`, `fold_groups`, `fold_entries` here).
- the store, as it ingests (its upserts, in SQL: `server/store/ingest_sql.py`,
  `server/store/ingest_ids.py`), whose rows the server reads back into summaries when it rebuilds
  a job (`flightdeck.server.live.rebuild`).

What they share, one function each here (the store's SQL spells the same rules out):

- which snapshot is newer: `snapshot_order`, by snapshot time, then kind (`KIND_RANK`: a final
  snapshot outranks a stall one, which outranks a periodic one, taken at the same time);
- the rank's metadata (`flightdeck.records.RankMeta`) is the newest snapshot's, but what a
  snapshot leaves empty keeps the value held (`merged_meta`, `newer_value`), much as the
  store's `COALESCE` does; so are its thread stacks and configuration report (`newest_of`: not
  every snapshot carries them);
- its progress is the sample taken last, by the sample's own time (`later_progress`): a
  snapshot may carry a sample older than one a snapshot before it carried;
- a process group's description and members come from the newest snapshot that has them
  (`merged_group`);
- an entry's state only moves forward: a copy of it `behind` the one held (a re-sent older
  view: a retried batch, a stall snapshot written after the final one) changes nothing, and its
  frames are never taken away (`merged_entry`; the store's `_FORWARD`, which keeps a row's stack).

Folded snapshot by snapshot in snapshot order, the live fold gives the summary of the files'
merge (tests/test_summary.py checks it on every committed scenario). It folds in arrival order,
though, which is not snapshot order (a retried batch arrives after newer ones): an entry's state
and the progress do not depend on that order (forward only, the latest sample), but the metadata
of a snapshot older than the one held is not taken at all (not even a field the held one left
empty). Neither is on the wire what only the files hold (NCCL's `pg_status`, whether a time is
only a file's mtime). The store keeps the newest snapshot's progress, not the latest sample: a job
rebuilt from it after a snapshot that carried an older sample than the one before it holds that
older sample until the next one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TypeVar

from flightdeck.analysis.summary import (
    RankSummary,
    add_entries,
    fingerprint,
    merged_entry,
    signature_of,
)
from flightdeck.records import GroupInfo, MetaHolder, Progress, RankMeta, set_meta
from flightdeck.wire import Snapshot

T = TypeVar("T")

__all__ = [
    "KIND_RANK",
    "fold_entries",
    "fold_groups",
    "fold_metadata",
    "later_progress",
    "merged_entry",
    "merged_group",
    "merged_meta",
    "newer_value",
    "newest_of",
    "snapshot_order",
]

#: Snapshots of one rank taken at the same time, oldest first: a final one is the rank's last word.
KIND_RANK: dict[str, int] = {"dump": 0, "periodic": 1, "stall": 2, "final": 3}


def snapshot_order(snapshot_time_ns: int | None, kind: str) -> tuple[int, int]:
    """Sort key of a rank's snapshots, oldest first: by snapshot time, then `KIND_RANK`."""
    return (snapshot_time_ns or 0, KIND_RANK[kind])


def newer_value(held: T, new: T) -> T:
    """A newer snapshot's value, unless it has none (None, empty, zero): then the one held."""
    return new or held


def newest_of(values: Iterable[T], default: T) -> T:
    """Of a rank's values, oldest snapshot first, the newest that is not missing (`newer_value`
    over them); `default` when every one is."""
    out = default
    for v in values:
        out = newer_value(out, v)
    return out


def merged_group(
    name: str,
    old: GroupInfo | None,
    new: GroupInfo,
    intern: Callable[[tuple[int, ...]], tuple[int, ...]] | None = None,
) -> GroupInfo:
    """Group `name` as `new` (a newer snapshot's) describes it, its description and members
    kept from `old` where `new` has none; `intern` gives the one object for a member list."""
    ranks = new.ranks or (old.ranks if old else None)
    if ranks is not None and intern is not None:
        ranks = intern(ranks)
    return type(new)(name, new.desc or (old.desc if old else ""), ranks)


def later_progress(held: Progress | None, new: Progress | None) -> Progress | None:
    """Of two progress samples, the one taken last (`sampled_ns`; `new` when they tie); a
    missing one keeps the other."""
    if new is None or (held is not None and new.sampled_ns < held.sampled_ns):
        return held
    return new


def merged_meta(held: MetaHolder, new: MetaHolder) -> RankMeta:
    """A rank's metadata once a newer snapshot's (`new`) is taken: who the rank is and what this
    snapshot is as it says; what it leaves empty keeps the value held (`newer_value`; its local
    rank only when None, 0 being one)."""
    return RankMeta(
        job=newer_value(held.job, new.job),
        attempt=new.attempt,
        rank=new.rank,
        world_size=newer_value(held.world_size, new.world_size),
        local_rank=held.local_rank if new.local_rank is None else new.local_rank,
        host=newer_value(held.host, new.host),
        pid=newer_value(held.pid, new.pid),
        torch_version=newer_value(held.torch_version, new.torch_version),
        backend=newer_value(held.backend, new.backend),
        version=newer_value(held.version, new.version),
        source=newer_value(held.source, new.source),
        snapshot_time_ns=new.snapshot_time_ns,
        kind=new.kind,
        interval_s=newer_value(held.interval_s, new.interval_s),
        exception=newer_value(held.exception, new.exception),
    )


def fold_metadata(s: RankSummary, snap: Snapshot) -> bool:
    """Take a snapshot's metadata into its rank's summary if it is not older than the summary's
    (`merged_meta`: what it leaves out keeps the value held), and its progress if sampled later
    (`later_progress`); returns whether the metadata was taken."""
    s.progress = later_progress(s.progress, snap.progress)  # by its own time, whatever the order
    if snap.snapshot_time_ns < (s.snapshot_time_ns or 0):
        return False
    set_meta(s, merged_meta(s, snap))
    s.wrapped = snap.wrapped
    s.thread_stacks = newer_value(s.thread_stacks, snap.thread_stacks)
    s.config = newer_value(s.config, snap.config)
    return True


def fold_groups(
    s: RankSummary,
    groups: Mapping[str, GroupInfo],
    intern: Callable[[tuple[int, ...]], tuple[int, ...]] | None = None,
) -> None:
    """Fold a snapshot's process groups into its rank's summary (`merged_group`)."""
    for name, g in groups.items():
        s.groups[name] = merged_group(name, s.groups.get(name), g, intern)


def fold_entries(s: RankSummary, snap: Snapshot) -> None:
    """Fold a snapshot's entries into its rank's summary."""
    c = snap.columns
    if c is None:
        add_entries(s, snap.entries)
    else:  # each signature's fingerprint once per signature table, not once per entry
        table = [fingerprint(signature_of(op, i, o, idt, odt)) for _, op, _, _, i, o, idt, odt in c.sigs]
        add_entries(s, snap.entries, map(table.__getitem__, c.sig))
