"""The rank page: where a rank runs, its latest snapshot's stacks, its recent collectives."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from flightdeck.web.data import RankDetail
from flightdeck.web.views.entries import EntryView, FrameView, entry_view, frame_views
from flightdeck.web.views.fmt import fmt_datetime_s
from flightdeck.web.views.verdict import FindingLine, _finding_line

#: Recent entries listed on the rank page.
RANK_RECENT = 50


@dataclass(frozen=True, slots=True)
class RankView:
    """One rank: where it runs, its latest snapshot's stacks, its recent collectives."""

    job: str
    rank: int
    host: str
    pid: str
    snapshot: str
    snapshot_kind: str
    exception: str
    culprit_in: list[FindingLine]
    recent: list[EntryView]
    stacks: list[tuple[str, list[FrameView]]]


def rank_view(report_json: Mapping[str, Any], detail: RankDetail, *, job: str) -> RankView:
    """The rank page from the report and `WebData.rank_detail()`."""
    recent = [entry_view(e) for e in list(detail.recent)[-RANK_RECENT:]]
    recent.reverse()  # newest first: what it did last is what matters in an incident
    return RankView(
        job=job,
        rank=detail.rank,
        host=detail.host or "?",
        pid="?" if detail.pid is None else str(detail.pid),
        snapshot=fmt_datetime_s(None if detail.snapshot_time_ns is None else detail.snapshot_time_ns / 1e9),
        snapshot_kind=detail.snapshot_kind or "",
        exception=detail.exception or "",
        culprit_in=[
            _finding_line(f)
            for f in report_json.get("findings") or []
            if detail.rank in (f.get("culprit_ranks") or [])
        ],
        recent=recent,
        stacks=[(s.thread_name, frame_views(s.frames)) for s in detail.thread_stacks],
    )
