"""The simulated job: its ranks and process groups, the injected faults, and each host's batch
as the collector builds it (the wire document, gzip); with `--digests`, each host's progress
digests (`flightdeck.digest`'s wire document) and the batch it ships when the server asks."""

from __future__ import annotations

import bisect
import functools
import gzip
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import orjson

from flightdeck import __version__
from flightdeck.analysis.summary import fingerprint, signature_of
from flightdeck.digest import MS, SPAN, span_fingerprint
from flightdeck.digest import VERSION as DIGEST_VERSION
from flightdeck.records import WIRE_VERSION, GroupInfo, canonical_op
from flightdeck.wire import encode_group

NS = 1_000_000_000
#: (raw op, input size) of the collectives of each group kind, cycled.
OPS = (
    ("nccl:all_reduce", 4_194_304),
    ("nccl:all_gather", 1_048_576),
    ("nccl:reduce_scatter", 1_048_576),
    ("nccl:broadcast", 65_536),
)
#: How long a collective runs: the ones younger than this at a snapshot are shipped in flight.
DURATION_NS = 20_000_000
RING = 2000
#: Ranks start their collectives up to this much apart.
JITTER_NS = 2_000_000


@dataclass(slots=True)
class Topology:
    """Ranks, hosts and the process groups of every rank (group names as torch numbers them)."""

    ranks: int
    hosts: int
    kinds: int
    #: rank -> kind -> (group name, desc, members)
    member: list[list[tuple[str, str, tuple[int, ...]]]] = field(default_factory=list)
    #: group name -> the group as `encode_group` writes it (encoded once: a world of 16,384 ranks
    #: would cost its member list's runs in every rank's snapshot that carries groups)
    wire: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def per_host(self) -> int:
        """Ranks per host."""
        return self.ranks // self.hosts

    def build(self) -> None:
        """Lay out the groups: kind 0 the world, then blocks and stripes of ranks."""
        n, rph = self.ranks, self.per_host
        world = tuple(range(n))
        self.member = [[("0", "default_pg", world)] for _ in range(n)]
        self.wire = {"0": encode_group(GroupInfo("0", "default_pg", world))}
        next_name = 1
        for k in range(1, self.kinds):
            parts: list[tuple[int, ...]]
            if k % 2 == 1:  # contiguous blocks: 1, 2, 4 ... hosts wide
                size = min(n, rph * (1 << (k // 2)))
                parts = [tuple(range(s, min(n, s + size))) for s in range(0, n, size)]
            else:  # stripes: the same local rank on every host (data parallel)
                stride = rph
                parts = [tuple(range(o, n, stride)) for o in range(stride)]
            for p in parts:
                name = str(next_name)
                next_name += 1
                info = (name, f"kind{k}", p)
                self.wire[name] = encode_group(GroupInfo(*info))
                for r in p:
                    self.member[r].append(info)

    def host_ranks(self, h: int) -> range:
        """The ranks of host `h`."""
        return range(h * self.per_host, (h + 1) * self.per_host)


@dataclass(slots=True)
class RankSim:
    """One rank: which collectives it created, and which were in flight at its last snapshot."""

    rank: int
    jitter_ns: int
    next_i: int = 0
    #: Indexes of the collectives in flight at the last snapshot (shipped as started, and again
    #: once completed), in order.
    in_flight: dict[int, None] = field(default_factory=dict)
    #: `--digests --ship-completions`: indexes of the collectives a batch carried as open whose
    #: completion no batch has carried yet, in order.
    shipped_open: dict[int, None] = field(default_factory=dict)
    #: `--digests`: group kind -> the newest span its digests reported (each is reported once).
    sent_span: dict[int, int] = field(default_factory=dict)
    #: Generator time (epoch ns) the rank last shipped its groups.
    groups_sent_ns: int = 0


@dataclass(slots=True)
class Step:
    """One rank's snapshot as the collector's delta reader takes it (`Sim.advance`)."""

    now_ns: int
    #: Collectives in flight at the snapshot before that have completed since.
    done: list[int]
    #: Collectives created since the snapshot before.
    new: range
    #: Every collective open (entered, not finished) at `now_ns`, in order.
    open: list[int]
    #: The newest collective the rank has created (-1: none).
    last: int


@dataclass(slots=True)
class Fault:
    """One injected fault: at the first world collective from `at_s` seconds in, rank `rank`
    stops before it (`hang`) or enters it with other sizes (`mismatch`); the collective stays
    unfinished on every rank for `hold_s` seconds, then completes and the job goes on (None:
    for ever, the job stops there)."""

    kind: str
    at_s: float
    rank: int
    hold_s: float | None = None
    #: The world collective it happens at (`plan_faults`), and when that one is created (epoch ns
    #: of the simulated job, without the ranks' jitter).
    index: int = -1
    at_ns: int = 0

    def label(self) -> str:
        """The fault as the command line gives it (`hang@40:rank=5:for=30`)."""
        hold = "" if self.hold_s is None else f":for={self.hold_s:g}"
        return f"{self.kind}@{self.at_s:g}:rank={self.rank}{hold}"


FAULT_KINDS = ("hang", "mismatch")


def parse_fault(text: str) -> Fault:
    """`KIND@SECONDS[:rank=R][:for=S]` as a `Fault` (rank 5 unless given). Raises ValueError."""
    kind, at, rest = text.partition("@")
    if kind not in FAULT_KINDS or not at:
        raise ValueError(f"{text!r}: expected KIND@SECONDS[:rank=R][:for=S], KIND one of {FAULT_KINDS}")
    at_s, *opts = rest.split(":")
    fault = Fault(kind, float(at_s), 5)
    for opt in opts:
        key, _, value = opt.partition("=")
        if key == "rank":
            fault.rank = int(value)
        elif key == "for":
            fault.hold_s = float(value)
        else:
            raise ValueError(f"{text!r}: unknown option {key!r} (rank=, for=)")
    if fault.at_s < 0 or (fault.hold_s is not None and fault.hold_s < 0):
        raise ValueError(f"{text!r}: negative time")
    return fault


def plan_faults(faults: list[Fault], t0_ns: int, rate: float, kinds: int, ranks: int) -> list[Fault]:
    """Place the faults on world collectives, in time order: each at the first world collective
    created at or after its `at_s` (after the one before it, which delays everything after it by
    its hold). Raises ValueError for a fault after one that holds for ever (it would never come)."""
    out: list[Fault] = []
    shift_s = 0.0
    for f in sorted(faults, key=lambda f: f.at_s):
        if out and out[-1].hold_s is None:
            raise ValueError(
                f"{f.label()} never comes: the job stops at {out[-1].label()} (give that one for=S)"
            )
        i = max(int((f.at_s - shift_s) * rate), out[-1].index + 1 if out else 0)
        i += (-i) % kinds  # a world collective (kind 0)
        f.rank %= ranks
        f.index = i
        f.at_ns = t0_ns + int(i * NS / rate) + int(shift_s * NS)
        shift_s += f.hold_s or 0.0
        out.append(f)
    return out


@dataclass(slots=True)
class Sim:
    """The job: every rank's state, the faults, and how to build a host's batch."""

    job: str
    topo: Topology
    rate: float
    interval_s: float
    t0_ns: int
    #: Groups go again after this many seconds (the collector's GROUPS_RESEND_S); 0: every snapshot.
    groups_resend_s: float
    #: `--digests --ship-completions`: a batch asked for also carries the completion of each entry
    #: an earlier batch carried open, when the snapshot that saw it complete was not shipped.
    ship_completions: bool = False
    #: Placed by `plan_faults` (index and time set), in time order.
    faults: list[Fault] = field(default_factory=list)
    ranks: list[RankSim] = field(default_factory=list)
    #: Fault collective index -> its fault; rank -> indexes at which it enters with other sizes.
    _at: dict[int, Fault] = field(default_factory=dict)
    _bad: dict[int, set[int]] = field(default_factory=dict)
    #: Group kind -> the fingerprint of any of its spans on a rank without a mismatch.
    _fps: dict[int, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._at = {f.index: f for f in self.faults}
        for f in self.faults:
            if f.kind == "mismatch":
                self._bad.setdefault(f.rank, set()).add(f.index)

    def _shift_ns(self, i: int) -> int:
        """How much later than at `--rate` collective `i` comes: the holds of the faults before it."""
        return sum(int((f.hold_s or 0.0) * NS) for f in self.faults if f.index < i)

    def _times(self, r: RankSim, i: int) -> tuple[int, int | None]:
        """(created, finished or None: never) of the rank's collective `i` (epoch ns)."""
        created = self.t0_ns + r.jitter_ns + int(i * NS / self.rate) + self._shift_ns(i)
        f = self._at.get(i)
        if f is None:
            return created, created + DURATION_NS
        if f.hold_s is None:
            return created, None
        release = f.at_ns + int(f.hold_s * NS) + JITTER_NS  # when the last rank has entered it
        if f.kind == "hang" and r.rank == f.rank:
            created = release - JITTER_NS + r.jitter_ns
        return created, release + DURATION_NS

    def last_index(self, r: RankSim, now_ns: int) -> int:
        """The last collective index the rank has created by `now_ns` (faults included)."""
        x = now_ns - self.t0_ns - r.jitter_ns
        shift = 0
        floor = -1  # a fault's collective, created on every rank that got there
        for f in self.faults:
            n = max(floor, int((x - shift) * self.rate / NS))
            if n < f.index:
                return n
            hung = f.kind == "hang" and r.rank == f.rank
            if f.hold_s is None:
                return f.index - 1 if hung else f.index
            hold = int(f.hold_s * NS)
            if hung and x < int(f.index * NS / self.rate) + shift + hold:
                return f.index - 1
            shift += hold
            floor = f.index
        return max(floor, int((x - shift) * self.rate / NS))

    def advance(self, r: RankSim, now_ns: int) -> Step:
        """Take the rank's snapshot at `now_ns` as the collector's delta reader sees it: which of
        the collectives it shipped in flight have completed since, which are new, which are open.

        Cheap (no list per collective): the generator advances every rank every interval, and in
        `--digests` mode most of these snapshots are never built into entries.
        """
        done_by = now_ns - DURATION_NS  # finished at or before: completed at `now_ns`
        done: list[int] = []
        for i in list(r.in_flight):
            _, end = self._times(r, i)
            if end is not None and end <= now_ns:
                del r.in_flight[i]
                done.append(i)
        last = self.last_index(r, now_ns)
        new = range(r.next_i, last + 1)
        r.next_i = max(r.next_i, last + 1)
        if not self._fault_in(new):
            # Created in order, DURATION_NS apart from the end: only the newest can be running.
            base, rate = self.t0_ns + r.jitter_ns + self._shift_ns(new.start), self.rate
            i = new.stop - 1
            while i >= new.start and base + int(i * NS / rate) > done_by:
                i -= 1
            flying: range | list[int] = range(i + 1, new.stop)
        else:
            flying = [i for i in new if (e := self._times(r, i)[1]) is None or e > now_ns]
        for i in flying:
            r.in_flight[i] = None
        return Step(now_ns, done, new, list(r.in_flight), r.next_i - 1)

    def _fault_in(self, new: range) -> bool:
        return any(new.start <= f.index < new.stop for f in self.faults)

    def snapshot_doc(self, r: RankSim, now_ns: int, host: str, sigs: SigTable) -> dict[str, Any]:
        """The rank's periodic snapshot at `now_ns`, only new and changed entries, as the wire
        dict `encode_batch` writes for it (tests/test_loadgen.py checks that it is).

        Built column by column from the collective indexes, without an `Entry` per collective:
        the generator shares the machine with the server it measures, and building entries and
        encoding them cost it ~10 us per entry (0.4 core at 4,096 ranks); this, with JSON and gzip,
        costs 2.6-4. Collectives between faults take the fast path (one time shift for all).
        """
        return self.step_doc(r, self.advance(r, now_ns), host, sigs)

    def step_doc(
        self, r: RankSim, step: Step, host: str, sigs: SigTable, extra: Iterable[int] = ()
    ) -> dict[str, Any]:
        """The rank's snapshot of `step` (`advance`) as `snapshot_doc` writes it, with the entries
        of the collectives `extra` as well (created before the step's new ones: what a collector on
        digests adds when the server asks for the job's entries, `detail_doc`)."""
        now_ns = step.now_ns
        done_by = now_ns - DURATION_NS
        # The in-flight ones completed since (and the extra ones, in order), then the new ones.
        new = step.new
        idx = step.done
        more = set(extra).difference(idx).difference(new)
        if more:
            idx = sorted([*idx, *more])
        created: list[int] = []
        fin: list[int | None] = []
        for i in idx:
            c, end = self._times(r, i)
            created.append(c)
            fin.append(end if end is not None and end <= now_ns else None)
        dur: list[float | None] = [
            None if e is None else (e - c) / 1e6 for c, e in zip(created, fin, strict=True)
        ]
        if not self._fault_in(new):
            base, rate = self.t0_ns + r.jitter_ns + self._shift_ns(new.start), self.rate
            new_created = [base + int(i * NS / rate) for i in new]
            # Created in order: the first k have finished, the rest are in flight.
            k = bisect.bisect_right(new_created, done_by)
            left = len(new_created) - k
            new_fin: list[int | None] = [c + DURATION_NS for c in new_created[:k]]
            new_fin += [None] * left
            dur += [DURATION_NS / 1e6] * k
            dur += [None] * left
        else:
            times = [self._times(r, i) for i in new]
            new_created = [c for c, _ in times]
            new_fin = [e if e is not None and e <= now_ns else None for _, e in times]
            dur += [None if e is None else (e - c) / 1e6 for c, e in zip(new_created, new_fin, strict=True)]
        idx = idx + list(new)
        created += new_created
        fin += new_fin
        done = [e is not None for e in fin]
        kinds = self.topo.kinds
        member = self.topo.member[r.rank]
        bad = self._bad.get(r.rank)  # where its entries' sizes differ from its peers'
        names = [m[0] for m in member]
        mods = [i % kinds for i in idx]
        cols: dict[str, Any] = {
            "n": len(idx),
            "rid": idx,
            "g": [names[k] for k in mods],
            "seq": [i // kinds + 1 for i in idx],
            "p2p": [0] * len(idx),
            "opid": [i + 1 for i in idx],
            "st": ["completed" if d else "started" for d in done],
            "ret": done,
            "tc": created,
        }
        # As `encode_batch`: an optional column that holds only its default is left out.
        optional: dict[str, list[Any]] = {
            "ts": [c + 10_000 for c in created],
            "td": fin,
            "dur": dur,
            "to": [600_000] * len(idx),
        }
        cols |= {k: v for k, v in optional.items() if any(x is not None for x in v)}
        if bad:
            cols["sig"] = [sigs.ref(k % len(OPS), i in bad) for i, k in zip(idx, mods, strict=True)]
        else:  # one lookup per kind, in order of first use (as `encode_batch` numbers them)
            refs = {k: sigs.ref(k % len(OPS), False) for k in dict.fromkeys(mods)}
            cols["sig"] = [refs[k] for k in mods]
        groups: dict[str, Any] = {}
        if not r.groups_sent_ns or now_ns - r.groups_sent_ns >= self.groups_resend_s * NS:
            groups = {n: self.topo.wire[n] for n, _, _ in member}
            r.groups_sent_ns = now_ns
        return {
            "job": self.job,
            "attempt": 0,
            "rank": r.rank,
            "snapshot_time_ns": now_ns,
            "kind": "periodic",
            "world_size": self.topo.ranks,
            "local_rank": r.rank % self.topo.per_host,
            "host": host,
            "pid": 100_000 + r.rank,
            "torch_version": "2.13.0",
            "backend": "nccl",
            "version": "2.10",
            "interval_s": self.interval_s,
            "exception": None,
            "wrapped": False,
            "oldest_record_id": max(0, step.last + 1 - RING),
            "groups": groups,
            "thread_stacks": [],
            "entries": cols,
            "source": "loadgen",
            "config": None,
        }

    def host_doc(self, h: int, now_ns: int) -> dict[str, Any]:
        """Host `h`'s batch at `now_ns` as the JSON document a collector sends."""
        host = host_name(h)
        sigs = SigTable()
        snaps = [self.snapshot_doc(self.ranks[r], now_ns, host, sigs) for r in self.topo.host_ranks(h)]
        return batch_doc(host, sigs, snaps)

    def host_batch(self, h: int, now_ns: int) -> tuple[str, bytes, int]:
        """(batch id, gzip body, entries) of host `h`'s batch at `now_ns`, as the collector builds it."""
        return gzip_batch(self.host_doc(h, now_ns))

    # --- progress digests (`--digests`) ---------------------------------------------------------

    def host_steps(self, h: int, now_ns: int) -> list[Step]:
        """Advance host `h`'s ranks to their snapshot at `now_ns` (`advance`), in rank order."""
        return [self.advance(self.ranks[r], now_ns) for r in self.topo.host_ranks(h)]

    def progress(self, r: RankSim, step: Step) -> list[tuple[str, int, int, int, int, int]]:
        """(group, entered, finished, open since ns or 0, newest finished span or -1, its
        fingerprint or 0) of each group the rank entered a collective of, in the order of its
        kinds: what `flightdeck.analysis.board.progress_of` says of its entries at the step
        (tests/test_loadgen.py checks that it is), from the indexes alone."""
        kinds = self.topo.kinds
        member = self.topo.member[r.rank]
        oldest: dict[int, int] = {}  # kind -> its oldest open collective
        for i in step.open:
            oldest.setdefault(i % kinds, i)
        top = step.last
        out = []
        for k in range(min(kinds, top + 1)):
            entered = (top - (top - k) % kinds) // kinds + 1  # its newest collective of kind k
            o = oldest.get(k)
            # Finished up to the one before its oldest open one, waiting since that one came.
            finished, since = (entered, 0) if o is None else (o // kinds, self._times(r, o)[0])
            span = finished // SPAN - 1  # every collective of it finished (`newest_span`)
            out.append((member[k][0], entered, finished, since, span, self._span_fp(r, k, span)))
        return out

    def _span_fp(self, r: RankSim, k: int, span: int) -> int:
        """The fingerprint of the rank's span `span` of its group of kind `k` (0 for -1)."""
        if span < 0:
            return 0
        bad = self._bad.get(r.rank)
        kinds = self.topo.kinds
        idx = range(span * SPAN * kinds + k, (span + 1) * SPAN * kinds + k, kinds)
        if not bad or bad.isdisjoint(idx):
            fp = self._fps.get(k)
            if fp is None:
                fp = self._fps[k] = span_fingerprint([sig_fp(k % len(OPS), False)] * SPAN)
            return fp
        return span_fingerprint(sig_fp(k % len(OPS), i in bad) for i in idx)

    def digest_doc(self, h: int, steps: list[Step], sent_ns: int) -> dict[str, Any]:
        """Host `h`'s digest request at `sent_ns` for its ranks' `steps`, as the JSON document
        `flightdeck.digest.encode_digests` writes (built column by column: no object per rank;
        tests/test_loadgen.py checks that it is the same document). Each finished span is reported
        once, as the collector does (`RankSim.sent_span`)."""
        names: dict[str, int] = {}
        groups: list[str] = []
        cols: dict[str, list[int]] = {c: [] for c in ("rank", "age_ms", "n", "g", "e", "d", "w", "k", "h")}
        rank, age, n, g, e, d, w, ks, hs = cols.values()
        for r, st in zip(self.topo.host_ranks(h), steps, strict=True):
            rs = self.ranks[r]
            cells = self.progress(rs, st)
            rank.append(r)
            age.append(max(0, (sent_ns - st.now_ns) // MS))
            n.append(len(cells))
            for kind, (name, entered, finished, since, span, fp) in enumerate(cells):
                i = names.get(name)
                if i is None:
                    i = names[name] = len(groups)
                    groups.append(name)
                g.append(i)
                e.append(entered)
                d.append(entered - finished)
                w.append(max(0, (st.now_ns - since) // MS) if since else -1)
                if span > rs.sent_span.get(kind, -1):
                    rs.sent_span[kind] = span
                    ks.append(span)
                    hs.append(fp)
                else:  # reported before (or none yet)
                    ks.append(-1)
                    hs.append(0)
        block = {"job": self.job, "attempt": 0, "world_size": self.topo.ranks, "groups": groups, **cols}
        return {"v": DIGEST_VERSION, "host": host_name(h), "sent_ns": sent_ns, "jobs": [block]}

    def digest_body(self, h: int, steps: list[Step], sent_ns: int) -> bytes:
        """`digest_doc`, gzipped as the collector sends it."""
        return gzip.compress(orjson.dumps(self.digest_doc(h, steps, sent_ns)), compresslevel=3)

    def detail_doc(
        self,
        h: int,
        steps: list[Step],
        spans: dict[str, int] | None = None,
        ranks: frozenset[int] = frozenset(),
    ) -> dict[str, Any] | None:
        """Host `h`'s batch of its ranks' `steps` when the server asked for the job's entries, as
        the collector on digests ships it: each snapshot's new and changed entries, the entries
        still open even if unchanged, and for a mismatch round (`spans`: group -> span) the
        finished entries it still holds of those spans; with `ship_completions` also the entries
        shipped open before whose completion was dropped. `ranks`: only those of the host's ranks
        (none named: all); None when none of them is named."""
        host = host_name(h)
        sigs = SigTable()
        snaps = []
        for r, st in zip(self.topo.host_ranks(h), steps, strict=True):
            if ranks and r not in ranks:
                continue
            rs = self.ranks[r]
            extra = [i for i in st.open if i < st.new.start]
            if self.ship_completions:
                extra += rs.shipped_open
            if spans:
                extra += self._span_entries(rs, st, spans)
            doc = self.step_doc(rs, st, host, sigs, extra)
            if self.ship_completions:
                cols = doc["entries"]
                for i, state in zip(cols["rid"], cols["st"], strict=True):
                    if state == "completed":
                        rs.shipped_open.pop(i, None)
                    else:
                        rs.shipped_open[i] = None
            snaps.append(doc)
        return batch_doc(host, sigs, snaps) if snaps else None

    def _span_entries(self, r: RankSim, step: Step, spans: dict[str, int]) -> list[int]:
        """The collectives of these spans (group -> span) the rank has finished and its collector
        still holds (`collector/digests.py` keeps the spans from the one before its newest
        finished one on)."""
        kinds = self.topo.kinds
        out: list[int] = []
        for k, (name, _, finished, _, _, _) in enumerate(self.progress(r, step)):
            span = spans.get(name)
            if span is None:
                continue
            low = max(span * SPAN, (finished // SPAN - 2) * SPAN)  # seqs above it are held
            out += [(q - 1) * kinds + k for q in range(low + 1, min(finished, (span + 1) * SPAN) + 1)]
        return out

    def detail_batch(
        self,
        h: int,
        steps: list[Step],
        spans: dict[str, int] | None = None,
        ranks: frozenset[int] = frozenset(),
    ) -> tuple[str, bytes, int] | None:
        """(batch id, gzip body, entries) of `detail_doc`, None when it ships nothing."""
        doc = self.detail_doc(h, steps, spans, ranks)
        return gzip_batch(doc) if doc is not None else None


def host_name(h: int) -> str:
    """Simulated host `h`'s name."""
    return f"sim-{h:05d}"


def batch_doc(host: str, sigs: SigTable, snaps: list[dict[str, Any]]) -> dict[str, Any]:
    """A host's batch document around its snapshots (fresh batch id, sent now)."""
    return {
        "wire_version": WIRE_VERSION,
        "batch_id": str(uuid.uuid4()),
        "collector": {"host": host, "version": __version__},
        "sent_at_ns": time.time_ns(),
        "stacks": [],
        "sigs": sigs.table,
        "snapshots": snaps,
        "nixl": [],
    }


def gzip_batch(doc: dict[str, Any]) -> tuple[str, bytes, int]:
    """(batch id, gzip body, entries) of a batch document."""
    body = gzip.compress(orjson.dumps(doc), compresslevel=3)
    return doc["batch_id"], body, sum(s["entries"]["n"] for s in doc["snapshots"])


@dataclass(slots=True)
class SigTable:
    """A batch's `sigs` table: each (op of `OPS`, mismatched or not) once, in order of use."""

    table: list[dict[str, Any]] = field(default_factory=list)
    index: dict[tuple[int, bool], int] = field(default_factory=dict)

    def ref(self, op: int, mismatched: bool) -> int:
        """The index of the signature of collective kind `op` (sizes off by one when mismatched)."""
        key = (op, mismatched)
        i = self.index.get(key)
        if i is None:
            raw_op, size = OPS[op]
            size += mismatched
            i = self.index[key] = len(self.table)
            sz = [[size]]
            self.table.append(
                {
                    "be": "nccl",
                    "op": raw_op,
                    "isp2p": False,
                    "isz": sz,
                    "osz": sz,
                    "idt": ["Float"],
                    "odt": ["Float"],
                }
            )
        return i


@functools.cache
def sig_fp(op: int, mismatched: bool) -> int:
    """The signature fingerprint (`flightdeck.analysis.summary`) of the entries `SigTable.ref`
    describes: what a span's fingerprint is made of."""
    raw_op, size = OPS[op]
    sz = ((size + mismatched,),)
    return fingerprint(signature_of(canonical_op(raw_op), sz, sz, ("Float",), ("Float",)))
