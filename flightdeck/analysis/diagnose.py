"""Cross-rank diagnosis: rank summaries in, findings out. Pure: no files, clock, env or database.

The order of the questions matters, because one fault causes others. A rank that sent a tensor of
the wrong size makes gloo abort the receiving rank, which then looks lost, and everybody else hangs;
the answer is the size mismatch by the sending rank. So mismatches are found first, then lost ranks,
then hangs, and each later finding that follows from an earlier one points back at it.
"""

from __future__ import annotations

import bisect
import statistics
from array import array
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import islice

from flightdeck.analysis import evidence
from flightdeck.analysis.config_skew import PeerJob, RankConfigRef, config_findings
from flightdeck.analysis.evidence import ClockSource, Evidence
from flightdeck.analysis.findings import (
    MISMATCH_KINDS,
    Finding,
    FindingKind,
    Options,
    RankRef,
    Report,
    entry_json,
)
from flightdeck.analysis.frames import innermost_user_frame, is_agent_frame
from flightdeck.analysis.p2p_gaps import link_stranded
from flightdeck.analysis.p2p_gaps import refine_hang as blame_p2p_gap
from flightdeck.analysis.progress import name_where
from flightdeck.analysis.progress import refine_hang as judge_progress
from flightdeck.analysis.sizes import all_to_all_balance
from flightdeck.analysis.summary import GroupTrack, RankSummary, Signature
from flightdeck.records import Entry, Stack

NS = 1_000_000_000
#: Ranks without a dump listed (in `Report.without_dump` and a finding's culprits) beyond the
#: ranks that have one: the count is always whole, the list is bounded by what was received.
MAX_LISTED_MISSING = 4096
#: Collectives looked at for arrival skew and stragglers (the most recent ones of the window).
SKEW_WINDOW = 256


@dataclass(frozen=True, slots=True)
class _Group:
    name: str
    desc: str
    #: A world group whose members are known only by its size is a `range` (the ranks seen are
    #: looked up in it: nothing is allocated per rank of a size a batch claims).
    members: Sequence[int]


def diagnose(
    summaries: Sequence[RankSummary],
    *,
    now_ns: int,
    options: Options | None = None,
    world_size: int | None = None,
    job: str | None = None,
    peers: Sequence[PeerJob] = (),
    stragglers: bool = True,
    agreed: Mapping[str, tuple[int, int]] | None = None,
    clock: ClockSource | None = None,
) -> Report:
    """Diagnose one job (one attempt) from the latest summary of each rank it has.

    `peers`: other jobs, for the cross-job configuration rules (see `config_skew`).
    `agreed`: the previous diagnosis's `Report.agreed` of these same summaries, grown since
    (a live server's): the collectives it found in agreement are not compared again, so a
    diagnosis costs what arrived since the last one, not the whole history held.
    `stragglers=False` skips the arrival-skew analysis (no straggler findings, no
    `arrival_skew_s`): the costliest part on large jobs, which a live server runs less often.
    `clock`: where `now_ns` came from (see `evidence.ClockSource`); None infers "snapshot" or,
    when every rank's time is only its file's mtime, "file": then elapsed times are unknown, and
    what is claimed rests on what the dumps prove (`evidence`).
    """
    opts = options or Options()
    by_rank: dict[int, RankSummary] = {}
    for s in summaries:
        old = by_rank.get(s.rank)
        if old is None or (s.snapshot_time_ns or 0) >= (old.snapshot_time_ns or 0):
            by_rank[s.rank] = s
    groups = _groups(by_rank, world_size)
    expected = _expected_ranks(by_rank, world_size, groups)
    without, missing = missing_ranks(by_rank, expected)
    report = Report(
        expected_ranks=expected,
        with_dump=sorted(by_rank),
        without_dump=without,
        without_dump_count=missing,
        findings=[],
        job=job if job is not None else next((s.job for s in by_rank.values() if s.job), None),
        now_s=now_ns / NS,
    )
    ev = evidence.gather(by_rank, ((g.name, g.members) for g in groups), now_ns=now_ns, clock=clock)
    report.clock = ev.clock
    if not ev.elapsed_known:
        # Elapsed times are measured to the newest moment the dumps themselves recorded, never
        # to a copy's file time.
        now_ns = ev.now_ns
    for s in by_rank.values():
        report.warnings.extend(f"rank {s.rank}: {w}" for w in s.warnings)
    if not by_rank:
        report.findings.append(
            Finding(kind="undecided", detail="No usable dump: there is nothing to diagnose.")
        )
        return report

    findings: list[Finding] = []
    for g in groups:
        f, report.agreed[g.name] = _mismatch(g, by_rank, (agreed or {}).get(g.name))
        if f is None:
            f = all_to_all_balance(g.name, g.desc, g.members, by_rank)
        if f is not None:
            f.elapsed_s = _pending_for(g, f.collective_seq_id, by_rank, now_ns)
            # Where the culprit took the other path, from its agent's evidence when the snapshots
            # carry no entry frames (periodic ones do not).
            name_where(f, by_rank, now_ns, fresh_s=opts.stall_after_s)
            findings.append(f)
        findings.extend(_p2p(g, by_rank, now_ns, opts, ev.elapsed_known))
    findings.extend(_per_host(_lost(by_rank, now_ns, opts), by_rank))
    for g in groups:
        f = _hang(g, by_rank, without, missing, now_ns, opts, ev)
        if f is not None:
            findings.append(blame_p2p_gap(f, g.name, g.members, by_rank))
    if ev.positions_only:
        findings.extend(_where_culprits_are(findings, groups, by_rank))
    if without:
        findings.append(_missing(without, missing))
    roots = _link_consequences(findings)
    link_stranded(findings, roots, {g.name: g.members for g in groups}, by_rank)
    if stragglers:
        report.arrival_skew_s, slow = _stragglers(groups, by_rank, opts)
        if not findings:
            # A straggler is worth a finding on an otherwise healthy job; beside a fault it is noise.
            findings.extend(slow)
    _order(findings, roots)
    if not ev.elapsed_known:
        # Under file times only, elapsed times were measured to the newest moment the dumps
        # recorded: a lower bound that orders the findings (the older wait is the root cause),
        # never reported as how long anything waited.
        for f in findings:
            f.elapsed_s = None
    report.findings = findings
    if not report.findings and _nothing_compared(by_rank):
        report.findings.append(
            Finding(
                kind="undecided",
                detail="The dumps hold no collective entries (flight recorder off, TORCH_FR_BUFFER_SIZE=0, "
                "or dumped before the first collective): nothing can be decided.",
            )
        )
    # How the ranks are set up, after what they ran: context, never a consequence of either.
    report.findings.extend(
        config_findings(
            [RankConfigRef(s.rank, s.host, s.config) for s in by_rank.values() if s.config is not None],
            peers=peers,
        )
    )
    return report


# --- groups and ranks ----------------------------------------------------------------------------


def _group_sort_key(name: str) -> tuple[int, int | str]:
    return (0, int(name)) if name.isdigit() else (1, name)


def _groups(by_rank: dict[int, RankSummary], world_size: int | None) -> list[_Group]:
    """Every process group with its members: from metadata/pg_config, else from who recorded it."""
    # One pass over the ranks (not one per group: thousands of groups times thousands of ranks).
    names: set[str] = set()
    # Member lists are counted by object first: hashing a world-sized tuple once per rank is
    # ranks x world element hashes per diagnosis, while ranks that share one list object (the
    # live server interns them) cost one hash for all.
    declared_by: dict[str, dict[int, tuple[tuple[int, ...], int]]] = {}
    descs_by: dict[str, Counter[str]] = {}
    recorded_by: dict[str, list[int]] = {}
    for r, s in by_rank.items():
        names.update(s.tracks)
        names.update(s.groups)
        for name in s.tracks:
            recorded_by.setdefault(name, []).append(r)
        for name, info in s.groups.items():
            if info.ranks:
                objs = declared_by.setdefault(name, {})
                seen = objs.get(id(info.ranks))
                objs[id(info.ranks)] = (info.ranks, 1 if seen is None else seen[1] + 1)
            if info.desc and info.desc != "undefined":
                descs_by.setdefault(name, Counter())[info.desc] += 1
    out: list[_Group] = []
    for name in sorted(names, key=_group_sort_key):
        declared: Counter[tuple[int, ...]] = Counter()
        for members_obj, n in (declared_by.get(name) or {}).values():
            declared[members_obj] += n
        descs = descs_by.get(name) or Counter()
        recorded = tuple(sorted(recorded_by.get(name, ())))
        members: Sequence[int]
        if declared:
            members = declared.most_common(1)[0][0]
        elif name == "0" or descs.get("default_pg"):
            size = world_size or max((s.world_size or 0) for s in by_rank.values()) or (max(by_rank) + 1)
            members = range(size)
        else:
            members = recorded
        if not members:
            continue
        desc = descs.most_common(1)[0][0] if descs else ""
        out.append(_Group(name, desc, members))
    return out


def _expected_ranks(by_rank: dict[int, RankSummary], world_size: int | None, groups: list[_Group]) -> int:
    if world_size:
        return world_size
    sizes = [s.world_size for s in by_rank.values() if s.world_size]
    if sizes:
        return max(sizes)
    top = max(by_rank)
    for g in groups:
        top = max(top, g.members[-1] if isinstance(g.members, range) else max(g.members))
    return top + 1


def missing_ranks(present: Iterable[int], expected: int) -> tuple[list[int], int]:
    """The ranks below `expected` not in `present` (the first `MAX_LISTED_MISSING` more than
    there are present ones, in order) and how many there are in all: the work and the list are
    bounded by the ranks present, whatever `expected` claims."""
    have = {r for r in present if 0 <= r < expected}
    limit = MAX_LISTED_MISSING + len(have)
    listed = list(islice((r for r in range(expected) if r not in have), limit))
    return listed, expected - len(have)


def _present(members: Sequence[int], by_rank: Mapping[int, object]) -> list[int]:
    """The members that have a summary, in member order (a `range` one: from the ranks seen)."""
    if isinstance(members, range):
        return [r for r in sorted(by_rank) if r in members]
    return [r for r in members if r in by_rank]


def _ref(s: RankSummary | None, rank: int) -> RankRef:
    return RankRef(rank, s.host if s else None, s.pid if s else None)


def _refs(ranks: Sequence[int], by_rank: dict[int, RankSummary]) -> list[RankRef]:
    return [_ref(by_rank.get(r), r) for r in ranks]


def _fmt_ranks(
    ranks: Sequence[int],
    by_rank: dict[int, RankSummary] | None = None,
    limit: int = 8,
    total: int | None = None,
) -> str:
    """'rank 3 (host-a pid 42)' / 'ranks 0, 1, 2 … (+5 more)'; `total`: how many `ranks` (a
    bounded list) stands for."""
    total = len(ranks) if total is None else total
    shown = list(ranks[:limit])
    parts = []
    for r in shown:
        s = by_rank.get(r) if by_rank else None
        where = ""
        if s is not None and s.host:
            where = f" ({s.host}" + (f" pid {s.pid})" if s.pid else ")")
        parts.append(f"{r}{where}")
    more = f" (+{total - len(shown)} more)" if total > len(shown) else ""
    return ("rank " if total == 1 else "ranks ") + ", ".join(parts) + more


def _group_label(g: _Group) -> str:
    return f"group {g.name}" + (f" ({g.desc})" if g.desc else "")


# --- mismatches ----------------------------------------------------------------------------------


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
    name = g.name
    tracks = {
        r: t
        for r in _present(g.members, by_rank)
        if (s := by_rank.get(r)) is not None and (t := s.tracks.get(name)) is not None and t.seqs
    }
    holders = list(tracks)
    if len(holders) < 2:
        return None, (0, len(holders))
    # Entries older than what every rank still holds are not evidence (ring-buffer wrap).
    lo = max(t.seqs[0] for t in tracks.values())
    hi_common = min(t.seqs[-1] for t in tracks.values())
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
        hi_all = max(t.seqs[-1] for t in tracks.values())
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
        for r in _present(g.members, by_rank)
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


def _sig_view(sig: Signature) -> dict[str, object]:
    return {
        "op": sig[0],
        "input_sizes": [list(s) for s in sig[1]],
        "output_sizes": [list(s) for s in sig[2]],
        "input_dtypes": list(sig[3]),
        "output_dtypes": list(sig[4]),
    }


def _kind(ref: Signature, other: Signature) -> FindingKind:
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
        other_fp, other_ranks = ranked[1]
        other_sig = by_rank[other_ranks[0]].sigs[other_fp]
        kind = _kind(ref_sig, other_sig)
        sides = "; ".join(
            f"{_fmt_ranks(rs)} recorded {_describe(by_rank[rs[0]].sigs[fp])}" for fp, rs in ranked
        )
        detail = (
            f"{_kind_words(kind).capitalize()} in {_group_label(g)} at collective_seq_id {seq}: {sides}. "
            "The ranks split evenly, so which side diverged cannot be told from the dumps alone; "
            "compare the call sites below."
        )
        return Finding(
            kind=kind,
            detail=detail,
            process_group=g.name,
            process_group_desc=g.desc,
            collective_seq_id=seq,
            op=ref_sig[0],
            culprit_ranks=culprits,
            culprits=_refs(culprits, by_rank),
            expected=_sig_view(ref_sig),
            actual=_sig_view(other_sig),
            culprit_frames=by_rank[other_ranks[0]].sig_frames.get(other_fp, ()),
            waiting_frames=by_rank[top_ranks[0]].sig_frames.get(top_fp, ()),
        )
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
        detail += " The element sizes are equal, so gloo completes the collective silently with wrong data."
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


def _nbytes_equal(a: Signature, b: Signature) -> bool:
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


def _describe(sig: Signature) -> str:
    op, ins, outs, idt, _odt = sig
    sizes = ",".join("x".join(str(d) for d in s) or "scalar" for s in ins) or (
        ",".join("x".join(str(d) for d in s) for s in outs)
    )
    dtypes = ",".join(idt)
    bits = " ".join(b for b in (sizes and f"[{sizes}]", dtypes) if b)
    return f"{op} {bits}".strip()


# --- point-to-point ------------------------------------------------------------------------------


def _p2p(
    g: _Group, by_rank: dict[int, RankSummary], now_ns: int, opts: Options, elapsed_known: bool = True
) -> list[Finding]:
    """Point-to-point faults from the send/recv entries NCCL records (gloo records none).

    Between two ranks NCCL delivers in order, so the k-th send src->dst pairs with the k-th recv
    dst<-src (ops of one `batch_isend_irecv` share a `p2p_seq_id`; the reader gives them the
    batch's state). A pair that disagrees on sizes or dtypes is a mismatch; its culprit is the side
    that changed from the transfers between the two that matched before. An unpaired op that is
    stuck waits for a peer: when the rank it names posted nothing for it while another rank waits
    for a message from the same rank (a send src->X unpaired, a recv Y<-src unpaired), src sent to
    the wrong peer (or, mirrored, a receiver named the wrong source); otherwise the peer that
    never posted the matching op is the culprit.

    Under file times only (`elapsed_known` False) an op counts as stuck by position instead: it is
    the newest thing its rank recorded, and another member of the group recorded something later.
    """
    sends: dict[tuple[int, int], list[Entry]] = {}
    recvs: dict[tuple[int, int], list[Entry]] = {}
    for r in _present(g.members, by_rank):
        s = by_rank.get(r)
        if s is None or s.wrapped:
            continue
        track = s.tracks.get(g.name)
        if track is None:
            continue
        for e in track.p2p:
            if e.peer is None:
                continue
            peer = g.members[e.peer] if e.peer < len(g.members) else e.peer
            if e.op == "send":
                sends.setdefault((r, peer), []).append(e)
            elif e.op == "recv":
                recvs.setdefault((peer, r), []).append(e)
    out: list[Finding] = []
    #: Unpaired ops still in flight, by pair: (the op, its position in the pair's stream).
    lone_sends: dict[tuple[int, int], tuple[Entry, int]] = {}
    lone_recvs: dict[tuple[int, int], tuple[Entry, int]] = {}
    for pair in sorted(set(sends) | set(recvs)):
        src, dst = pair
        if src not in by_rank or dst not in by_rank:
            continue
        ss, rr = sends.get(pair, []), recvs.get(pair, [])
        for k in range(max(len(ss), len(rr))):
            se = ss[k] if k < len(ss) else None
            re_ = rr[k] if k < len(rr) else None
            if se is not None and re_ is not None:
                if se.input_sizes != re_.output_sizes or se.input_dtypes != re_.output_dtypes:
                    out.append(_p2p_mismatch(g, src, dst, k, ss[:k], rr[:k], se, re_, by_rank))
                    break
                continue
            lone = se or re_
            assert lone is not None
            owner = src if se is not None else dst
            stuck = (
                (now_ns - lone.time_created_ns) / NS >= opts.stall_after_s
                if elapsed_known
                else _stuck_by_position(lone, owner, g, by_rank)
            )
            if not lone.finished and stuck:
                (lone_sends if se is not None else lone_recvs)[pair] = (lone, k)
            break
    # Wrong peer: src's unpaired send is the first transfer ever seen between src and X, while Y,
    # which src did send to before, waits for the next one. (When src had sent to X before, X not
    # posting its recv is the likelier fault: X is stuck elsewhere, src blocks on it and so has
    # not reached its send to Y yet; that is left to the hang findings below.)
    blamed: set[tuple[int, int]] = set()
    for (src, x), (se, k_s) in sorted(lone_sends.items()):
        other = next(
            ((y, rv) for (s2, y), rv in sorted(lone_recvs.items()) if s2 == src and y != x and rv[1] > 0),
            None,
        )
        if other is None or k_s > 0:
            continue
        y, (re_, k) = other
        blamed.update({(src, x), (src, y)})
        out.append(
            _wrong_peer(
                g, src, se, re_, k, by_rank, now_ns, elapsed_known, sender=True, named=x, expected_by=y
            )
        )
    for (x, dst), (re_, k_r) in sorted(lone_recvs.items()):
        if (x, dst) in blamed or k_r > 0:
            continue
        other = next(
            ((y, sv) for (y, d2), sv in sorted(lone_sends.items()) if d2 == dst and y != x and sv[1] > 0),
            None,
        )
        if other is None or (other[0], dst) in blamed:
            continue
        y, (se, k) = other
        blamed.update({(x, dst), (y, dst)})
        out.append(
            _wrong_peer(
                g, dst, re_, se, k, by_rank, now_ns, elapsed_known, sender=False, named=x, expected_by=y
            )
        )
    lone_ops = [(pair, v, True) for pair, v in lone_sends.items()] + [
        (pair, v, False) for pair, v in lone_recvs.items()
    ]
    for pair, (lone, k), is_send in sorted(lone_ops, key=lambda x: x[0]):
        if pair in blamed:
            continue
        src, dst = pair
        waiting, missing = (src, dst) if is_send else (dst, src)
        elapsed = (now_ns - lone.time_created_ns) / NS
        verb = "recv from" if is_send else "send to"
        out.append(
            Finding(
                kind="hang",
                detail=(
                    f"Point-to-point hang in {_group_label(g)}: rank {waiting} has waited "
                    f"{_waited(elapsed, elapsed_known)} "
                    f"in {lone.op} #{k + 1} with rank {missing} (p2p_seq_id {lone.p2p_seq_id}), which never "
                    f"posted the matching {verb} rank {waiting}."
                ),
                process_group=g.name,
                process_group_desc=g.desc,
                op=lone.op,
                culprit_ranks=[missing],
                waiting_ranks=[waiting],
                elapsed_s=elapsed,
                culprits=_refs([missing], by_rank),
                waiting_frames=lone.frames,
            )
        )
    return out


def _p2p_mismatch(
    g: _Group,
    src: int,
    dst: int,
    k: int,
    before_s: list[Entry],
    before_r: list[Entry],
    se: Entry,
    re_: Entry,
    by_rank: dict[int, RankSummary],
) -> Finding:
    """A send and its recv that disagree; the culprit is the side that changed since the pair last
    matched (both sides when there is no earlier transfer to tell, or both changed)."""

    def shape(sizes: tuple[tuple[int, ...], ...], dtypes: tuple[str, ...]) -> tuple[object, ...]:
        return (sizes, dtypes)

    sent, wanted = shape(se.input_sizes, se.input_dtypes), shape(re_.output_sizes, re_.output_dtypes)
    before = [shape(b.input_sizes, b.input_dtypes) for b in before_s[-3:]]
    before += [shape(b.output_sizes, b.output_dtypes) for b in before_r[-3:]]
    culprits = [src, dst]
    if before and all(b == wanted for b in before):
        culprits = [src]
    elif before and all(b == sent for b in before):
        culprits = [dst]
    what = "size" if se.input_sizes != re_.output_sizes else "dtype"
    blame = ""
    if len(culprits) == 1:
        side = "sender" if culprits[0] == src else "receiver"
        blame = (
            f" The {min(k, 3)} transfer(s) before between the two carried "
            f"{_sizes(re_.output_sizes if side == 'sender' else se.input_sizes)}: the {side}, rank "
            f"{culprits[0]}, changed."
        )
    return Finding(
        kind="p2p_mismatch",
        detail=(
            f"Point-to-point {what} mismatch in {_group_label(g)}: send #{k + 1} from rank {src} to rank "
            f"{dst} (p2p_seq_id {se.p2p_seq_id} on rank {src}) carries {_sizes(se.input_sizes)} "
            f"{','.join(se.input_dtypes)} but the matching recv (p2p_seq_id {re_.p2p_seq_id} on rank {dst}) "
            f"expects {_sizes(re_.output_sizes)} {','.join(re_.output_dtypes)}.{blame}"
        ),
        process_group=g.name,
        process_group_desc=g.desc,
        op="send" if culprits == [src] else "recv" if culprits == [dst] else "send/recv",
        culprit_ranks=culprits,
        waiting_ranks=[r for r in (src, dst) if r not in culprits],
        culprits=_refs(culprits, by_rank),
        culprit_frames=se.frames if culprits[0] == src else re_.frames,
        waiting_frames=re_.frames if culprits[0] == src else se.frames,
        expected=_p2p_view(re_ if culprits[0] == src else se, recv=culprits[0] == src),
        actual=_p2p_view(se if culprits[0] == src else re_, recv=culprits[0] != src),
    )


def _p2p_view(e: Entry, *, recv: bool) -> dict[str, object]:
    sizes, dtypes = (e.output_sizes, e.output_dtypes) if recv else (e.input_sizes, e.input_dtypes)
    return {"op": e.op, "sizes": [list(x) for x in sizes], "dtypes": list(dtypes), "p2p_seq_id": e.p2p_seq_id}


def _waited(elapsed: float, known: bool) -> str:
    """How long an op has waited, in words (unknown under file times only)."""
    return f"{elapsed:.1f} s" if known else "an unknown time (only file times date the dumps)"


def _stuck_by_position(op: Entry, owner: int, g: _Group, by_rank: dict[int, RankSummary]) -> bool:
    """Whether `op` is stuck as the dumps alone show it: its rank recorded nothing after it, while
    another member of the group went on: it reached a later collective of the group, or recorded
    something later."""
    s = by_rank.get(owner)
    if s is None or evidence.went_on_after(s, op):
        return False
    mine = s.tracks.get(g.name)
    my_last = mine.last_seq if mine is not None and mine.seqs else 0
    for r in _present(g.members, by_rank):
        o = by_rank.get(r)
        if r == owner or o is None:
            continue
        theirs = o.tracks.get(g.name)
        if theirs is not None and theirs.seqs and theirs.last_seq > my_last:
            return True
        if evidence.recorded_ns(o) > op.time_created_ns:
            return True
    return False


def _wrong_peer(
    g: _Group,
    culprit: int,
    mine: Entry,
    theirs: Entry,
    k: int,
    by_rank: dict[int, RankSummary],
    now_ns: int,
    elapsed_known: bool,
    *,
    sender: bool,
    named: int,
    expected_by: int,
) -> Finding:
    """`culprit`'s unpaired op names rank `named`, which posted nothing for it, while rank
    `expected_by` waits in an unpaired op with `culprit`: the culprit picked the wrong peer."""
    elapsed = (now_ns - min(mine.time_created_ns, theirs.time_created_ns)) / NS
    if sender:
        detail = (
            f"Point-to-point mismatch in {_group_label(g)}: rank {culprit} sent to rank {named} (p2p_seq_id "
            f"{mine.p2p_seq_id}), which posted no recv from it, while rank {expected_by} waits in recv #{k + 1} "
            f"from rank {culprit}: rank {culprit} sent to the wrong peer. Both have waited "
            f"{_waited(elapsed, elapsed_known)}."
        )
    else:
        detail = (
            f"Point-to-point mismatch in {_group_label(g)}: rank {culprit} waits to receive from rank {named} "
            f"(p2p_seq_id {mine.p2p_seq_id}), which sent it nothing, while rank {expected_by} waits in send "
            f"#{k + 1} to rank {culprit}: rank {culprit} receives from the wrong peer. Both have waited "
            f"{_waited(elapsed, elapsed_known)}."
        )
    return Finding(
        kind="p2p_mismatch",
        detail=detail,
        process_group=g.name,
        process_group_desc=g.desc,
        op=mine.op,
        culprit_ranks=[culprit],
        waiting_ranks=[expected_by],
        elapsed_s=elapsed,
        culprits=_refs([culprit], by_rank),
        culprit_frames=mine.frames,
        waiting_frames=theirs.frames,
        expected=_p2p_view(theirs, recv=sender),
        actual=_p2p_view(mine, recv=not sender),
    )


def _sizes(sizes: tuple[tuple[int, ...], ...]) -> str:
    return "[" + ",".join("x".join(str(d) for d in s) for s in sizes) + "]"


# --- lost ranks ----------------------------------------------------------------------------------


def _lost(by_rank: dict[int, RankSummary], now_ns: int, opts: Options) -> list[Finding]:
    """Ranks that stopped reporting while others went on, or died without a final snapshot."""
    # File times say when a copy was made, not when a rank last reported: not evidence here.
    times = {r: t for r, s in by_rank.items() if (t := evidence.trusted_time(s)) is not None}
    if len(times) < 2:
        return []
    finals = {r for r, s in by_rank.items() if s.kind == "final"}
    # Sorted once: "how many ranks wrote later than t + threshold" is then a bisection, not a scan
    # of every rank per rank (quadratic: seconds per diagnosis at 4,096 ranks). Judged as of
    # `now_ns`: a live server judging late data sets it back to what every collector delivered,
    # and snapshots newer than that must not make the ranks behind a slower collector look lost.
    ordered = sorted(min(t, now_ns) for t in times.values())
    newest = ordered[-1]
    # A rank still snapshotting after the others' finals is alive (blocked, perhaps), not lost.
    last_final = max((times[f] for f in finals if f in times), default=None)
    lost: list[int] = []
    finals_missing: set[int] = set()
    reasons: dict[int, str] = {}
    for r, t in times.items():
        s = by_rank[r]
        if s.kind == "dump":
            continue  # a plain PyTorch dump says nothing about liveness
        interval = s.interval_s
        threshold_ns = int((opts.lost_after_intervals * interval if interval else opts.lost_after_s) * NS)
        # Ranks whose newest snapshot is more than the threshold after this one (never r itself).
        later = len(ordered) - bisect.bisect_right(ordered, t + threshold_ns)
        exited_before = last_final is None or t <= last_final
        if (
            s.kind != "final"
            and finals
            and exited_before
            # Silent as long as a lost rank, too: it may merely not have snapshotted since the
            # others exited, or its own final snapshot may still be on its way (written after the
            # others', or queued behind them on a busy collector).
            and _silent(s, now_ns, opts)
            and len(finals) + 1 >= 2
            and len(finals) >= len(by_rank) // 2
        ):
            lost.append(r)
            finals_missing.add(r)
            reasons[r] = "it left no final snapshot while the other ranks wrote theirs on exit"
        elif s.kind != "final" and later and later >= max(1, (len(times) - 1) // 2):
            lost.append(r)
            reasons[r] = f"its snapshots stopped {(newest - t) / NS:.1f} s before the others'"
    out: list[Finding] = []
    for r in sorted(lost):
        s = by_rank[r]
        last = _last_entry(s)
        # Where the rank was lost: the collective the others had reached, else its own last one.
        at = last
        where = ""
        if last is not None:
            where = (
                f" Its last recorded collective was {last.op} (group {last.group}, collective_seq_id "
                f"{last.collective_seq_id}, {'finished' if last.finished else 'unfinished'})."
            )
            others = (
                [
                    e
                    for r2, s2 in by_rank.items()
                    # Ranks outside the lost rank's last group (a subgroup) hold no track of it.
                    if r2 != r
                    and last.group in s2.tracks
                    and (e := s2.entry_at(last.group, s2.tracks[last.group].last_seq)) is not None
                ]
                if last.group
                else []
            )
            ahead = [e for e in others if e.collective_seq_id > last.collective_seq_id]
            if ahead:
                e0 = at = max(ahead, key=lambda e: e.collective_seq_id)
                reached = (
                    f" The other ranks had reached {e0.op} {_sizes(e0.input_sizes)} "
                    f"{','.join(e0.input_dtypes)} (collective_seq_id {e0.collective_seq_id})"
                )
                if r in finals_missing:
                    # Only what the snapshots show: no final one, so the process ended without
                    # its exit hook (a kill, a crash or an abort look the same from here).
                    where += (
                        f"{reached} when it died; the collectives in between completed, so it died inside that "
                        "one, without writing its final snapshot (killed, crashed or aborted: the snapshots "
                        "do not say which; its exit status or log does)."
                    )
                else:
                    # Silence is not death: a stopped process, a host or a link down look the same.
                    where += (
                        f"{reached} when its snapshots stopped; the collectives in between completed, so it "
                        "went silent in that one or just before it: it died or was stopped, or its host or "
                        "link is down."
                    )
        t = s.snapshot_time_ns or now_ns
        out.append(
            Finding(
                kind="rank_lost",
                detail=f"{_fmt_ranks([r], by_rank).capitalize()} is lost: {reasons[r]}.{where}",
                process_group=at.group if at else None,
                process_group_desc=s.group_desc(at.group) if at else "",
                collective_seq_id=at.collective_seq_id if at else None,
                op=at.op if at else None,
                culprit_ranks=[r],
                elapsed_s=max(0.0, (now_ns - t) / NS),
                culprits=_refs([r], by_rank),
                culprit_frames=_main_stack(s) or (last.frames if last else ()),
                culprit_last_entry=entry_json(last) if last else None,
            )
        )
    return out


def _per_host(lost: list[Finding], by_rank: dict[int, RankSummary]) -> list[Finding]:
    """Fold the lost ranks of a host that went silent as a whole into one finding for that host.

    Every rank of one host lost while ranks on other hosts go on points at the host (down, link
    cut, collector or processes stopped), not at N unrelated ranks; the on-call engineer should
    read "host X" first. Without a live host to compare with, nothing is folded.
    """
    if len(lost) < 2:
        return lost
    hosts: dict[str, list[int]] = {}
    for r, s in by_rank.items():
        if s.host:
            hosts.setdefault(s.host, []).append(r)
    by_culprit = {f.culprit_ranks[0]: f for f in lost if len(f.culprit_ranks) == 1}
    silent = [h for h, ranks in hosts.items() if len(ranks) >= 2 and all(r in by_culprit for r in ranks)]
    if not silent or len(silent) == len(hosts):
        return lost
    folded: set[int] = set()
    out: list[Finding] = []
    for host in sorted(silent):
        ranks = sorted(hosts[host])
        folded.update(ranks)
        first = by_culprit[ranks[0]]
        first.culprit_ranks = ranks
        first.culprits = _refs(ranks, by_rank)
        first.elapsed_s = min(by_culprit[r].elapsed_s or 0.0 for r in ranks)
        first.detail = (
            f"Host {host} went silent: all {len(ranks)} of its ranks ({', '.join(map(str, ranks))}) stopped "
            "reporting while the other hosts go on: the host is down, its network link is cut, or its "
            f"processes are stopped. {first.detail}"
        )
        out.append(first)
    return out + [f for f in lost if not set(f.culprit_ranks) & folded]


def _last_entry(s: RankSummary) -> Entry | None:
    best: Entry | None = None
    for t in s.tracks.values():
        for e in (t.tail[-1:] if t.tail else []) + t.p2p[-1:]:
            if best is None or e.record_id > best.record_id:
                best = e
    return best


def _main_stack(s: RankSummary) -> Stack:
    """The main thread's Python stack from the rank's stall/final snapshot, when it has one."""
    main = next((t for t in s.thread_stacks if t.thread_name == "MainThread"), None)
    if main is None:
        return ()
    # Drop the agent's own frames (a final snapshot is taken from an exit hook on the main thread):
    # what is left is where the user's code is, or nothing when the interpreter was shutting down.
    return tuple(f for f in main.frames if not is_agent_frame(f))


# --- hangs ---------------------------------------------------------------------------------------


def _hang(
    g: _Group,
    by_rank: dict[int, RankSummary],
    without: list[int],
    missing: int,
    now_ns: int,
    opts: Options,
    ev: Evidence | None = None,
) -> Finding | None:
    """The oldest collective of the group that is not finished on every member rank.

    `without`: the ranks without a dump (bounded: see `missing_ranks`), `missing` how many in all.
    Never at or before the group's proven floor (`Evidence.floor`): every member entered those.
    Under a file clock the hang must show in the positions alone (`_positional`)."""
    ev = ev or Evidence("snapshot", now_ns)
    floor = ev.floor(g.name)
    last: dict[int, int] = {}
    for r in _present(g.members, by_rank):
        s = by_rank.get(r)
        if s is None:
            continue
        track = s.tracks.get(g.name)
        if track is None or not track.seqs:
            if s.wrapped:
                continue  # its ring no longer holds this group: position unknown
            if floor and s.config is not None and s.config.fr_buffer_size == 0:
                # Every member entered the floor's collectives, yet this rank records none:
                # its flight recorder is off (TORCH_FR_BUFFER_SIZE=0), its position unknown.
                continue
            last[r] = 0
        else:
            last[r] = track.last_seq
    if not last or max(last.values()) == 0:
        return None
    low = min(last.values())
    high = max(last.values())
    if isinstance(g.members, range):
        missing_members = [r for r in without if r in g.members]
        # A world group (`range(expected)`) holds the ranks left off the bounded list too.
        missing_total = len(missing_members) + missing - len(without)
    else:
        absent = set(without)
        missing_members = [r for r in g.members if r in absent]
        missing_total = len(missing_members)
    if low < high:
        # Members behind the floor were dumped earlier: they entered everything up to it.
        seq = max(low, floor) + 1
        if seq > high:
            return None
        culprits = sorted(r for r, v in last.items() if v < seq)
    else:
        seq = high
        if seq <= floor:
            return None
        culprits = list(missing_members)
    if ev.positions_only:
        placed = _positional(g.name, seq, last, culprits, ev, by_rank, bool(missing_members))
        if placed is None:
            return None
        entered, stuck = placed
    else:
        # A culprit behind the floor (or dumped early in another group) was seen only before
        # what every member did since: its snapshot's time says nothing about this collective.
        behind = any((r in last and last[r] < floor) or r in ev.early for r in culprits)
        entered, stuck = _stuck_at(g.name, seq, last, culprits, by_rank, seen=not behind)
    # Members behind the floor took part in what lies between, and members dumped early in
    # another group (or snapshotted before this collective began) were not seen since: what is
    # stale is their data, not their position.
    began = min((e.time_created_ns for e in stuck.values()), default=None)
    stale = not ev.positions_only and any(
        (r in last and last[r] < floor)
        or r in ev.early
        or (began is not None and r in by_rank and not _newer_than(by_rank[r], began))
        for r in culprits
    )
    if not stuck and low < high and not ev.positions_only:
        # Every rank holding `seq` finished it, so the members behind did take part in it: what is
        # stale is their data (snapshots stopped: a cut link, a stopped or killed process), not their
        # position. The others wait in their oldest collective still in flight, or the one they
        # failed in; the stale members are the ones not seen entering it.
        later = _pending_seq(g.name, seq - 1, entered, by_rank)
        if later is not None:
            seq, stale = later, True
            culprits = sorted(r for r, v in last.items() if v < seq)
            entered, stuck = _stuck_at(g.name, seq, last, culprits, by_rank, seen=not behind)
    if not stuck or (stale and not _stale_shown(culprits, stuck, by_rank, ev, opts)):
        return None
    first = min(stuck.values(), key=lambda e: e.time_created_ns)
    elapsed = (now_ns - first.time_created_ns) / NS
    finished_here = [r for r in entered if r not in stuck]
    # Finished on some, pending on others: gloo sets completion flags asynchronously, so a rank
    # snapshotted right after the collective returned may still show it pending. Only a rank
    # whose own data shows it pending for stall_after is evidence of a stall.
    if (
        not culprits
        and finished_here
        and max(ev.age_s(by_rank[r], e) for r, e in stuck.items()) < opts.stall_after_s
    ):
        return None
    positional = bool(culprits) and not ev.elapsed_known
    # No need to wait out stall_after when a member already failed in it (exited with the error):
    # the collective cannot complete any more. But not before every culprit has been silent as
    # long as a lost rank: one merely between two snapshots would otherwise be named with the dead.
    failed = any(_failed_in(by_rank[r], e) for r, e in stuck.items()) and all(
        _silent(by_rank[c], now_ns, opts) for c in culprits if c in by_rank
    )
    if elapsed < opts.stall_after_s and not (culprits and failed) and not positional:
        return None
    waiting = sorted(stuck)
    gone = _gone_quiet(culprits, waiting, by_rank, now_ns, opts)
    if gone:
        culprits = sorted([*culprits, *gone])
        waiting = [r for r in waiting if r not in gone]
    label = _group_label(g)
    if ev.elapsed_known:
        waited = f"{elapsed:.1f} s"
    elif positional:
        waited = _UNKNOWN_WAIT
    else:
        waited = f"at least {elapsed:.1f} s (by the newest time recorded in the dumps)"
    what = f"{first.op} {_sizes(first.input_sizes)} {','.join(first.input_dtypes)}".rstrip()
    kind: FindingKind = "hang"
    if culprits and stale:
        one = len(culprits) == 1
        detail = (
            f"Hang in {label} at collective_seq_id {seq} ({what}): {_fmt_ranks(waiting)} "
            f"{'has' if len(waiting) == 1 else 'have'} waited {waited}; {_fmt_ranks(culprits, by_rank)} "
            f"{'was' if one else 'were'} not seen entering it: {'its' if one else 'their'} last snapshots "
            "predate it (the process stopped or died, or its host or link is down)."
        )
    elif culprits and low < high:
        detail = (
            f"Hang in {label} at collective_seq_id {seq} ({what}): {_fmt_ranks(culprits, by_rank)} never "
            f"entered it; {_fmt_ranks(waiting)} {'has' if len(waiting) == 1 else 'have'} waited {waited}."
        )
    elif culprits:
        detail = (
            f"Hang in {label} at collective_seq_id {seq} ({what}): every rank with a dump entered it and "
            f"has waited {waited}; {_fmt_ranks(culprits, total=missing_total)} left no dump and must be "
            "the one missing."
        )
    elif finished_here:
        kind = "state_mismatch"
        culprits = waiting
        detail = (
            f"State mismatch in {label} at collective_seq_id {seq} ({what}): finished on "
            f"{_fmt_ranks(finished_here)} but still pending on {_fmt_ranks(waiting)} after {waited}."
        )
    else:
        not_started = [r for r, e in stuck.items() if e.state == "scheduled"]
        started = [r for r, e in stuck.items() if e.state == "started"]
        if started and not_started:
            culprits = sorted(not_started)
            detail = (
                f"Hang in {label} at collective_seq_id {seq} ({what}): all member ranks entered it, but "
                f"{_fmt_ranks(culprits, by_rank)} never started it on the device while the others did; "
                f"waited {waited}."
            )
        elif left := _left_before_the_last(stuck, opts):
            # A collective completes soon after its last member arrives. One still unfinished
            # though its last member came stall_after later than some others: those others are no
            # longer in it (a rank killed or stopped inside it, as a dump shows it).
            late = [r for r in waiting if r not in left]
            gap = (max(e.time_created_ns for e in stuck.values()) - stuck[left[0]].time_created_ns) / NS
            culprits, waiting = left, late
            one = len(left) == 1
            detail = (
                f"Hang in {label} at collective_seq_id {seq} ({what}): every member entered it, but "
                f"{_fmt_ranks(late)} arrived {gap:.1f} s after {_fmt_ranks(left, by_rank)} and it still did "
                f"not finish: {'it is' if one else 'they are'} no longer in it (stopped, died or killed "
                f"inside it, or {'its' if one else 'their'} link is down)."
            )
        else:
            detail = (
                f"Hang in {label} at collective_seq_id {seq} ({what}): all {len(waiting)} member ranks "
                f"entered it and none finished in {waited}. No rank is behind in this group: either "
                "the ranks disagree on what this collective is, or the transport between them is stuck."
            )
    if gone:
        quiet_s = min((now_ns - (by_rank[r].snapshot_time_ns or now_ns)) / NS for r in gone)
        detail += (
            f" {_fmt_ranks(gone, by_rank).capitalize()} entered it too but {'has' if len(gone) == 1 else 'have'} "
            f"sent nothing for {quiet_s:.1f} s while the others kept reporting (the process stopped, or its "
            "host or link is down), so it is named with the culprits."
        )
    finding = Finding(
        kind=kind,
        detail=detail,
        process_group=g.name,
        process_group_desc=g.desc,
        collective_seq_id=seq,
        op=first.op,
        culprit_ranks=culprits,
        waiting_ranks=waiting,
        elapsed_s=elapsed,  # reported only when known: see `diagnose`
        culprits=_refs(culprits, by_rank),
        expected={
            "op": first.op,
            "input_sizes": [list(s) for s in first.input_sizes],
            "output_sizes": [list(s) for s in first.output_sizes],
            "input_dtypes": list(first.input_dtypes),
            "output_dtypes": list(first.output_dtypes),
        },
        waiting_frames=first.frames or _main_stack(by_rank[waiting[0]]),
    )
    if len(culprits) >= 1 and culprits[0] in by_rank:
        cs = by_rank[culprits[0]]
        last_e = _last_entry(cs)
        finding.culprit_frames = _main_stack(cs) or (last_e.frames if last_e else ())
        # NCCL's counters confirm where the culprit stopped (gloo's say the same as its entries).
        st = cs.pg_status.get(g.name) if cs.backend and "nccl" in cs.backend else None
        if st is not None:
            finding.detail += (
                f" Its dump's pg_status for this group: last enqueued {st[0]}, last completed {st[2]}."
            )
        if last_e is not None:
            finding.culprit_last_entry = entry_json(last_e)
            if last_e.group != g.name or last_e.collective_seq_id < seq:
                finding.detail += (
                    f" {_fmt_ranks(culprits[:1]).capitalize()} is instead at {last_e.op} (group "
                    f"{last_e.group}, collective_seq_id {last_e.collective_seq_id}, "
                    f"{'finished' if last_e.finished else 'unfinished'})."
                )
        main = _main_stack(cs)
        if main and cs.kind != "final":
            # Taken while the others waited: where the culprit is stuck instead (a data loader, I/O):
            # the line of the user's code, not the library call it is blocked in (`queue.get`).
            top = innermost_user_frame(main) or main[0]
            finding.detail += (
                f" Its main thread is in {top.name} ({top.filename.rsplit('/', 1)[-1]}:{top.line})."
            )
        if cs.kind == "final":
            finding.detail += (
                f" It then exited with {cs.exception}."
                if cs.exception
                else " It then exited without an error."
            )
    # Busy or stuck, from the culprits' own evidence (flightdeck.analysis.progress).
    return judge_progress(finding, by_rank, now_ns, opts, failed=failed)


_UNKNOWN_WAIT = "an unknown time (only file times date the dumps)"


def _stale_shown(
    culprits: list[int], stuck: dict[int, Entry], by_rank: dict[int, RankSummary], ev: Evidence, opts: Options
) -> bool:
    """Whether culprits known only from older snapshots are shown to be missing, not merely
    snapshotted earlier than the ranks that wait: a waiting rank failed in the collective, or
    their snapshots stopped while the waiting ranks went on reporting (as long as makes a rank
    lost), or the waiting ranks' own snapshots show them waiting for stall_after. Snapshots of a
    healthy job taken at different moments show none of these, however late it is judged."""
    if any(_failed_in(by_rank[r], e) for r, e in stuck.items()):
        return True
    if max(ev.age_s(by_rank[r], e) for r, e in stuck.items()) >= opts.stall_after_s:
        return True
    newest = max((evidence.trusted_time(by_rank[r]) or 0) for r in stuck)

    def quiet(c: int) -> bool:
        s = by_rank.get(c)
        t = evidence.trusted_time(s) if s is not None else None
        if s is None or s.kind == "final" or t is None:
            return True
        threshold = opts.lost_after_intervals * s.interval_s if s.interval_s else opts.lost_after_s
        return (newest - t) / NS > threshold

    return all(quiet(c) for c in culprits)


def _positional(
    group: str,
    seq: int,
    last: dict[int, int],
    culprits: list[int],
    ev: Evidence,
    by_rank: dict[int, RankSummary],
    missing: bool,
) -> tuple[list[int], dict[int, Entry]] | None:
    """Under a file clock: the members that entered (group, seq) and those blocked in it, when
    the positions alone show a hang there; else None.

    Positions show one only when they are not explained by dumps taken at different moments: no
    rank's dump stops before the floor of one of its groups (it was dumped earlier, so the dumps
    were not taken together), the members that entered recorded nothing after it (they are blocked in it, or
    failed in it: gloo retires a failed collective too) and they are no fewer than the members
    not in it. Without culprits (every member entered) only the age the dumps themselves record
    can tell a stall, which the caller judges.
    """
    if culprits and ev.early:
        return None
    entered = sorted(r for r, v in last.items() if v >= seq)
    stuck: dict[int, Entry] = {}
    for r in entered:
        e = by_rank[r].entry_at(group, seq)
        if e is None:
            continue
        if not e.finished or (culprits and last[r] == seq and not evidence.went_on_after(by_rank[r], e)):
            stuck[r] = e
    if culprits and (len(stuck) < len(entered) or (len(stuck) < len(culprits) and not missing)):
        return None
    return entered, stuck


def _left_before_the_last(stuck: dict[int, Entry], opts: Options) -> list[int]:
    """The members of an unfinished collective that every member entered who had entered it
    stall_after before its last member did (none when that is all of them or none)."""
    last = max(e.time_created_ns for e in stuck.values())
    left = sorted(r for r, e in stuck.items() if (last - e.time_created_ns) / NS >= opts.stall_after_s)
    return left if len(left) < len(stuck) else []


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


def _gone_quiet(
    culprits: list[int], waiting: list[int], by_rank: dict[int, RankSummary], now_ns: int, opts: Options
) -> list[int]:
    """The waiting ranks that went silent with the culprits while other waiting ranks still report.

    A cut link or a dead host stops its ranks' snapshots at whatever moment: one rank of the host
    may have been seen entering the collective, its neighbour not. What the silent one does since
    is unknown, and it is stranded with the culprits, not waiting with the majority. Ranks that
    exited (final snapshot) are not silent in this sense: their last state is known.
    """
    if not culprits or not all(c in by_rank and _silent(by_rank[c], now_ns, opts) for c in culprits):
        return []
    gone = [r for r in waiting if by_rank[r].kind != "final" and _silent(by_rank[r], now_ns, opts)]
    return gone if len(gone) < len(waiting) else []


def _stuck_at(
    group: str,
    seq: int,
    last: dict[int, int],
    culprits: list[int],
    by_rank: dict[int, RankSummary],
    *,
    seen: bool = True,
) -> tuple[list[int], dict[int, Entry]]:
    """The members that entered (group, seq), and the entries of those still stuck in it.

    `seen=False`: the culprits' data is older than what every member did since (behind a floor),
    so no snapshot of theirs shows them not entering it."""
    entered = sorted(r for r, v in last.items() if v >= seq)
    stuck: dict[int, Entry] = {}
    for r in entered:
        e = by_rank[r].entry_at(group, seq)
        if e is None:
            continue
        # With a member that never entered, the collective cannot have succeeded anywhere: gloo marks
        # it retired when it fails (timeout, peer gone), which is not completion. Ranks that moved
        # past it (async ops) are the exception. "Never entered" needs a culprit snapshot taken after
        # the collective began (or its final one); an older one only says it is not known to have
        # entered, so then only a rank that failed in it (exited with an error there) is stuck.
        fresh = seen and all(_newer_than(by_rank[c], e.time_created_ns) for c in culprits if c in by_rank)
        if not e.finished or (culprits and last[r] == seq and (fresh or _failed_in(by_rank[r], e))):
            stuck[r] = e
    return entered, stuck


def _newer_than(s: RankSummary, t_ns: int) -> bool:
    """Whether the rank's data shows its state after `t_ns` (its final state always does)."""
    if s.snapshot_time_from_file:
        return s.kind == "final"
    return s.kind == "final" or s.snapshot_time_ns is None or s.snapshot_time_ns >= t_ns


def _failed_in(s: RankSummary, e: Entry) -> bool:
    """Whether the rank exited with an error inside `e`, its newest collective (gloo retires that too)."""
    return s.kind == "final" and bool(s.exception) and e is _last_entry(s) and e.state != "completed"


def _silent(s: RankSummary, now_ns: int, opts: Options) -> bool:
    """Whether the rank has sent nothing for as long as makes a rank lost (or has exited)."""
    if s.kind == "final" or s.snapshot_time_ns is None:
        return True
    if s.snapshot_time_from_file:
        return False  # a file time says when the file was copied, not when the rank last spoke
    threshold = opts.lost_after_intervals * s.interval_s if s.interval_s else opts.lost_after_s
    return (now_ns - s.snapshot_time_ns) / NS > threshold


def _pending_seq(group: str, after: int, ranks: list[int], by_rank: dict[int, RankSummary]) -> int | None:
    """The oldest collective of `group` past `after` that one of `ranks` is in: unfinished, or the
    last one of a rank that exited with an error in it (gloo retires a failed collective too)."""
    found: list[int] = []
    for r in ranks:
        s = by_rank[r]
        track = s.tracks.get(group)
        if track is None or not track.tail:
            continue
        found.extend(
            e.collective_seq_id for e in track.tail if e.collective_seq_id > after and not e.finished
        )
        tip = track.tail[-1]
        if _failed_in(s, tip) and tip.collective_seq_id > after:
            found.append(tip.collective_seq_id)
    return min(found) if found else None


def _missing(without: list[int], missing: int) -> Finding:
    return Finding(
        kind="missing_dump",
        detail=(
            f"No dump from {_fmt_ranks(without, total=missing)}: the diagnosis uses the other ranks; where these ranks "
            "are is inferred from what the others wait for."
        ),
        culprit_ranks=list(without),
    )


# --- how findings relate -------------------------------------------------------------------------


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


# --- arrival skew and stragglers -----------------------------------------------------------------


def _stragglers(
    groups: list[_Group], by_rank: dict[int, RankSummary], opts: Options
) -> tuple[dict[str, list[float]], list[Finding]]:
    skews: dict[str, list[float]] = {}
    last_count: Counter[int] = Counter()
    #: Per compared group: (enqueue times by rank, the earliest of each collective). Lags are
    #: worked out only for the few ranks that arrive last most often, at the end.
    compared: list[tuple[dict[int, array[int]], list[int]]] = []
    samples = 0
    for g in groups:
        tracks = {
            r: by_rank[r].tracks[g.name]
            for r in _present(g.members, by_rank)
            if g.name in by_rank[r].tracks and by_rank[r].tracks[g.name].seqs
        }
        if len(tracks) < 2 or len(tracks) < len(g.members):
            continue
        lo = max(t.seqs[0] for t in tracks.values())
        hi = min(t.seqs[-1] for t in tracks.values())
        if hi < lo:
            continue
        lo = max(lo, hi - SKEW_WINDOW + 1)
        rows: dict[int, array[int]] = {}
        for r, t in tracks.items():
            i, j = t.index_of(lo), t.index_of(hi)
            if i is None or j is None or j - i != hi - lo:
                break
            rows[r] = t.created_ns[i : j + 1]
        else:
            # Column by column (one collective across the ranks), with the loops in C: this
            # runs over every member of every group, 256 collectives deep.
            ranks = list(rows)
            cols = list(zip(*rows.values(), strict=True))
            tmins = list(map(min, cols))
            tmaxs = list(map(max, cols))
            last_count.update(ranks[col.index(tmax)] for col, tmax in zip(cols, tmaxs, strict=True))
            samples += hi - lo + 1
            skews[g.name] = [(b - a) / NS for a, b in zip(tmins, tmaxs, strict=True)]
            compared.append((rows, tmins))
    found: list[Finding] = []
    if samples >= opts.straggler_min_samples:
        for r, n in last_count.most_common(3):
            share = n / samples
            lag = statistics.median(
                (t - m) / NS
                for rows, tmins in compared
                if r in rows
                for t, m in zip(rows[r], tmins, strict=True)
            )
            if share >= opts.straggler_min_share and lag >= opts.straggler_min_lag_s:
                found.append(
                    Finding(
                        kind="straggler",
                        detail=(
                            f"Straggler: {_fmt_ranks([r], by_rank)} arrived last at {share:.0%} of {samples} "
                            f"recent collectives, {lag * 1000:.1f} ms after the first rank (median)."
                        ),
                        culprit_ranks=[r],
                        culprits=_refs([r], by_rank),
                        elapsed_s=lag,
                    )
                )
    return skews, found


def _nothing_compared(by_rank: dict[int, RankSummary]) -> bool:
    return all(not t.seqs and not t.p2p for s in by_rank.values() for t in s.tracks.values())
