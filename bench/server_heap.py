"""What an ended job leaves in a server's heap under pymalloc, in process: arenas and survivors.

The server's app (its defaults, workers on) runs in this process on a fresh PostgreSQL database
behind a test client, so `sys._debugmallocstats()` and tracemalloc see its heap. Jobs of `--ranks`
x 2,000 collectives are posted (bench/web_server.py's poster) and ended (every rank's final
snapshot) one after the other; after each step, once the server has had time to release the job
(`gc.collect`, `malloc_trim`), the RSS, pymalloc's arenas (1 MiB each) and the bytes in used
blocks are printed. `--warm N`: an N-rank job run and ended first, so that the caches and threads
a job's ingest creates exist before the measured jobs. `--trace`: tracemalloc from the baseline
on (the arena counts are then not available: tracemalloc wraps the allocator), and the
allocations that survive the jobs, largest first.

    python -m bench.server_heap --ranks 1024 --jobs 2
    python -m bench.server_heap --ranks 256 --warm 32 --trace
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import os
import re
import sys
import tempfile
import time
import tracemalloc
import warnings
from pathlib import Path

import httpx
from prometheus_client import CollectorRegistry

from bench.server_ingest import make_token
from bench.server_memory import end_job
from bench.web_server import database, post_job, rss_mib
from flightdeck.server.app import create_app
from flightdeck.server.settings import ServerSettings

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # starlette's import-time warning about httpx
    from fastapi.testclient import TestClient

_STATS = {
    "arenas": r"# arenas allocated current\s*=\s*([\d,]+)",
    "used": r"# bytes in allocated blocks\s*=\s*([\d,]+)",
}


def mallocstats() -> dict[str, int]:
    """pymalloc's arenas in use and bytes in used blocks (empty while tracemalloc runs)."""
    with tempfile.TemporaryFile() as f:
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(f.fileno(), 2)  # _debugmallocstats writes to the C stderr
        try:
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        f.seek(0)
        text = f.read().decode()
    out = {}
    for key, pat in _STATS.items():
        m = re.search(pat, text)
        if m:
            out[key] = int(m.group(1).replace(",", ""))
    return out


def settle(seconds: float) -> None:
    """Wait, then collect and trim as the server does when a job is released."""
    time.sleep(seconds)
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)


def report(label: str) -> None:
    """One line: RSS, arenas, bytes in used blocks."""
    st = mallocstats()
    heap = f"arenas {st['arenas']:4d}  used blocks {st['used'] / 2**20:5.1f} MiB" if st else "(traced)"
    print(f"  {label:18s} RSS {rss_mib(os.getpid()):6.1f} MiB  {heap}", flush=True)


def run_job(client: httpx.Client, token: str, job: str, ranks: int, label: str, batch_entries: int) -> None:
    """Post a job, report, end it, report."""
    post_job(client, token, job, ranks, 2000, hang=False, batch_entries=batch_entries)
    settle(8)
    report(f"{label} open")
    end_job(client, token, job, ranks)
    settle(15)  # stall_after_s (5 s by default) and the worker's step after it
    report(f"{label} ended")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--warm", type=int, default=0, help="ranks of a job run and ended first")
    ap.add_argument("--batch-entries", type=int, default=32_000, help="most entries a posted batch")
    ap.add_argument("--trace", action="store_true", help="tracemalloc: what survives the jobs")
    args = ap.parse_args(argv)
    print(f"postgresql, in process, {args.jobs} job(s) of {args.ranks} ranks x 2000", flush=True)
    with database("postgresql", None) as url:
        token = make_token(url)
        app = create_app(ServerSettings(database_url=url, migrate=True), registry=CollectorRegistry())
        with TestClient(app) as client:
            client.get("/healthz")
            if args.warm:
                run_job(client, token, "warm", args.warm, "warm-up job", args.batch_entries)
            settle(3)
            report("baseline")
            if args.trace:
                tracemalloc.start(8)
                before = tracemalloc.take_snapshot()
            for k in range(args.jobs):
                run_job(client, token, f"heap-{k}", args.ranks, f"job {k + 1}", args.batch_entries)
            if args.trace:
                stats = [
                    s for s in tracemalloc.take_snapshot().compare_to(before, "traceback") if s.size_diff > 0
                ]
                n, size = sum(s.count_diff for s in stats), sum(s.size_diff for s in stats)
                print(f"  survivors: {n} blocks, {size / 1024:.0f} KiB; largest:", flush=True)
                for s in stats[:25]:
                    where = " <- ".join(f"{Path(f.filename).name}:{f.lineno}" for f in list(s.traceback)[:6])
                    print(f"    {s.size_diff / 1024:7.1f} KiB {s.count_diff:6d}  {where}")


if __name__ == "__main__":
    main()
