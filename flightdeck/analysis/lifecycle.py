"""A job's life as its summaries tell it: the status a diagnosis implies, when it ended and how.

Pure functions of a job's summaries, its diagnosis and the ranks reported gone; the live server
(`flightdeck.server.live`) calls them after each diagnosis and stores what they say.
"""

from __future__ import annotations

from collections.abc import Sequence

from flightdeck.analysis.findings import MISMATCH_KINDS, Report
from flightdeck.analysis.summary import RankSummary

NS = 1_000_000_000


def job_status(report: Report, summaries: Sequence[RankSummary], world_size: int | None) -> str:
    """The status of a running job implied by a diagnosis (mismatch > hung > lost > slow >
    finished > running; an ended job's is `end_state`'s)."""
    kinds = {f.kind for f in report.findings}
    if kinds & MISMATCH_KINDS:
        return "mismatch"
    if kinds & {"hang", "state_mismatch"}:
        return "hung"
    if "rank_lost" in kinds:
        return "lost"
    if kinds & {"slow_rank", "straggler"}:
        return "slow"
    expected = world_size or report.expected_ranks
    if summaries and len(summaries) >= expected and all(s.kind == "final" for s in summaries):
        return "finished"
    return "running"


#: Findings that make a job that ends with one open `failed` (the others are context or advice).
FAULT_KINDS = MISMATCH_KINDS | {"hang", "slow_rank", "state_mismatch", "rank_lost"}
#: How the agent's final snapshot on SIGTERM / SIGINT starts its `exception` ("terminated by SIGTERM").
KILLED_PREFIXES = ("terminated by ", "interrupted by ")


def job_end(summaries: dict[int, RankSummary], gone: dict[int, int], expected: int) -> int | None:
    """When the job ended: once each of its `expected` ranks has written its final snapshot or
    was reported gone, the latest of those times (epoch ns); None while one still runs."""
    ranks = summaries.keys() | gone.keys()
    if not ranks or len(ranks) < expected:
        return None
    end = 0
    for r in ranks:
        s = summaries.get(r)
        if s is not None and s.kind == "final":
            end = max(end, s.snapshot_time_ns or 0)
        elif r in gone:
            end = max(end, gone[r], (s.snapshot_time_ns or 0) if s is not None else 0)
        else:
            return None
    return end


def end_state(open_kinds: set[str], summaries: dict[int, RankSummary], gone: dict[int, int]) -> str:
    """How an ended job ended: `failed` with a fault open at the end, a rank whose process ended
    without a final snapshot (gone), or a final snapshot with an exception (a crash, or killed:
    `KILLED_PREFIXES`); else `finished`."""
    if open_kinds & FAULT_KINDS:
        return "failed"
    for r in summaries.keys() | gone.keys():
        s = summaries.get(r)
        if s is None or s.kind != "final" or s.exception:
            return "failed"
    return "finished"


def ending(
    summaries: dict[int, RankSummary], gone: dict[int, int], now_ns: int, stall_after_s: float
) -> bool:
    """Whether the job is going down: some of its ranks wrote their final snapshot (or were
    reported gone) less than `stall_after_s` ago and the others have not yet. A scheduler's
    SIGTERM reaches the ranks within moments of each other, but their final snapshots (and the
    collector's gone reports) arrive apart: a rank whose final is a second behind the others'
    is not lost, and a collective they all left is not hung."""
    ends = [s.snapshot_time_ns or 0 for s in summaries.values() if s.kind == "final"]
    ends += gone.values()
    return bool(ends) and now_ns - max(ends) < stall_after_s * NS
