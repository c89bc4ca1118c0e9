"""Ingest throughput of a real `flightdeck server` under different allocators, in alternation.

With `PYTHONMALLOC=malloc` every object of the server comes from the C library's malloc (glibc's,
or jemalloc's preloaded in its place: `--allocators jemalloc`), which hands an ended job's memory
back (docs/performance.md, "Server memory"); this measures what that costs against CPython's own
allocator (pymalloc). Each round posts the same synthetic job (bench/server_ingest.py) into a
fresh database and server under each allocator, the order rotated every round, so that the load
of a shared machine falls on all alike. Printed
per run and as medians: entries/s while posting, the server's CPU per entry while posting and
until it is at rest again (folding the job into its live summaries, the first diagnosis).

    python -m bench.server_allocator --db postgresql --rounds 3 --ranks 256
    python -m bench.server_allocator --allocators pymalloc jemalloc --malloc-conf background_thread:true
"""

from __future__ import annotations

import argparse
import signal
import statistics
import sys
import tempfile
from pathlib import Path

from bench.server_ingest import allocator_env, run, scratch_pg_database

ALLOCATORS = ("pymalloc", "malloc", "jemalloc", "mimalloc")


def load() -> str:
    """The machine's load averages (1, 5, 15 min)."""
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def server_env(allocator: str, malloc_conf: str | None) -> dict[str, str]:
    """The server's environment for `allocator` (`malloc_conf`: jemalloc's MALLOC_CONF)."""
    env = allocator_env(allocator)
    if allocator == "jemalloc" and malloc_conf:
        env["MALLOC_CONF"] = malloc_conf
    return env


def one(kind: str, allocator: str, args: argparse.Namespace) -> dict[str, float]:
    """One run of the ingest bench on a fresh `kind` database, the server under `allocator`."""
    env = server_env(allocator, args.malloc_conf)
    if kind == "sqlite":
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "bench.db"
            return run(f"sqlite:///{path}", path, args, env)
    with scratch_pg_database() as url:
        return run(url, None, args, env)


def main(argv: list[str] | None = None) -> None:
    """Run the rounds, print each run and the medians per allocator."""
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--db", choices=["sqlite", "postgresql"], default="postgresql")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--ranks", type=int, default=256)
    ap.add_argument("--entries", type=int, default=2000)
    ap.add_argument("--ranks-per-batch", type=int, default=4)
    ap.add_argument("--concurrency", type=int, default=2)
    ap.add_argument("--allocators", nargs="+", choices=ALLOCATORS, default=list(ALLOCATORS))
    ap.add_argument("--malloc-conf", help="MALLOC_CONF of the jemalloc runs (e.g. background_thread:true)")
    args = ap.parse_args(argv)
    # Stopped (`timeout`, a kill): its server stopped and its scratch database dropped all the same.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    args.shape, args.window = "ring", args.entries
    names = list(dict.fromkeys(args.allocators))
    got: dict[str, list[dict[str, float]]] = {a: [] for a in names}
    for i in range(args.rounds):
        # Each allocator first in turn (with two: swapped every round).
        for allocator in names[i % len(names) :] + names[: i % len(names)]:
            print(
                f"round {i + 1}, {allocator} {server_env(allocator, args.malloc_conf)} (load {load()})",
                flush=True,
            )
            got[allocator].append(one(args.db, allocator, args))
    print(
        f"{args.db}, {args.ranks} ranks x {args.entries} entries, medians of {args.rounds} (load {load()}):"
    )
    for allocator, runs in got.items():
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        print(
            f"  {allocator:>8}: {med['entries_per_s']:,.0f} entries/s"
            f" (runs {', '.join(format(r['entries_per_s'], ',.0f') for r in runs)}),"
            f" server CPU {med['cpu_us_per_entry']:.1f} µs/entry posting"
            f" (runs {', '.join(format(r['cpu_us_per_entry'], '.1f') for r in runs)}),"
            f" {med['cpu_us_per_entry_at_rest']:.1f} µs/entry until at rest",
            flush=True,
        )


if __name__ == "__main__":
    main()
