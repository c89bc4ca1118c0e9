"""The progress boards of the jobs on digests, and when each is asked for its entries in full.

Collectors of large jobs send a digest per rank every interval (`flightdeck.digest`) and hold
the entries back; `Boards.take` folds a request's digests into its jobs' boards
(`flightdeck.analysis.board`) and says which of them are to ship their entries now: a **round**,
open for `detail_round_s` so that every collector of the job hears it, and answered once per
collector (`Detail.round`), so that the entries arrive as one cut through the job. A round of
every rank opens when a job is first heard of and every `detail_interval_s`. Two kinds name
their ranks (`Detail.ranks`): when the members of a group disagree on a span's fingerprint, at
once, a round of the odd ranks and more of those that agreed, asking for the span's entries too
(`Detail.spans`); while a group has waited in a collective for `stall_after_s / 2` or longer,
a round of its culprits and a few of its waiters every `stall_after_s / 2`.

The hangs (and busy ranks) of such a job come from its board
(`flightdeck.analysis.board.stall_findings`, the kinds of its `BOARD_KINDS`), worded with the
stall rounds' entries; its other findings (mismatches, configuration) from the entries of the
rounds of every rank and of mismatches (`entries_due`, `mismatch_round`), judged as of the round
(`LiveDiagnosis.diagnose_job`): a cut taken then, not a picture of now.

Everything here is in memory and costs no transaction: at 16,384 ranks on 2,048 hosts the
digests are 1,024 requests a second, which the ingest path (~3.4 ms a request) could not take.
"""

from __future__ import annotations

import json
import random
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from flightdeck.analysis.board import Board, SpanMismatch, Stall
from flightdeck.digest import DigestBlock, DigestRequest

#: Least time between two evaluations of one board's stall rule (a loop over its open groups).
CHECK_EVERY_S = 0.5
#: How long after a round of every rank (or of a mismatch) opens its job's new entries go to the
#: full diagnosis (`Boards.entries_due`): at 16,384 ranks a whole round's batches came within
#: ~30 s in the load generator's runs.
ENTRIES_DIAGNOSED_S = 120.0
#: Span mismatches kept per job (the latest), for the pages and tests.
KEEP_MISMATCHES = 16


@dataclass(frozen=True, slots=True)
class Detail:
    """A job whose entries a collector is to ship now, and the spans of its groups to add
    (group -> span index: `flightdeck.digest.SPAN`) when the round is for a mismatch; `ranks`:
    only these ranks' (a stall's culprits and a few of its waiters), empty for every rank."""

    job: str
    attempt: int
    spans: dict[str, int] = field(default_factory=dict)
    ranks: tuple[int, ...] = ()
    #: The round's id, opaque (0: none): a round stays open over two intervals so that every
    #: collector hears it, and a collector ships once per id.
    round: int = field(default=0, compare=False)

    def asks(self) -> str:
        """The spans, ranks and id as stored for the cluster (`digest_rounds.asks`)."""
        return json.dumps({"spans": self.spans, "ranks": list(self.ranks), "round": self.round})

    @classmethod
    def of(cls, job: str, attempt: int, asks: str) -> Detail:
        """A round as stored (written by a server)."""
        raw = json.loads(asks)
        if not isinstance(raw, dict):
            raw = {}
        spans = raw.get("spans") or {}
        ranks = raw.get("ranks") or []
        return cls(
            job,
            attempt,
            {str(g): int(k) for g, k in spans.items()},
            tuple(int(r) for r in ranks),
            int(raw.get("round") or 0),
        )

    def to_json(self) -> dict[str, object]:
        """The answer's form."""
        doc: dict[str, object] = {"job": self.job, "attempt": self.attempt}
        if self.round:
            doc["round"] = self.round
        if self.spans:
            doc["spans"] = dict(self.spans)
        if self.ranks:
            doc["ranks"] = list(self.ranks)
        return doc


#: A targeted round asks for at most this many culprits of each stall, and this many waiters.
EVIDENCE_CULPRITS = 64
EVIDENCE_WAITERS = 4


def _evidence_ranks(stalls: list[Stall]) -> tuple[int, ...]:
    """The ranks whose evidence a stall's findings read: its culprits, a few of its waiters."""
    ranks: set[int] = set()
    for st in stalls:
        ranks.update(st.culprits[:EVIDENCE_CULPRITS])
        ranks.update(st.waiting[:EVIDENCE_WAITERS])
    return tuple(sorted(ranks))


def _mismatch_ranks(found: list[SpanMismatch]) -> tuple[int, ...]:
    """The ranks whose span entries a mismatch's finding reads: the odd ones (up to
    `EVIDENCE_CULPRITS`) and more of those that agreed than that, so that the entries' majority
    rule, which says which field differs and where, sees the same majority as the board."""
    ranks: set[int] = set()
    for m in found:
        odd = m.ranks[:EVIDENCE_CULPRITS]
        ranks.update(odd)
        ranks.update(m.agreed[: len(odd) + EVIDENCE_WAITERS])
    return tuple(sorted(ranks))


@dataclass(slots=True)
class JobBoard:
    """One job attempt's board and its rounds (monotonic times)."""

    board: Board = field(default_factory=Board)
    #: A round is open until then.
    round_until: float = float("-inf")
    #: When the latest round opened, the latest of every rank (not only a stall's), and the
    #: latest whose entries the full diagnosis reads (every rank's, or a mismatch's spans).
    round_at: float = float("-inf")
    whole_at: float = float("-inf")
    entries_at: float = float("-inf")
    #: Until when the latest mismatch round is to be diagnosed without waiting (`mismatch_round`).
    urgent_until: float = float("-inf")
    #: The spans the open round asks for, its ranks (empty: all) and its id (`Detail.round`).
    spans: dict[str, int] = field(default_factory=dict)
    ranks: tuple[int, ...] = ()
    round_id: int = 0
    #: When a digest of the job last came.
    heard: float = float("-inf")
    checked: float = float("-inf")
    #: The stalls of the latest check.
    stalls: list[Stall] = field(default_factory=list)
    #: The latest span mismatches found.
    mismatches: list[SpanMismatch] = field(default_factory=list)

    def detail(self, key: tuple[str, int]) -> Detail:
        """What the open round asks of the collectors."""
        return Detail(key[0], key[1], dict(self.spans), self.ranks, self.round_id)


class Boards:
    """The boards of the jobs on digests, keyed by (job name, attempt); thread-safe."""

    def __init__(
        self,
        *,
        stall_after_s: float,
        detail_interval_s: float,
        detail_round_s: float,
        forget_after_s: float,
        monotonic: Callable[[], float],
    ) -> None:
        """A board not heard of for `forget_after_s` is dropped (`check`)."""
        self._stall_after_s = stall_after_s
        self._interval_s = detail_interval_s
        self._round_s = detail_round_s
        self._forget_s = forget_after_s
        self._mono = monotonic
        self._lock = threading.Lock()
        self._boards: dict[tuple[str, int], JobBoard] = {}
        #: Rounds opened since `check` last returned them.
        self._opened: list[tuple[str, int]] = []

    def take(self, request: DigestRequest) -> list[Detail]:
        """Fold a request's digests in; returns its jobs whose round is open (their collector
        ships their ranks' entries now)."""
        self.fold_blocks(request.blocks)
        now = self._mono()
        out: dict[tuple[str, int], Detail] = {}
        with self._lock:
            for block in request.blocks:
                key = (block.job, block.attempt)
                jb = self._boards[key]
                if now < jb.round_until and key not in out:
                    out[key] = jb.detail(key)
        return list(out.values())

    def fold_blocks(self, blocks: Iterable[DigestBlock]) -> None:
        """Fold digests in (a request's, or in a cluster the owned jobs' from the shared feed). A
        job first heard of gets a round at once: its groups, its metadata, a first cut for the
        pages; then one every detail_interval_s."""
        now = self._mono()
        with self._lock:
            for block in blocks:
                key = (block.job, block.attempt)
                jb = self._boards.get(key)
                if jb is None:
                    jb = self._boards[key] = JobBoard()
                    self._open_round(key, jb, now)
                jb.board.fold(block)
                jb.heard = now

    def keep(self, keys: set[tuple[str, int]]) -> None:
        """Drop the boards of every other job (in a cluster: the jobs this process does not own)."""
        with self._lock:
            for key in list(self._boards):
                if key not in keys:
                    del self._boards[key]

    def check(self) -> list[tuple[Detail, float]]:
        """Open the rounds that are due (the interval passed, a group stalls, a span's
        fingerprints differ) and forget the boards not heard of for `forget_after_s`; called by
        the diagnosis worker every step. Returns the rounds opened since the last call, with
        their monotonic end."""
        now = self._mono()
        with self._lock:
            for key, jb in list(self._boards.items()):
                if now - jb.heard >= self._forget_s:
                    del self._boards[key]
                    continue
                if now - jb.checked >= CHECK_EVERY_S:
                    jb.checked = now
                    jb.stalls = jb.board.stalls(min_wait_s=self._stall_after_s / 2)
                    found = jb.board.mismatches()
                    if found:
                        # At once, open or not: the collectors that heard the open round shipped
                        # without the span.
                        jb.mismatches = (jb.mismatches + found)[-KEEP_MISMATCHES:]
                        self._open_round(
                            key, jb, now, {m.group: m.span for m in found}, _mismatch_ranks(found)
                        )
                        continue
                if now < jb.round_until:
                    continue
                if now - jb.whole_at >= self._interval_s:
                    self._open_round(key, jb, now)
                elif jb.stalls and now - jb.round_at >= self._stall_after_s / 2:
                    # The board makes a stall's findings; their words (what the waiters wait in,
                    # whether the culprits are busy or stuck) come from the culprits' and a few
                    # waiters' entries and evidence, asked for every stall_after_s / 2 while it
                    # lasts: a whole round at 16,384 ranks is 2,048 batches for ingest.
                    self._open_round(key, jb, now, ranks=_evidence_ranks(jb.stalls))
            opened, self._opened = self._opened, []
            return [
                (self._boards[(j, a)].detail((j, a)), self._boards[(j, a)].round_until)
                for j, a in dict.fromkeys(opened)
                if (j, a) in self._boards
            ]

    def _open_round(
        self,
        key: tuple[str, int],
        jb: JobBoard,
        now: float,
        spans: dict[str, int] | None = None,
        ranks: tuple[int, ...] = (),
    ) -> None:
        jb.round_at = now
        if not ranks:
            jb.whole_at = now
        if not ranks or spans:
            jb.entries_at = now
        if spans:
            jb.urgent_until = now + 2 * self._round_s
        jb.round_until = now + self._round_s
        jb.spans = spans or {}
        jb.ranks = ranks
        # Random: ids of rounds a process taking the job over opens differ from its old owner's.
        jb.round_id = random.getrandbits(52) or 1
        self._opened.append(key)

    def entries_due(self, job: str, attempt: int) -> bool:
        """Whether new entries of a job on digests are for its full diagnosis: they came within
        `ENTRIES_DIAGNOSED_S` of a round of every rank or of a mismatch. Others are a stall's
        evidence (a few ranks' entries every `stall_after_s / 2`), which the board's findings
        read: at 16,384 ranks a full diagnosis is seconds for nothing new."""
        jb = self._boards.get((job, attempt))
        return jb is None or self._mono() - jb.entries_at < ENTRIES_DIAGNOSED_S

    def mismatch_round(self, job: str, attempt: int) -> str | None:
        """Where a job's latest mismatch round is: "open" (its entries arriving: the full
        diagnosis waits for them), "closed" (for `detail_round_s` after: the entries are
        diagnosed at once, not spaced by the diagnosis's cost nor its budget, since the
        mismatch's finding is made from them), or None (long closed, or none)."""
        jb = self._boards.get((job, attempt))
        if jb is None:
            return None
        now = self._mono()
        if now >= jb.urgent_until:
            return None
        return "open" if now < jb.round_until else "closed"

    def holds(self, job: str, attempt: int) -> bool:
        """Whether the job is on digests (its board is held)."""
        return (job, attempt) in self._boards

    def stalls(self, job: str, attempt: int) -> list[Stall]:
        """The job's stalls as of the latest check (empty for a job not on digests)."""
        jb = self._boards.get((job, attempt))
        return list(jb.stalls) if jb is not None else []

    def frontiers(self, job: str, attempt: int) -> dict[str, tuple[int | None, int]] | None:
        """The job's board's frontiers (`Board.frontiers`), None for a job not on digests."""
        with self._lock:
            jb = self._boards.get((job, attempt))
            return jb.board.frontiers() if jb is not None else None

    def mismatches(self, job: str, attempt: int) -> list[SpanMismatch]:
        """The job's latest span mismatches (empty for a job not on digests)."""
        jb = self._boards.get((job, attempt))
        return list(jb.mismatches) if jb is not None else []
