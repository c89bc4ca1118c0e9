"""Where each process group of a job stands across its ranks: what the live gauges export.

Pure: a job's summaries in, per group the oldest collective not yet finished on every member and
the sequence id every member holding the group has reached. The live server turns them into
`flightdeck_job_oldest_unfinished_*` and the arrival-skew histograms (`flightdeck.server.live`).
"""

from __future__ import annotations

from collections.abc import Iterable

from flightdeck.analysis.summary import GroupTrack, RankSummary


def group_frontiers(summaries: Iterable[RankSummary]) -> dict[str, tuple[int | None, int]]:
    """group -> (enqueue time in epoch ns of its oldest collective not finished on every member
    holding it, None when every one is; the highest sequence id all those members hold), for the
    groups some rank holds a collective of."""
    out: dict[str, tuple[int | None, int]] = {}
    # One pass over the ranks' tracks (not one per group: thousands of groups x ranks).
    by_group: dict[str, list[GroupTrack]] = {}
    for s in summaries:
        for g, t in s.tracks.items():
            if t.seqs:
                by_group.setdefault(g, []).append(t)
    for g, holders in by_group.items():
        t_min: int | None = None
        for t in holders:
            for e in t.tail:
                # `Entry.finished`, inlined: every held entry of every rank, per diagnosis.
                if not (e.state == "completed" or e.retired) and (t_min is None or e.time_created_ns < t_min):
                    t_min = e.time_created_ns
        lasts = [t.last_seq for t in holders]
        low = min(lasts)
        if any(v > low for v in lasts):
            # Entered by some ranks, not yet by the slowest: unfinished on that member.
            for t in holders:
                i = t.index_of(low + 1)
                if i is None:
                    continue
                # A live server keeps the times of each track's newest collectives only: where
                # this one's is not kept (the rank is hundreds of collectives ahead of the
                # slowest), the oldest time kept, which it is at least as old as.
                at = t.created_at(i)
                if at is None:
                    if not t.created_ns:
                        continue
                    at = t.created_ns[0]
                if t_min is None or at < t_min:
                    t_min = at
        out[g] = (t_min, low)
    return out
