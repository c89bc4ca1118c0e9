"""Digest mode: the ranks of large jobs send their progress, and their entries when the server asks.

A part of `Collector` (`flightdeck.collector.daemon`). At thousands of ranks the server cannot take
every changed entry of every rank as it happens (issue 25, `flightdeck.digest`); what it needs
between incidents is each rank's progress per process group. So for the ranks of a job whose
`world_size` is at least `digest_from_ranks` ("on digests"), a flush goes:

- each file is read as any other: the reader diffs it against what was shipped and gives the
  changed entries, which update the rank's tracked progress (`RankProgress`: per group the newest
  collective entered and the entries entered and not finished, kept as entries);
- its snapshot is held, not put into a batch;
- at the end of the flush one `POST /api/v1/digest` carries the latest digest of every rank on
  digests read within `DIGEST_WINDOW_S`; the answer names the jobs in a *detail round*. The held
  snapshots of their ranks are enqueued as usual, with the rank's open entries added (the server
  then sees what a waiting rank waits in even when that entry did not change in this flush); stall
  and final snapshots are enqueued whatever the answer (an incident's evidence and a rank's end).
  The other held snapshots are dropped, but what was read is recorded as shipped all the same (in
  the same transaction as the batches): the next flush diffs against it, so each change updates
  the tracked progress once and the server, asked later, gets the changes since plus what is open.
- a failed request (connection error, non-2xx) counts as "no detail round": counted, logged once
  per outage, not retried (the next flush's digests supersede it).

The tracked progress lives in memory. A rank first seen by this process (a collector restart)
is read in full, not diffed (`_reads_in_full`), so that its open entries are known even when none
of them changed since the last shipped read (an agent's recent-changes file read so holds only the
ring's new and open entries: the groups of the rest come with the rank's next whole ring).

A flush that finds the queue full reads nothing and sends no digest: the files stay dirty, and the
flush that reads them sends the digests and ships what a round asks for.
"""

from __future__ import annotations

import gzip
import logging
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import httpx
import orjson

from flightdeck.analysis.summary import fingerprint, signature
from flightdeck.collector.metrics import CollectorMetrics
from flightdeck.collector.pusher import Pusher, _message
from flightdeck.collector.queue import RankKey
from flightdeck.collector.settings import CollectorSettings
from flightdeck.digest import (
    MAX_CELLS,
    MAX_JOBS,
    SPAN,
    GroupProgress,
    RankDigest,
    encode_digests,
    newest_span,
)
from flightdeck.records import Entry, RankDump
from flightdeck.wire import Snapshot

if TYPE_CHECKING:
    from flightdeck.collector.daemon import FlushResult

#: The daemon's parts log under the one name they had as one module (log lines name it).
log = logging.getLogger("flightdeck.collector.daemon")

#: A rank's digest is sent while it was read within this many seconds: a rank whose files stopped
#: changing (its job ended, its agent is gone) is no longer vouched for.
DIGEST_WINDOW_S = 60.0
#: Open entries kept per rank and group. A rank usually has 0-1 open per group (a few when ops are
#: queued on several streams); over the bound the newest are dropped, since the digest needs the
#: oldest (the rank's digest then says it finished the dropped ones once the older ones finish).
MAX_OPEN_PER_GROUP = 64
#: Fingerprints of finished collectives kept per rank and group, for the spans of SPAN the digest
#: reports (`flightdeck.digest`): usually the newest span's and the one under way.
MAX_DONE_PER_GROUP = 4 * SPAN
#: Of a shipped snapshot's changed entries, the newest this many per group go (besides the open
#: ones, a mismatch round's spans and the completions of entries shipped open): a round is a cut
#: through the job, not its history, and at 16,384 ranks every entry since the last round would
#: be ~10 a rank-second for the store (the ingest path takes ~17 µs an entry). One span's worth.
DETAIL_PER_GROUP = SPAN
#: Jobs whose latest answered round a collector remembers (the least recently asked go first).
ROUNDS_REMEMBERED = 256
#: Snapshot kinds shipped at once, detail round or not: an incident's evidence, a rank's end.
SHIP_AT_ONCE = frozenset({"stall", "final"})


@dataclass(slots=True)
class _Group:
    """A rank's progress in one process group."""

    #: Newest collective sequence id entered.
    entered: int = 0
    #: The entries entered and not finished, by record id.
    open: dict[int, Entry] = field(default_factory=dict)
    #: Sequence id -> the finished collectives a digest may still report a span of
    #: (`flightdeck.digest.newest_span`), and that a mismatch round may ask for.
    done: dict[int, Entry] = field(default_factory=dict)
    #: The newest span sent (a span is reported once: `ProgressTracker.digests`).
    sent_span: int = -1

    @property
    def finished(self) -> int:
        """Newest sequence id up to which every collective it entered finished."""
        if not self.open:
            return self.entered
        return min(e.collective_seq_id for e in self.open.values()) - 1

    def finish(self, e: Entry) -> None:
        """A collective finished: its fingerprint, for the span it belongs to."""
        seq = e.collective_seq_id
        held = self.done.get(seq)
        # Of the entries of one sequence id (coalesced ops), the newest one's, as `progress_of`.
        if held is None or e.record_id >= held.record_id:
            self.done[seq] = e

    def span(self) -> tuple[int, int]:
        """(index, fingerprint) of the newest finished span held (`flightdeck.digest.newest_span`)."""
        return newest_span(self.finished, {q: fingerprint(signature(e)) for q, e in self.done.items()})

    def span_entries(self, k: int) -> list[Entry]:
        """The finished entries held of span k."""
        return [e for q, e in self.done.items() if k * SPAN < q <= (k + 1) * SPAN]

    def prune(self) -> None:
        """Forget the finished entries no digest can report any more: those of spans before the
        one before the newest finished (`finished` only grows; one span back stays for a mismatch
        round, which comes a few seconds after the span was reported), and the oldest beyond
        MAX_DONE_PER_GROUP (collectives finishing behind one that does not: the span after it is
        reported once it finishes)."""
        start = (self.finished // SPAN - 2) * SPAN
        old = [q for q in self.done if q <= start]
        if len(self.done) - len(old) > MAX_DONE_PER_GROUP:
            old = sorted(self.done)[: len(self.done) - MAX_DONE_PER_GROUP]
        for q in old:
            del self.done[q]


@dataclass(slots=True)
class RankProgress:
    """One rank's progress, as its reads' changed entries told it (see the module's doc)."""

    job: str
    attempt: int
    rank: int
    world_size: int | None = None
    #: Snapshot time of its newest snapshot read (epoch ns).
    time_ns: int = 0
    pid: int | None = None
    #: When it was last read (the collector's monotonic clock).
    read_at: float = -math.inf
    groups: dict[str, _Group] = field(default_factory=dict)
    #: Record ids of the entries shipped while open, and those of them that finished since: the
    #: server holds them open until it gets them finished (`completions`), so they go with the
    #: rank's next shipped snapshot (a flush that ships nothing drops its changes: without this a
    #: collective shipped open in one round stayed open on the server, and every stall of the
    #: job later named its group as hung too).
    shipped_open: set[int] = field(default_factory=set)
    finished_since: dict[int, Entry] = field(default_factory=dict)

    def take(self, snap: Snapshot, oldest_record_id: int | None, now: float) -> None:
        """Update from a read's snapshot, whose entries are the read's changed ones."""
        t = snap.snapshot_time_ns
        newest = t >= self.time_ns
        if newest and snap.pid is not None and self.pid is not None and snap.pid != self.pid:
            # Another process under the same rank (a job re-run under the same name): its sequence
            # ids start again, and it re-sends every entry (new creation times) to rebuild from.
            self.groups.clear()
        for e in snap.entries:
            # As `flightdeck.analysis.board.progress_of`: point-to-point ops have no collective sequence id.
            if e.is_p2p or e.collective_seq_id <= 0:
                continue
            g = self.groups.get(e.group)
            if g is None:
                g = self.groups[e.group] = _Group()
            if e.collective_seq_id > g.entered:
                g.entered = e.collective_seq_id
            if e.finished:
                g.open.pop(e.record_id, None)
                g.finish(e)
                if e.record_id in self.shipped_open:
                    self.shipped_open.discard(e.record_id)
                    self.finished_since[e.record_id] = e
            else:
                g.open[e.record_id] = e
                if len(g.open) > MAX_OPEN_PER_GROUP:
                    newest_open = max(g.open.values(), key=lambda o: (o.collective_seq_id, o.record_id))
                    del g.open[newest_open.record_id]
        if newest:
            self.time_ns = t
            self.world_size = snap.world_size or self.world_size
            self.pid = snap.pid if snap.pid is not None else self.pid
            if oldest_record_id is not None:
                # Overwritten in the ring before it was seen finished: nothing will say so now.
                for g in self.groups.values():
                    for rid in [rid for rid in g.open if rid < oldest_record_id]:
                        del g.open[rid]
        for g in self.groups.values():
            g.prune()
        self.read_at = now

    def digest(self, *, once: bool = False) -> RankDigest:
        """The rank's digest (what `progress_of` of its whole ring would say); `once`: a span
        already reported so is left out (what goes on the wire)."""
        groups = []
        for name, g in self.groups.items():
            since = 0
            if g.open:
                # The oldest entry of the lowest sequence id, as `progress_of` takes it.
                oldest = min(g.open.values(), key=lambda e: (e.collective_seq_id, e.record_id))
                since = max(oldest.time_created_ns, 0)
            k, h = g.span()
            if once and k >= 0:
                if k <= g.sent_span:
                    k, h = -1, 0  # reported before: 4 bytes a group saved per digest
                else:
                    g.sent_span = k
            groups.append(GroupProgress(name, g.entered, g.finished, since, k, h))
        return RankDigest(self.job, self.attempt, self.rank, self.world_size, self.time_ns, tuple(groups))

    def span_entries(self, spans: dict[str, int]) -> list[Entry]:
        """The finished entries held of these spans (group -> span index)."""
        return [e for name, k in spans.items() if (g := self.groups.get(name)) for e in g.span_entries(k)]

    def open_entries(self) -> list[Entry]:
        """The entries entered and not finished, all groups."""
        return [e for g in self.groups.values() for e in g.open.values()]

    def shipped(self, entries: Iterable[Entry]) -> list[Entry]:
        """Record a snapshot shipped with `entries`; returns the completions to add to it (entries
        shipped open before that have finished since)."""
        extra = list(self.finished_since.values())
        self.finished_since.clear()
        for e in entries:
            if e.finished:
                self.shipped_open.discard(e.record_id)
            else:
                self.shipped_open.add(e.record_id)
        return extra


class ProgressTracker:
    """The tracked progress of the ranks on digests, by rank key."""

    def __init__(self) -> None:
        self._ranks: dict[RankKey, RankProgress] = {}

    def __contains__(self, key: object) -> bool:
        return key in self._ranks

    def take(self, key: RankKey, snap: Snapshot, oldest_record_id: int | None, now: float) -> None:
        """Update a rank from a read (`RankProgress.take`), tracking it from now on."""
        p = self._ranks.get(key)
        if p is None:
            p = self._ranks[key] = RankProgress(key[0], key[1], key[2])
        p.take(snap, oldest_record_id, now)

    def digest(self, key: RankKey) -> RankDigest | None:
        """The rank's digest, None when it is not tracked."""
        p = self._ranks.get(key)
        return p.digest() if p is not None else None

    def digests(self, now: float, window_s: float = DIGEST_WINDOW_S) -> list[RankDigest]:
        """The digests to send: of the ranks read within `window_s` of `now`, each span reported
        once (should that request be lost, the span is missing from the server's vote: it
        decides on the others' and on newer spans)."""
        return [p.digest(once=True) for p in self._ranks.values() if now - p.read_at <= window_s]

    def open_entries(self, key: RankKey) -> list[Entry]:
        """The rank's open entries (none when it is not tracked)."""
        p = self._ranks.get(key)
        return p.open_entries() if p is not None else []

    def shipped(self, key: RankKey, entries: Iterable[Entry]) -> list[Entry]:
        """`RankProgress.shipped` of the rank (nothing when it is not tracked)."""
        p = self._ranks.get(key)
        return p.shipped(entries) if p is not None else []

    def span_entries(self, key: RankKey, spans: dict[str, int]) -> list[Entry]:
        """The rank's finished entries of these spans (none when it is not tracked)."""
        p = self._ranks.get(key)
        return p.span_entries(spans) if p is not None else []

    def forget(self, keys: Iterable[RankKey]) -> None:
        """Stop tracking these ranks (their shipped state was forgotten: a later read is a full one)."""
        for key in keys:
            self._ranks.pop(key, None)


def newest_per_group(entries: Sequence[Entry], n: int) -> list[Entry]:
    """The newest `n` entries of each group (by record id; the ring's order), in record order."""
    by_group: dict[str, list[Entry]] = {}
    for e in entries:
        by_group.setdefault(e.group, []).append(e)
    kept = [e for es in by_group.values() for e in sorted(es, key=lambda e: e.record_id)[-n:]]
    return sorted(kept, key=lambda e: e.record_id)


def split_requests(digests: Sequence[RankDigest]) -> list[list[RankDigest]]:
    """The digests cut into requests the server takes: at most `MAX_JOBS` job blocks and
    `MAX_CELLS` (rank, group) cells each (a host runs a few jobs: almost always one request)."""
    by_job: dict[tuple[str, int], list[RankDigest]] = {}
    for d in digests:
        by_job.setdefault((d.job, d.attempt), []).append(d)
    out: list[list[RankDigest]] = [[]]
    jobs = cells = 0
    for block in by_job.values():
        if out[-1] and jobs >= MAX_JOBS:
            out.append([])
            jobs = cells = 0
        jobs += 1
        for d in block:
            if out[-1] and cells + len(d.groups) > MAX_CELLS:
                out.append([])
                jobs, cells = 1, 0
            cells += len(d.groups)
            out[-1].append(d)
    return [r for r in out if r]


class DigestMode:
    """The `Collector`'s part for the ranks on digests (see the module's doc).

    Its state is the `Collector`'s, set in `Collector.__init__` (what each field holds is said
    there); the annotations below name the fields this part uses.
    """

    settings: CollectorSettings
    clock: Callable[[], int]
    monotonic: Callable[[], float]
    host: str
    metrics: CollectorMetrics
    pusher: Pusher
    _progress: ProgressTracker
    _digest_url: str
    _digest_failing: bool
    _rounds_answered: dict[tuple[str, int], int]

    if TYPE_CHECKING:

        def _thin_groups(self, key: RankKey, snap: Snapshot, now_mono: float) -> None: ...  # `Collector`'s

    def _on_digests(self, world_size: int | None) -> bool:
        """Whether the ranks of a job of this size are on digests."""
        least = self.settings.digest_from_ranks
        return least > 0 and world_size is not None and world_size >= least

    def _reads_in_full(self, head: RankDump, key: RankKey) -> bool:
        """Whether to read a dump in full rather than diff it against the shipped state: a rank on
        digests this process does not track yet (a collector restart: the shipped state says what
        went out before, but the open entries that did not change since would never be seen)."""
        return self._on_digests(head.world_size) and key not in self._progress

    def _track(self, key: RankKey, snap: Snapshot, oldest_record_id: int | None) -> None:
        """Update a rank on digests from a read's snapshot (its changed entries)."""
        self._progress.take(key, snap, oldest_record_id, self.monotonic())

    def digest_of(self, key: RankKey) -> RankDigest | None:
        """The digest the collector holds for a rank on digests (None when it tracks none)."""
        return self._progress.digest(key)

    def _settle_digests(self, held: list[Snapshot], now_mono: float, result: FlushResult) -> list[Snapshot]:
        """Send the digests; of the held snapshots, those to ship now (a detail round for their job,
        or a stall or final snapshot), with each rank's open entries added. The rest are counted
        held back."""
        detail = self._send_digests(result)
        for job, heard in list(detail.items()):
            # A round heard again (it stays open over two intervals): answered already. (Round 0:
            # a server that names none; every hearing is a round.)
            if heard.round and self._rounds_answered.get(job) == heard.round:
                del detail[job]
            else:
                self._rounds_answered.pop(job, None)
                self._rounds_answered[job] = heard.round
                if len(self._rounds_answered) > ROUNDS_REMEMBERED:
                    del self._rounds_answered[next(iter(self._rounds_answered))]
        ship: list[Snapshot] = []
        for snap in held:
            asked = detail.get((snap.job, snap.attempt))
            # A round for a stall's evidence names its ranks (`Asked.ranks`); others name none.
            if snap.kind in SHIP_AT_ONCE or (
                asked is not None and (not asked.ranks or snap.rank in asked.ranks)
            ):
                ship.append(snap)
        held_back = len(held) - len(ship)
        result.held_back += held_back
        self.metrics.snapshots_held_back.inc(held_back)
        # The open entries go with the rank's newest snapshot shipped, unless one of its snapshots
        # carries them already (the server upserts by record id: re-sending one would be harmless).
        newest: dict[RankKey, Snapshot] = {}
        carried: dict[RankKey, dict[int, Entry]] = {}
        for snap in ship:
            key = (snap.job, snap.attempt, snap.rank)
            if len(snap.entries) > DETAIL_PER_GROUP:
                snap.entries = newest_per_group(snap.entries, DETAIL_PER_GROUP)
                snap.columns = None
            if key not in newest or snap.snapshot_time_ns >= newest[key].snapshot_time_ns:
                newest[key] = snap
            carried.setdefault(key, {}).update((e.record_id, e) for e in snap.entries)
        for key, snap in newest.items():
            wanted = self._progress.open_entries(key)
            asked = detail.get((snap.job, snap.attempt))
            spans = asked.spans if asked is not None else {}
            if spans:
                # A mismatch round: the span's entries, which went out (or were held back) long ago.
                wanted += self._progress.span_entries(key, spans)
            extra = {e.record_id: e for e in wanted if e.record_id not in carried[key]}
            for e in self._progress.shipped(key, [*carried[key].values(), *extra.values()]):
                if e.record_id not in carried[key]:
                    extra[e.record_id] = e
            if extra:
                snap.entries = sorted([*snap.entries, *extra.values()], key=lambda e: e.record_id)
                snap.columns = None
        for snap in ship:
            # Marked shipped only now: a held snapshot's groups were not sent.
            self._thin_groups((snap.job, snap.attempt, snap.rank), snap, now_mono)
        return ship

    def _send_digests(self, result: FlushResult) -> dict[tuple[str, int], Asked]:
        """POST the digests of the ranks read within `DIGEST_WINDOW_S`; the (job, attempt) whose
        entries the server asks for now, with what it asks (none when a request failed)."""
        digests = self._progress.digests(self.monotonic())
        detail: dict[tuple[str, int], Asked] = {}
        for part in split_requests(digests):
            body = gzip.compress(orjson.dumps(encode_digests(self.host, self.clock(), part)), compresslevel=3)
            headers = {"Content-Type": "application/json", "Content-Encoding": "gzip"}
            # The pusher's token: it reads a changed token_file again while the server rejects one.
            auth = self.pusher.headers.get("Authorization")
            if auth:
                headers["Authorization"] = auth
            try:
                resp = self.pusher.client.post(
                    self._digest_url, content=body, headers=headers, timeout=self.settings.request_timeout_s
                )
            except httpx.HTTPError as exc:
                self._digest_failed(f"{type(exc).__name__}: {exc}")
                continue
            if not 200 <= resp.status_code < 300:
                self._digest_failed(f"HTTP {resp.status_code}: {_message(resp)}")
                continue
            jobs = _detail(resp)
            if jobs is None:
                self._digest_failed(f"HTTP {resp.status_code} with an answer that is not a digest answer")
                continue
            detail.update(jobs)
            result.digest_ranks += len(part)
            self.metrics.digest_requests.labels(outcome="sent").inc()
            if self._digest_failing:
                self._digest_failing = False
                log.info("progress digests go through again")
        return detail

    def _digest_failed(self, why: str) -> None:
        """Count a failed digest request; log the first of an outage (each flush would repeat it)."""
        self.metrics.digest_requests.labels(outcome="failed").inc()
        if self._digest_failing:
            log.debug("digest request failed: %s", why)
            return
        self._digest_failing = True
        log.warning(
            "progress digests cannot be sent to %s (%s): until they can, the entries of ranks on "
            "digests are not shipped, but for their stall and final snapshots (logged once)",
            self._digest_url,
            why,
        )


@dataclass(frozen=True, slots=True)
class Asked:
    """What a round asks of a job's ranks: the spans to add (group -> span index), which ranks
    are to ship (empty: every one), and the round's id (0: none given)."""

    spans: dict[str, int]
    ranks: frozenset[int]
    round: int = 0


def _detail(resp: httpx.Response) -> dict[tuple[str, int], Asked] | None:
    """The (job, attempt) of a digest answer's `detail`, each with what it asks; None when the
    answer is not one."""
    try:
        doc: Any = resp.json()
    except ValueError:
        return None
    listed = doc.get("detail") if isinstance(doc, dict) else None
    if not isinstance(listed, list):
        return None
    out: dict[tuple[str, int], Asked] = {}
    for d in listed:
        if not isinstance(d, dict) or not isinstance(d.get("job"), str) or type(d.get("attempt")) is not int:
            return None
        spans = d.get("spans") or {}
        ranks = d.get("ranks") or []
        if not isinstance(spans, dict) or not all(type(k) is int for k in spans.values()):
            return None
        if not isinstance(ranks, list) or not all(type(r) is int for r in ranks):
            return None
        round_id = d.get("round", 0)
        if type(round_id) is not int:
            return None
        out[(d["job"], d["attempt"])] = Asked(
            {str(g): k for g, k in spans.items()}, frozenset(ranks), round_id
        )
    return out
