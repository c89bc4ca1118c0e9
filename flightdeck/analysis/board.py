"""The progress board: a job attempt's digests folded into arrays, and the stall rule read from them.

Per process group, one array per field (`entered`, `finished`, `since`, `seen`) indexed by the
member's slot, so that a 16,384-rank job is a few flat arrays rather than an object per rank
(issue 25). Folding is a per-field maximum over sequence ids, with the open-since time taken
from the newer digest: folding a digest twice, or an older one after a newer, leaves the same
board (what a collector re-sending, or two replicas seeing the same digests, needs).

The stall rule is the hang rule's core on numbers alone: a group whose slowest member finished
up to `lo` while some member entered beyond it is waiting in collective `lo + 1`; the members
that never entered it are the culprits, those inside it are waiting. A stall counts once a
waiting member has waited `min_wait_s` as of its own snapshot (`waited_s`: a digest that comes
late, from a collector behind on its queue, shows an old wait as old as it was then, not as a
stall); how old it is as of the job's newest digest (`age_s`) orders stalls of several groups,
as the entries' diagnosis judges a job as of its newest snapshot: the older one is the root. Whether it is a hang (or a rank busy in a checkpoint save, or a rank gone) is decided by
the full diagnosis on the entries the stall makes the server ask for; the board says when to ask.

The mismatch rule is the same on span fingerprints (`flightdeck.digest.SPAN`): the members that
reported a span each vote with its fingerprint; once every member has, or the group is two spans
further on, a span with more than one fingerprint is a mismatch there, and the ranks outside
the largest agreeing set are where it differs. Which field differs, and whether it is a fault
at all, the full diagnosis says from that span's entries.

What a rank's entries say of its progress (`progress_of`: what a collector sends, and what its
tracked digest must equal) is here too: it reads the signatures the analysis compares.

Pure: no clock, no I/O; the caller passes the digests and the thresholds.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from flightdeck.analysis.findings import MISMATCH_KINDS, Finding, Options
from flightdeck.analysis.progress import refine_hang
from flightdeck.analysis.rules.common import _fmt_ranks, _main_stack, _refs
from flightdeck.analysis.rules.consequences import _link_consequences, _order
from flightdeck.analysis.summary import RankSummary, fingerprint, signature
from flightdeck.digest import SPAN, DigestBlock, GroupProgress, newest_span
from flightdeck.records import Entry

NS = 1_000_000_000
#: The finding kinds a job on digests gets from its board, not from its round's entries
#: (`stall_findings`): where each rank is comes with every digest, where a round's cut is minutes
#: old or, at thousands of ranks, still arriving (its missing ranks would read as lost or behind).
BOARD_KINDS = frozenset({"hang", "slow_rank", "rank_lost", "missing_dump"})


def progress_of(entries: Iterable[Entry]) -> tuple[GroupProgress, ...]:
    """Each group's progress as a rank's flight-recorder entries say it (point-to-point entries
    have no collective sequence id and are left out; they ship in full around an incident).

    `finished` is the newest id below the oldest unfinished collective, not the newest finished
    one: a rank waiting in collective 7 while 8 completed (another stream) is still stuck at 7.
    """
    entered: dict[str, int] = {}
    oldest_open: dict[str, tuple[int, int]] = {}  # group -> (seq, created_ns) of the oldest open
    fps: dict[str, dict[int, int]] = {}  # group -> seq -> signature fingerprint, finished ones
    for e in entries:
        if e.is_p2p or e.collective_seq_id <= 0:
            continue
        g, seq = e.group, e.collective_seq_id
        if seq > entered.get(g, 0):
            entered[g] = seq
        if e.finished:
            fps.setdefault(g, {})[seq] = fingerprint(signature(e))
        else:
            o = oldest_open.get(g)
            if o is None or seq < o[0]:
                oldest_open[g] = (seq, e.time_created_ns)
    out = []
    for g, e_seq in entered.items():
        o = oldest_open.get(g)
        finished, since = (e_seq, 0) if o is None else (o[0] - 1, max(o[1], 0))
        k, h = newest_span(finished, fps.get(g, {}))
        out.append(GroupProgress(g, e_seq, finished, since, k, h))
    return tuple(out)


#: Ranks of a span mismatch's largest agreeing set that it keeps (`SpanMismatch.agreed`).
AGREED_KEPT = 128


class GroupCells:
    """One process group's members on the board: a slot per member, one array per field."""

    __slots__ = ("entered", "finished", "rank", "seen", "since", "slot", "span", "votes")

    def __init__(self) -> None:
        #: rank -> its slot in the arrays.
        self.slot: dict[int, int] = {}
        self.rank = array("q")
        #: Newest collective sequence id entered, per slot.
        self.entered = array("q")
        #: Newest id up to which every collective finished, per slot.
        self.finished = array("q")
        #: Enqueue time (epoch ns) of the oldest open collective, 0 when none, per slot.
        self.since = array("q")
        #: Snapshot time (epoch ns) of the newest digest folded, per slot.
        self.seen = array("q")
        #: The newest span each member reported, per slot (-1: none).
        self.span = array("q")
        #: span -> fingerprint -> the members that reported it, for the spans not decided yet.
        self.votes: dict[int, dict[int, list[int]]] = {}

    def add(self, rank: int) -> int:
        """The slot of a new member."""
        i = self.slot[rank] = len(self.rank)
        self.rank.append(rank)
        self.entered.append(0)
        self.finished.append(0)
        self.since.append(0)
        self.seen.append(0)
        self.span.append(-1)
        return i


@dataclass(frozen=True, slots=True)
class SpanMismatch:
    """A span of a group's collectives whose fingerprint differs across its members."""

    group: str
    span: int
    #: Members outside the largest set that agreed (sorted).
    ranks: tuple[int, ...]
    #: How many agreed.
    agreeing: int
    #: The first of those that agreed (sorted; at most `AGREED_KEPT`), to compare the odd with.
    agreed: tuple[int, ...] = ()

    @property
    def seqs(self) -> range:
        """The span's sequence ids."""
        return range(self.span * SPAN + 1, (self.span + 1) * SPAN + 1)


@dataclass(frozen=True, slots=True)
class Stall:
    """A group waiting in one collective: who never entered it, who waits in it, for how long."""

    group: str
    #: The collective sequence id the group waits in.
    seq: int
    #: Members that have not entered it (sorted).
    culprits: tuple[int, ...]
    #: Members inside it, not finished (sorted).
    waiting: tuple[int, ...]
    #: The longest wait a waiting member reported, as of its own snapshot (seconds).
    waited_s: float
    #: How long ago the first waiting member entered, as of the job's newest digest (seconds).
    age_s: float


class Board:
    """One job attempt's digests, folded (see the module's doc)."""

    __slots__ = ("groups", "newest_ns")

    def __init__(self) -> None:
        self.groups: dict[str, GroupCells] = {}
        #: Newest snapshot time (epoch ns) folded.
        self.newest_ns = 0

    def fold(self, block: DigestBlock) -> int:
        """Fold one request's block of the job's digests in; returns the cells folded."""
        cells = [self.groups.get(name) or self.groups.setdefault(name, GroupCells()) for name in block.groups]
        g, entered, finished, since = block.g, block.entered, block.finished, block.open_since_ns
        spans, span_fps = block.span, block.span_fp
        k = 0
        for rank, t, count in zip(block.rank, block.time_ns, block.n, strict=True):
            for c in range(k, k + count):
                gc = cells[g[c]]
                i = gc.slot.get(rank)
                if i is None:
                    i = gc.add(rank)
                if t < gc.seen[i]:
                    continue  # older than what the board holds for this member: nothing to learn
                if entered[c] > gc.entered[i]:
                    gc.entered[i] = entered[c]
                if finished[c] > gc.finished[i]:
                    gc.finished[i] = finished[c]
                # The wait belongs to the oldest open collective as of the newest digest.
                gc.since[i] = since[c] if gc.finished[i] < gc.entered[i] else 0
                gc.seen[i] = t
                span = spans[c]
                if span > gc.span[i]:
                    gc.span[i] = span
                    gc.votes.setdefault(span, {}).setdefault(span_fps[c], []).append(rank)
            k += count
            if t > self.newest_ns:
                self.newest_ns = t
        return k

    def stalls(self, *, min_wait_s: float) -> list[Stall]:
        """The groups waiting in a collective that a member has waited in for `min_wait_s` or
        longer, by group name."""
        out: list[Stall] = []
        min_wait_ns = int(min_wait_s * NS)
        for name in sorted(self.groups):
            gc = self.groups[name]
            if not gc.rank:
                continue
            lo = min(gc.finished)
            if max(gc.entered) <= lo:
                continue  # every member finished what it entered
            oldest = min(filter(None, gc.since), default=0)
            if not oldest or max(gc.seen) - oldest < min_wait_ns:
                # Nobody has waited that long in anything (a healthy group caught mid-collective):
                # decided in C, without the loop over its members below.
                continue
            seq = lo + 1
            since = waited = 0
            culprits: list[int] = []
            waiting: list[int] = []
            for i, rank in enumerate(gc.rank):
                if gc.entered[i] < seq:
                    culprits.append(rank)
                elif gc.finished[i] < seq:
                    waiting.append(rank)
                    if gc.since[i]:
                        waited = max(waited, gc.seen[i] - gc.since[i])
                        if not since or gc.since[i] < since:
                            since = gc.since[i]
            if waiting and waited >= min_wait_ns:
                age = (self.newest_ns - since) / NS
                out.append(
                    Stall(name, seq, tuple(sorted(culprits)), tuple(sorted(waiting)), waited / NS, age)
                )
        return out

    def frontiers(self) -> dict[str, tuple[int | None, int]]:
        """group -> (enqueue time in epoch ns of the oldest collective a member is inside, None
        when none is; the newest sequence id every member finished): the board's counterpart of
        `flightdeck.analysis.frontier.group_frontiers`, for collectives only (point-to-point
        entries carry no sequence id and are not on the board)."""
        return {
            name: (min(filter(None, gc.since), default=None), min(gc.finished))
            for name, gc in self.groups.items()
            if gc.rank
        }

    def mismatches(self) -> list[SpanMismatch]:
        """The spans decided since the last call whose fingerprints differ, by group. A span is
        decided once every member reported it, or the group reported two newer ones (a member
        that never reports it, its ring wrapped or it is gone, does not hold it open)."""
        out: list[SpanMismatch] = []
        for name in sorted(self.groups):
            gc = self.groups[name]
            if not gc.votes:
                continue
            newest = max(gc.votes)
            for k in sorted(gc.votes):
                by_fp = gc.votes[k]
                if sum(map(len, by_fp.values())) < len(gc.rank) and k >= newest - 1:
                    continue
                del gc.votes[k]
                if len(by_fp) > 1:
                    biggest = max(by_fp.values(), key=len)
                    odd = sorted(r for v in by_fp.values() if v is not biggest for r in v)
                    agreed = tuple(sorted(biggest)[:AGREED_KEPT])
                    out.append(SpanMismatch(name, k, tuple(odd), len(biggest), agreed))
        return out


def stall_findings(
    stalls: Sequence[Stall], by_rank: dict[int, RankSummary], now_ns: int, opts: Options
) -> list[Finding]:
    """The hang findings of a job on digests: one per stall of `stall_after_s` or longer, from the
    board (where each rank is, as of its last digest: every rank every interval, so no cut of
    entries need be whole), worded with what the ranks' entries say when a round brought them
    (the collective's op and signature from a waiting rank's open entry; the culprit's evidence,
    `refine_hang`: busy is a `slow_rank` finding, stuck names where it is)."""
    out: list[Finding] = []
    for st in stalls:
        if st.waited_s < opts.stall_after_s:
            continue
        first = _open_entry(st, by_rank)
        culprits = list(st.culprits)
        waiting = list(st.waiting)
        if culprits:
            detail = (
                f"Collective {st.seq} of group {st.group} has not finished: "
                f"{_fmt_ranks(culprits, by_rank)} never entered it, {_fmt_ranks(waiting, by_rank)} have waited in it "
                f"{st.age_s:.1f} s."
            )
        else:
            detail = (
                f"Collective {st.seq} of group {st.group} has not finished: every member entered it "
                f"and {_fmt_ranks(waiting, by_rank)} have waited in it {st.age_s:.1f} s (the transport, or a "
                "member stuck inside it)."
            )
        finding = Finding(
            kind="hang",
            detail=detail,
            process_group=st.group,
            collective_seq_id=st.seq,
            op=first.op if first is not None else None,
            culprit_ranks=culprits,
            waiting_ranks=waiting,
            elapsed_s=st.age_s,
            culprits=_refs(culprits, by_rank),
            waiting_frames=first.frames if first is not None else (),
        )
        if first is not None:
            finding.expected = {
                "op": first.op,
                "input_sizes": [list(s) for s in first.input_sizes],
                "output_sizes": [list(s) for s in first.output_sizes],
                "input_dtypes": list(first.input_dtypes),
                "output_dtypes": list(first.output_dtypes),
            }
        if culprits and (cs := by_rank.get(culprits[0])) is not None:
            finding.culprit_frames = _main_stack(cs)
        refined = refine_hang(finding, by_rank, now_ns, opts)
        if refined is not None:
            out.append(refined)
    return out


def _open_entry(st: Stall, by_rank: dict[int, RankSummary]) -> Entry | None:
    """A waiting rank's entry of the stalled collective, when a round brought it."""
    for r in st.waiting[:64]:
        s = by_rank.get(r)
        track = s.tracks.get(st.group) if s is not None else None
        if track is None:
            continue
        for e in reversed(track.tail):
            if e.collective_seq_id == st.seq and not e.is_p2p:
                return e
    return None


def merge_findings(board: list[Finding], entries: list[Finding]) -> list[Finding]:
    """A digest job's findings: the board's (`stall_findings`) with those of its round's entries
    but the `BOARD_KINDS`, root causes first, each consequence pointing at its root (a hang whose
    culprits wait in an older hang, one that follows from a mismatch), as `diagnose` orders them."""
    kept = [f for f in entries if f.kind not in BOARD_KINDS]
    kept_ids = {id(f) for f in kept}
    roots: dict[int, Finding] = {}
    for f in kept:
        if f.consequence_of is not None and id(root := entries[f.consequence_of]) in kept_ids:
            roots[id(f)] = root
    roots.update(_link_consequences(board + [f for f in kept if f.kind in MISMATCH_KINDS]))
    out = board + kept
    _order(out, roots)
    return out
