"""Arrival skew and stragglers: how far apart the ranks enter the recent collectives of each
group, and the rank that arrives last most often."""

from __future__ import annotations

from array import array
from collections import Counter
from collections.abc import Iterable
from itertools import islice

from flightdeck.analysis.findings import Finding, Options
from flightdeck.analysis.rules.common import NS, _fmt_ranks, _Group, _refs
from flightdeck.analysis.summary import RankSummary

#: Collectives looked at for arrival skew and stragglers (the most recent ones of the window).
SKEW_WINDOW = 256
#: Enqueue times compared at a time (columns of ranks x collectives): about 1 MiB of int objects.
_CHUNK = 1 << 15


def _stragglers(
    groups: list[_Group], by_rank: dict[int, RankSummary], opts: Options
) -> tuple[dict[str, list[float]], list[Finding]]:
    skews: dict[str, list[float]] = {}
    last_count: Counter[int] = Counter()
    #: Per compared group: (enqueue times by rank, the earliest of each collective). Lags are
    #: worked out only for the few ranks that arrive last most often, at the end.
    compared: list[tuple[dict[int, array[int]], list[int]]] = []
    samples = 0
    for g in groups:
        tracks = g.held
        if len(tracks) < 2 or len(tracks) < len(g.members):
            continue
        lo = max(t.first_seq for t in tracks.values())
        hi = min(t.last_seq for t in tracks.values())
        if hi < lo:
            continue
        # Within the times every rank keeps: a live server keeps those of each track's newest
        # `enqueue_times_kept` collectives (512, twice this window), so this cuts the window
        # only where some rank is more than 256 collectives ahead of the group's slowest one
        # (summaries from files keep them all: nothing cut).
        timed = [f for t in tracks.values() if (f := t.timed_from) is not None]
        if len(timed) < len(tracks):
            continue
        lo = max(lo, hi - SKEW_WINDOW + 1, *timed)
        if hi < lo:
            continue
        rows: dict[int, array[int]] = {}
        for r, t in tracks.items():
            i, j = t.index_of(lo), t.index_of(hi)
            if i is None or j is None or j - i != hi - lo:
                break
            times = t.created_between(i, j + 1)
            if times is None:  # not reached: lo is at or above every track's `timed_from`
                break
            rows[r] = times
        else:
            # Column by column (one collective across the ranks), with the loops in C: this
            # runs over every member of every group, 256 collectives deep. A few columns at a
            # time (about `_CHUNK` values): all 256 of a world group at once are an int object
            # per value (~170 MB at 16,384 ranks), slower to build than ones that stay in cache.
            ranks = list(rows)
            tmins: list[int] = []
            tmaxs: list[int] = []
            last: list[int] = []
            columns = zip(*rows.values(), strict=True)
            while cols := list(islice(columns, max(1, _CHUNK // len(ranks)))):
                at_min = list(map(min, cols))
                at_max = list(map(max, cols))
                last += map(tuple.index, cols, at_max)
                tmins += at_min
                tmaxs += at_max
            last_count.update(map(ranks.__getitem__, last))
            samples += hi - lo + 1
            skews[g.name] = [(b - a) / NS for a, b in zip(tmins, tmaxs, strict=True)]
            compared.append((rows, tmins))
    found: list[Finding] = []
    if samples >= opts.straggler_min_samples:
        for r, n in last_count.most_common(3):
            share = n / samples
            lag = _median(
                (t - m) / NS
                for rows, tmins in compared
                if r in rows
                for t, m in zip(rows[r], tmins, strict=True)
            )
            if share >= opts.straggler_min_share and lag >= opts.straggler_min_lag_s:
                found.append(
                    Finding(
                        kind="straggler",
                        detail=(
                            f"Straggler: {_fmt_ranks([r], by_rank)} arrived last at {share:.0%} of {samples} "
                            f"recent collectives, {lag * 1000:.1f} ms after the first rank (median)."
                        ),
                        culprit_ranks=[r],
                        culprits=_refs([r], by_rank),
                        elapsed_s=lag,
                    )
                )
    return skews, found


def _median(values: Iterable[float]) -> float:
    """`statistics.median`, the same value: `statistics` (with `fractions`, `decimal`, `random`)
    was ~13 ms of `flightdeck analyze`'s start-up, for this one call."""
    data = sorted(values)
    n = len(data)
    if n == 0:
        raise ValueError("no median for empty data")
    if n % 2:
        return data[n // 2]
    return (data[n // 2 - 1] + data[n // 2]) / 2
