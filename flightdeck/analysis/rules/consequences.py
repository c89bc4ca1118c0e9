"""How findings relate: which one follows from another (a hang from a mismatch or a lost rank,
a hang from an older hang), and the order that lists root causes first."""

from __future__ import annotations

from flightdeck.analysis.findings import MISMATCH_KINDS, Finding
from flightdeck.analysis.rules.mismatch import _kind_words


def _link_consequences(findings: list[Finding]) -> dict[int, Finding]:
    """Find the findings that follow from another one: id(consequence) -> its root cause."""
    roots: dict[int, Finding] = {}
    mismatches = [f for f in findings if f.kind in MISMATCH_KINDS]
    lost = [f for f in findings if f.kind == "rank_lost"]
    hangs = sorted(
        (f for f in findings if f.kind in ("hang", "state_mismatch")), key=lambda f: -(f.elapsed_s or 0)
    )
    for f in findings:
        if f.kind in MISMATCH_KINDS:
            continue
        for m in mismatches:
            same_group_later = f.process_group == m.process_group and (
                f.collective_seq_id is None or (m.collective_seq_id or 0) <= f.collective_seq_id
            )
            if same_group_later or f.kind in ("rank_lost", "missing_dump"):
                roots[id(f)] = m
                f.detail += (
                    f" This follows from the {_kind_words(m.kind)} at collective_seq_id "
                    f"{m.collective_seq_id} in group {m.process_group}."
                )
                break
        if id(f) in roots or f.kind != "hang" or not f.culprit_ranks:
            continue
        dead = next(
            (
                x
                for x in lost
                if set(f.culprit_ranks) <= set(x.culprit_ranks) or x.culprit_ranks[0] in f.culprit_ranks
            ),
            None,
        )
        if dead is not None:
            roots[id(f)] = dead
            continue
        # A hang whose culprits are themselves waiting in an older hang follows from that one.
        for older in hangs:
            if older is f or (older.elapsed_s or 0) < (f.elapsed_s or 0) or id(older) in roots:
                continue
            if set(f.culprit_ranks) & set(older.waiting_ranks):
                roots[id(f)] = older
                f.detail += (
                    f" The culprit is itself blocked in the older hang in group {older.process_group} "
                    f"(collective_seq_id {older.collective_seq_id})."
                )
                break
    return roots


def _order(findings: list[Finding], roots: dict[int, Finding]) -> None:
    """Sort root causes first and point each consequence at its root's position."""
    for f in findings:
        f.consequence_of = 0 if id(f) in roots else None  # only its truthiness matters for sorting
    findings.sort(key=Finding.sort_key)
    pos = {id(f): i for i, f in enumerate(findings)}
    for f in findings:
        root = roots.get(id(f))
        f.consequence_of = None if root is None else pos[id(root)]
