"""How long requests wait while a server restarts itself in place (`idle_restart_above_mib`).

A real `flightdeck server` process on SQLite is sent a real gloo job's final snapshots over HTTP;
once the job's series leave /metrics it holds no job and restarts in place. Meanwhile a client
asks `/healthz` every `--every-ms`, each request on a new connection, and the bench prints the
longest answer time, how many were asked and how many failed. **Lowered thresholds**, so that the
restart comes within seconds: `ended_series_s` 1 s and `idle_restart_above_mib` 0.001 (what a
request waits depends on the restart, not on what triggers it; bench/server_memory.py measures
the restart with the shipped defaults).

    python -m bench.idle_restart [--runs 3] [--every-ms 20]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from tests.support.paging_stack import ServerProcess, healthy_job
from tests.support.waiting import wait_until


def one_run(tmp: Path, every_s: float) -> tuple[float, int, list[str]]:
    """One restart: (the longest /healthz answer time in s, requests asked, failures)."""
    server = ServerProcess(
        tmp,
        env={"FLIGHTDECK_SERVER_IDLE_RESTART_ABOVE_MIB": "0.001", "FLIGHTDECK_SERVER_ENDED_SERIES_S": "1"},
    )
    waits: list[float] = []
    failures: list[str] = []
    stop = threading.Event()

    def poll() -> None:
        while not stop.is_set():
            t = time.monotonic()
            try:
                with urllib.request.urlopen(f"{server.url}/healthz", timeout=60) as r:
                    r.read()
            except OSError as exc:
                failures.append(repr(exc))
            waits.append(time.monotonic() - t)
            time.sleep(every_s)

    with server:
        server.start()
        poller = threading.Thread(target=poll, daemon=True)
        poller.start()
        try:
            server.post(healthy_job("restart"))
            log = tmp / "server.log"
            wait_until(lambda: "restarted in place" in log.read_text(), 120, "the idle restart")
            n = len(waits)
            wait_until(lambda: len(waits) > n + 10, 60, "the new image to answer")
        finally:
            stop.set()
            poller.join(90)
    return max(waits), len(waits), failures


def main(argv: list[str] | None = None) -> None:
    """Run the restarts; print each and the median of the longest waits."""
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--every-ms", type=float, default=20.0)
    args = ap.parse_args(argv)
    longest = []
    for i in range(args.runs):
        with tempfile.TemporaryDirectory() as tmp:
            worst, asked, failed = one_run(Path(tmp), args.every_ms / 1000)
        longest.append(worst)
        print(
            f"run {i + 1}: longest /healthz answer {worst:.2f} s of {asked} asked, {len(failed)} failed"
            f"{': ' + failed[0] if failed else ''} (load {' '.join(f'{x:.2f}' for x in os.getloadavg())})",
            flush=True,
        )
    print(f"median of the longest waits: {statistics.median(longest):.2f} s", flush=True)


if __name__ == "__main__":
    main()
