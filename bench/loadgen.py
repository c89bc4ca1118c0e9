"""Load generator: N simulated ranks on H simulated hosts push to real `flightdeck server` processes.

It speaks the collector's protocol: one batch per host and snapshot interval (the document
`flightdeck.wire.encode_batch` writes, built column by column: tests/test_loadgen.py), gzip,
`Authorization: Bearer`, `Idempotency-Key` = the batch id, `Flightdeck-Batch-Age-Ms` = how long
it waited to be sent), each rank's
snapshot carrying only its new or changed entries (what `flightdeck/readers/delta.py` ships: a collective
is shipped when it appears, and again when it completes if it was in flight at the snapshot), one
request in flight per host, retried on 429/503 after `Retry-After` like `collector/pusher.py`.

Each rank runs `--rate` collectives per second, round-robin over `--groups` kinds of process
groups (the world, per-host blocks, same-local-rank stripes, two-host blocks, ...). At `--fault-at`
seconds one rank stops (`--fault hang`: every other rank waits in the next world collective) or
enters that collective with other sizes (`--fault mismatch`); the generator polls
`GET /api/v1/jobs/{job}/findings` until the finding appears.

Reports delivered entries/s, per-request and delivery latency percentiles (early vs late half of
the run, to show growth), the delivery lag behind the snapshot time, fault -> finding, server CPU
and peak RSS (from /proc), machine CPU, and the database size. Traffic goes to 127.0.0.1 only.

    # spawn the servers on a fresh database (dropped afterwards) and run 60 s:
    python -m bench.loadgen --spawn postgresql --servers 1 --ranks 1024 --hosts 128 --duration 60
    # against running servers:
    python -m bench.loadgen --url http://127.0.0.1:8470 --token fdk_... --server-pid 1234 ...
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gzip
import json
import os
import random
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


# --- the simulated job ------------------------------------------------------------------------------


@dataclass(slots=True)
class Topology:
    """Ranks, hosts and the process groups of every rank (group names as torch numbers them)."""

    ranks: int
    hosts: int
    kinds: int
    #: rank -> kind -> (group name, desc, members)
    member: list[list[tuple[str, str, tuple[int, ...]]]] = field(default_factory=list)

    @property
    def per_host(self) -> int:
        """Ranks per host."""
        return self.ranks // self.hosts

    def build(self) -> None:
        """Lay out the groups: kind 0 the world, then blocks and stripes of ranks."""
        n, rph = self.ranks, self.per_host
        world = tuple(range(n))
        self.member = [[("0", "default_pg", world)] for _ in range(n)]
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
class Sim:
    """The job: every rank's state, the fault, and how to build a host's batch."""

    job: str
    topo: Topology
    rate: float
    interval_s: float
    t0_ns: int
    fault: str
    fault_rank: int
    fault_index: int | None
    #: Groups go again after this many seconds (the collector's GROUPS_RESEND_S); 0: every snapshot.
    groups_resend_s: float
    ranks: list[RankSim] = field(default_factory=list)

    def last_index(self, r: RankSim, now_ns: int) -> int:
        """The last collective index the rank has created by `now_ns` (fault included)."""
        n = int((now_ns - self.t0_ns - r.jitter_ns) * self.rate / NS)
        if self.fault_index is not None:
            stop = (
                self.fault_index - 1
                if r.rank == self.fault_rank and self.fault == "hang"
                else self.fault_index
            )
            n = min(n, stop)
        return n

    def snapshot_doc(self, r: RankSim, now_ns: int, host: str, sigs: SigTable) -> dict[str, Any]:
        """The rank's periodic snapshot at `now_ns`, only new and changed entries, as the wire
        dict `encode_batch` writes for it (tests/test_loadgen.py checks that it is).

        Built column by column from the collective indexes, without an `Entry` per collective:
        the generator shares the machine with the server it measures, and building entries and
        encoding them cost it ~10 us per entry (0.4 core at 4,096 ranks); this, with JSON and gzip,
        costs 2.6-4.
        """
        fi = self.fault_index
        base, rate = self.t0_ns + r.jitter_ns, self.rate  # collective i was created at base + i / rate
        done_by = now_ns - DURATION_NS  # created at or before: completed at `now_ns`
        # In-flight ones that completed since the last snapshot go again, then the new ones.
        idx = [i for i in r.in_flight if i != fi and base + int(i * NS / rate) <= done_by]
        for i in idx:
            del r.in_flight[i]
        last = self.last_index(r, now_ns)
        new = range(r.next_i, last + 1)
        r.next_i = max(r.next_i, last + 1)
        idx += new
        created = [base + int(i * NS / rate) for i in idx]
        done = [i != fi and c <= done_by for i, c in zip(idx, created, strict=True)]
        for i, d in zip(new, done[len(done) - len(new) :], strict=True):
            if not d:
                r.in_flight[i] = None
        kinds = self.topo.kinds
        member = self.topo.member[r.rank]
        bad = self.fault == "mismatch" and r.rank == self.fault_rank  # its stuck entry's sizes differ
        cols: dict[str, Any] = {
            "n": len(idx),
            "rid": idx,
            "g": [member[i % kinds][0] for i in idx],
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
            "td": [c + DURATION_NS if d else None for c, d in zip(created, done, strict=True)],
            "dur": [DURATION_NS / 1e6 if d else None for d in done],
            "to": [600_000] * len(idx),
        }
        cols |= {k: v for k, v in optional.items() if any(x is not None for x in v)}
        cols["sig"] = [sigs.ref(i % kinds % len(OPS), bad and i == fi) for i in idx]
        groups: dict[str, Any] = {}
        if not r.groups_sent_ns or now_ns - r.groups_sent_ns >= self.groups_resend_s * NS:
            groups = {n: encode_group(GroupInfo(n, d, tuple(m))) for n, d, m in member}
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
    request_s: list[tuple[float, float]] = field(default_factory=list)  # (t, seconds)
    delivery_s: list[tuple[float, float]] = field(default_factory=list)  # (t, first try -> ok)
    lag_s: list[float] = field(default_factory=list)  # snapshot time -> delivered
    entries: int = 0
    #: (seconds since start, entries) of every delivered batch.
    entry_log: list[tuple[float, int]] = field(default_factory=list)
    batches: int = 0
    bytes_sent: int = 0
    throttled: int = 0
    unavailable: int = 0
    errors: int = 0
    late_ticks: int = 0
    finding_s: float | None = None
    finding_kind: str = ""
    #: Finding episodes of the job at the end, by kind (one expected: the fault's).
    findings: dict[str, int] = field(default_factory=dict)


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


def machine_busy() -> tuple[float, float]:
    """(busy, total) jiffies of the whole machine since boot."""
    parts = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = parts[3] + parts[4]
    return float(sum(parts) - idle), float(sum(parts))


def pg_backend_cpu_s(url: str) -> float:
    """CPU seconds so far of the PostgreSQL backends connected to the database at `url` (the
    servers' pooled connections live for the whole run), read from /proc: PostgreSQL runs here."""
    if not url.startswith("postgresql"):
        return 0.0
    import psycopg

    with psycopg.connect(url.replace("+psycopg", "").split("?")[0]) as conn:
        pids = [
            int(r[0])
            for r in conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
            ).fetchall()
        ]
    total = 0.0
    for pid in pids:
        with contextlib.suppress(OSError):  # ended meanwhile
            total += proc_cpu_s(pid)
    return total


def db_size(url: str) -> int:
    """Bytes of the database: PostgreSQL's pg_database_size, or the SQLite file and its WAL."""
    if url.startswith("sqlite"):
        path = Path(url.split("///", 1)[1])
        return sum(p.stat().st_size for p in (path, Path(f"{path}-wal")) if p.exists())
    import psycopg

    with psycopg.connect(url.replace("+psycopg", "").split("?")[0]) as conn:
        row = conn.execute("SELECT pg_database_size(current_database())").fetchone()
        return int(row[0]) if row else 0


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
                    if status == 429:
                        stats.throttled += 1
                    else:
                        stats.unavailable += 1
                    retry = float(got.get("retry-after", "1"))
                    await asyncio.sleep(retry * (0.5 + random.random()))
                    continue
                if status != 200:
                    stats.errors += 1
                    print(f"batch {batch_id}: HTTP {status} {text[:200]!r}", file=sys.stderr)
                    break
                stats.request_s.append((now - stats.start, now - t))
                stats.delivery_s.append((now - stats.start, now - first))
                stats.lag_s.append((time.time_ns() - snap_ns) / NS)
                stats.entries += n
                stats.entry_log.append((now - stats.start, n))
                stats.batches += 1
                stats.bytes_sent += len(body)
                break
    finally:
        conn.close()


async def poll_findings(
    client: httpx.AsyncClient, url: str, job: str, sim: Sim, stats: Stats, stop: asyncio.Event
) -> None:
    """Poll the findings API from the fault on; record when the expected finding appears."""
    if sim.fault_index is None:
        return
    fault_ns = sim.t0_ns + int(sim.fault_index * NS / sim.rate)
    await asyncio.sleep(max(0.0, (fault_ns - time.time_ns()) / NS))
    kinds = {"hang"} if sim.fault == "hang" else set(MISMATCH_KINDS)
    while not stop.is_set():
        try:
            r = await client.get(f"{url}/api/v1/jobs/{job}/findings", timeout=10)
            if r.status_code == 200:
                for f in r.json()["findings"]:
                    culprits = f["finding"].get("culprit_ranks") or []
                    right = sim.fault == "mismatch" or sim.fault_rank in culprits
                    if f["kind"] in kinds and f["open"] and right:
                        stats.finding_s = (time.time_ns() - fault_ns) / NS
                        stats.finding_kind = f["kind"]
                        return
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


async def drive(args: argparse.Namespace, urls: list[str], token: str, pids: list[int]) -> dict[str, Any]:
    """Run the simulated job against `urls` for `args.duration` seconds; returns the figures."""
    topo = Topology(args.ranks, args.hosts, args.groups)
    topo.build()
    rng = random.Random(7)
    t0 = time.time_ns()
    fault_index = None
    if args.fault != "none":
        i = int(args.fault_at * args.rate)
        fault_index = i + (-i) % args.groups  # a world collective (kind 0)
    sim = Sim(
        job=args.job or f"loadgen-{uuid.uuid4().hex[:6]}",
        topo=topo,
        rate=args.rate,
        interval_s=args.interval,
        t0_ns=t0,
        fault=args.fault,
        fault_rank=args.fault_rank % args.ranks,
        fault_index=fault_index,
        groups_resend_s=args.groups_resend_s,
        ranks=[RankSim(r, rng.randrange(0, 2_000_000)) for r in range(args.ranks)],
    )
    stats = Stats(start=time.perf_counter())
    limits = httpx.Limits(max_connections=8, max_keepalive_connections=8)  # findings and metrics only
    cpu0 = {p: proc_cpu_s(p) for p in pids}
    busy0 = machine_busy()
    gen0 = time.process_time()
    rss_peak = dict.fromkeys(pids, 0)
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
        # Hosts snapshot at their own phase within the interval, like independent collectors.
        phase = [args.interval * h / args.hosts for h in range(args.hosts)]
        end = time.monotonic() + args.duration
        start = time.monotonic()
        k = 0
        backlog_max = 0
        next_rss = 0.0
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
                if time.monotonic() >= next_rss:
                    next_rss = time.monotonic() + 1.0
                    for p in pids:
                        rss_peak[p] = max(rss_peak[p], proc_rss_bytes(p))
            k += 1
        gen_wall = time.perf_counter() - stats.start
        for q in queues:
            q.put_nowait(None)
        await asyncio.wait(senders, timeout=args.drain_s)
        drained = all(t.done() for t in senders)
        for t in senders:
            t.cancel()
        if not poller.done() and sim.fault_index is not None:
            await asyncio.wait([poller], timeout=args.stall_after + 10)
        stop.set()
        poller.cancel()
        try:
            doc = (await client.get(f"{urls[0]}/api/v1/jobs/{sim.job}/findings", timeout=30)).json()
            for f in doc["findings"]:
                stats.findings[f["kind"]] = stats.findings.get(f["kind"], 0) + 1
        except (httpx.HTTPError, ValueError, KeyError):
            pass
        server_stats = [await scrape(client, u) for u in urls]
    wall = time.perf_counter() - stats.start
    busy1 = machine_busy()
    cpu = {p: (proc_cpu_s(p) - cpu0[p]) / wall for p in pids}
    for p in pids:
        rss_peak[p] = max(rss_peak[p], proc_rss_bytes(p))
    half = gen_wall / 2
    early = [s for t, s in stats.request_s if t < half]
    late = [s for t, s in stats.request_s if half <= t <= gen_wall]
    offered = args.ranks * args.rate
    # Steady state: from 10 s in to the fault (after it the simulated job stops making entries).
    t_end = args.fault_at if args.fault != "none" else gen_wall
    steady = sum(n for t, n in stats.entry_log if 10.0 <= t < t_end) / max(1e-9, t_end - 10.0)
    return {
        "job": sim.job,
        "ranks": args.ranks,
        "hosts": args.hosts,
        "servers": len(urls),
        "interval_s": args.interval,
        "rate_per_rank": args.rate,
        "duration_s": args.duration,
        "groups_resend_s": args.groups_resend_s,
        "wall_s": round(wall, 1),
        "offered_collectives_per_s": offered,
        "entries_per_s": round(stats.entries / wall),
        "steady_entries_per_s": round(steady),
        "batches_per_s": round(stats.batches / wall, 1),
        "entries": stats.entries,
        "kib_per_batch": round(stats.bytes_sent / max(1, stats.batches) / 1024, 1),
        "bytes_per_rank_per_s": round(stats.bytes_sent / wall / args.ranks),
        "request_ms": {p: round(pct([s for _, s in stats.request_s], p) * 1000) for p in (50, 90, 99)},
        "request_ms_early_late_p50": [round(pct(early, 50) * 1000), round(pct(late, 50) * 1000)],
        "request_ms_early_late_p99": [round(pct(early, 99) * 1000), round(pct(late, 99) * 1000)],
        "delivery_ms": {p: round(pct([s for _, s in stats.delivery_s], p) * 1000) for p in (50, 99)},
        "lag_s": {p: round(pct(stats.lag_s, p), 2) for p in (50, 99, 100)},
        "backlog_max_batches_per_host": backlog_max,
        "drained": drained,
        "throttled_429": stats.throttled,
        "unavailable_503": stats.unavailable,
        "errors": stats.errors,
        "late_ticks": stats.late_ticks,
        "fault": args.fault,
        "fault_to_finding_s": None if stats.finding_s is None else round(stats.finding_s, 2),
        "finding_after_stall_s": (
            None
            if stats.finding_s is None
            else round(stats.finding_s - (args.stall_after if args.fault == "hang" else 0.0), 2)
        ),
        "finding_kind": stats.finding_kind,
        "findings": stats.findings,
        "server_cpu": [round(c, 2) for c in cpu.values()],
        "server_rss_mib": [round(r / 2**20) for r in rss_peak.values()],
        "generator_cpu": round((time.process_time() - gen0) / wall, 2),
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
        "machine_busy": round((busy1[0] - busy0[0]) / max(1.0, busy1[1] - busy0[1]), 2),
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
    ap.add_argument("--database-url", default="", help="for the database size (with --url)")
    ap.add_argument("--job", default="", help="job name (default: a fresh one)")
    ap.add_argument("--ranks", type=int, default=256)
    ap.add_argument("--hosts", type=int, default=32)
    ap.add_argument("--groups", type=int, default=3, help="kinds of process groups (>= 1)")
    ap.add_argument("--rate", type=float, default=10.0, help="collectives per second per rank")
    ap.add_argument("--interval", type=float, default=2.0, help="snapshot interval (s)")
    ap.add_argument("--duration", type=float, default=60.0, help="seconds of traffic")
    ap.add_argument("--drain-s", type=float, default=60.0, help="wait this long for queued batches")
    ap.add_argument("--fault", choices=["none", "hang", "mismatch"], default="hang")
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
            pg0 = pg_backend_cpu_s(url)
            t0 = time.perf_counter()
            out = asyncio.run(drive(args, urls, token, pids))
            if args.spawn == "postgresql":
                out["postgres_cpu"] = round((pg_backend_cpu_s(url) - pg0) / (time.perf_counter() - t0), 2)
            out["db"] = args.spawn
            out["db_mib"] = round(db_size(url) / 2**20, 1)
    else:
        out = asyncio.run(drive(args, args.url, args.token, args.server_pid))
        if args.database_url:
            out["db_mib"] = round(db_size(args.database_url) / 2**20, 1)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
