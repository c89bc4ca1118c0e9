"""The cell page: one rank at one collective, side by side with the same collective on another rank."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from flightdeck.web.data import EntryLike, RankDetail, RankTrack, TimelineData
from flightdeck.web.views.entries import EntryView, FrameView, _finished, entry_view, frame_views, seq_of
from flightdeck.web.views.timeline import STATES, CellState, cell_state, mismatched_cells


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
