"""Server memory per open job, after the jobs end, and at a restart's rebuild, through a real server.

A fresh database (SQLite file or a new PostgreSQL database) and one `flightdeck server` process
with the shipped defaults. `--jobs` jobs of `--ranks` x `--entries` collectives are posted to it
over HTTP as a collector would (bench/web_server.py's poster), one after the other; after each the
bench waits for the server to be at rest (under a tenth of a core) and reads its resident memory
(`VmRSS`). Then the server is stopped and started again on the same database while the jobs are
still open: it rebuilds their summaries from the store (`VmHWM`: its peak while doing so). Last,
every rank of every job sends its final snapshot, as the agent does when its process exits, the
server ends the jobs, and the memory is read once more (`--again`: and after one more job run
and ended). Printed, in MiB:

* the server's RSS at rest before any job (baseline), after each job and the increment of each
  (the median of those after the first: the first job's data also fills the store's caches);
* after the restart's rebuild (and its peak), after every job ended, and once the server holds
  no job (`ended_series_s` later: it then restarts itself in place, `idle_restart_above_mib`).

Batches hold whole rings of at most `--batch-entries` entries (the collector's own limit by
default).

    python -m bench.server_memory --db sqlite --ranks 1024 --entries 2000 --jobs 10
    python -m bench.server_memory --db postgresql --jobs 3
    python -m bench.server_memory --db postgresql --jobs 3 --allocator malloc
    python -m bench.server_memory --db postgresql --jobs 3 --allocator jemalloc --malloc-conf dirty_decay_ms:1000

The server runs under its default allocator unless `--allocator` names one (`PYTHONMALLOC`; for
jemalloc also `LD_PRELOAD`, and `--malloc-conf` its MALLOC_CONF); the one it runs under
(`flightdeck_build_info`) is printed.
"""

from __future__ import annotations

import argparse
import re
import signal
import statistics
import sys
import time
import uuid
from dataclasses import replace
from pathlib import Path

import httpx

from bench.server_ingest import allocator_env, make_token, start_server, wait_idle
from bench.server_synth import snapshot
from bench.web_server import database, post_batch, post_job, rss_mib
from flightdeck.collector.settings import CollectorSettings
from flightdeck.wire import Batch

#: The collector's default batch size: what a server is sent by the collectors it serves.
MAX_BATCH_ENTRIES: int = CollectorSettings.model_fields["max_batch_entries"].default

ENDED = ("finished", "failed")


def status_mib(pid: int, field: str) -> float:
    """A memory field of /proc/PID/status (VmRSS, VmHWM), MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return 0.0


def restarted(pid: int) -> bool:
    """Whether the server restarted itself in place (its command line names the socket handed over)."""
    return b"--listen-fd=" in Path(f"/proc/{pid}/cmdline").read_bytes()


def end_job(client: httpx.Client, token: str, job: str, ranks: int) -> None:
    """Every rank's final snapshot (its process exited), 32 ranks a batch."""
    now = time.time_ns()
    for first in range(0, ranks, 32):
        snaps = [
            replace(snapshot(job, r, ranks, [], now), kind="final")
            for r in range(first, min(ranks, first + 32))
        ]
        post_batch(client, token, Batch(uuid.uuid4().hex, "bench-host", "bench", time.time_ns(), snaps))


def wait_status(client: httpx.Client, job: str, want: tuple[str, ...], timeout_s: float) -> str:
    """The job's status once it is one of `want`."""
    deadline = time.monotonic() + timeout_s
    status = ""
    while time.monotonic() < deadline:
        r = client.get(f"/api/v1/jobs/{job}")
        if r.status_code == 200:
            status = str(r.json().get("status"))
            if status in want:
                return status
        time.sleep(0.5)
    raise SystemExit(f"{job} is {status!r}, not {want}, after {timeout_s:.0f} s")


def allocator(client: httpx.Client) -> str:
    """The allocator the server's objects come from (`flightdeck_build_info`)."""
    found = re.search(r'^flightdeck_build_info\{[^}]*allocator="([a-z]+)"', client.get("/metrics").text, re.M)
    return found.group(1) if found else "?"


def load() -> str:
    """The machine's load averages (1, 5, 15 min)."""
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def main(argv: list[str] | None = None) -> None:
    """Post the jobs, restart, end them; print the server's memory at each step."""
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--db", choices=["sqlite", "postgresql"], default="sqlite")
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--entries", type=int, default=2000)
    ap.add_argument("--jobs", type=int, default=10)
    ap.add_argument("--no-restart", action="store_true", help="skip the restart's rebuild")
    ap.add_argument(
        "--allocator", choices=["malloc", "pymalloc", "jemalloc", "mimalloc"], help="the server's allocator"
    )
    ap.add_argument(
        "--malloc-conf", help="MALLOC_CONF with --allocator jemalloc (e.g. background_thread:true)"
    )
    ap.add_argument("--again", action="store_true", help="then one more job, run and ended")
    ap.add_argument("--release-wait", type=float, default=10.0, help="seconds to wait after the jobs ended")
    ap.add_argument(
        "--batch-entries",
        type=int,
        default=MAX_BATCH_ENTRIES,
        help=f"most entries a posted batch (default {MAX_BATCH_ENTRIES}: the collector's max_batch_entries)",
    )
    ap.add_argument(
        "--restart-wait",
        type=float,
        default=720.0,
        help="seconds to wait after the jobs ended for the server's idle restart (ended_series_s, 600 s "
        "by default, then one diagnosis step); 0: do not wait",
    )
    args = ap.parse_args(argv)
    # Stopped (`timeout`, a kill): its server stopped and its scratch database dropped all the same.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    jobs = [f"mem-{i}" for i in range(args.jobs)]
    print(f"{args.db}, {args.jobs} job(s) of {args.ranks} ranks x {args.entries} collectives", flush=True)
    with database(args.db, None) as url:
        token = make_token(url)
        env = allocator_env(args.allocator) if args.allocator else {}
        if args.malloc_conf:
            env["MALLOC_CONF"] = args.malloc_conf
        server = start_server(url, env)
        try:
            with httpx.Client(base_url=server.url, timeout=300) as client:

                def post(job: str) -> None:
                    """Post the job as its collectors would; return once the server is at rest."""
                    post_job(
                        client,
                        token,
                        job,
                        args.ranks,
                        args.entries,
                        hang=False,
                        batch_entries=args.batch_entries,
                    )
                    wait_status(client, job, ("running",), 300)
                    wait_idle(server.pid)

                wait_idle(server.pid)
                base = prev = rss_mib(server.pid)
                print(f"  allocator             {allocator(client)}", flush=True)
                print(f"  baseline              {base:7.0f} MiB   (load {load()})", flush=True)
                steps = []
                for i, job in enumerate(jobs):
                    t = time.monotonic()
                    post(job)
                    rss = rss_mib(server.pid)
                    steps.append(rss - prev)
                    print(
                        f"  after job {i + 1:<3}         {rss:7.0f} MiB   {rss - prev:+6.1f} MiB"
                        f"   ({time.monotonic() - t:.0f} s, load {load()})",
                        flush=True,
                    )
                    prev = rss
                # The first job also fills the store's caches (SQLite's page cache per
                # connection, the connection pool): the ones after it are what a job costs.
                later = steps[1:] or steps
                print(
                    f"  per job after the 1st median {statistics.median(later):+.1f} MiB"
                    f" (min {min(later):+.1f}, max {max(later):+.1f}); all jobs {prev - base:+.0f} MiB",
                    flush=True,
                )
                if not args.no_restart:
                    server.stop()
                    server.start(timeout_s=30)
                    start = rss_mib(server.pid)
                    wait_idle(server.pid)
                    rss, peak = rss_mib(server.pid), status_mib(server.pid, "VmHWM")
                    print(
                        f"  restarted, rebuilt    {rss:7.0f} MiB   (at start {start:.0f}, peak {peak:.0f}; "
                        f"load {load()})",
                        flush=True,
                    )
                for job in jobs:
                    end_job(client, token, job, args.ranks)
                ended = {job: wait_status(client, job, ENDED, 300) for job in jobs}
                # The server lets an ended job's memory go once no batch of it came for
                # stall_after_s (5 s by default): the late final snapshots come within that.
                time.sleep(args.release_wait)
                wait_idle(server.pid)
                rss = rss_mib(server.pid)
                print(
                    f"  jobs ended            {rss:7.0f} MiB   ({', '.join(sorted(set(ended.values())))};"
                    f" load {load()})",
                    flush=True,
                )
                if args.restart_wait > 0:
                    # Once the ended jobs' series leave /metrics the server holds no job, and it
                    # restarts in place (idle_restart_above_mib): the same pid, a new image.
                    t = time.monotonic()
                    while time.monotonic() - t < args.restart_wait and not restarted(server.pid):
                        time.sleep(2)
                    wait_idle(server.pid)
                    rss = rss_mib(server.pid)
                    said = (
                        f"restarted in place after {time.monotonic() - t:.0f} s more"
                        if restarted(server.pid)
                        else "not restarted"
                    )
                    print(f"  no job held           {rss:7.0f} MiB   ({said}; load {load()})", flush=True)
                if args.again:
                    # One more job run and ended: the process's level once its caches have seen
                    # jobs; what an ended job leaves behind adds up here if anything does.
                    job = "mem-again"
                    post(job)
                    open_rss = rss_mib(server.pid)
                    end_job(client, token, job, args.ranks)
                    wait_status(client, job, ENDED, 300)
                    time.sleep(args.release_wait)
                    wait_idle(server.pid)
                    print(
                        f"  one more job, ended   {rss_mib(server.pid):7.0f} MiB   (open: {open_rss:.0f};"
                        f" load {load()})",
                        flush=True,
                    )
        finally:
            server.stop()


if __name__ == "__main__":
    main()
