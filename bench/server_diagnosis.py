"""Time from the last batch of a 1,024-rank x 2,000-entry job to its hang finding, through a real
`flightdeck server` process (default settings: diagnosis_debounce_s 0.5, stall_after_s 30).

    python bench/server_diagnosis.py [--ranks 1024] [--entries 2000] [--db sqlite|postgresql]

The job (cut from a real gloo dump, see server_synth) runs healthy for `entries` collectives on
every rank; then one last batch brings a new collective that every rank but one entered ~100 s
ago. Measured: last batch answered -> GET /api/v1/jobs/{job} names the hang. Target: < 1 s.
Also: one `diagnose()` call on the in-memory summaries of the same job, and the server's RSS.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere
from bench.server_ingest import make_token, scratch_pg_database, start_server
from bench.server_synth import encode, rank_entries, snapshot, stuck_entry, template
from flightdeck.analysis import Options, diagnose, summarize
from flightdeck.records import RankDump

NS = 1_000_000_000
JOB = "bench-diagnosis"


def rss_mib(pid: int) -> float:
    """Resident memory of a process (Linux)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def offline_diagnose_s(ranks: int, entries: int, culprit: int) -> float:
    """Seconds for one diagnose() of the stuck job from in-memory summaries."""
    tpl = template()
    base = time.time_ns() - 100 * NS
    sums = []
    for r in range(ranks):
        es = rank_entries(tpl, r, 0, entries, base)
        if r != culprit:
            es.append(stuck_entry(tpl, r, entries, base))
        sums.append(summarize(RankDump(rank=r, source="bench", version="2.10", entries=es, world_size=ranks)))
    t = time.perf_counter()
    report = diagnose(sums, now_ns=time.time_ns(), options=Options(stall_after_s=30), world_size=ranks)
    took = time.perf_counter() - t
    assert report.findings[0].kind == "hang" and report.findings[0].culprit_ranks == [culprit]
    return took


def run(url: str, args: argparse.Namespace) -> None:
    """Stream the job into a fresh server, then time the last batch to the finding."""
    token = make_token(url)
    tpl = template()
    base = time.time_ns() - 100 * NS
    culprit = args.ranks // 2 + 5
    healthy_t = base + 10 * NS
    bodies = []
    for first in range(0, args.ranks, args.ranks_per_batch):
        snaps = [
            snapshot(JOB, r, args.ranks, rank_entries(tpl, r, 0, args.entries, base), healthy_t)
            for r in range(first, min(args.ranks, first + args.ranks_per_batch))
        ]
        bodies.append(encode(snaps))
    server = start_server(url, {})
    headers = {
        "Authorization": f"Bearer {token}",
        "Content-Encoding": "gzip",
        "Content-Type": "application/json",
    }
    try:
        with httpx.Client(base_url=server.url, timeout=300) as client:
            t0 = time.perf_counter()
            with ThreadPoolExecutor(2) as pool:
                list(
                    pool.map(
                        lambda b: client.post(
                            "/api/v1/ingest", content=b, headers=headers
                        ).raise_for_status(),
                        bodies,
                    )
                )
            stream_s = time.perf_counter() - t0
            time.sleep(3)  # let the worker fold everything and settle into periodic diagnoses
            now = time.time_ns()
            last = [
                snapshot(
                    JOB, r, args.ranks, [] if r == culprit else [stuck_entry(tpl, r, args.entries, base)], now
                )
                for r in range(args.ranks)
            ]
            body = encode(last)
            t_send = time.perf_counter()
            client.post("/api/v1/ingest", content=body, headers=headers).raise_for_status()
            t_acked = time.perf_counter()
            while True:
                doc = client.get(f"/api/v1/jobs/{JOB}").json()
                hang = [f for f in doc["findings"] if f["kind"] == "hang"]
                if hang:
                    break
                if time.perf_counter() - t_acked > 30:
                    raise RuntimeError(f"no hang finding: {doc['findings']}")
                time.sleep(0.01)
            t_found = time.perf_counter()
            assert hang[0]["culprit_ranks"] == [culprit], hang[0]
            mem = rss_mib(server.pid)
    finally:
        server.stop()
    n = args.ranks * args.entries
    print(
        f"{url.split(':', 1)[0]}: {args.ranks} ranks x {args.entries} entries streamed in {stream_s:.1f} s "
        f"({n / stream_s:,.0f} entries/s); last batch answered in {(t_acked - t_send) * 1000:.0f} ms; "
        f"last batch answered -> hang finding via the API: {(t_found - t_acked) * 1000:.0f} ms "
        f"(debounce 0.5 s included); culprit rank {culprit} named; server RSS {mem:.0f} MiB"
    )


def main() -> None:
    """Parse arguments and run."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--entries", type=int, default=2000)
    ap.add_argument("--ranks-per-batch", type=int, default=8)
    ap.add_argument("--db", default="sqlite", choices=["sqlite", "postgresql"])
    ap.add_argument("--skip-offline", action="store_true")
    args = ap.parse_args()
    if not args.skip_offline:
        took = offline_diagnose_s(args.ranks, args.entries, args.ranks // 2 + 5)
        print(f"diagnose() on {args.ranks} x {args.entries} in-memory summaries: {took * 1000:.0f} ms")
    if args.db == "sqlite":
        with tempfile.TemporaryDirectory() as tmp:
            run(f"sqlite:///{tmp}/bench.db", args)
    else:
        with scratch_pg_database() as url:
            run(url, args)


if __name__ == "__main__":
    main()
