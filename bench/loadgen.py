"""Load generator: N simulated ranks on H simulated hosts push to real `flightdeck server` processes.

It speaks the collector's protocol: one batch per host and snapshot interval (the document
`flightdeck.wire.encode_batch` writes, built column by column: tests/test_loadgen.py), gzip,
`Authorization: Bearer`, `Idempotency-Key` = the batch id, `Flightdeck-Batch-Age-Ms` = how long
it waited to be sent), each rank's
snapshot carrying only its new or changed entries (what `flightdeck/readers/delta.py` ships: a collective
is shipped when it appears, and again when it completes if it was in flight at the snapshot), one
request in flight per host, retried on 429/503 after `Retry-After` like `collector/pusher.py`.

Each rank runs `--rate` collectives per second, round-robin over `--groups` kinds of process
groups (the world, per-host blocks, same-local-rank stripes, two-host blocks, ...). Faults, as many
as wanted, each `--fault KIND@SECONDS[:rank=R][:for=S]`: at the first world collective from that
moment rank R (5 unless given) stops before it (`hang`: every other rank waits in it) or enters it
with other sizes (`mismatch`); with `for=S` the collective completes S seconds later on every rank
and the job goes on (a stall that clears; `mismatch@T:for=0` is a silent one), else the job stops
there, so a fault after it is refused. The old single form, `--fault hang|mismatch|none
--fault-at S --fault-rank R`, still works. The generator polls `GET /api/v1/jobs/{job}/findings`
until each fault's finding appears, and at the end matches every finding episode to the fault
that explains it (its own finding, or one at its collective or naming its rank after it); the
others are `false_findings`.

Reports delivered entries/s, per-request and delivery latency percentiles, the delivery lag behind
the snapshot time, wire bytes per rank-second, each fault -> finding, false findings, server CPU
and RSS, the generator's own CPU, PostgreSQL backends' CPU and memory (PSS from /proc), the
database's size at the start and end (MiB per hour, extrapolated), machine CPU; and all of these
per `--window-s` window, to show how they move over the run. Traffic goes to 127.0.0.1 only.

    # spawn the servers on a fresh database (dropped afterwards) and run 60 s:
    python -m bench.loadgen --spawn postgresql --servers 1 --ranks 1024 --hosts 128 --duration 60
    # against running servers:
    python -m bench.loadgen --url http://127.0.0.1:8470 --token fdk_... --server-pid 1234 ...
    # issue #25's job: a silent mismatch at 60 s, a hang for good at 120 s, figures every 30 s:
    python -m bench.loadgen --spawn postgresql --ranks 16384 --hosts 2048 --groups 4
        --duration 150 --fault mismatch@60:rank=9000:for=0 --fault hang@120:rank=5 --window-s 30
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import dataclasses
import gzip
import json
import os
import random
import resource
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere
from flightdeck import __version__
from flightdeck.analysis.findings import MISMATCH_KINDS
from flightdeck.collector.daemon import GROUPS_RESEND_S
from flightdeck.records import WIRE_VERSION, GroupInfo
from flightdeck.wire import BATCH_AGE_HEADER, encode_group

NS = 1_000_000_000
PG_ADMIN = os.environ.get("FLIGHTDECK_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/test")
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


# --- the simulated job ------------------------------------------------------------------------------


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


# --- measurement --------------------------------------------------------------------------------


@dataclass(slots=True)
class Stats:
    """What the senders observed."""

    start: float
    #: Every delivered batch: (seconds since start, request s, first try -> ok s, snapshot time
    #: -> delivered s, entries, bytes).
    delivered: list[tuple[float, float, float, float, int, int]] = field(default_factory=list)
    entries: int = 0
    batches: int = 0
    bytes_sent: int = 0
    #: Seconds since start of each 429 and 503 answer.
    throttled: list[float] = field(default_factory=list)
    unavailable: list[float] = field(default_factory=list)
    errors: int = 0
    late_ticks: int = 0
    #: Fault index -> (seconds from the fault until the poller saw its finding, the finding's kind).
    found: dict[int, tuple[float, str]] = field(default_factory=dict)
    #: Every finding episode of the job at the end (the findings API's objects).
    findings: list[dict[str, Any]] = field(default_factory=list)
    #: One per `--window-s` boundary (and the start and the end), from `sample`.
    samples: list[Sample] = field(default_factory=list)


@dataclass(slots=True)
class Sample:
    """Resources at one moment of the run."""

    t: float  # seconds since start
    server_cpu_s: list[float]
    #: The servers' highest RSS since the sample before (sampled every second) and now.
    server_rss_peak: list[int]
    server_rss: list[int]
    generator_cpu_s: float
    #: The database's backends: CPU seconds, memory (bytes; `pg_backends`), how many.
    pg_cpu_s: float = 0.0
    pg_mem: int = 0
    pg_backends: int = 0
    db_bytes: int = 0
    machine: tuple[float, float] = (0.0, 0.0)


def pct(values: list[float], p: float) -> float:
    """The p-th percentile (nearest rank) of `values`, 0 when empty."""
    if not values:
        return 0.0
    s = sorted(values)
    return s[min(len(s) - 1, int(p / 100 * len(s)))]


def proc_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process (and its waited-for children) from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return sum(int(x) for x in fields[11:15]) / tick


def proc_rss_bytes(pid: int) -> int:
    """Resident memory of a process from /proc."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def proc_pss_bytes(pid: int) -> int | None:
    """Proportional set size of a process (its shared pages, PostgreSQL's shared buffers among
    them, divided among the processes that map them) from /proc; None where it may not be read."""
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) * 1024
    return None


def machine_busy() -> tuple[float, float]:
    """(busy, total) jiffies of the whole machine since boot."""
    parts = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = parts[3] + parts[4]
    return float(sum(parts) - idle), float(sum(parts))


def _backend_pids(conn: Any) -> list[int]:
    return [
        int(r[0])
        for r in conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
        ).fetchall()
    ]


def pg_backend_cpu_s(url: str) -> float:
    """CPU seconds so far of the PostgreSQL backends connected to the database at `url` (the
    servers' pooled connections live for the whole run), read from /proc: PostgreSQL runs here."""
    if not url.startswith("postgresql"):
        return 0.0
    import psycopg

    with psycopg.connect(url.replace("+psycopg", "").split("?")[0]) as conn:
        pids = _backend_pids(conn)
    total = 0.0
    for pid in pids:
        with contextlib.suppress(OSError):  # ended meanwhile
            total += proc_cpu_s(pid)
    return total


#: What `pg_backends` sums as the backends' memory: "pss" where /proc lets it be read, else "rss".
PG_MEM_SOURCE = ["pss"]


def pg_backends(url: str) -> tuple[float, int, int, int]:
    """(CPU seconds, memory bytes, backends, database bytes) of the PostgreSQL backends connected
    to the database at `url`, from /proc. Memory is the sum of their PSS (shared buffers counted
    once over the processes that map them, not once per backend as RSS would), or their RSS where
    PSS may not be read (`PG_MEM_SOURCE` says which)."""
    import psycopg

    with psycopg.connect(url.replace("+psycopg", "").split("?")[0]) as conn:
        pids = _backend_pids(conn)
        row = conn.execute("SELECT pg_database_size(current_database())").fetchone()
    cpu, mem = 0.0, 0
    for pid in pids:
        with contextlib.suppress(OSError):  # ended meanwhile
            cpu += proc_cpu_s(pid)
            pss = proc_pss_bytes(pid)
            if pss is None:
                PG_MEM_SOURCE[0] = "rss"
            mem += proc_rss_bytes(pid) if pss is None else pss
    return cpu, mem, len(pids), int(row[0]) if row else 0


def db_size(url: str) -> int:
    """Bytes of the database: PostgreSQL's pg_database_size, or the SQLite file and its WAL."""
    if url.startswith("sqlite"):
        path = Path(url.split("///", 1)[1])
        return sum(p.stat().st_size for p in (path, Path(f"{path}-wal")) if p.exists())
    import psycopg

    with psycopg.connect(url.replace("+psycopg", "").split("?")[0]) as conn:
        row = conn.execute("SELECT pg_database_size(current_database())").fetchone()
        return int(row[0]) if row else 0


def take_sample(t: float, pids: list[int], peak: dict[int, int], db_url: str) -> Sample:
    """The resources now (`peak`: the servers' highest RSS since the last sample, then reset)."""
    rss = [proc_rss_bytes(p) for p in pids]
    s = Sample(
        t=t,
        server_cpu_s=[proc_cpu_s(p) for p in pids],
        server_rss_peak=[max(peak.get(p, 0), m) for p, m in zip(pids, rss, strict=True)],
        server_rss=rss,
        generator_cpu_s=time.process_time(),
        machine=machine_busy(),
    )
    peak.clear()
    if db_url.startswith("postgresql"):
        s.pg_cpu_s, s.pg_mem, s.pg_backends, s.db_bytes = pg_backends(db_url)
    elif db_url:
        s.db_bytes = db_size(db_url)
    return s


async def sampler(pids: list[int], db_url: str, window_s: float, stats: Stats, stop: asyncio.Event) -> None:
    """Sample the servers' RSS every second and everything at each `window_s` boundary (the
    database in a thread: its query must not stall the senders)."""
    peak: dict[int, int] = {}
    k = 1
    while not stop.is_set():
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), 1.0)
        for p in pids:
            with contextlib.suppress(OSError):
                peak[p] = max(peak.get(p, 0), proc_rss_bytes(p))
        t = time.perf_counter() - stats.start
        if t >= k * window_s and not stop.is_set():
            k = int(t / window_s) + 1
            stats.samples.append(await asyncio.to_thread(take_sample, t, pids, dict(peak), db_url))
            peak.clear()


# --- findings against faults --------------------------------------------------------------------


def fault_seq(f: Fault, kinds: int) -> int:
    """The world group's collective_seq_id of the fault's collective."""
    return f.index // kinds + 1


def own_finding(f: Fault, finding: dict[str, Any], kinds: int) -> bool:
    """Whether `finding` (the findings API's object) is the one the fault should give: a hang
    naming the hung rank; a mismatch naming the odd rank or at the fault's collective."""
    d = finding["finding"]
    culprits = d.get("culprit_ranks") or []
    at = d.get("process_group") == "0" and d.get("collective_seq_id") == fault_seq(f, kinds)
    if f.kind == "hang":
        return finding["kind"] == "hang" and f.rank in culprits
    return finding["kind"] in MISMATCH_KINDS and (f.rank in culprits or at)


def explained_by(faults: list[Fault], finding: dict[str, Any], kinds: int) -> Fault | None:
    """The fault that explains `finding`, None for a false finding: its own finding, or one opened
    after it (1 s of clock slack) at its collective or naming its rank (a blocking mismatch also
    gives a hang in that collective; the hung rank may also show up slow)."""
    d = finding["finding"]
    opened = finding.get("opened_at_s") or 0.0
    for f in faults:
        if own_finding(f, finding, kinds):
            return f
    for f in faults:
        at = d.get("process_group") == "0" and d.get("collective_seq_id") == fault_seq(f, kinds)
        if opened >= f.at_ns / NS - 1.0 and (at or f.rank in (d.get("culprit_ranks") or [])):
            return f
    return None


def finding_brief(finding: dict[str, Any], t0_ns: int) -> dict[str, Any]:
    """A finding as the report lists it."""
    d = finding["finding"]
    culprits = d.get("culprit_ranks") or []
    return {
        "kind": finding["kind"],
        "opened_s": None
        if finding.get("opened_at_s") is None
        else round(finding["opened_at_s"] - t0_ns / NS, 1),
        "open": finding.get("open"),
        "group": d.get("process_group"),
        "seq": d.get("collective_seq_id"),
        "culprits": culprits[:8] + (["..."] if len(culprits) > 8 else []),
    }


def windows(stats: Stats, ranks: int, end_s: float, window_s: float) -> list[dict[str, Any]]:
    """The run window by window: delivered entries/s, request and delivery latency, delivery lag,
    wire bytes per rank-second and 429s by delivery time; resources from the samples."""
    out = []
    samples = sorted(stats.samples, key=lambda s: s.t)
    bounds = [s.t for s in samples]
    if not bounds or bounds[-1] < end_s - 0.5:
        bounds.append(end_s)
    by_window: list[list[tuple[float, float, float, float, int, int]]] = [[] for _ in bounds]
    for row in stats.delivered:
        by_window[min(bisect.bisect_right(bounds, row[0]), len(bounds) - 1)].append(row)
    lo = 0.0
    for w, hi in enumerate(bounds):
        if hi <= lo:
            continue
        rows, span = by_window[w], hi - lo
        req = [r[1] for r in rows]
        dly = [r[2] for r in rows]
        lag = [r[3] for r in rows]
        win: dict[str, Any] = {
            "t_s": round(hi, 1),
            "entries_per_s": round(sum(r[4] for r in rows) / span),
            "batches_per_s": round(len(rows) / span, 1),
            "request_ms": [round(pct(req, p) * 1000) for p in (50, 90, 99)],
            "delivery_ms": [round(pct(dly, p) * 1000) for p in (50, 99)],
            "lag_s": [round(pct(lag, p), 2) for p in (50, 99, 100)],
            "bytes_per_rank_per_s": round(sum(r[5] for r in rows) / span / ranks),
            "throttled_429": sum(lo <= t < hi for t in stats.throttled),
        }
        now = next((s for s in samples if s.t == hi), None)
        before = next((s for s in reversed(samples) if s.t <= lo), None)
        if now is not None and before is not None:
            win["server_cpu"] = [
                round((b - a) / span, 2) for a, b in zip(before.server_cpu_s, now.server_cpu_s, strict=True)
            ]
            win["server_rss_mib"] = [round(m / 2**20) for m in now.server_rss_peak]
            win["generator_cpu"] = round((now.generator_cpu_s - before.generator_cpu_s) / span, 2)
            if now.pg_backends:
                win["postgres_cpu"] = round((now.pg_cpu_s - before.pg_cpu_s) / span, 2)
                win["postgres_mem_mib"] = round(now.pg_mem / 2**20)
            if now.db_bytes:
                win["db_mib"] = round(now.db_bytes / 2**20, 1)
        out.append(win)
        lo = hi
    return out


# --- the run ------------------------------------------------------------------------------------


class Connection:
    """One keep-alive HTTP/1.1 connection, written and parsed by hand.

    A host sends one request at a time, so each sender keeps its own connection. httpx costs
    ~2 ms of CPU per request, which at thousands of simulated ranks made the generator, sharing
    the machine with the server, the bottleneck of the measurement; the bytes on the wire are
    the same (the server cannot tell).
    """

    def __init__(self, url: str) -> None:
        rest = url.split("://", 1)[1]
        host, _, port = rest.partition(":")
        self.host, self.port = host, int(port or 80)
        self._rw: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    async def post(
        self, path: str, headers: dict[str, str], body: bytes
    ) -> tuple[int, dict[str, str], bytes]:
        """POST `body`; returns (status, lower-cased headers, body). Raises OSError on failure."""
        if self._rw is None:
            self._rw = await asyncio.open_connection(self.host, self.port)
        reader, writer = self._rw
        head = f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\nContent-Length: {len(body)}\r\n"
        head += "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        try:
            writer.write(head.encode() + b"\r\n" + body)
            await writer.drain()
            status_line = await reader.readuntil(b"\r\n")
            raw = await reader.readuntil(b"\r\n\r\n")
            got = {}
            for line in raw.decode("latin-1").split("\r\n"):
                k, sep, v = line.partition(":")
                if sep:
                    got[k.strip().lower()] = v.strip()
            data = await reader.readexactly(int(got.get("content-length", "0")))
            if got.get("connection", "").lower() == "close":
                self.close()
            return int(status_line.split()[1]), got, data
        except (OSError, asyncio.IncompleteReadError, ValueError, IndexError) as exc:
            self.close()
            raise OSError(f"request failed: {exc}") from exc

    def close(self) -> None:
        """Drop the connection (the next request opens a new one)."""
        if self._rw is not None:
            self._rw[1].close()
            self._rw = None


async def sender(
    url: str,
    token: str,
    queue: asyncio.Queue[tuple[str, bytes, int, int] | None],
    stats: Stats,
) -> None:
    """Deliver one host's batches in order, one at a time, retrying 429/503 like the pusher."""
    headers = {
        "Content-Type": "application/json",
        "Content-Encoding": "gzip",
        "Authorization": f"Bearer {token}",
    }
    conn = Connection(url)
    try:
        while True:
            item = await queue.get()
            if item is None:
                return
            batch_id, body, n, snap_ns = item
            first = time.perf_counter()
            while True:
                t = time.perf_counter()
                try:
                    # As the collector does: how long the batch has waited here, by this clock.
                    age = {BATCH_AGE_HEADER: f"{(time.time_ns() - snap_ns) / 1e6:.0f}"}
                    status, got, text = await conn.post(
                        "/api/v1/ingest", {**headers, "Idempotency-Key": batch_id, **age}, body
                    )
                except OSError:
                    stats.errors += 1
                    await asyncio.sleep(0.5)
                    continue
                now = time.perf_counter()
                if status in (429, 503):
                    (stats.throttled if status == 429 else stats.unavailable).append(now - stats.start)
                    retry = float(got.get("retry-after", "1"))
                    await asyncio.sleep(retry * (0.5 + random.random()))
                    continue
                if status != 200:
                    stats.errors += 1
                    print(f"batch {batch_id}: HTTP {status} {text[:200]!r}", file=sys.stderr)
                    break
                lag = (time.time_ns() - snap_ns) / NS
                stats.delivered.append((now - stats.start, now - t, now - first, lag, n, len(body)))
                stats.entries += n
                stats.batches += 1
                stats.bytes_sent += len(body)
                break
    finally:
        conn.close()


async def poll_findings(
    client: httpx.AsyncClient, url: str, job: str, sim: Sim, stats: Stats, stop: asyncio.Event
) -> None:
    """Poll the findings API from the first fault on; record when each fault's finding appears."""
    if not sim.faults:
        return
    await asyncio.sleep(max(0.0, (sim.faults[0].at_ns - time.time_ns()) / NS))
    kinds = sim.topo.kinds
    while not stop.is_set() and len(stats.found) < len(sim.faults):
        try:
            r = await client.get(f"{url}/api/v1/jobs/{job}/findings", timeout=10)
            if r.status_code == 200:
                now = time.time_ns()
                for f in sim.faults:
                    if f.index in stats.found or now < f.at_ns:
                        continue
                    for x in r.json()["findings"]:
                        if own_finding(f, x, kinds) and (x.get("opened_at_s") or 0) >= f.at_ns / NS - 1:
                            stats.found[f.index] = ((now - f.at_ns) / NS, x["kind"])
                            break
        except httpx.HTTPError:
            pass
        await asyncio.sleep(0.2)


async def scrape(client: httpx.AsyncClient, url: str) -> dict[str, float]:
    """The server's unlabelled samples from /metrics (empty if it does not answer)."""
    try:
        text = (await client.get(f"{url}/metrics", timeout=30)).text
    except httpx.HTTPError:
        return {}
    out = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name.startswith("flightdeck_") and "{" not in name:
            with contextlib.suppress(ValueError):
                out[name] = float(value)
    return out


async def drive(
    args: argparse.Namespace, urls: list[str], token: str, pids: list[int], db_url: str = ""
) -> dict[str, Any]:
    """Run the simulated job against `urls` for `args.duration` seconds; returns the figures."""
    topo = Topology(args.ranks, args.hosts, args.groups)
    topo.build()
    rng = random.Random(7)
    t0 = time.time_ns()
    faults = plan_faults(
        [dataclasses.replace(f) for f in args.faults], t0, args.rate, args.groups, args.ranks
    )
    sim = Sim(
        job=args.job or f"loadgen-{uuid.uuid4().hex[:6]}",
        topo=topo,
        rate=args.rate,
        interval_s=args.interval,
        t0_ns=t0,
        groups_resend_s=args.groups_resend_s,
        faults=faults,
        ranks=[RankSim(r, rng.randrange(0, JITTER_NS)) for r in range(args.ranks)],
    )
    stats = Stats(start=time.perf_counter())
    limits = httpx.Limits(max_connections=8, max_keepalive_connections=8)  # findings and metrics only
    stats.samples.append(await asyncio.to_thread(take_sample, 0.0, pids, {}, db_url))
    stop = asyncio.Event()
    async with httpx.AsyncClient(limits=limits, timeout=60) as client:
        queues: list[asyncio.Queue[tuple[str, bytes, int, int] | None]] = [
            asyncio.Queue() for _ in range(args.hosts)
        ]
        senders = [
            asyncio.create_task(sender(urls[h % len(urls)], token, queues[h], stats))
            for h in range(args.hosts)
        ]
        poller = asyncio.create_task(poll_findings(client, urls[0], sim.job, sim, stats, stop))
        sampling = asyncio.create_task(sampler(pids, db_url, args.window_s, stats, stop))
        # Hosts snapshot at their own phase within the interval, like independent collectors.
        phase = [args.interval * h / args.hosts for h in range(args.hosts)]
        end = time.monotonic() + args.duration
        start = time.monotonic()
        k = 0
        backlog_max = 0
        while time.monotonic() < end:
            for h in range(args.hosts):
                due = start + k * args.interval + phase[h]
                delay = due - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                elif delay < -args.interval / 2:
                    stats.late_ticks += 1
                if time.monotonic() >= end:
                    break
                now_ns = time.time_ns()
                batch_id, body, n = sim.host_batch(h, now_ns)
                queues[h].put_nowait((batch_id, body, n, now_ns))
                backlog_max = max(backlog_max, queues[h].qsize())
            k += 1
        gen_wall = time.perf_counter() - stats.start
        for q in queues:
            q.put_nowait(None)
        await asyncio.wait(senders, timeout=args.drain_s)
        drained = all(t.done() for t in senders)
        for t in senders:
            t.cancel()
        if not poller.done() and sim.faults:
            await asyncio.wait([poller], timeout=args.stall_after + 10)
        stop.set()
        poller.cancel()
        await sampling
        try:
            doc = (await client.get(f"{urls[0]}/api/v1/jobs/{sim.job}/findings", timeout=30)).json()
            stats.findings = list(doc["findings"])
        except (httpx.HTTPError, ValueError, KeyError):
            pass
        server_stats = [await scrape(client, u) for u in urls]
    wall = time.perf_counter() - stats.start
    last = await asyncio.to_thread(take_sample, wall, pids, {}, db_url)
    stats.samples.append(last)
    first = stats.samples[0]
    cpu = [(b - a) / wall for a, b in zip(first.server_cpu_s, last.server_cpu_s, strict=True)]
    rss_peak = [max(s.server_rss_peak[i] for s in stats.samples) for i in range(len(pids))]
    request_s = [(r[0], r[1]) for r in stats.delivered]
    half = gen_wall / 2
    early = [s for t, s in request_s if t < half]
    late = [s for t, s in request_s if half <= t <= gen_wall]
    offered = args.ranks * args.rate
    # Steady state: from 10 s in to the first fault that stops the simulated job (for a while or
    # for good; a mismatch held 0 s does not); None when that comes before 11 s.
    stops = [(f.at_ns - t0) / NS for f in faults if f.hold_s != 0.0]
    t_end = min([gen_wall, *stops])
    steady = None
    if t_end >= 11.0:
        steady = round(sum(r[4] for r in stats.delivered if 10.0 <= r[0] < t_end) / (t_end - 10.0))
    by_fault: dict[int, list[str]] = {f.index: [] for f in faults}
    false: list[dict[str, Any]] = []
    for x in stats.findings:
        f = explained_by(faults, x, args.groups)
        if f is None:
            false.append(finding_brief(x, t0))
        else:
            by_fault[f.index].append(x["kind"])
    kinds: dict[str, int] = {}
    for x in stats.findings:
        kinds[x["kind"]] = kinds.get(x["kind"], 0) + 1
    fault_rows = []
    for f in faults:
        found = stats.found.get(f.index)
        after_stall = None
        if found is not None:
            after_stall = round(found[0] - (args.stall_after if f.kind == "hang" else 0.0), 2)
        fault_rows.append(
            {
                "fault": f.label(),
                "at_s": round((f.at_ns - t0) / NS, 1),
                "group": "0",
                "seq": fault_seq(f, args.groups),
                "to_finding_s": None if found is None else round(found[0], 2),
                "finding_after_stall_s": after_stall,
                "finding_kind": "" if found is None else found[1],
                "explains": by_fault[f.index],
            }
        )
    db_growth = last.db_bytes - first.db_bytes
    return {
        "job": sim.job,
        "ranks": args.ranks,
        "hosts": args.hosts,
        "groups": args.groups,
        "servers": len(urls),
        "interval_s": args.interval,
        "rate_per_rank": args.rate,
        "duration_s": args.duration,
        "groups_resend_s": args.groups_resend_s,
        "wall_s": round(wall, 1),
        "offered_collectives_per_s": offered,
        "entries_per_s": round(stats.entries / wall),
        "steady_entries_per_s": steady,
        "batches_per_s": round(stats.batches / wall, 1),
        "entries": stats.entries,
        "kib_per_batch": round(stats.bytes_sent / max(1, stats.batches) / 1024, 1),
        "bytes_per_rank_per_s": round(stats.bytes_sent / wall / args.ranks),
        "request_ms": {p: round(pct([s for _, s in request_s], p) * 1000) for p in (50, 90, 99)},
        "request_ms_early_late_p50": [round(pct(early, 50) * 1000), round(pct(late, 50) * 1000)],
        "request_ms_early_late_p99": [round(pct(early, 99) * 1000), round(pct(late, 99) * 1000)],
        "delivery_ms": {p: round(pct([r[2] for r in stats.delivered], p) * 1000) for p in (50, 99)},
        "lag_s": {p: round(pct([r[3] for r in stats.delivered], p), 2) for p in (50, 99, 100)},
        "backlog_max_batches_per_host": backlog_max,
        "drained": drained,
        "throttled_429": len(stats.throttled),
        "unavailable_503": len(stats.unavailable),
        "errors": stats.errors,
        "late_ticks": stats.late_ticks,
        "faults": fault_rows,
        "findings": kinds,
        "false_findings": len(false),
        "false_finding_list": false[:20],
        "server_cpu": [round(c, 2) for c in cpu],
        "server_rss_mib": [round(r / 2**20) for r in rss_peak],
        "server_rss_mib_start_end": [
            [round(a / 2**20), round(b / 2**20)]
            for a, b in zip(first.server_rss, last.server_rss, strict=True)
        ],
        "generator_cpu": round((last.generator_cpu_s - first.generator_cpu_s) / wall, 2),
        "generator_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        # Per server: diagnoses run, the share of a core they took, batches per ingest transaction.
        "diagnoses": [m.get("flightdeck_diagnosis_duration_seconds_count", 0) for m in server_stats],
        "diagnosis_core_share": [
            round(m.get("flightdeck_diagnosis_duration_seconds_sum", 0) / wall, 3) for m in server_stats
        ],
        "batches_per_transaction": [
            round(
                m.get("flightdeck_ingest_group_size_batches_sum", 0)
                / max(1, m.get("flightdeck_ingest_group_size_batches_count", 0)),
                1,
            )
            for m in server_stats
        ],
        "machine_busy": round(
            (last.machine[0] - first.machine[0]) / max(1.0, last.machine[1] - first.machine[1]), 2
        ),
        **(
            {
                "postgres_cpu": round((last.pg_cpu_s - first.pg_cpu_s) / wall, 2),
                "postgres_mem_mib_start_end": [round(first.pg_mem / 2**20), round(last.pg_mem / 2**20)],
                "postgres_mem_source": PG_MEM_SOURCE[0],
                "postgres_backends": last.pg_backends,
            }
            if db_url.startswith("postgresql")
            else {}
        ),
        **(
            {
                "db_mib": round(last.db_bytes / 2**20, 1),
                "db_mib_start_end": [round(first.db_bytes / 2**20, 1), round(last.db_bytes / 2**20, 1)],
                "db_mib_per_hour": round(db_growth / 2**20 / wall * 3600),
            }
            if db_url
            else {}
        ),
        "window_s": args.window_s,
        "windows": windows(stats, args.ranks, wall, args.window_s),
    }


# --- spawned servers ----------------------------------------------------------------------------


@contextmanager
def spawned(args: argparse.Namespace) -> Iterator[tuple[list[str], str, list[int], str]]:
    """Fresh database + token + `args.servers` server processes; yields (urls, token, pids, db url)."""
    from bench.server_ingest import make_token, scratch_pg_database, start_server

    env = {
        "FLIGHTDECK_SERVER_STALL_AFTER_S": str(args.stall_after),
    }
    if args.inflight is not None:
        env["FLIGHTDECK_SERVER_MAX_INFLIGHT_INGESTS"] = str(args.inflight)
    if args.servers > 1:
        env["FLIGHTDECK_SERVER_CLUSTER"] = "true"
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as scratch:
        if args.spawn == "sqlite":
            url = f"sqlite:///{tmp}/loadgen.db"
        else:
            url = scratch.enter_context(scratch_pg_database("flightdeck_scale"))
        servers = []
        try:
            token = make_token(url)
            for _ in range(args.servers):
                servers.append(start_server(url, env))
            yield [s.url for s in servers], token, [s.pid for s in servers], url
        finally:
            for server in servers:
                server.stop()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line."""
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--spawn", choices=["sqlite", "postgresql"], help="start servers on a fresh database")
    ap.add_argument("--servers", type=int, default=1, help="server processes to spawn (--spawn)")
    ap.add_argument("--url", action="append", default=[], help="server base URL (repeat: round-robin)")
    ap.add_argument("--token", default=os.environ.get("FLIGHTDECK_TOKEN", ""), help="collector token")
    ap.add_argument("--server-pid", type=int, action="append", default=[], help="measure this pid")
    ap.add_argument("--database-url", default="", help="for the database size and backends (with --url)")
    ap.add_argument("--job", default="", help="job name (default: a fresh one)")
    ap.add_argument("--ranks", type=int, default=256)
    ap.add_argument("--hosts", type=int, default=32)
    ap.add_argument("--groups", type=int, default=3, help="kinds of process groups (>= 1)")
    ap.add_argument("--rate", type=float, default=10.0, help="collectives per second per rank")
    ap.add_argument("--interval", type=float, default=2.0, help="snapshot interval (s)")
    ap.add_argument("--duration", type=float, default=60.0, help="seconds of traffic")
    ap.add_argument("--drain-s", type=float, default=60.0, help="wait this long for queued batches")
    ap.add_argument("--window-s", type=float, default=30.0, help="report figures per window this long")
    ap.add_argument(
        "--fault",
        action="append",
        default=[],
        metavar="FAULT",
        help="KIND@SECONDS[:rank=R][:for=S], repeat for several (KIND: hang or mismatch; rank 5 "
        "unless given; for=S: the fault's collective completes S s later and the job goes on, "
        "default for ever); or hang, mismatch or none with --fault-at and --fault-rank "
        "(default: hang at 2/3 of the duration)",
    )
    ap.add_argument("--fault-at", type=float, default=None, help="seconds in (default: 2/3 of duration)")
    ap.add_argument("--fault-rank", type=int, default=5)
    ap.add_argument(
        "--stall-after", type=float, default=5.0, help="the servers' FLIGHTDECK_SERVER_STALL_AFTER_S"
    )
    ap.add_argument(
        "--inflight", type=int, help="FLIGHTDECK_SERVER_MAX_INFLIGHT_INGESTS (--spawn; default: the server's)"
    )
    ap.add_argument(
        "--groups-resend-s",
        type=float,
        default=GROUPS_RESEND_S,
        help="ship a rank's groups when new and again after this long, as the collector does "
        "(0: in every snapshot, as collectors before this change did)",
    )
    args = ap.parse_args(argv)
    if args.ranks % args.hosts:
        ap.error("--ranks must be a multiple of --hosts")
    if args.fault_at is None:
        args.fault_at = args.duration * 2 / 3
    faults: list[Fault] = []
    old = [x for x in args.fault if "@" not in x] or ([] if args.fault else ["hang"])
    if len(old) > 1 or (old and len(args.fault) > 1):
        ap.error("give one --fault KIND (with --fault-at, --fault-rank), or KIND@SECONDS forms")
    for x in old:
        if x not in (*FAULT_KINDS, "none"):
            ap.error(f"--fault {x!r}: expected hang, mismatch, none or KIND@SECONDS[:rank=R][:for=S]")
        if x != "none":
            faults.append(Fault(x, args.fault_at, args.fault_rank))
    for x in args.fault:
        if "@" in x:
            try:
                faults.append(parse_fault(x))
            except ValueError as exc:
                ap.error(f"--fault: {exc}")
    try:
        plan_faults([dataclasses.replace(f) for f in faults], 0, args.rate, args.groups, args.ranks)
    except ValueError as exc:
        ap.error(f"--fault: {exc}")
    args.faults = faults
    if args.window_s <= 0:
        ap.error("--window-s must be positive")
    if not args.spawn and not args.url:
        ap.error("give --spawn or --url")
    for u in args.url:
        if not u.startswith(("http://127.0.0.1", "http://localhost")):
            ap.error("the load generator only talks to 127.0.0.1")
    return args


def main(argv: list[str] | None = None) -> None:
    """Run once and print the figures as JSON."""
    args = parse_args(argv)
    if args.spawn:
        with spawned(args) as (urls, token, pids, url):
            out = asyncio.run(drive(args, urls, token, pids, url))
            out["db"] = args.spawn
    else:
        out = asyncio.run(drive(args, args.url, args.token, args.server_pid, args.database_url))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
