"""The (rank x seq) timeline of the job page: the state of each cell, and the rows that fold the
ranks showing the same states across the window."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from flightdeck.analysis.findings import MISMATCH_KINDS
from flightdeck.web.data import EntryLike, RankTrack
from flightdeck.web.views.entries import _finished
from flightdeck.web.views.fmt import fmt_ranks

CellState = Literal["completed", "in_flight", "never_entered", "mismatched", "unknown"]


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
