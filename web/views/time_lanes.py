"""The wall-time view of the job page's timeline: each row's collectives as bars on a wall-clock axis."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from flightdeck.records import Entry
from flightdeck.web.data import EntryLike
from flightdeck.web.views.entries import _finished
from flightdeck.web.views.fmt import fmt_duration, fmt_ranks, fmt_time_ns
from flightdeck.web.views.timeline import STATES, CellState, Row


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
