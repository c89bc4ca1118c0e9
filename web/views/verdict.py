"""The verdict as the pages show it: the banner (the root cause), one line per other finding, the
titles of the finding kinds, and the fingerprint that tells whether a page changed."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from flightdeck.analysis.findings import CONFIG_KINDS
from flightdeck.web.views.entries import FrameView, frame_views
from flightdeck.web.views.fmt import fmt_duration, fmt_ranks, fmt_sizes

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
