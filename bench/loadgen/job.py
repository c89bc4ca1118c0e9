"""The simulated job: its ranks and process groups, the injected faults, and each host's batch
as the collector builds it (the wire document, gzip)."""

from __future__ import annotations

import bisect
import gzip
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import orjson

from flightdeck import __version__
from flightdeck.records import WIRE_VERSION, GroupInfo
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
    """One rank: which collectives it created, and which were shipped while still in flight."""

    rank: int
    jitter_ns: int
    next_i: int = 0
    #: Indexes of the collectives shipped as started (shipped again once completed), in order.
    in_flight: dict[int, None] = field(default_factory=dict)
    #: Generator time (epoch ns) the rank last shipped its groups.
    groups_sent_ns: int = 0


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
    #: Placed by `plan_faults` (index and time set), in time order.
    faults: list[Fault] = field(default_factory=list)
    ranks: list[RankSim] = field(default_factory=list)
    #: Fault collective index -> its fault; rank -> indexes at which it enters with other sizes.
    _at: dict[int, Fault] = field(default_factory=dict)
    _bad: dict[int, set[int]] = field(default_factory=dict)

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

    def snapshot_doc(self, r: RankSim, now_ns: int, host: str, sigs: SigTable) -> dict[str, Any]:
        """The rank's periodic snapshot at `now_ns`, only new and changed entries, as the wire
        dict `encode_batch` writes for it (tests/test_loadgen.py checks that it is).

        Built column by column from the collective indexes, without an `Entry` per collective:
        the generator shares the machine with the server it measures, and building entries and
        encoding them cost it ~10 us per entry (0.4 core at 4,096 ranks); this, with JSON and gzip,
        costs 2.6-4. Collectives between faults take the fast path (one time shift for all).
        """
        done_by = now_ns - DURATION_NS  # finished at or before: completed at `now_ns`
        # In-flight ones that completed since the last snapshot go again, then the new ones.
        idx: list[int] = []
        created: list[int] = []
        fin: list[int | None] = []
        for i in list(r.in_flight):
            c, end = self._times(r, i)
            if end is not None and end <= now_ns:
                del r.in_flight[i]
                idx.append(i)
                created.append(c)
                fin.append(end)
        dur: list[float | None] = [(e - c) / 1e6 for c, e in zip(created, fin, strict=True) if e is not None]
        last = self.last_index(r, now_ns)
        new = range(r.next_i, last + 1)
        r.next_i = max(r.next_i, last + 1)
        if not any(new.start <= f.index < new.stop for f in self.faults):
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
        for i, e in zip(new, new_fin, strict=True):
            if e is None:
                r.in_flight[i] = None
        idx += new
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
            "oldest_record_id": max(0, r.next_i - RING),
            "groups": groups,
            "thread_stacks": [],
            "entries": cols,
            "source": "loadgen",
            "config": None,
        }

    def host_doc(self, h: int, now_ns: int) -> dict[str, Any]:
        """Host `h`'s batch at `now_ns` as the JSON document a collector sends."""
        host = f"sim-{h:05d}"
        sigs = SigTable()
        snaps = [self.snapshot_doc(self.ranks[r], now_ns, host, sigs) for r in self.topo.host_ranks(h)]
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

    def host_batch(self, h: int, now_ns: int) -> tuple[str, bytes, int]:
        """(batch id, gzip body, entries) of host `h`'s batch at `now_ns`, as the collector builds it."""
        doc = self.host_doc(h, now_ns)
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
