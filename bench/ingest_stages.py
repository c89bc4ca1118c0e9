"""CPU per entry of each ingest stage, in process, on one large job's batches.

The batches are `bench/loadgen/`'s (N ranks on H hosts, 10 collectives/s over 3 kinds of
groups, one gzip batch per host every 2 s carrying new and changed entries). Each stage runs on
all of them in turn, timed by this thread's CPU clock: gunzip, JSON parse and `decode_batch`
(the garbage collector paused, as the server's `GcPause` has it), `decode_checked` (the same
decode plus the server's validation of every value, which is what ingest runs),
`store.ingest_batches` on a fresh PostgreSQL database (groups of `--group` batches, one
transaction each, as group commit makes them under load), and the fold into the live
summaries. One warm-up round goes first (ids, caches). The server process does the same work
under contention with its other threads, which `bench/loadgen/` measures.

    python bench/ingest_stages.py --ranks 4096 --hosts 512 --rounds 3 [--requeue] [--label L]

`--requeue` then sends every measured batch again (new ids), older than what is stored: the
store keeps the newer states, and measures what that costs.
"""

from __future__ import annotations

import argparse
import gzip
import random
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere
from bench.loadgen.job import NS, RankSim, Sim, Topology
from bench.loadgen.resources import pg_backend_cpu_s
from bench.server_ingest import scratch_pg_database
from flightdeck.analysis import RankSummary
from flightdeck.analysis.merge import fold_entries
from flightdeck.runtime_tuning import GC_PAUSE
from flightdeck.server import store
from flightdeck.server.db import connect, migrate
from flightdeck.server.validation import decode_checked
from flightdeck.wire import Batch, decode_batch


def cpu_of(fn: Callable[[], Any]) -> tuple[float, Any]:
    """(CPU seconds of this thread, result) of `fn()`."""
    started = time.thread_time()
    out = fn()
    return time.thread_time() - started, out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--ranks", type=int, default=4096)
    ap.add_argument("--hosts", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=3, help="2 s snapshot rounds measured")
    ap.add_argument("--group", type=int, default=30, help="batches per transaction")
    ap.add_argument(
        "--requeue",
        action="store_true",
        help="then send every measured batch again, under new ids, after the newer ones: what a "
        "collector's --requeue-dead-letters does (the store keeps the newer states)",
    )
    ap.add_argument("--label", default="", help="printed with the figures (e.g. before / after)")
    args = ap.parse_args(argv)

    topo = Topology(args.ranks, args.hosts, 3)
    topo.build()
    t0 = time.time_ns() - 60 * NS
    rng = random.Random(1)
    sim = Sim("bench-stages", topo, 10.0, 2.0, t0, 60.0)
    sim.ranks = [RankSim(r, rng.randrange(2_000_000)) for r in range(args.ranks)]
    rounds = [
        [sim.host_batch(h, t0 + (k + 1) * 2 * NS)[1] for h in range(args.hosts)]
        for k in range(args.rounds + 1)
    ]
    warm = [decode_batch(orjson.loads(gzip.decompress(b))) for b in rounds[0]]
    bodies = [b for r in rounds[1:] for b in r]

    cpu: dict[str, float] = {}
    cpu["gunzip"], raws = cpu_of(lambda: [gzip.decompress(b) for b in bodies])
    with GC_PAUSE:  # as the server decodes: the GC off
        cpu["JSON parse"], docs = cpu_of(lambda: [orjson.loads(r) for r in raws])
        cpu["decode_batch"], batches = cpu_of(lambda: [decode_batch(d) for d in docs])
        # What the server runs: the same decode plus the checks against the store (validation.py).
        cpu["decode_checked (decode + validation)"], _ = cpu_of(lambda: [decode_checked(d) for d in docs])
    n = sum(b.entry_count for b in batches)

    with scratch_pg_database("flightdeck_stages") as url:
        db = connect(url)
        pg_cpu: dict[str, float] = {}
        try:
            migrate(db)
            cache = store.IngestCache()

            def write(bs: list[Batch]) -> None:
                for i in range(0, len(bs), args.group):
                    with db.write() as session, session.begin():
                        _, learned = store.ingest_batches(
                            session=session,
                            batches=[(b, None) for b in bs[i : i + args.group]],
                            now_ns=time.time_ns(),
                            cache=cache,
                        )
                    cache.learn(learned)

            write(warm)
            # PostgreSQL's own CPU (its backends, from /proc): steadier than the wall clock on a
            # shared machine, where the write's wall time mostly measures the other processes.
            pg0 = pg_backend_cpu_s(url)
            wall = time.perf_counter()
            cpu["store.ingest_batches (this process)"], _ = cpu_of(lambda: write(batches))
            wall = time.perf_counter() - wall
            pg_cpu["write"] = pg_backend_cpu_s(url) - pg0
            requeue_wall = None
            if args.requeue:
                stale = [replace(b, batch_id=uuid.uuid4().hex) for b in batches]
                pg0 = pg_backend_cpu_s(url)
                requeue_wall = time.perf_counter()
                cpu["store.ingest_batches, requeued (process)"], _ = cpu_of(lambda: write(stale))
                requeue_wall = time.perf_counter() - requeue_wall
                pg_cpu["requeued write"] = pg_backend_cpu_s(url) - pg0
        finally:
            db.dispose()

    summaries: dict[int, RankSummary] = {}

    def fold(bs: list[Batch]) -> None:
        for b in bs:
            for s in b.snapshots:
                rs = summaries.get(s.rank)
                if rs is None:
                    rs = summaries[s.rank] = RankSummary(rank=s.rank, source="bench", groups=dict(s.groups))
                fold_entries(rs, s)  # as the server folds them

    fold(warm)
    cpu["fold into the summaries"], _ = cpu_of(lambda: fold(batches))

    print(
        (f"[{args.label}] " if args.label else "")
        + f"{args.ranks} ranks / {args.hosts} hosts, {args.rounds} rounds: {n:,} entries in "
        f"{len(batches)} batches ({n / len(batches):.0f} entries each), {args.group} per transaction"
    )
    for stage, s in cpu.items():
        print(f"{stage:40s} {s / n * 1e6:6.2f} µs/entry")
    print(f"{'write, wall clock (database included)':40s} {wall / n * 1e6:6.2f} µs/entry")
    if requeue_wall is not None:
        print(f"{'requeued write, wall clock':40s} {requeue_wall / n * 1e6:6.2f} µs/entry")
    for what, s in pg_cpu.items():
        print(f"{'PostgreSQL CPU, ' + what:40s} {s / n * 1e6:6.2f} µs/entry")


if __name__ == "__main__":
    main()
