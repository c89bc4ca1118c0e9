"""The job's gauges the metrics export, updated after each diagnosis: the oldest collective not
finished per group and the arrival skews (`flightdeck.server.metrics` reads them off `JobState`)."""

from __future__ import annotations

from flightdeck.analysis import Report
from flightdeck.analysis.frontier import group_frontiers
from flightdeck.server.live.state import JobState, SkewHistogram


def update_gauges(js: JobState, report: Report) -> None:
    """Set the job's oldest unfinished collective per group and observe the arrival skews of the
    collectives every member has now reached (each once: `JobState.skew_hi`)."""
    assert js.summaries is not None
    oldest: dict[str, int] = {}
    for g, (t_min, low) in group_frontiers(js.summaries.values()).items():
        if t_min is not None:
            oldest[g] = t_min
        hi = low
        skews = report.arrival_skew_s.get(g)
        if skews:
            prev = js.skew_hi.get(g, 0)
            new = len(skews) if prev == 0 else max(0, min(len(skews), hi - prev))
            hist = js.skew.setdefault(g, SkewHistogram())
            for v in skews[len(skews) - new :]:
                hist.observe(v)
            js.skew_hi[g] = max(prev, hi)
    js.oldest_unfinished_ns = oldest
