"""Findings against faults: which injected fault explains a finding the server reported."""

from __future__ import annotations

from typing import Any

from bench.loadgen.job import NS, Fault
from flightdeck.analysis.findings import MISMATCH_KINDS


def fault_seq(f: Fault, kinds: int) -> int:
    """The world group's collective_seq_id of the fault's collective."""
    return f.index // kinds + 1


def own_finding(f: Fault, finding: dict[str, Any], kinds: int) -> bool:
    """Whether `finding` (the findings API's object) is the one the fault should give: a hang
    naming the hung rank; a mismatch naming the odd rank or at the fault's collective."""
    d = finding["finding"]
    culprits = d.get("culprit_ranks") or []
    at = d.get("process_group") == "0" and d.get("collective_seq_id") == fault_seq(f, kinds)
    if f.kind == "hang":
        return finding["kind"] == "hang" and f.rank in culprits
    return finding["kind"] in MISMATCH_KINDS and (f.rank in culprits or at)


def explained_by(faults: list[Fault], finding: dict[str, Any], kinds: int) -> Fault | None:
    """The fault that explains `finding`, None for a false finding: its own finding, or one opened
    after it (1 s of clock slack) at its collective or naming its rank (a blocking mismatch also
    gives a hang in that collective; the hung rank may also show up slow)."""
    d = finding["finding"]
    opened = finding.get("opened_at_s") or 0.0
    for f in faults:
        if own_finding(f, finding, kinds):
            return f
    for f in faults:
        at = d.get("process_group") == "0" and d.get("collective_seq_id") == fault_seq(f, kinds)
        if opened >= f.at_ns / NS - 1.0 and (at or f.rank in (d.get("culprit_ranks") or [])):
            return f
    return None


def finding_brief(finding: dict[str, Any], t0_ns: int) -> dict[str, Any]:
    """A finding as the report lists it."""
    d = finding["finding"]
    culprits = d.get("culprit_ranks") or []
    return {
        "kind": finding["kind"],
        "opened_s": None
        if finding.get("opened_at_s") is None
        else round(finding["opened_at_s"] - t0_ns / NS, 1),
        "open": finding.get("open"),
        "group": d.get("process_group"),
        "seq": d.get("collective_seq_id"),
        "culprits": culprits[:8] + (["..."] if len(culprits) > 8 else []),
    }
