"""The incident page of one job: the verdict banner, then the timeline of one group in a window
of seqs (folded rows, or the wall-time view)."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import urlencode

from flightdeck.records import Entry
from flightdeck.web.data import EntryLike, RankTrack, TimelineData
from flightdeck.web.views.config import ConfigRow, config_rows
from flightdeck.web.views.entries import _op_of
from flightdeck.web.views.fmt import fmt_datetime_s
from flightdeck.web.views.time_lanes import Lane, TimeAxis, _time_lanes
from flightdeck.web.views.timeline import STATES, CellState, Column, Row, StateStyle, _row, mismatched_cells
from flightdeck.web.views.verdict import Banner, FindingLine, _finding_line, banner

#: Columns per timeline page: fits a laptop screen at the cell size of web.css.
DEFAULT_COLUMNS = 40

#: Members listed when a folded row is expanded; more than this is a job for the rank filter.
MAX_EXPANDED = 256


@dataclass(frozen=True, slots=True)
class GroupOption:
    """One entry of the group selector."""

    name: str
    label: str
    selected: bool


@dataclass(frozen=True, slots=True)
class Window:
    """The visible seq range, with the neighbouring pages (None at either end)."""

    first: int
    last: int
    size: int
    min_seq: int
    max_seq: int
    prev_start: int | None
    next_start: int | None
    incident_start: int | None


@dataclass(slots=True)
class JobView:
    """The incident page of one job."""

    job: str
    attempt: int
    active: bool
    healthy: bool
    expected_ranks: int
    reporting_ranks: int
    banner: Banner | None
    other_findings: list[FindingLine]
    warnings: list[str]
    groups: list[GroupOption]
    group: str
    group_desc: str
    columns: list[Column]
    rows: list[Row]
    window: Window | None
    rank_filter: str
    shown_ranks: int
    expand: frozenset[int]
    legend: list[StateStyle] = field(default_factory=lambda: list(STATES.values()))
    #: "seq": columns are collectives in sequence order; "time": bars on a wall-clock axis.
    view: str = "seq"
    lanes: list[Lane] = field(default_factory=list)
    axis: TimeAxis | None = None
    #: When the verdict was made (its "now"): elapsed times are as of then.
    as_of: str = ""
    #: Settings that differ across the job's ranks (configuration section; empty: none).
    config: list[ConfigRow] = field(default_factory=list)

    def query(self, **changes: Any) -> str:
        """The page's query string with `changes` applied (None drops a key), for links."""
        params: dict[str, Any] = {
            "group": self.group,
            "start": self.window.first if self.window else None,
            "ranks": self.rank_filter or None,
            "expand": ",".join(str(k) for k in sorted(self.expand)) or None,
            "view": self.view,
        }
        params.update(changes)
        if params["view"] == "seq":
            params["view"] = None  # the default: keep the URLs of the sequence view as they were
        return urlencode({k: v for k, v in params.items() if v is not None})

    def toggled(self, key: int) -> str | None:
        """The `expand` parameter with the row of lowest rank `key` flipped."""
        keys = set(self.expand) ^ {key}
        return ",".join(str(k) for k in sorted(keys)) or None


def incident_finding(report: Mapping[str, Any], group: str | None = None) -> Mapping[str, Any] | None:
    """The finding the page centres on: the root cause (first listed) located at a collective,
    restricted to `group` when given."""
    for f in report.get("findings") or []:
        if f.get("collective_seq_id") is None or f.get("process_group") is None:
            continue
        if group is None or str(f["process_group"]) == group:
            return dict(f)
    return None


def default_group(report: Mapping[str, Any], meta: Mapping[str, Any]) -> str:
    """The group shown when none is asked for: the root cause's, else the first (default) group."""
    f = incident_finding(report)
    if f is not None:
        return str(f["process_group"])
    groups = meta.get("groups") or []
    return str(groups[0]["name"]) if groups else "0"


def plan_window(
    *, min_seq: int, max_seq: int, stuck_seq: int | None, start: int | None, size: int = DEFAULT_COLUMNS
) -> Window:
    """Which seqs to show: `start` when asked, else centred on the stuck seq, else the newest page."""
    size = max(1, size)
    hi_start = max(min_seq, max_seq - size + 1)
    incident_start = None
    if stuck_seq is not None:
        incident_start = min(max(min_seq, stuck_seq - size // 2), hi_start)
    if start is None:
        start = incident_start if incident_start is not None else hi_start
    start = min(max(min_seq, start), hi_start)
    last = min(max_seq, start + size - 1)
    return Window(
        first=start,
        last=last,
        size=size,
        min_seq=min_seq,
        max_seq=max_seq,
        prev_start=max(min_seq, start - size) if start > min_seq else None,
        next_start=min(hi_start, start + size) if last < max_seq else None,
        incident_start=incident_start,
    )


def _group_meta(meta: Mapping[str, Any], group: str) -> Mapping[str, Any]:
    for g in meta.get("groups") or []:
        if str(g.get("name")) == group:
            return dict(g)
    return {}


def job_view(
    report_json: Mapping[str, Any],
    job_meta: Mapping[str, Any],
    timeline: TimelineData,
    *,
    group: str,
    window: Window | None,
    rank_filter: str = "",
    expand: Collection[int] = (),
    view: Literal["seq", "time"] = "seq",
) -> JobView:
    """The incident page: verdict banner, then the (rank x seq) timeline of `group` in `window`.

    `timeline` holds the group's entries for the window's seqs (and the filtered ranks); `window`
    comes from `plan_window` (None: the group has no collectives). Ranks whose cells read the
    same across the window fold into one row, so 1,024 ranks in one state pattern are one row;
    `expand` lists the rows (by lowest rank) whose members are listed.
    """
    findings = list(report_json.get("findings") or [])
    ranks_info = report_json.get("ranks") or {}
    root = findings[0] if findings else None
    the_banner = banner(root) if root is not None else None
    gmeta = _group_meta(job_meta, group)
    incident = incident_finding(report_json, group)
    stuck_seq = None if incident is None else int(incident["collective_seq_id"])
    culprits = {
        int(r) for f in findings if str(f.get("process_group")) == group for r in f.get("culprit_ranks") or []
    }
    groups = [
        GroupOption(
            name=str(g["name"]),
            label=str(g["name"]) + (f" ({g['desc']})" if g.get("desc") else ""),
            selected=str(g["name"]) == group,
        )
        for g in job_meta.get("groups") or []
    ]

    columns: list[Column] = []
    rows: list[Row] = []
    lanes: list[Lane] = []
    axis: TimeAxis | None = None
    if window is not None:
        seqs = list(range(window.first, window.last + 1))
        bad = mismatched_cells(report_json, group)
        tracks = sorted(timeline.ranks, key=lambda t: t.rank)
        by_rank: list[dict[int, EntryLike]] = []
        op_votes: dict[int, dict[str, int]] = {s: {} for s in seqs}
        patterns: list[tuple[CellState, ...]] = []
        for t in tracks:
            at: dict[int, EntryLike] = {}
            done: dict[int, CellState] = {}
            for e in t.entries:
                # `seq_of`, `_op_of` and `_finished` inlined: this loop sees every cell of the page.
                if isinstance(e, Entry):
                    s, op, fin = e.collective_seq_id, e.op, e.finished
                else:
                    s, op = int(e["collective_seq_id"]), str(e.get("op", ""))
                    fin = e.get("state") == "completed" or bool(e.get("retired"))
                if window.first <= s <= window.last:
                    at[s] = e
                    votes = op_votes[s]
                    votes[op] = votes.get(op, 0) + 1
                    done[s] = "completed" if fin else "in_flight"
            by_rank.append(at)
            # One state per cell (`cell_state`, inlined: 1,024 ranks x 40 columns per page).
            after = -1 if t.last_seq is None else t.last_seq
            patterns.append(
                tuple(
                    ("mismatched" if (t.rank, s) in bad else done[s])
                    if s in done
                    else ("never_entered" if s > after else "unknown")
                    for s in seqs
                )
            )
        col_op = {s: max(v.items(), key=lambda kv: kv[1])[0] if v else "" for s, v in op_votes.items()}
        if stuck_seq in col_op and not col_op[stuck_seq] and incident is not None and incident.get("op"):
            # No shown rank entered it (a filter on the culprits): the finding still knows the op.
            col_op[stuck_seq] = str(incident["op"])
        columns = [Column(s, col_op[s], s == stuck_seq) for s in seqs]
        # Fold: ranks with the same state pattern share a row. Patterns are tuples of short
        # strings, hashed once per rank: 1,024 ranks x 40 columns is ~40k cheap state calls.
        folds: dict[tuple[CellState, ...], list[RankTrack]] = {}
        for t, pattern in zip(tracks, patterns, strict=True):
            folds.setdefault(pattern, []).append(t)
        entry_op = (
            {(t.rank, s): _op_of(e) for t, at in zip(tracks, by_rank, strict=True) for s, e in at.items()}
            if len(tracks) <= 64
            else {}
        )
        expand_set = set(expand)
        for pattern, members in folds.items():
            row = _row(members, pattern, columns, culprits, col_op, entry_op)
            if row.key in expand_set and len(members) > 1:
                row.expanded = True
                row.members = [
                    _row([m], pattern, columns, culprits, col_op, entry_op) for m in members[:MAX_EXPANDED]
                ]
                row.more_members = max(0, len(members) - MAX_EXPANDED)
            rows.append(row)
        rows.sort(key=lambda r: r.key)
        if view == "time":
            now_s = report_json.get("now_s")
            now_ns = None if now_s is None else int(float(now_s) * 1e9)
            at_rank = {t.rank: at for t, at in zip(tracks, by_rank, strict=True)}
            lanes, axis = _time_lanes(rows, at_rank, now_ns)
    return JobView(
        job=str(report_json.get("job") or job_meta.get("job") or ""),
        attempt=int(job_meta.get("attempt") or 0),
        active=bool(job_meta.get("active")),
        healthy=bool(report_json.get("healthy")),
        expected_ranks=int(ranks_info.get("expected") or 0),
        reporting_ranks=len(ranks_info.get("with_dump") or []),
        banner=the_banner,
        other_findings=[_finding_line(f) for f in findings[1:]],
        config=config_rows(report_json),
        warnings=[str(w) for w in report_json.get("warnings") or []],
        groups=groups,
        group=group,
        group_desc=str(gmeta.get("desc") or ""),
        columns=columns,
        rows=rows,
        window=window,
        rank_filter=rank_filter,
        shown_ranks=sum(r.count for r in rows),
        expand=frozenset(expand),
        view=view,
        lanes=lanes,
        axis=axis,
        as_of=fmt_datetime_s(report_json.get("now_s")),
    )
