"""Mismatches: the first collective at which the members of a group recorded different ones (op,
sizes or dtypes), found by comparing the fingerprints each rank holds, and the words for it."""

from __future__ import annotations

import bisect
from array import array

from flightdeck.analysis.findings import Finding, FindingKind
from flightdeck.analysis.rules.common import NS, _fmt_ranks, _Group, _group_label, _refs
from flightdeck.analysis.summary import Comparable, GroupTrack, RankSummary


def _holds(track: GroupTrack, lo: int, hi: int) -> array[int] | None:
    """The fingerprints for seqs lo..hi, when the track holds all of them contiguously."""
    i = track.index_of(lo)
    j = track.index_of(hi)
    if i is None or j is None or j - i != hi - lo:
        return None
    return track.fps[i : j + 1]


def _fp_at(track: GroupTrack, seq: int) -> int | None:
    i = track.index_of(seq)
    return None if i is None else track.fps[i]


def _mismatch(
    g: _Group, by_rank: dict[int, RankSummary], prior: tuple[int, int] | None
) -> tuple[Finding | None, tuple[int, int]]:
    """The first (group, seq) at which the member ranks recorded different collectives, and the
    group's new `Report.agreed` value. `prior`: that value from the last diagnosis."""
    tracks = dict(g.held)
    holders = list(tracks)
    if len(holders) < 2:
        return None, (0, len(holders))
    # Entries older than what every rank still holds are not evidence (ring-buffer wrap).
    lasts = [t.last_seq for t in tracks.values()]
    lo = max(t.first_seq for t in tracks.values())
    hi_common = min(lasts)
    agreed_hi = lo - 1
    if prior is not None and prior[1] == len(holders):
        # The same ranks (a job's holders only grow) agreed up to prior[0] last time.
        agreed_hi = max(agreed_hi, prior[0])
        lo = max(lo, prior[0] + 1)
    first_bad: int | None = None
    if lo <= hi_common:
        slices = {r: _holds(t, lo, hi_common) for r, t in tracks.items()}
        if all(v is not None for v in slices.values()):
            # Identical windows are one class: compared as bytes, one hash per rank.
            classes: dict[bytes, array[int]] = {}
            for sl in slices.values():
                assert sl is not None
                classes.setdefault(sl.tobytes(), sl)
            if len(classes) > 1:
                reps = list(classes.values())
                for k in range(hi_common - lo + 1):
                    if len({rep[k] for rep in reps}) > 1:
                        first_bad = lo + k
                        break
        else:
            first_bad = _scan(tracks, lo, hi_common)
    if first_bad is None:
        agreed_hi = max(agreed_hi, hi_common)
        hi_all = max(lasts)
        first_bad = _scan(tracks, max(lo, hi_common + 1), hi_all)
    else:
        agreed_hi = first_bad - 1
    agreed = (agreed_hi, len(holders))
    if first_bad is None:
        return None, agreed
    return _mismatch_at(g, first_bad, tracks, by_rank), agreed


def _pending_for(g: _Group, seq: int | None, by_rank: dict[int, RankSummary], now_ns: int) -> float | None:
    """Seconds the divergent collective has been in flight on the first member that entered it
    (None when it finished everywhere: a silent mismatch blocks nobody)."""
    created = [
        e.time_created_ns
        for r in g.present
        if seq is not None
        if (e := by_rank[r].entry_at(g.name, seq)) is not None and not e.finished
    ]
    return max(0.0, (now_ns - min(created)) / NS) if created else None


def _scan(tracks: dict[int, GroupTrack], lo: int, hi: int) -> int | None:
    """The first seq in lo..hi that two tracks holding it recorded differently, else None.

    Track by track over the seqs each holds in the range (not seq by seq over every track: the
    range above what all ranks hold is a few seqs, and the ranks are thousands)."""
    if lo > hi:
        return None
    first: dict[int, int] = {}
    bad: int | None = None
    for t in tracks.values():
        seqs = t.seqs
        i, j = bisect.bisect_left(seqs, lo), bisect.bisect_right(seqs, hi)
        for seq, fp in zip(seqs[i:j], t.fps[i:j], strict=True):
            if first.setdefault(seq, fp) != fp and (bad is None or seq < bad):
                bad = seq
    return bad


def _sig_view(sig: Comparable) -> dict[str, object]:
    return {
        "op": sig[0],
        "input_sizes": [list(s) for s in sig[1]],
        "output_sizes": [list(s) for s in sig[2]],
        "input_dtypes": list(sig[3]),
        "output_dtypes": list(sig[4]),
    }


def _kind(ref: Comparable, other: Comparable) -> FindingKind:
    if ref[0] != other[0]:
        return "collective_type_mismatch"
    if ref[1] != other[1] or ref[2] != other[2]:
        return "size_mismatch"
    return "dtype_mismatch"


def _mismatch_at(
    g: _Group, seq: int, tracks: dict[int, GroupTrack], by_rank: dict[int, RankSummary]
) -> Finding:
    votes: dict[int, list[int]] = {}
    for r, t in tracks.items():
        fp = _fp_at(t, seq)
        if fp is not None:
            votes.setdefault(fp, []).append(r)
    ranked = sorted(votes.items(), key=lambda kv: (-len(kv[1]), kv[1][0]))
    top_fp, top_ranks = ranked[0]
    tie = len(ranked) > 1 and len(ranked[1][1]) == len(top_ranks)
    ref_sig = by_rank[top_ranks[0]].sigs[top_fp]
    if tie:
        culprits = sorted(r for fp, rs in ranked for r in rs)
        bad_fp, bad_ranks = ranked[1]
        bad_sig = by_rank[bad_ranks[0]].sigs[bad_fp]
        kind = _kind(ref_sig, bad_sig)
        sides = "; ".join(
            f"{_fmt_ranks(rs)} recorded {_describe(by_rank[rs[0]].sigs[fp])}" for fp, rs in ranked
        )
        detail = (
            f"{_kind_words(kind).capitalize()} in {_group_label(g)} at collective_seq_id {seq}: {sides}. "
            "The ranks split evenly, so which side diverged cannot be told from the dumps alone; "
            "compare the call sites below."
        )
    else:
        culprits = sorted(r for fp, rs in ranked[1:] for r in rs)
        # The worst disagreement names the finding: a different op explains any size difference.
        kinds = sorted(
            ((_kind(ref_sig, by_rank[rs[0]].sigs[fp]), fp, rs) for fp, rs in ranked[1:]),
            key=lambda x: ("collective_type_mismatch", "size_mismatch", "dtype_mismatch").index(x[0]),
        )
        kind, bad_fp, bad_ranks = kinds[0]
        bad_sig = by_rank[bad_ranks[0]].sigs[bad_fp]
        detail = (
            f"{_kind_words(kind).capitalize()} in {_group_label(g)} at collective_seq_id {seq}: "
            f"{_fmt_ranks(culprits, by_rank)} recorded {_describe(bad_sig)} where the other "
            f"{len(top_ranks)} rank{'s' if len(top_ranks) != 1 else ''} recorded {_describe(ref_sig)}."
        )
        if kind == "dtype_mismatch" and _nbytes_equal(ref_sig, bad_sig):
            detail += (
                " The element sizes are equal, so gloo completes the collective silently with wrong data."
            )
    return Finding(
        kind=kind,
        detail=detail,
        process_group=g.name,
        process_group_desc=g.desc,
        collective_seq_id=seq,
        op=ref_sig[0],
        culprit_ranks=culprits,
        waiting_ranks=[],
        culprits=_refs(culprits, by_rank),
        expected=_sig_view(ref_sig),
        actual=_sig_view(bad_sig),
        culprit_frames=by_rank[bad_ranks[0]].sig_frames.get(bad_fp, ()),
        waiting_frames=by_rank[top_ranks[0]].sig_frames.get(top_fp, ()),
    )


_DTYPE_BYTES = {
    "Float": 4, "Int": 4, "UInt32": 4, "Double": 8, "Long": 8, "UInt64": 8, "Half": 2, "BFloat16": 2,
    "Short": 2, "UInt16": 2, "Byte": 1, "Char": 1, "Bool": 1, "ComplexFloat": 8, "ComplexDouble": 16,
    "Float8_e4m3fn": 1, "Float8_e5m2": 1,
}  # fmt: skip


def _nbytes_equal(a: Comparable, b: Comparable) -> bool:
    da = [_DTYPE_BYTES.get(d) for d in a[3]]
    db = [_DTYPE_BYTES.get(d) for d in b[3]]
    return None not in da and da == db


def _kind_words(kind: str) -> str:
    return {
        "collective_type_mismatch": "collective type mismatch",
        "size_mismatch": "size mismatch",
        "dtype_mismatch": "dtype mismatch",
        "p2p_mismatch": "point-to-point mismatch",
    }.get(kind, kind)


def _describe(sig: Comparable) -> str:
    op, ins, outs, idt, _odt = sig
    sizes = ",".join("x".join(str(d) for d in s) or "scalar" for s in ins) or (
        ",".join("x".join(str(d) for d in s) for s in outs)
    )
    dtypes = ",".join(idt)
    bits = " ".join(b for b in (sizes and f"[{sizes}]", dtypes) if b)
    return f"{op} {bits}".strip()
