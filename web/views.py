"""View models of the web pages: pure functions from plain data to what the templates show.

No I/O, no clock, no HTTP here: the routes fetch data through `WebData` and hand it to these
builders; tests and benchmarks call them directly. Every string that comes from a job (names,
frames, file paths, exception texts) stays a plain string: the templates escape it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import urlencode

from flightdeck.analysis.findings import CONFIG_KINDS, MISMATCH_KINDS
from flightdeck.analysis.frames import is_library_path
from flightdeck.nixl_rates import RATE_WINDOW_S, Quantiles, window_stats
from flightdeck.records import Entry
from flightdeck.web.data import EntryLike, RankDetail, RankTrack, TimelineData

CellState = Literal["completed", "in_flight", "never_entered", "mismatched", "unknown"]

#: Columns per timeline page: fits a laptop screen at the cell size of web.css.
DEFAULT_COLUMNS = 40
#: Members listed when a folded row is expanded; more than this is a job for the rank filter.
MAX_EXPANDED = 256
#: Recent entries listed on the rank page.
RANK_RECENT = 50


@dataclass(frozen=True, slots=True)
class StateStyle:
    """How a cell state is shown: colour is never the only signal (symbol, words, CSS pattern)."""

    state: CellState
    symbol: str
    words: str


STATES: dict[CellState, StateStyle] = {
    "completed": StateStyle("completed", "✓", "completed"),
    "in_flight": StateStyle("in_flight", "⋯", "in flight"),
    "mismatched": StateStyle("mismatched", "✗", "mismatched"),
    "never_entered": StateStyle("never_entered", "∅", "never entered"),
    # Before the first seq a rank holds: its ring buffer overwrote it, or it never reported.
    "unknown": StateStyle("unknown", "·", "not recorded"),
}

TITLES: dict[str, str] = {
    "hang": "Hang",
    "slow_rank": "Slow rank",
    "collective_type_mismatch": "Collective type mismatch",
    "size_mismatch": "Size mismatch",
    "dtype_mismatch": "Dtype mismatch",
    "state_mismatch": "State mismatch",
    "p2p_mismatch": "Point-to-point mismatch",
    "rank_lost": "Rank lost",
    "missing_dump": "Missing dumps",
    "straggler": "Straggler",
    "undecided": "Undecided",
    "version_skew": "Version skew",
    "config_skew": "Configuration skew",
}


# --- small formatting helpers ---------------------------------------------------------------------


def fmt_ranks(ranks: Iterable[int], limit: int = 12) -> str:
    """Ranks as compact ranges: `0–3, 5, 8–1023`; at most `limit` ranges, then `(+N more)`."""
    rs = sorted(set(ranks))
    parts: list[str] = []
    i = 0
    while i < len(rs):
        j = i
        while j + 1 < len(rs) and rs[j + 1] == rs[j] + 1:
            j += 1
        parts.append(str(rs[i]) if i == j else f"{rs[i]}–{rs[j]}")
        i = j + 1
    if len(parts) > limit:
        more = sum(1 for _ in parts[limit:])
        return ", ".join(parts[:limit]) + f" (+{more} more ranges)"
    return ", ".join(parts)


#: Ranks a filter may name: the server's largest world size (`flightdeck.server.validation`).
MAX_RANKS = 1_048_576


def parse_ranks(text: str | None) -> frozenset[int] | None:
    """A rank filter like `0-7, 12` as a set; None for an empty filter. Raises ValueError."""
    if text is None or not text.strip():
        return None
    out: set[int] = set()
    named = 0
    for part in text.replace(" ", "").split(","):
        if not part:
            continue
        lo, sep, hi = part.replace("–", "-").partition("-")
        a = int(lo)
        b = int(hi) if sep else a
        if a < 0 or b < a or b >= MAX_RANKS:
            raise ValueError(f"bad rank range {part!r}")
        named += b - a + 1
        if named > MAX_RANKS:  # repeated ranges count each time: the work is bounded
            raise ValueError("rank filter names too many ranks")
        out.update(range(a, b + 1))
    return frozenset(out) if out else None


def fmt_time_ns(ns: int | None) -> str:
    """Epoch ns as `HH:MM:SS.mmm` UTC (the date is on the page header); empty when unknown."""
    if ns is None:
        return ""
    t = time.gmtime(ns // 1_000_000_000)
    return time.strftime("%H:%M:%S", t) + f".{(ns // 1_000_000) % 1000:03d}"


def fmt_datetime_s(s: float | None) -> str:
    """Epoch seconds as `YYYY-MM-DD HH:MM:SS UTC`; empty when unknown."""
    if s is None:
        return ""
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(s))


def fmt_duration(s: float | None) -> str:
    """Seconds as `850 ms`, `8.7 s`, `3 min 20 s`; empty when unknown."""
    if s is None:
        return ""
    if s < 1:
        return f"{s * 1000:.0f} ms"
    if s < 120:
        return f"{s:.1f} s"
    return f"{int(s // 60)} min {int(s % 60)} s"


def fmt_sizes(sizes: Sequence[Sequence[int]]) -> str:
    """Tensor shapes as `[256] [4, 8]`; `–` for none."""
    return " ".join("[" + ", ".join(str(x) for x in s) + "]" for s in sizes) or "–"


def fmt_bytes(n: float) -> str:
    """Bytes with a binary unit: `512 B`, `1.5 KiB`, `3.0 GiB`."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # unreachable; keeps mypy's return analysis simple


# --- entries and frames -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FrameView:
    """One stack frame; `library` marks PyTorch/stdlib plumbing, folded away by default."""

    name: str
    filename: str
    line: int
    library: bool


@dataclass(frozen=True, slots=True)
class EntryView:
    """One recorded collective, ready to show."""

    seq: int
    group: str
    op: str
    profiling_name: str
    state: str
    finished: bool
    input_sizes: str
    output_sizes: str
    input_dtypes: str
    output_dtypes: str
    created: str
    started: str
    completed: str
    duration: str
    frames: list[FrameView]

    @property
    def user_frames(self) -> list[FrameView]:
        """The frames that are not library plumbing (all frames when every one is)."""
        return [f for f in self.frames if not f.library] or self.frames


def frame_views(frames: Iterable[Any]) -> list[FrameView]:
    """Frames (records or `{name, filename, line}` dicts) as views, innermost first."""
    out = []
    for f in frames:
        if isinstance(f, Mapping):
            name, filename, line = str(f.get("name", "")), str(f.get("filename", "")), f.get("line", 0)
        else:
            name, filename, line = str(f.name), str(f.filename), f.line
        out.append(FrameView(name, filename, int(line or 0), is_library_path(filename)))
    return out


def seq_of(e: EntryLike) -> int:
    """The collective_seq_id of an entry or entry dict."""
    return e.collective_seq_id if isinstance(e, Entry) else int(e["collective_seq_id"])


def _finished(e: EntryLike) -> bool:
    if isinstance(e, Entry):
        return e.finished
    return e.get("state") == "completed" or bool(e.get("retired"))


def _op_of(e: EntryLike) -> str:
    return e.op if isinstance(e, Entry) else str(e.get("op", ""))


def entry_view(e: EntryLike) -> EntryView:
    """An entry (record or `entry_json` dict) as a view."""
    if isinstance(e, Entry):
        dur = e.duration_ms
        if dur is None and e.time_started_ns and e.time_completed_ns:
            dur = (e.time_completed_ns - e.time_started_ns) / 1e6
        return EntryView(
            seq=e.collective_seq_id,
            group=e.group,
            op=e.op,
            profiling_name=e.raw_op,
            state="retired" if e.retired and e.state != "completed" else e.state,
            finished=e.finished,
            input_sizes=fmt_sizes(e.input_sizes),
            output_sizes=fmt_sizes(e.output_sizes),
            input_dtypes=", ".join(e.input_dtypes) or "–",
            output_dtypes=", ".join(e.output_dtypes) or "–",
            created=fmt_time_ns(e.time_created_ns),
            started=fmt_time_ns(e.time_started_ns),
            completed=fmt_time_ns(e.time_completed_ns),
            duration="" if dur is None else f"{dur:.3f} ms",
            frames=frame_views(e.frames),
        )
    state = str(e.get("state", ""))
    retired = bool(e.get("retired"))
    return EntryView(
        seq=int(e["collective_seq_id"]),
        group=str(e.get("process_group", "")),
        op=str(e.get("op", "")),
        profiling_name=str(e.get("profiling_name", "")),
        state="retired" if retired and state != "completed" else state,
        finished=_finished(e),
        input_sizes=fmt_sizes(e.get("input_sizes") or []),
        output_sizes=fmt_sizes(e.get("output_sizes") or []),
        input_dtypes=", ".join(e.get("input_dtypes") or []) or "–",
        output_dtypes=", ".join(e.get("output_dtypes") or []) or "–",
        created=fmt_time_ns(e.get("time_created_ns")),
        started=fmt_time_ns(e.get("time_started_ns")),
        completed=fmt_time_ns(e.get("time_completed_ns")),
        duration="" if e.get("duration_ms") is None else f"{float(e['duration_ms']):.3f} ms",
        frames=frame_views(e.get("frames") or []),
    )


# --- jobs list --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class JobRow:
    """One line of the jobs page."""

    job: str
    attempt: int
    active: bool
    healthy: bool | None
    #: One of `JOB_STATUS_ORDER`.
    status: str
    ranks: str
    hosts: str
    #: Open findings (the root cause is the first).
    findings: int
    #: How long the job has been seen (first to last report), and when it last reported.
    age: str
    last_seen: str
    summary: str
    #: When the job ended (every rank final or gone); '' while it runs.
    ended: str = ""


@dataclass(frozen=True, slots=True)
class JobsView:
    """The jobs page: one page of the list, with the filters it was asked for."""

    jobs: list[JobRow]
    any_active: bool
    #: The status filter ('' for any) and the name search ('' for none).
    status: str = ""
    search: str = ""
    #: The statuses the filter offers.
    statuses: tuple[str, ...] = ()
    #: The `before` value of the next page, '' when this is the last.
    next_before: str = ""


#: Job statuses in the order the jobs page lists them: the ones to act on first.
JOB_STATUS_ORDER = (
    "hung",
    "mismatch",
    "lost",
    "failed",
    "fault",
    "slow",
    "no_data",
    "unknown",
    "running",
    "finished",
)
#: The statuses the server gives a job (`flightdeck.server.models.JOB_STATUSES`), the filter's choices.
FILTER_STATUSES = ("running", "slow", "hung", "mismatch", "lost", "no_data", "finished", "failed")
#: Jobs per page of the jobs page.
JOBS_PAGE = 100


def _job_status(j: Mapping[str, Any], rc: Any) -> str:
    """The server's job status when given (`FILTER_STATUSES`), else the one the verdict
    implies, as the server's `job_status` derives it."""
    given = j.get("status")
    if isinstance(given, str) and given in JOB_STATUS_ORDER:
        return given
    healthy = j.get("healthy")
    if healthy is None:
        return "unknown"
    if not healthy:
        kind = rc.get("kind") if isinstance(rc, Mapping) else None
        if kind in ("hang", "state_mismatch"):
            return "hung"
        if kind in MISMATCH_KINDS:
            return "mismatch"
        return "lost" if kind == "rank_lost" else "fault"
    return "running" if j.get("active") else "finished"


def jobs_view(
    jobs: list[dict[str, Any]], *, status: str = "", search: str = "", page: int | None = None
) -> JobsView:
    """The jobs page from `WebData.list_jobs()` items (unknown keys are ignored): hung jobs
    first, then mismatched, lost, failed, other faults, slow, without data, unknown, running and
    finished ones, each in the given (newest first) order. `page`: the page size asked for (a
    full page has a next one)."""
    rows = []
    for j in jobs:
        healthy = j.get("healthy")
        rc = j.get("root_cause")
        status = _job_status(j, rc)
        summary = ""
        if isinstance(rc, Mapping):
            where = [TITLES.get(str(rc.get("kind")), str(rc.get("kind")))]
            if rc.get("process_group") is not None:
                where.append(f"group {rc['process_group']}")
            if rc.get("collective_seq_id") is not None:
                where.append(f"seq {rc['collective_seq_id']}")
            if rc.get("op"):
                where.append(str(rc["op"]))
            if rc.get("culprit_ranks"):
                where.append(f"culprit {fmt_ranks(rc['culprit_ranks'], limit=4)}")
            summary = where[0] + (": " + ", ".join(where[1:]) if len(where) > 1 else "")
        expected, reporting = j.get("ranks_expected"), j.get("ranks_reporting")
        ranks = f"{reporting}/{expected}" if expected is not None else str(reporting or "")
        first, last = j.get("first_seen_s"), j.get("last_seen_s")
        rows.append(
            JobRow(
                job=str(j.get("job", "")),
                attempt=int(j.get("attempt") or 0),
                active=bool(j.get("active")),
                healthy=None if healthy is None else bool(healthy),
                status=status,
                ranks=ranks,
                hosts="" if j.get("hosts") is None else str(j["hosts"]),
                findings=int(j.get("open_findings") or 0),
                age=fmt_duration(float(last) - float(first))
                if first is not None and last is not None
                else "",
                last_seen=fmt_datetime_s(j.get("last_seen_s")),
                summary=summary,
                ended=fmt_datetime_s(j.get("ended_at_s")) if j.get("ended_at_s") is not None else "",
            )
        )
    rows.sort(key=lambda r: JOB_STATUS_ORDER.index(r.status))
    full = page is not None and len(jobs) >= page
    return JobsView(
        jobs=rows,
        any_active=any(r.active for r in rows),
        status=status,
        search=search,
        statuses=FILTER_STATUSES,
        next_before=str(jobs[-1].get("cursor") or "") if full and jobs else "",
    )


# --- the incident view --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Culprit:
    """A culprit rank and where to find it."""

    rank: int
    host: str
    pid: str


@dataclass(frozen=True, slots=True)
class Banner:
    """The verdict, first thing on the job page: the root cause in the words an on-call reads."""

    kind: str
    title: str
    severity: Literal["fault", "warning"]
    detail: str
    culprits: list[Culprit]
    more_culprits: int
    group: str | None
    group_desc: str
    seq: int | None
    op: str | None
    expected: str
    actual: str
    elapsed: str
    waiting: str
    waiting_count: int
    waiting_frames: list[FrameView]
    culprit_frames: list[FrameView]


@dataclass(frozen=True, slots=True)
class FindingLine:
    """A finding after the root cause, in one line."""

    title: str
    text: str
    consequence: bool


def _sig_text(sig: Mapping[str, Any] | None) -> str:
    if not sig:
        return ""
    parts = [str(sig.get("op", ""))]
    ins, outs = sig.get("input_sizes") or [], sig.get("output_sizes") or []
    if ins:
        parts.append("in " + fmt_sizes(ins))
    if outs and outs != ins:
        parts.append("out " + fmt_sizes(outs))
    dts = list(dict.fromkeys([*(sig.get("input_dtypes") or []), *(sig.get("output_dtypes") or [])]))
    if dts:
        parts.append(", ".join(str(d) for d in dts))
    return " ".join(p for p in parts if p)


def banner(finding: Mapping[str, Any], *, limit: int = 8) -> Banner:
    """The banner for one finding (`Finding.to_json()` shape)."""
    kind = str(finding.get("kind", "undecided"))
    culprits = [
        Culprit(
            rank=int(c["rank"]),
            host=str(c.get("host") or "unknown host"),
            pid="?" if c.get("pid") is None else str(c["pid"]),
        )
        for c in finding.get("culprits") or []
    ]
    if not culprits:
        culprits = [Culprit(int(r), "unknown host", "?") for r in finding.get("culprit_ranks") or []]
    waiting = [int(r) for r in finding.get("waiting_ranks") or []]
    expected = finding.get("expected")
    actual = finding.get("actual")
    last = finding.get("culprit_last_entry")
    if kind == "hang" and not actual and isinstance(last, Mapping):
        # The culprit never entered the stuck collective: show where it is instead.
        actual = {**last, "op": f"{last.get('op', '')} (seq {last.get('collective_seq_id')})"}
    return Banner(
        kind=kind,
        title=TITLES.get(kind, kind),
        severity="warning" if kind in ("straggler", "undecided", "missing_dump", *CONFIG_KINDS) else "fault",
        detail=str(finding.get("detail", "")),
        culprits=culprits[:limit],
        more_culprits=max(0, len(culprits) - limit),
        group=None if finding.get("process_group") is None else str(finding["process_group"]),
        group_desc=str(finding.get("process_group_desc") or ""),
        seq=finding.get("collective_seq_id"),
        op=None if finding.get("op") is None else str(finding["op"]),
        expected=_sig_text(expected),
        actual=_sig_text(actual),
        elapsed=fmt_duration(finding.get("elapsed_s")),
        waiting=fmt_ranks(waiting),
        waiting_count=len(waiting),
        waiting_frames=frame_views(finding.get("waiting_frames") or []),
        culprit_frames=frame_views(finding.get("culprit_frames") or []),
    )


def _finding_line(f: Mapping[str, Any]) -> FindingLine:
    where = []
    if f.get("process_group") is not None:
        where.append(f"group {f['process_group']}")
    if f.get("collective_seq_id") is not None:
        where.append(f"seq {f['collective_seq_id']}")
    if f.get("op"):
        where.append(str(f["op"]))
    if f.get("culprit_ranks"):
        where.append(f"ranks {fmt_ranks(f['culprit_ranks'], limit=4)}")
    return FindingLine(
        title=TITLES.get(str(f.get("kind")), str(f.get("kind"))),
        text=", ".join(where) or str(f.get("detail", "")),
        consequence=f.get("consequence_of") is not None,
    )


@dataclass(frozen=True, slots=True)
class ConfigSide:
    """One value of a differing setting and who holds it."""

    value: str
    ranks: str
    rank_count: int
    hosts: str
    majority: bool


@dataclass(frozen=True, slots=True)
class ConfigRow:
    """One differing setting of the job's ranks (a version_skew / config_skew finding)."""

    kind: str
    setting: str
    group: str | None
    sides: list[ConfigSide]
    detail: str


#: What each config-skew setting is called on the page.
CONFIG_SETTINGS: dict[str, str] = {
    "torch_version": "torch version",
    "torch_git_version": "torch build (git)",
    "cuda_version": "CUDA version",
    "nccl_version": "NCCL version",
    "python_version": "Python version",
    "python_floor": "torch / Python combination",
    "checkpoint_compat": "checkpoint compatibility",
    "fr_disabled": "flight recorder off",
    "fr_buffer_size": "FR ring size (entries)",
    "fr_buffer_bytes": "FR ring size looks like bytes",
    "timeout_ms": "group timeout",
    "timeout_vs_job": "group timeout vs the job's",
    "dump_on_timeout": "dump on timeout",
}


def config_rows(report: Mapping[str, Any]) -> list[ConfigRow]:
    """The configuration section: each config finding's values side by side, majority first."""
    rows = []
    for f in report.get("findings") or []:
        if f.get("kind") not in CONFIG_KINDS:
            continue
        expected, actual = f.get("expected"), f.get("actual") or {}
        setting = str((expected or actual).get("setting") or "")
        raw_sides = ([expected] if expected else []) + list(actual.get("sides") or [])
        sides = [
            ConfigSide(
                value=str(side.get("value", "")),
                ranks=fmt_ranks([int(r) for r in side.get("ranks") or []]),
                rank_count=len(side.get("ranks") or []),
                hosts=", ".join(str(h) for h in (side.get("hosts") or [])[:8])
                + (f" (+{len(side['hosts']) - 8} more)" if len(side.get("hosts") or []) > 8 else ""),
                majority=expected is not None and i == 0,
            )
            for i, side in enumerate(raw_sides)
            if isinstance(side, Mapping)
        ]
        rows.append(
            ConfigRow(
                kind=str(f["kind"]),
                setting=CONFIG_SETTINGS.get(setting, setting),
                group=None if f.get("process_group") is None else str(f["process_group"]),
                sides=sides,
                detail=str(f.get("detail", "")),
            )
        )
    return rows


@dataclass(frozen=True, slots=True)
class GroupOption:
    """One entry of the group selector."""

    name: str
    label: str
    selected: bool


@dataclass(frozen=True, slots=True)
class Column:
    """One collective (sequence id) of the window."""

    seq: int
    op: str
    stuck: bool


@dataclass(frozen=True, slots=True)
class Cell:
    """One (row, seq) cell; a folded row's cells link to its first rank."""

    seq: int
    state: CellState
    symbol: str
    words: str
    op: str
    stuck: bool
    label: str


@dataclass(slots=True)
class Row:
    """Ranks that show the same state in every column of the window, folded into one row."""

    key: int
    ranks: list[int]
    label: str
    hosts: str
    cells: list[Cell]
    culprit: bool
    expanded: bool = False
    members: list[Row] = field(default_factory=list)
    more_members: int = 0

    @property
    def count(self) -> int:
        """Number of ranks in the row."""
        return len(self.ranks)

    @property
    def rank(self) -> int:
        """The representative rank (the lowest): where a folded row's cells link to."""
        return self.ranks[0]


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


@dataclass(frozen=True, slots=True)
class Bar:
    """One collective of a rank on the wall-time view: from creation to completion (or now)."""

    seq: int
    #: Position and length on a 0..`TIME_WIDTH` axis (SVG user units).
    x: float
    width: float
    state: CellState
    stuck: bool
    label: str


@dataclass(frozen=True, slots=True)
class Lane:
    """A row of the wall-time view: the row's (first rank's) collectives as bars."""

    row: Row
    member: bool
    bars: list[Bar]
    #: Cells with no bar, in words ("∅ never entered seq 12"), so absence reads as text too.
    note: str


@dataclass(frozen=True, slots=True)
class TimeAxis:
    """The wall-clock span of the wall-time view, with evenly spaced tick labels."""

    start: str
    end: str
    span: str
    ticks: list[str]


#: Width of the wall-time axis in SVG user units (the SVG scales to the page).
TIME_WIDTH = 1000.0
#: Thinnest bar drawn, in those units: a 50 µs collective in a 10 s window stays visible.
MIN_BAR = 3.0


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


def mismatched_cells(report: Mapping[str, Any], group: str) -> set[tuple[int, int]]:
    """(rank, seq) of every culprit of a mismatch finding in `group`."""
    out: set[tuple[int, int]] = set()
    for f in report.get("findings") or []:
        if f.get("kind") in MISMATCH_KINDS and str(f.get("process_group")) == group:
            seq = f.get("collective_seq_id")
            if seq is not None:
                out.update((int(r), int(seq)) for r in f.get("culprit_ranks") or [])
    return out


def cell_state(entry: EntryLike | None, track: RankTrack, seq: int, *, mismatched: bool) -> CellState:
    """The state of one rank at one seq of a group."""
    if entry is not None:
        if mismatched:
            return "mismatched"
        return "completed" if _finished(entry) else "in_flight"
    if track.last_seq is None or seq > track.last_seq:
        return "never_entered"
    return "unknown"


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


def _span_ns(e: EntryLike, now_ns: int | None) -> tuple[int, int | None] | None:
    """(created, end) of an entry in epoch ns; end None when unknown (unfinished, no clock)."""
    created: Any
    started: Any
    completed: Any
    dur: Any
    if isinstance(e, Entry):
        created, started, completed, dur = (
            e.time_created_ns,
            e.time_started_ns,
            e.time_completed_ns,
            e.duration_ms,
        )
    else:
        created, started = e.get("time_created_ns"), e.get("time_started_ns")
        completed, dur = e.get("time_completed_ns"), e.get("duration_ms")
    if not created:
        return None
    end = completed or None
    if end is None and _finished(e) and dur is not None:
        end = int(started or created) + int(float(dur) * 1e6)
    if end is None and not _finished(e):
        end = now_ns  # still running: up to the verdict's now
    return int(created), None if end is None else max(int(end), int(created))


def _time_lanes(
    rows: list[Row], at_rank: Mapping[int, Mapping[int, EntryLike]], now_ns: int | None
) -> tuple[list[Lane], TimeAxis | None]:
    """The wall-time view of the rows shown (folded rows by their first rank, expanded members)."""
    shown: list[tuple[Row, bool]] = []
    for r in rows:
        shown.append((r, False))
        shown.extend((m, True) for m in r.members)
    spans: dict[tuple[int, int], tuple[int, int | None]] = {}
    for r, _ in shown:
        for seq, e in at_rank.get(r.rank, {}).items():
            sp = _span_ns(e, now_ns)
            if sp is not None:
                spans[(r.rank, seq)] = sp
    if not spans:
        return [], None
    t0 = min(c for c, _ in spans.values())
    t1 = max(max(c, end or c) for c, end in spans.values())
    width_ns = max(t1 - t0, 1)
    lanes = []
    for r, member in shown:
        bars = []
        missing: dict[str, list[int]] = {}
        for cell in r.cells:
            sp = spans.get((r.rank, cell.seq))
            if sp is None:
                missing.setdefault(cell.words, []).append(cell.seq)
                continue
            created, end = sp
            x = (created - t0) / width_ns * TIME_WIDTH
            w = ((end if end is not None else created) - created) / width_ns * TIME_WIDTH
            w = max(MIN_BAR, min(w, TIME_WIDTH - x)) if x < TIME_WIDTH - MIN_BAR else MIN_BAR
            x = min(x, TIME_WIDTH - w)
            took = "" if end is None else f", {fmt_duration((end - created) / 1e9)}"
            since = "running since" if cell.state == "in_flight" else "from"
            bars.append(
                Bar(
                    seq=cell.seq,
                    x=round(x, 2),
                    width=round(w, 2),
                    state=cell.state,
                    stuck=cell.stuck,
                    label=f"{cell.label} ({since} {fmt_time_ns(created)}{took})",
                )
            )
        symbols = {st.words: st.symbol for st in STATES.values()}
        note = "; ".join(f"{symbols.get(w, '')} {w}: seq {fmt_ranks(seqs)}" for w, seqs in missing.items())
        lanes.append(Lane(row=r, member=member, bars=bars, note=note))
    ticks = [fmt_time_ns(t0 + width_ns * i // 4) for i in range(5)]
    axis = TimeAxis(start=ticks[0], end=ticks[-1], span=fmt_duration(width_ns / 1e9), ticks=ticks)
    return lanes, axis


def _row(
    members: list[RankTrack],
    pattern: tuple[CellState, ...],
    columns: list[Column],
    culprits: set[int],
    col_op: Mapping[int, str],
    entry_op: Mapping[tuple[int, int], str],
) -> Row:
    ranks = [m.rank for m in members]
    who = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {fmt_ranks(ranks, limit=4)}"
    hosts = sorted({m.host or "?" for m in members})
    if len(members) == 1:
        m = members[0]
        host_text = f"{m.host or '?'} pid {m.pid if m.pid is not None else '?'}"
    else:
        host_text = f"{len(hosts)} host{'s' if len(hosts) != 1 else ''}"
    cells = []
    for col, state in zip(columns, pattern, strict=True):
        style = STATES[state]
        op = entry_op.get((ranks[0], col.seq), col_op.get(col.seq, ""))
        cells.append(
            Cell(
                seq=col.seq,
                state=state,
                symbol=style.symbol,
                words=style.words,
                op=op,
                stuck=col.stuck,
                label=f"{who}, seq {col.seq}{' ' + op if op else ''}: {style.words}",
            )
        )
    return Row(
        key=ranks[0],
        ranks=ranks,
        label=who,
        hosts=host_text,
        cells=cells,
        culprit=any(r in culprits for r in ranks),
    )


# --- cell detail --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CellPanel:
    """One rank's side of the cell comparison."""

    role: str
    rank: int
    host: str
    pid: str
    state: CellState
    symbol: str
    words: str
    entry: EntryView | None
    note: str
    last_entry: EntryView | None
    stacks: list[tuple[str, list[FrameView]]]


@dataclass(frozen=True, slots=True)
class CellView:
    """A (rank, seq) cell of a group, side by side with the same collective on another rank."""

    job: str
    group: str
    seq: int
    selected: CellPanel
    other: CellPanel | None


def cell_view(
    report_json: Mapping[str, Any],
    timeline: TimelineData,
    *,
    job: str,
    group: str,
    seq: int,
    rank: int,
    last_entries: Mapping[int, EntryLike] | None = None,
    details: Mapping[int, RankDetail] | None = None,
) -> CellView:
    """The cell page. `timeline` holds seq `seq` of `group` for all ranks; `last_entries` the
    latest entry in the group of ranks that never entered `seq`; `details` their stack snapshots.

    The comparison rank: for a culprit, a healthy rank that holds the collective (completed
    preferred); for anyone else, the culprit of the finding at this seq when there is one, since
    that is what a person clicking a waiting rank wants to see; else another rank holding it.
    """
    last_entries = last_entries or {}
    details = details or {}
    bad = mismatched_cells(report_json, group)
    at_seq = [
        f
        for f in report_json.get("findings") or []
        if str(f.get("process_group")) == group and f.get("collective_seq_id") == seq
    ]
    culprits = [int(r) for f in at_seq for r in f.get("culprit_ranks") or []]
    tracks = {t.rank: t for t in timeline.ranks}
    entries: dict[int, EntryLike] = {}
    for t in timeline.ranks:
        for e in t.entries:
            if seq_of(e) == seq:
                entries[t.rank] = e

    def panel(r: int, role: str) -> CellPanel:
        t = tracks.get(r, RankTrack(rank=r))
        e = entries.get(r)
        state = cell_state(e, t, seq, mismatched=(r, seq) in bad)
        style = STATES[state]
        note = ""
        last = None
        if e is None:
            le = last_entries.get(r)
            if state == "never_entered":
                note = f"rank {r} never entered seq {seq} of group {group}"
            else:
                note = f"rank {r} holds no record of seq {seq} (its ring buffer starts later)"
            if le is not None:
                last = entry_view(le)
                note += f"; its latest entry in this group is seq {last.seq} {last.op} ({last.state})"
        d = details.get(r)
        stacks = [(s.thread_name, frame_views(s.frames)) for s in d.thread_stacks] if d else []
        host = t.host or (d.host if d else None) or "?"
        pid = t.pid if t.pid is not None else (d.pid if d else None)
        return CellPanel(
            role=role,
            rank=r,
            host=host,
            pid="?" if pid is None else str(pid),
            state=state,
            symbol=style.symbol,
            words=style.words,
            entry=None if e is None else entry_view(e),
            note=note,
            last_entry=last,
            stacks=stacks,
        )

    selected = panel(rank, "selected")
    other_rank: int | None = None
    role = ""
    healthy = [r for r in sorted(entries) if r != rank and r not in culprits]
    if rank in culprits or not culprits:
        done = [r for r in healthy if _finished(entries[r])]
        pick = done or healthy
        if pick:
            other_rank, role = pick[0], "healthy rank" if rank in culprits else "another rank"
    else:
        other_rank, role = culprits[0], "culprit"
    return CellView(
        job=job,
        group=group,
        seq=seq,
        selected=selected,
        other=None if other_rank is None else panel(other_rank, role),
    )


# --- rank page ----------------------------------------------------------------------------------


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


# --- NIXL -----------------------------------------------------------------------------------------


def _fmt_us(us: float | None) -> str:
    if us is None:
        return "–"
    if us < 1000:
        return f"{us:.0f} µs"
    if us < 1_000_000:
        return f"{us / 1000:.1f} ms"
    return f"{us / 1e6:.2f} s"


def _fmt_rate(n: float) -> str:
    return f"{n:.0f}/s" if n >= 100 else f"{n:.1f}/s"


@dataclass(frozen=True, slots=True)
class AgentRow:
    """One NIXL agent: totals over its whole life, rates and quantiles over the recent window."""

    host: str
    agent: str
    pid: str
    local_rank: str
    source: str
    #: Whether the owning process runs: "running", "exited", "not found" (ring owner unknown).
    alive: str
    #: When the newest sample was read (UTC clock time), and how long ago when known.
    sampled: str
    #: No sample for longer than the rate window: the rates describe the past, not now.
    stale: bool
    #: Bytes moved over every counter run.
    tx: str
    rx: str
    #: Over the window; "–" until two samples are kept.
    tx_rate: str
    rx_rate: str
    req_rate: str
    #: "last 58 s", or why there is no rate yet.
    window: str
    #: Transfer-time quantiles of the window's transfers, else of the current counter run.
    p50: str
    p90: str
    p99: str
    #: What the quantiles describe: "last 58 s (12 transfers)", "since start", "no transfers".
    quantile_scope: str
    #: Failures by kind over every counter run, and how many of them are new in the window.
    errors: list[tuple[str, int]]
    new_errors: int
    dropped: int
    new_dropped: int
    problem: bool
    #: The window as `NixlWindow.to_json()` (numbers, for the JSON twin); None without a window.
    rates: dict[str, Any] | None


@dataclass(frozen=True, slots=True)
class HostGroup:
    """The agents of one host."""

    host: str
    agents: list[AgentRow]


@dataclass(frozen=True, slots=True)
class NixlView:
    """The NIXL page."""

    hosts: list[HostGroup]
    agents: int
    total_errors: int
    total_dropped: int
    #: Errors and dropped events in the agents' recent windows: what is happening now.
    new_errors: int
    new_dropped: int
    window_s: float


def nixl_view(agents: list[dict[str, Any]]) -> NixlView:
    """The NIXL page from `WebData.nixl_agents()`: `NixlSample.to_wire()` dicts, each optionally
    with `totals` (counters over every counter run) and `history` (earlier samples of the same
    agent in the rate window, oldest first; see `flightdeck.nixl_rates`)."""
    by_host: dict[str, list[AgentRow]] = {}
    total_err = total_drop = new_err = new_drop = 0
    for a in sorted(agents, key=lambda a: (str(a.get("host")), str(a.get("agent")))):
        history = [h for h in a.get("history") or [] if isinstance(h, Mapping)]
        win = window_stats([*history, a])
        totals = a.get("totals") or a
        errors = sorted((str(k), int(v)) for k, v in (totals.get("errors") or {}).items() if int(v))
        dropped = int(totals.get("events_dropped") or 0)
        w_err = 0 if win is None else sum(win.errors.values())
        w_drop = 0 if win is None else win.events_dropped
        total_err += sum(n for _, n in errors)
        total_drop += dropped
        new_err += w_err
        new_drop += w_drop
        if win is not None and win.xfer_time is not None and win.xfer_time.count:
            q = win.xfer_time
            scope = f"last {fmt_duration(win.seconds)} ({q.count} transfer{'s' if q.count != 1 else ''})"
        else:
            hist = a.get("xfer_time") or {}
            q = Quantiles.of(hist.get("bounds_us") or [], hist.get("counts") or [])
            if not q.count:
                scope = "no transfers"
            elif win is None:
                scope = f"since start ({q.count} transfer{'s' if q.count != 1 else ''})"
            else:
                scope = f"none in last {fmt_duration(win.seconds)}; since start: {q.count}"
        alive = a.get("writer_alive")
        read_ns = a.get("read_time_ns")
        age_s = a.get("age_s")
        stale = age_s is not None and float(age_s) > RATE_WINDOW_S
        sampled = "" if read_ns is None else fmt_time_ns(int(read_ns)) + " UTC"
        if sampled and age_s is not None:
            sampled += f", {fmt_duration(float(age_s))} ago"
        row = AgentRow(
            host=str(a.get("host", "?")),
            agent=str(a.get("agent", "?")),
            pid="?" if a.get("pid") is None else str(a["pid"]),
            local_rank="–" if a.get("local_rank") is None else str(a["local_rank"]),
            source=str(a.get("source", "")),
            alive="not found" if alive is None else ("running" if alive else "exited"),
            sampled=sampled,
            stale=stale,
            tx=fmt_bytes(int(totals.get("tx_bytes") or 0)),
            rx=fmt_bytes(int(totals.get("rx_bytes") or 0)),
            tx_rate="–" if win is None else fmt_bytes(win.tx_bytes_per_s) + "/s",
            rx_rate="–" if win is None else fmt_bytes(win.rx_bytes_per_s) + "/s",
            req_rate="–" if win is None else _fmt_rate(win.tx_requests_per_s + win.rx_requests_per_s),
            window="no rate yet: one sample" if win is None else f"last {fmt_duration(win.seconds)}",
            p50=_fmt_us(q.p50_us),
            p90=_fmt_us(q.p90_us),
            p99=_fmt_us(q.p99_us),
            quantile_scope=scope,
            errors=errors,
            new_errors=w_err,
            dropped=dropped,
            new_dropped=w_drop,
            # Failures long past should not light the row up at 3 a.m.: with a window, only new
            # ones do (the totals stay in the errors column).
            problem=alive is False
            or (bool(w_err or w_drop) if win is not None else bool(errors) or dropped > 0),
            rates=None if win is None else win.to_json(),
        )
        by_host.setdefault(row.host, []).append(row)
    return NixlView(
        hosts=[HostGroup(h, rows) for h, rows in sorted(by_host.items())],
        agents=sum(len(r) for r in by_host.values()),
        total_errors=total_err,
        total_dropped=total_drop,
        new_errors=new_err,
        new_dropped=new_drop,
        window_s=RATE_WINDOW_S,
    )


def verdict_fingerprint(report: Mapping[str, Any]) -> tuple[Any, ...]:
    """What of a verdict (`Report.to_json()`) the pages show, without the times that grow with the
    clock alone (`now_s`, `elapsed_s`, and the detail texts that quote them): equal fingerprints,
    same page."""
    ranks = report.get("ranks") or {}
    return (
        report.get("healthy"),
        json.dumps(report.get("clock"), sort_keys=True),
        ranks.get("expected"),
        len(ranks.get("with_dump") or ()),
        ranks.get("without_dump_count"),
        tuple(
            (
                f.get("kind"),
                f.get("process_group"),
                f.get("collective_seq_id"),
                f.get("op"),
                tuple(f.get("culprit_ranks") or ()),
                len(f.get("waiting_ranks") or ()),
                json.dumps(
                    [f.get("expected"), f.get("actual"), f.get("consequence_of")], sort_keys=True, default=str
                ),
                f.get("elapsed_s") is None,
            )
            for f in report.get("findings") or ()
        ),
        tuple(report.get("warnings") or ()),
    )
