"""The incremental fold: each snapshot of a job, as it arrives, into its rank's summary.

The worker folds a job's pending snapshots one at a time (`fold_snapshot`): a summary holds a few
bytes per collective, not the entries, so it cannot be rebuilt from all of a rank's snapshots
each time. What a snapshot changes of the summary is `flightdeck.analysis.merge`'s (its
metadata, groups and entries, by the rules the files' merge and the store share); here, what the
job's state keeps of it: when the rank was last seen, whether it is back after it was reported
gone, the collectives counted, the tracks packed and cut to `max_summary_seqs`.
"""

from __future__ import annotations

from flightdeck.analysis import RankSummary
from flightdeck.analysis.merge import fold_entries, fold_groups, fold_metadata
from flightdeck.analysis.packed import pack_track
from flightdeck.server.live.state import JobState
from flightdeck.wire import Snapshot


def fold_snapshot(js: JobState, snap: Snapshot, *, max_seqs: int) -> int:
    """Fold one snapshot into its rank's summary (the job's summaries are in memory): its metadata
    when it is the rank's newest, its groups and entries, the collectives it counts; each group's
    track is packed and cut to the newest `max_seqs` collectives. Returns how many entries came in
    (for the worker's `malloc_trim`)."""
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
    cap = max_seqs
    for t in s.tracks.values():
        pack_track(t)  # a new group's track comes as plain arrays (`add_entries`)
        if len(t.seqs) > cap:
            cut = len(t.seqs) - cap
            del t.seqs[:cut], t.fps[:cut], t.created_ns[:cut]
            if len(t.op_ids) > cap:
                del t.op_ids[: len(t.op_ids) - cap]
        if len(t.p2p) > cap:
            del t.p2p[: len(t.p2p) - cap]
    return len(snap.entries)


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
