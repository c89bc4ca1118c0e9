"""Point-to-point ops that left no entry: who issued fewer of them, told by the groups' op_id gaps.

gloo records no flight-recorder entry for send, recv, isend, irecv or batch_isend_irecv, but each
one uses up an `op_id` in its group. So between two collectives K-1 and K of a group, a rank's
`op_id` advances by one plus the number of p2p ops it issued in that group in between (minus the
ones the backend did record, as NCCL does). A rank stuck waiting for a message never reaches K and
looks like the culprit of a hang at K; the rank that left its send out reached K having issued
fewer p2p ops since K-1 than it usually does there. This module turns such a hang around: that
rank is the culprit, and the stranded ranks are blocked by it.

"Usually" is the rank's own count at the last earlier pair of collectives with the same
signatures (the previous iteration of the same step): pipeline stages legitimately issue
different numbers of p2p ops (the first stage only sends, the last only receives), so counts are
compared with each rank's own history, not across ranks. Pure: summaries in, a finding out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from flightdeck.analysis.findings import Finding, RankRef, entry_json
from flightdeck.analysis.summary import GroupTrack, RankSummary


@dataclass(frozen=True, slots=True)
class Gap:
    """The p2p ops a rank issued in a group between collectives `seq - 1` and `seq`."""

    rank: int
    issued: int
    #: What the rank issued at the same place of the previous iteration (None: no history).
    usual: int | None
    op_id: int
    prev_op_id: int


def _recorded_between(track: GroupTrack, lo: int, hi: int) -> int:
    """p2p entries the backend did record with an op_id strictly between lo and hi (NCCL)."""
    return sum(1 for e in track.p2p if lo < e.op_id < hi)


def _gap_at(track: GroupTrack, i: int) -> int | None:
    """Unrecorded ops between the collectives at positions i-1 and i of the track, when known."""
    if i < 1 or track.seqs[i] - track.seqs[i - 1] != 1:
        return None
    hi, lo = track.op_ids[i], track.op_ids[i - 1]
    if hi <= lo:
        return None  # op_ids not filled in (old summaries, hand-built entries)
    return hi - lo - 1 - _recorded_between(track, lo, hi)


def gap(rank: int, track: GroupTrack, seq: int) -> Gap | None:
    """The rank's p2p count between `seq - 1` and `seq`, with its usual count there."""
    if len(track.op_ids) != len(track.seqs):
        return None
    i = track.index_of(seq)
    if i is None:
        return None
    issued = _gap_at(track, i)
    if issued is None:
        return None
    usual = None
    for j in range(i - 1, 0, -1):
        if track.fps[j] == track.fps[i] and track.fps[j - 1] == track.fps[i - 1]:
            usual = _gap_at(track, j)
            if usual is not None:
                break
    return Gap(rank, issued, usual, track.op_ids[i], track.op_ids[i - 1])


def short_of_p2p(gaps: Sequence[Gap]) -> list[Gap]:
    """The ranks that issued fewer p2p ops than they usually do here (or, with no history at all,
    fewer than the others: a ring or all-pairs exchange, where every rank issues the same)."""
    if any(g.usual is not None for g in gaps):
        return [g for g in gaps if g.usual is not None and g.issued < g.usual]
    top = max((g.issued for g in gaps), default=0)
    return [g for g in gaps if g.issued < top]


def refine_hang(f: Finding, group: str, members: Sequence[int], by_rank: dict[int, RankSummary]) -> Finding:
    """Re-assign a hang whose culprits are stranded in p2p ops to the rank that left one out.

    Applies to a hang at (group, K) whose culprits all stopped right after K-1 (they never reached
    K) while the other members did: a rank that reached K having issued fewer p2p ops since K-1
    than usual is the culprit. When every rank that reached K issued as many as usual, the
    stranded ranks' own ops did not match each other (a wrong peer or tag): they stay named, and
    the detail says so. Anything else is returned unchanged.
    """
    seq = f.collective_seq_id
    if f.kind != "hang" or seq is None or seq < 2 or not f.culprit_ranks:
        return f
    stranded = f.culprit_ranks
    for r in stranded:
        s = by_rank.get(r)
        t = s.tracks.get(group) if s is not None else None
        if t is None or t.last_seq != seq - 1:
            return f
    reached: list[Gap] = []
    for r in members:
        s = by_rank.get(r)
        t = s.tracks.get(group) if s is not None else None
        if r in stranded or t is None or t.index_of(seq) is None:
            continue
        g = gap(r, t, seq)
        if g is None:
            return f  # one rank's count unknown: no comparison is sound
        reached.append(g)
    if not reached or not any(g.issued or g.usual for g in reached):
        return f  # no p2p between these two collectives: an ordinary hang
    short = short_of_p2p(reached)
    who = ", ".join(map(str, stranded))
    many = len(stranded) > 1
    if not short:
        f.detail += (
            f" Rank{'s' if many else ''} {who} {'are' if many else 'is'} stuck in point-to-point ops "
            f"(which gloo does not record) issued after collective_seq_id {seq - 1}: every rank that "
            f"reached {seq} issued as many p2p ops in this group since {seq - 1} as it does there "
            "usually, so no send was left out; the stranded ranks' own sends and receives do not match "
            "each other (a wrong peer or tag), and the dumps do not say which side addressed the wrong "
            "rank."
        )
        sides = [f"rank {r} in a {side}" for r in stranded if (side := _p2p_side(by_rank.get(r)))]
        if sides:
            f.detail += f" They failed waiting: {', '.join(sides)}."
        return f
    culprits = sorted(g.rank for g in short)
    words = "; ".join(
        f"rank {g.rank} issued {g.issued} (op_id {g.prev_op_id} -> {g.op_id})"
        + (
            f" where it issues {g.usual} in the same place of the previous step"
            if g.usual is not None
            else ""
        )
        for g in short
    )
    usual_of_others = ", ".join(f"{g.rank}: {g.issued}" for g in reached if g.rank not in culprits)
    one = len(culprits) == 1
    f.detail = (
        f"Hang in group {group}{f' ({f.process_group_desc})' if f.process_group_desc else ''} at "
        f"collective_seq_id {seq} ({f.op}): rank{'s' if many else ''} {who} never reached it, stranded in "
        f"a point-to-point op after collective_seq_id {seq - 1} (gloo records no p2p entry, but each "
        f"p2p op uses up an op_id). Between {seq - 1} and {seq}, {words}"
        + (
            f"; the other ranks that reached it issued as usual ({usual_of_others})"
            if usual_of_others
            else ""
        )
        + f". The p2p op {'it' if one else 'they'} left out is the one rank{'s' if many else ''} {who} "
        f"{'wait' if many else 'waits'} for: rank{'s' if many else ''} {who} {'are' if many else 'is'} "
        f"blocked by {'it' if one else 'them'}."
    )
    f.culprit_ranks = culprits
    f.culprits = [_ref(by_rank.get(r), r) for r in culprits]
    f.waiting_ranks = sorted({*f.waiting_ranks, *stranded} - set(culprits))
    e = by_rank[culprits[0]].entry_at(group, seq)
    if e is not None:
        f.culprit_last_entry = entry_json(e)
        f.culprit_frames = e.frames
    return f


def _p2p_side(s: RankSummary | None) -> str | None:
    """'send' or 'recv' when the rank exited with gloo's timeout in that kind of p2p op."""
    exc = s.exception if s is not None else None
    if not exc:
        return None
    for side in ("send", "recv"):
        if f"for {side} operation" in exc:
            return side
    return None


def _ref(s: RankSummary | None, rank: int) -> RankRef:
    return RankRef(rank, s.host if s else None, s.pid if s else None)


def _does_p2p(track: GroupTrack) -> bool:
    """Whether the rank's op_ids in this group show p2p ops between its collectives."""
    if len(track.op_ids) != len(track.seqs):
        return False
    return any(_gap_at(track, i) for i in range(1, len(track.seqs)))


def _outside_collectives(s: RankSummary) -> bool:
    """Whether the rank's newest recorded collective is finished: it is not stuck in one."""
    newest = None
    for t in s.tracks.values():
        if t.tail and (newest is None or t.tail[-1].record_id > newest.record_id):
            newest = t.tail[-1]
    return newest is not None and newest.finished


def link_stranded(
    findings: Sequence[Finding],
    roots: dict[int, Finding],
    members: dict[str, Sequence[int]],
    by_rank: dict[int, RankSummary],
) -> None:
    """Point hangs at the older hang they follow from, where a rank is stranded between groups.

    Links `diagnose` cannot see from the collectives alone (`roots` is updated in place):
    - a hang whose culprits are stranded outside any collective and listed as blocked in another
      hang (by `refine_hang`: waiting for the p2p op that hang's culprit left out) follows from it;
    - a hang whose culprits wait in an older hang that is itself a consequence follows from the
      same root (the collective rules link only to older hangs that are root causes);
    - a hang whose culprits are all culprits of an older hang (the rank left, or is stuck, and
      every group it was to meet next hangs too) follows from that older hang;
    - a hang whose culprits are stuck outside any collective (in a p2p op gloo did not record)
      and do p2p in a group with a rank that is a culprit of, or waiting in, an older hang (a
      pipeline stage whose neighbour stopped) follows from that older hang.
    """
    hangs = sorted(
        (f for f in findings if f.kind == "hang" and f.culprit_ranks), key=lambda f: -(f.elapsed_s or 0)
    )
    for f in hangs:
        if id(f) in roots:
            continue
        blocker = next(
            (
                o
                for o in hangs
                if o is not f
                and id(o) not in roots
                and roots.get(id(o)) is not f
                and set(f.culprit_ranks) <= set(o.waiting_ranks)
                and all(c in by_rank and _outside_collectives(by_rank[c]) for c in f.culprit_ranks)
            ),
            None,
        )
        if blocker is not None:
            # Stranded in a p2p op by the other hang's culprit (see refine_hang), whatever the
            # order in which the two hangs began.
            roots[id(f)] = blocker
            f.detail += (
                f" The culprit is itself stranded in a point-to-point op, blocked by the culprit of the hang "
                f"in group {blocker.process_group} (collective_seq_id {blocker.collective_seq_id})."
            )
            continue
        waited_in = next(
            (
                o
                for o in hangs
                if o is not f
                and id(o) in roots
                and (o.elapsed_s or 0) >= (f.elapsed_s or 0)
                and set(f.culprit_ranks) & set(o.waiting_ranks)
                and _root_of(o, roots) is not f
            ),
            None,
        )
        if waited_in is not None:
            # The culprit waits in an older hang that itself follows from another: the same chain.
            roots[id(f)] = _root_of(waited_in, roots)
            f.detail += (
                f" The culprit is itself blocked in the older hang in group {waited_in.process_group} "
                f"(collective_seq_id {waited_in.collective_seq_id})."
            )
            continue
        for older in hangs:
            if older is f or id(older) in roots or (older.elapsed_s or 0) <= (f.elapsed_s or 0):
                continue
            if set(f.culprit_ranks) <= set(older.culprit_ranks):
                roots[id(f)] = older
                f.detail += (
                    f" The same rank{'s are' if len(f.culprit_ranks) > 1 else ' is'} the culprit of the older "
                    f"hang in group {older.process_group} (collective_seq_id {older.collective_seq_id})."
                )
                break
            involved = set(older.culprit_ranks) | set(older.waiting_ranks)
            via = _p2p_neighbour(f.culprit_ranks, involved, members, by_rank)
            if via is not None:
                roots[id(f)] = older
                group, peer = via
                f.detail += (
                    f" The culprit is stuck outside any collective, in a point-to-point op it exchanges in "
                    f"group {group} with rank {peer}, which is in the older hang in group "
                    f"{older.process_group} (collective_seq_id {older.collective_seq_id})."
                )
                break


def _root_of(f: Finding, roots: dict[int, Finding]) -> Finding:
    """Follow the consequence links from `f` to its root cause (stops on a cycle)."""
    seen = {id(f)}
    while id(f) in roots and id(roots[id(f)]) not in seen:
        f = roots[id(f)]
        seen.add(id(f))
    return f


def _p2p_neighbour(
    culprits: Sequence[int],
    involved: set[int],
    members: dict[str, Sequence[int]],
    by_rank: dict[int, RankSummary],
) -> tuple[str, int] | None:
    """(group, peer) through which every culprit waits on p2p with a rank in `involved`, or None."""
    first: tuple[str, int] | None = None
    for c in culprits:
        s = by_rank.get(c)
        if s is None or not _outside_collectives(s):
            return None
        found = None
        for name, t in s.tracks.items():
            peers = [r for r in members.get(name, ()) if r != c and r in involved]
            if peers and _does_p2p(t):
                found = (name, peers[0])
                break
        if found is None:
            return None
        first = first or found
    return first
