"""Resources of the servers, the generator, PostgreSQL's backends and the machine, from /proc
(PostgreSQL runs on this machine), sampled during the run."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from pathlib import Path
from typing import Any

from bench.loadgen.stats import Sample, Stats


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
