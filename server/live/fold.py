"""The incremental fold: each snapshot of a job, as it arrives, into its rank's summary.

The worker folds a job's pending snapshots one at a time (`fold_snapshot`): a summary holds a few
bytes per collective, not the entries, so it cannot be rebuilt from all of a rank's snapshots
each time. What a snapshot changes of the summary is `flightdeck.analysis.merge`'s (its
metadata, groups and entries, by the rules the files' merge and the store share); here, what the
job's state keeps of it: when the rank was last seen, whether it is back after it was reported
gone, the collectives counted, the tracks packed and cut to `max_summary_seqs` (their enqueue
times to `enqueue_times_kept`).
"""

from __future__ import annotations

from flightdeck.analysis import GroupTrack, RankSummary
from flightdeck.analysis.merge import fold_entries, fold_groups, fold_metadata
from flightdeck.analysis.packed import pack_track
from flightdeck.server.live.state import JobState
from flightdeck.wire import Snapshot

#: Enqueue times a track may hold beyond `enqueue_times_kept` before `bound_track` cuts them.
TIMES_SLACK = 64


def fold_snapshot(js: JobState, snap: Snapshot, *, max_seqs: int, max_times: int) -> int:
    """Fold one snapshot into its rank's summary (the job's summaries are in memory): its metadata
    when it is the rank's newest, its groups and entries, the collectives it counts; each group's
    track is packed and cut to the newest `max_seqs` collectives, the enqueue times to the newest
    `max_times` (`bound_track`). Returns how many entries came in (for the worker's
    `malloc_trim`)."""
    assert js.summaries is not None
    if snap.snapshot_time_ns == js.rank_seen_ns.get(snap.rank):
        # The rank's newest snapshot again (a restarted collector re-sending what it shipped):
        # nothing to learn. An older one changes no metadata below, and its entries only fill
        # in what the newer ones lacked (`add_entries` moves no state back).
        return 0
    if snap.snapshot_time_ns > js.gone.get(snap.rank, snap.snapshot_time_ns):
        del js.gone[snap.rank]  # seen again after it was reported gone
    s = js.summaries.get(snap.rank)
    if s is None:
        s = js.summaries[snap.rank] = RankSummary(rank=snap.rank, source=snap.source, job=js.name)
    if fold_metadata(s, snap):
        js.rank_seen_ns[snap.rank] = snap.snapshot_time_ns
    # One object per distinct member list of the job: diagnosis counts them by object.
    fold_groups(s, snap.groups, js.intern_members)
    fold_entries(s, snap)
    count_collectives(js, s, snap)
    for t in s.tracks.values():
        pack_track(t)  # a new group's track comes as plain arrays (`add_entries`)
        bound_track(t, max_seqs=max_seqs, max_times=max_times)
    return len(snap.entries)


def bound_track(t: GroupTrack, *, max_seqs: int, max_times: int) -> None:
    """Cut a track to its newest `max_seqs` collectives (and point-to-point entries), and its
    enqueue times to the newest `max_times` of those once it holds `TIMES_SLACK` more
    (`GroupTrack.created_ns`: aligned with the end of `seqs`; at least `max_times` kept).

    Why the times can go: they were 48 % of an open job's objects, and the diagnosis reads them
    only over each group's newest `SKEW_WINDOW` (256) collectives (arrival skew and stragglers,
    `flightdeck.analysis.rules.stragglers`; the frontier gauge reads the collective after the
    slowest rank's newest). The window ends at the slowest member's newest collective, so a
    rank ahead of it by d collectives needs 256 + d of its newest times: the default 512
    (`enqueue_times_kept`) gives every diagnosis unchanged while the ranks' newest collectives
    are within 256 of each other (snapshots of one round are); beyond, the straggler check
    compares the collectives every rank kept times for, fewer. The other columns stay
    `max_seqs` deep: matching sequence ids and signatures across ranks reads all of them."""
    if len(t.seqs) > max_seqs:
        cut = len(t.seqs) - max_seqs
        del t.seqs[:cut], t.fps[:cut]
        if len(t.op_ids) > max_seqs:
            del t.op_ids[: len(t.op_ids) - max_seqs]
    # Cut in steps of TIMES_SLACK, not at every snapshot: a cut rebuilds the packed column's runs
    # (cut at every snapshot of 20 entries, the fold took 2.10 against 2.02 µs an entry, not
    # alternated; cut in steps, 2.26 against 2.18 alternated, within the order's 0.4 µs).
    keep = min(max_times, len(t.seqs))
    if len(t.created_ns) > min(max_times + TIMES_SLACK, len(t.seqs)):
        del t.created_ns[: len(t.created_ns) - keep]
    if len(t.p2p) > max_seqs:
        del t.p2p[: len(t.p2p) - max_seqs]


def count_collectives(js: JobState, s: RankSummary, snap: Snapshot) -> None:
    """Count each collective once: on the lowest member rank of its group."""
    names = snap.columns.cols["g"] if snap.columns is not None else [e.group for e in snap.entries]
    counted: set[str] = set()  # the groups whose lowest member is this rank
    for name in dict.fromkeys(names):
        info = s.groups.get(name)
        if info is not None and info.ranks:
            # Known when interned; min() over a world-sized list per snapshot was most of
            # the cost of folding snapshots in at thousands of ranks.
            lowest = js.lowest_member.get(id(info.ranks))
            if lowest is None:
                lowest = min(info.ranks)
        else:
            # Members unknown: which rank counts is unclear, so none does (but the default
            # group's lowest member is rank 0).
            lowest = 0 if name == "0" else None
        if lowest == snap.rank:
            counted.add(name)
    if not counted:
        return  # most ranks are the lowest member of none of their groups
    for e in snap.entries:
        if e.group in counted and not e.is_p2p and e.collective_seq_id > js.counted_seq.get(e.group, 0):
            js.counted_seq[e.group] = e.collective_seq_id
            js.collectives[(e.group, e.op)] += 1
