"""The job's gauges the metrics export, updated after each diagnosis: the oldest collective not
finished per group and the arrival skews (`flightdeck.server.metrics` reads them off `JobState`)."""

from __future__ import annotations

from flightdeck.analysis import Report
from flightdeck.analysis.frontier import group_frontiers
from flightdeck.server.live.state import JobState, SkewHistogram


def update_gauges(
    js: JobState,
    report: Report,
    *,
    frontiers: dict[str, tuple[int | None, int]] | None = None,
    skews: bool = True,
) -> None:
    """Set the job's oldest unfinished collective per group and observe the arrival skews of the
    collectives every member has now reached (each once: `JobState.skew_hi`).

    `frontiers`: a job on digests gives its board's (`Board.frontiers`): read off its arrays, where
    the summaries' (`group_frontiers`) are a round's cut, and a loop over every held entry of every
    rank (at 16,384 ranks, more of the diagnosis worker's time than the board's diagnoses
    themselves). `skews`: False when the report's skews were observed already (a board-only
    diagnosis keeps its entries' report)."""
    assert js.summaries is not None
    oldest: dict[str, int] = {}
    if frontiers is None:
        frontiers = group_frontiers(js.summaries.values())
    for g, (t_min, low) in frontiers.items():
        if t_min is not None:
            oldest[g] = t_min
        if not skews:
            continue
        hi = low
        skews_g = report.arrival_skew_s.get(g)
        if skews_g:
            prev = js.skew_hi.get(g, 0)
            new = len(skews_g) if prev == 0 else max(0, min(len(skews_g), hi - prev))
            hist = js.skew.setdefault(g, SkewHistogram())
            for v in skews_g[len(skews_g) - new :]:
                hist.observe(v)
            js.skew_hi[g] = max(prev, hi)
    js.oldest_unfinished_ns = oldest
