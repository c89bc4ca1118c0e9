"""Ingest throughput end to end: gzip HTTP batches into a real `flightdeck server` process, until
the rows are committed (the server answers after COMMIT), on SQLite and on PostgreSQL.

    python bench/server_ingest.py [--db sqlite postgresql] [--ranks 64] [--entries 2000]
    python bench/server_ingest.py --shape stream --ranks-per-batch 64 --window 125 ...

Also reports the database bytes per stored entry (stacks and signatures deduplicated).
Target: >= 50,000 entries/s per server process on 2 cores; < 200 bytes per entry.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere
from bench.loadgen.resources import proc_cpu_s
from bench.server_synth import encode, rank_entries, snapshot, template
from flightdeck.server import store
from flightdeck.server.db import connect, migrate
from flightdeck.server.ingest import hash_token, new_token
from tests.support.server_process import ServerProcess

PG_ADMIN = os.environ.get("FLIGHTDECK_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/test")


@contextlib.contextmanager
def scratch_pg_database(prefix: str = "flightdeck_bench") -> Iterator[str]:
    """A fresh PostgreSQL database `<prefix>_<hex>` on PG_ADMIN's server (its SQLAlchemy URL),
    dropped afterwards."""
    import psycopg

    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        base = PG_ADMIN.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://", 1)
        yield f"{base}/{name}"
    finally:
        with psycopg.connect(PG_ADMIN, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


#: Where Debian's and Ubuntu's packages put jemalloc (libjemalloc2) and mimalloc (libmimalloc2.0).
ALLOCATOR_LIBRARIES = {
    "jemalloc": ("/usr/lib/x86_64-linux-gnu/libjemalloc.so.2", "/usr/lib/aarch64-linux-gnu/libjemalloc.so.2"),
    "mimalloc": ("/usr/lib/x86_64-linux-gnu/libmimalloc.so.2", "/usr/lib/aarch64-linux-gnu/libmimalloc.so.2"),
}


def allocator_library(name: str) -> str | None:
    """The path of the shared library of allocator `name` (jemalloc, mimalloc) if installed."""
    return next((p for p in ALLOCATOR_LIBRARIES.get(name, ()) if os.path.exists(p)), None)


def allocator_env(name: str) -> dict[str, str]:
    """The environment that runs a Python process's objects on allocator `name`: `pymalloc`
    (CPython's own), `malloc` (the C library's), or `jemalloc` / `mimalloc` (preloaded in place
    of the C library's malloc, objects on it). A ValueError when that library is not installed."""
    if name in ("pymalloc", "malloc"):
        return {"PYTHONMALLOC": name}
    lib = allocator_library(name)
    if lib is None:
        raise ValueError(
            f"{name} is not installed (looked for {', '.join(ALLOCATOR_LIBRARIES.get(name, ()))})"
        )
    return {"PYTHONMALLOC": "malloc", "LD_PRELOAD": lib}


def start_server(url: str, env_extra: dict[str, str]) -> ServerProcess:
    """`flightdeck server` on the database `url` in its own process, on a free 127.0.0.1 port (its
    output this process's); returns it once /healthz answers."""
    server = ServerProcess({**os.environ, **env_extra}, None, "--database-url", url, "--log-level", "warning")
    server.start(timeout_s=30)
    return server


def make_token(url: str) -> str:
    """A collector token stored in the database at `url`."""
    db = connect(url)
    migrate(db)
    token = new_token()
    with db.write() as session, session.begin():
        store.create_token(
            session=session, name=f"bench-{uuid.uuid4().hex[:6]}", token_hash=hash_token(token), now_ns=1
        )
    db.dispose()
    return token


def bytes_per_entry(url: str, path: Path | None) -> dict[str, float]:
    """Bytes per entry: the entries table with its indexes, and the whole database."""
    db = connect(url)
    try:
        with db.read() as session:
            n = store.count_entries(session=session)
            table = store.db_size_bytes(session=session, table="entries")
            if db.dialect == "postgresql":
                from sqlalchemy import func, select

                total = int(
                    session.execute(select(func.pg_database_size(func.current_database()))).scalar_one()
                )
            else:
                total = 0
        if path is not None:
            with db.engine.connect() as conn:
                conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
            total = path.stat().st_size
        return {
            "entries": n,
            "table_bytes_per_entry": (table or 0) / n if n else 0.0,
            "db_bytes_per_entry": total / n if n else 0.0,
        }
    finally:
        db.dispose()


def run(
    url: str, path: Path | None, args: argparse.Namespace, env: dict[str, str] | None = None
) -> dict[str, float]:
    """Push the synthetic job into a fresh server on `url` (`env`: more of its environment), print
    the figures and return them (entries/s, server CPU µs per entry while posting, and until the
    server is at rest again: its folding and first diagnosis of the job)."""
    token = make_token(url)
    tpl = template()
    base = time.time_ns() - 3600 * 1_000_000_000
    bodies = []
    # ring: each batch brings a few ranks' whole rings (a collector meeting a running job);
    # stream: in time order, each batch the next `window` entries of a block of ranks (live shipping).
    window = args.entries if args.shape == "ring" else args.window
    for start in range(0, args.entries, window):
        for first in range(0, args.ranks, args.ranks_per_batch):
            snaps = [
                snapshot(
                    "bench-ingest",
                    r,
                    args.ranks,
                    rank_entries(tpl, r, start, min(window, args.entries - start), base),
                    base + 10**10 + start * 10**7,
                )
                for r in range(first, min(args.ranks, first + args.ranks_per_batch))
            ]
            bodies.append(encode(snaps))
    n_entries = args.ranks * args.entries
    server = start_server(
        url, {"FLIGHTDECK_SERVER_MAX_INFLIGHT_INGESTS": str(args.concurrency), **(env or {})}
    )
    try:
        headers = {
            "Authorization": f"Bearer {token}",
            "Content-Encoding": "gzip",
            "Content-Type": "application/json",
        }
        with httpx.Client(base_url=server.url, timeout=120) as client:

            def post(b: bytes) -> float:
                t = time.perf_counter()
                r = client.post("/api/v1/ingest", content=b, headers=headers)
                r.raise_for_status()
                return time.perf_counter() - t

            cpu0, t0 = proc_cpu_s(server.pid), time.perf_counter()
            with ThreadPoolExecutor(args.concurrency) as pool:
                lat = sorted(pool.map(post, bodies))
            wall, cpu = time.perf_counter() - t0, proc_cpu_s(server.pid) - cpu0
            wait_idle(server.pid)
            cpu_all = proc_cpu_s(server.pid) - cpu0
    finally:
        server.stop()
    size = bytes_per_entry(url, path)
    assert size["entries"] == n_entries, size
    kib = sum(len(b) for b in bodies) / len(bodies) / 1024
    print(
        f"{url.split(':', 1)[0]:>20}: {n_entries} entries in {len(bodies)} batches "
        f"({n_entries // len(bodies)} entries, {kib:.0f} KiB gzip each, {args.shape}), "
        f"concurrency {args.concurrency}: "
        f"{wall:.2f} s = {n_entries / wall:,.0f} entries/s; batch latency p50 {lat[len(lat) // 2] * 1000:.0f} ms "
        f"max {lat[-1] * 1000:.0f} ms; server CPU {cpu / wall:.2f} core, {cpu / n_entries * 1e6:.1f} µs/entry; "
        f"entries table {size['table_bytes_per_entry']:.0f} B/entry, "
        f"whole database {size['db_bytes_per_entry']:.0f} B/entry"
    )
    return {
        "entries_per_s": n_entries / wall,
        "cpu_us_per_entry": cpu / n_entries * 1e6,
        "cpu_us_per_entry_at_rest": cpu_all / n_entries * 1e6,
    }


def wait_idle(pid: int, timeout_s: float = 600) -> None:
    """Until the server uses under a tenth of a core over 2 s (its folds, start-up rebuild and
    diagnoses done): what is measured next is a server at rest."""
    deadline = time.monotonic() + timeout_s
    last = proc_cpu_s(pid)
    while time.monotonic() < deadline:
        time.sleep(2)
        now = proc_cpu_s(pid)
        if now - last < 0.2:
            return
        last = now


def main() -> None:
    """Parse arguments and run the benchmark on each database."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", nargs="+", default=["sqlite", "postgresql"], choices=["sqlite", "postgresql"])
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--entries", type=int, default=2000)
    ap.add_argument("--ranks-per-batch", type=int, default=4)
    ap.add_argument(
        "--shape",
        choices=["ring", "stream"],
        default="ring",
        help="ring: batches of a few ranks' whole rings; stream: time order, --window entries per rank",
    )
    ap.add_argument("--window", type=int, default=125, help="entries per rank per batch (--shape stream)")
    ap.add_argument("--concurrency", type=int, default=2)
    args = ap.parse_args()
    for kind in args.db:
        if kind == "sqlite":
            with tempfile.TemporaryDirectory() as tmp:
                path = Path(tmp) / "bench.db"
                run(f"sqlite:///{path}", path, args)
        else:
            with scratch_pg_database() as url:
                run(url, None, args)


if __name__ == "__main__":
    main()
