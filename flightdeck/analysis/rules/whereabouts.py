"""Under file times only: where a hang's culprits are, when they all stopped in one collective
of another group that some of them finished and the others are still inside."""

from __future__ import annotations

from flightdeck.analysis import evidence
from flightdeck.analysis.findings import Finding, entry_json
from flightdeck.analysis.rules.common import _fmt_ranks, _Group, _group_label, _last_entry, _refs, _sizes
from flightdeck.analysis.summary import RankSummary


def _where_culprits_are(
    findings: list[Finding], groups: list[_Group], by_rank: dict[int, RankSummary]
) -> list[Finding]:
    """Under file times only: where the culprits of a hang are, when they all stopped in one
    collective of another group that some of them finished (or failed) and the others are still
    inside. Raw dumps hold no liveness, so a rank killed or stopped there shows only as this: the
    hang follows from it, and the ranks still inside it are named, with its group and seq."""
    by_name = {g.name: g for g in groups}
    have = {(f.process_group, f.collective_seq_id) for f in findings}
    out: list[Finding] = []
    for f in list(findings):
        if f.kind != "hang" or not f.culprit_ranks or any(c not in by_rank for c in f.culprit_ranks):
            continue
        tips = {(e.group, e.collective_seq_id) for c in f.culprit_ranks if (e := _last_entry(by_rank[c]))}
        if len(tips) != 1:
            continue
        ((name, seq),) = tips
        g = by_name.get(name)
        if g is None or name == f.process_group or (name, seq) in have:
            continue
        inside: list[int] = []
        left: list[int] = []
        for r in g.members:
            s = by_rank.get(r)
            e = s.entry_at(name, seq) if s is not None else None
            if s is None or e is None or evidence.went_on_after(s, e):
                continue
            (left if e.finished else inside).append(r)
        if not inside or not left:
            continue
        e0 = by_rank[inside[0]].entry_at(name, seq)
        assert e0 is not None
        one = len(inside) == 1
        what = f"{e0.op} {_sizes(e0.input_sizes)} {','.join(e0.input_dtypes)}".rstrip()
        have.add((name, seq))
        out.append(
            Finding(
                kind="state_mismatch",
                detail=(
                    f"State mismatch in {_group_label(g)} at collective_seq_id {seq} ({what}): "
                    f"{_fmt_ranks(left)} finished it (gloo retires a failed collective too) and recorded "
                    f"nothing after it, while {_fmt_ranks(inside, by_rank)} {'is' if one else 'are'} still "
                    f"inside it: {'it' if one else 'they'} stopped, died or {'was' if one else 'were'} killed "
                    f"in it (a dump cannot tell which, nor how long ago). The ranks of group "
                    f"{f.process_group} wait for {_fmt_ranks(f.culprit_ranks)} at collective_seq_id "
                    f"{f.collective_seq_id}."
                ),
                process_group=name,
                process_group_desc=g.desc,
                collective_seq_id=seq,
                op=e0.op,
                culprit_ranks=inside,
                waiting_ranks=inside,
                culprits=_refs(inside, by_rank),
                waiting_frames=e0.frames,
                culprit_last_entry=entry_json(e0),
            )
        )
    return out
