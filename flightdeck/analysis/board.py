"""The progress board: a job attempt's digests folded into arrays, and the stall rule read from them.

Per process group, one array per field (`entered`, `finished`, `since`, `seen`) indexed by the
member's slot, so that a 16,384-rank job is a few flat arrays rather than an object per rank
(issue 25). Folding is a per-field maximum over sequence ids, with the open-since time taken
from the newer digest: folding a digest twice, or an older one after a newer, leaves the same
board (what a collector re-sending, or two replicas seeing the same digests, needs).

The stall rule is the hang rule's core on numbers alone: a group whose slowest member finished
up to `lo` while some member entered beyond it is waiting in collective `lo + 1`; the members
that never entered it are the culprits, those inside it are waiting, and the stall is as old as
the longest wait a waiting member reported (as of its own snapshot: stale digests do not age
it). Whether it is a hang (or a rank busy in a checkpoint save, or a rank gone) is decided by
the full diagnosis on the entries the stall makes the server ask for; the board says when to ask.

The mismatch rule is the same on span fingerprints (`flightdeck.digest.SPAN`): the members that
reported a span each vote with its fingerprint; once every member has, or the group is two spans
further on, a span with more than one fingerprint is a mismatch there, and the ranks outside
the largest agreeing set are where it differs. Which field differs, and whether it is a fault
at all, the full diagnosis says from that span's entries.

Pure: no clock, no I/O; the caller passes the digests and the thresholds.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass

from flightdeck.digest import SPAN, DigestBlock

NS = 1_000_000_000


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


class Board:
    """One job attempt's digests, folded (see the module's doc)."""

    __slots__ = ("groups", "moved_ns", "newest_ns")

    def __init__(self) -> None:
        self.groups: dict[str, GroupCells] = {}
        #: Newest snapshot time (epoch ns) at which some member's progress moved.
        self.moved_ns = 0
        #: Newest snapshot time (epoch ns) folded.
        self.newest_ns = 0

    @property
    def cells(self) -> int:
        """(rank, group) cells held."""
        return sum(len(c.rank) for c in self.groups.values())

    def fold(self, block: DigestBlock) -> int:
        """Fold one request's block of the job's digests in; returns the cells folded."""
        cells = [self.groups.get(name) or self.groups.setdefault(name, GroupCells()) for name in block.groups]
        g, entered, finished, since = block.g, block.entered, block.finished, block.open_since_ns
        spans, span_fps = block.span, block.span_fp
        moved = self.moved_ns
        k = 0
        for rank, t, count in zip(block.rank, block.time_ns, block.n, strict=True):
            for c in range(k, k + count):
                gc = cells[g[c]]
                i = gc.slot.get(rank)
                if i is None:
                    i = gc.add(rank)
                if t < gc.seen[i]:
                    continue  # older than what the board holds for this member: nothing to learn
                e, f = entered[c], finished[c]
                if e > gc.entered[i] or f > gc.finished[i]:
                    moved = max(moved, t)
                    gc.entered[i] = max(e, gc.entered[i])
                    gc.finished[i] = max(f, gc.finished[i])
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
        self.moved_ns = moved
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
            seq = lo + 1
            waited = 0
            culprits: list[int] = []
            waiting: list[int] = []
            for i, rank in enumerate(gc.rank):
                if gc.entered[i] < seq:
                    culprits.append(rank)
                elif gc.finished[i] < seq:
                    waiting.append(rank)
                    if gc.since[i]:
                        waited = max(waited, gc.seen[i] - gc.since[i])
            if waiting and waited >= min_wait_ns:
                out.append(Stall(name, seq, tuple(sorted(culprits)), tuple(sorted(waiting)), waited / NS))
        return out

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
                    out.append(SpanMismatch(name, k, tuple(odd), len(biggest)))
        return out
