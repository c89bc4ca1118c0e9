"""all_to_all size checks: the group's element totals must balance, whatever the splits.

The flight recorder keeps only each rank's total input and output sizes of an all_to_all, never
the splits, and uneven splits are legal (each rank's totals may differ from every other's). What
always holds is conservation: every element sent is received, so across the group the inputs and
the outputs add up to the same number. A rank that sends fewer elements than its peers expect
(gloo then completes the collective silently with wrong data) breaks exactly that. The rank whose
own totals explain the difference is the one whose totals moved by that much since the last
balanced all_to_all of the group, or, with no history, the one rank off the others' common total.
Pure: summaries in, a finding out.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from flightdeck.analysis.findings import Finding, RankRef
from flightdeck.analysis.summary import RankSummary
from flightdeck.records import Stack

Totals = dict[int, tuple[int, int]]


def _explain(at: Totals, before: Totals | None, diff: int) -> tuple[list[int], str]:
    """The ranks whose totals account for `diff` (outputs minus inputs over the group), and why."""
    if before is not None:
        moved = [r for r in at if at[r] != before[r]]
        # A short (or long) send moves the sender's input by -diff; a receiver that expects too
        # much (or too little) moves its output by +diff.
        exact = [
            r
            for r in moved
            if (at[r][0] - before[r][0] == -diff and at[r][1] == before[r][1])
            or (at[r][1] - before[r][1] == diff and at[r][0] == before[r][0])
        ]
        if len(exact) == 1:
            r = exact[0]
            side = "sent" if at[r][0] != before[r][0] else "expected to receive"
            was = before[r][0] if side == "sent" else before[r][1]
            now = at[r][0] if side == "sent" else at[r][1]
            return exact, (
                f"rank {r} {side} {now} elements where it {side} {was} at the previous balanced "
                f"all_to_all of the group, with its {'output' if side == 'sent' else 'input'} unchanged: "
                f"that accounts for the difference of {abs(diff)}"
            )
        if len(moved) == 1:
            return (
                moved,
                f"rank {moved[0]} is the only rank whose totals changed since the previous balanced one",
            )
    for side, idx in (("input", 0), ("output", 1)):
        common = Counter(v[idx] for v in at.values()).most_common()
        if len(common) > 1 and common[0][1] == len(at) - 1:
            odd = [r for r, v in at.items() if v[idx] != common[0][0]]
            delta = at[odd[0]][idx] - common[0][0]
            if (idx == 0 and delta == -diff) or (idx == 1 and delta == diff):
                return odd, (
                    f"rank {odd[0]}'s {side} total is {at[odd[0]][idx]} where every other rank's is "
                    f"{common[0][0]}: that accounts for the difference of {abs(diff)}"
                )
    return [], "which rank's splits are wrong cannot be told from the totals"


def all_to_all_balance(
    group: str, desc: str, members: Sequence[int], by_rank: dict[int, RankSummary]
) -> Finding | None:
    """The first all_to_all of the group whose input and output totals do not add up, or None.

    Judged only where every member's dump holds the collective (a partial sum proves nothing).
    """
    tracks = []
    for r in members:
        s = by_rank.get(r)
        t = s.tracks.get(group) if s is not None else None
        if t is None or not t.totals:
            return None
        tracks.append((r, t))
    common = set(tracks[0][1].totals)
    for _, t in tracks[1:]:
        common &= set(t.totals)
    before: Totals | None = None
    for seq in sorted(common):
        at = {r: t.totals[seq] for r, t in tracks}
        sent = sum(v[0] for v in at.values())
        received = sum(v[1] for v in at.values())
        if sent == received:
            before = at
            continue
        diff = received - sent
        culprits, why = _explain(at, before, diff)
        label = f"group {group}" + (f" ({desc})" if desc else "")
        detail = (
            f"Size mismatch in {label} at collective_seq_id {seq} (all_to_all): its ranks sent "
            f"{sent} elements in all but expected to receive {received}, "
            f"{abs(diff)} {'more' if diff > 0 else 'fewer'} than were sent, so their splits do not "
            f"agree; {why}. gloo completes such an all_to_all without an error, with wrong data "
            "(uneven splits alone are legal: only totals that do not add up are flagged)."
        )
        expected = {"sent_total": received, "received_total": received}
        actual = {
            "sent_total": sent,
            "received_total": received,
            "per_rank": {str(r): list(v) for r, v in at.items()},
        }
        return Finding(
            kind="size_mismatch",
            detail=detail,
            process_group=group,
            process_group_desc=desc,
            collective_seq_id=seq,
            op="all_to_all",
            culprit_ranks=culprits,
            culprits=[RankRef(r, by_rank[r].host, by_rank[r].pid) for r in culprits],
            expected=expected,
            actual=actual,
            culprit_frames=_frames(by_rank, culprits, group, seq),
        )
    return None


def _frames(by_rank: dict[int, RankSummary], culprits: list[int], group: str, seq: int) -> Stack:
    """Where the culprit called it: the entry's own stack, else the latest one of its signature."""
    if not culprits:
        return ()
    s = by_rank[culprits[0]]
    e = s.entry_at(group, seq)
    if e is not None:
        return e.frames
    t = s.tracks[group]
    i = t.index_of(seq)
    return s.sig_frames.get(t.fps[i], ()) if i is not None else ()
