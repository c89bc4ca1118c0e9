"""What the server's 5 s `stall_after_s` must clear in a healthy job, and what the agent's
progress evidence costs, with the shipped defaults (agent snapshot every 1 s, collector push every
1 s, server defaults):

    python bench/progress_evidence.py [--ranks 4] [--steps 300] [--step-s 0.1]

Runs a healthy `flightdeck.launch.demo.worker` gloo job (no fault) under a real server and collector on
127.0.0.1 and prints:

- per collective, the arrival skew (last minus first rank to enter it, from the ranks' final
  flight-recorder dumps): how long a healthy rank waits in a collective, the quantity `stall_after`
  must clear (a hang is a collective unfinished for `stall_after` on some ranks);
- per rank, the gap between consecutive collectives (how long a rank is "quiet");
- snapshot -> stored in the server (the server's `received_ns` minus the snapshot time, sampled
  from its SQLite database while the job runs);
- the cost of one `ProgressSampler.sample()` (CPU time and stack of the main thread) on a thread
  30 frames deep, and what it is at two samples a second.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from flightdeck.agent.progress import PROGRESS_SAMPLE_S, ProgressSampler  # noqa: E402
from flightdeck.launch.demo.ranks import free_port  # noqa: E402
from flightdeck.launch.local_stack import LocalStack, provision_token, sqlite_url  # noqa: E402
from flightdeck.readers.fr.files import read_dump_file  # noqa: E402


def pct(values: list[float], q: float) -> float:
    """The q-quantile (0..1) of `values` (nearest rank)."""
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def sampler_cost(n: int = 2000) -> float:
    """Microseconds per sample of a thread blocked 30 frames deep."""
    ready, stop = threading.Event(), threading.Event()

    def deep(k: int) -> None:
        if k:
            deep(k - 1)
        else:
            ready.set()
            stop.wait()

    t = threading.Thread(target=deep, args=(30,))
    t.start()
    ready.wait()
    sampler = ProgressSampler(time.time_ns, thread=t)
    try:
        c0 = time.thread_time()
        for _ in range(n):
            sampler.sample()
        return (time.thread_time() - c0) / n * 1e6
    finally:
        stop.set()
        t.join()


def main() -> int:
    """Run the job, print the figures."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--step-s", type=float, default=0.1, help="pretend compute per step (the worker's)")
    args = p.parse_args()
    us = sampler_cost()
    print(
        f"ProgressSampler.sample(): {us:.0f} us CPU per sample (30-frame stack); every {PROGRESS_SAMPLE_S} s: "
        f"{us / 1e6 / PROGRESS_SAMPLE_S:.3%} of one core"
    )
    with tempfile.TemporaryDirectory(prefix="fd-progress-") as tmp:
        root = Path(tmp)
        stack = LocalStack(log_dir=root / "logs")
        try:
            url = stack.start_server(data_dir=root / "data", port=free_port())
            provision_token(sqlite_url(root / "data"), root / "token")
            spool = root / "spool"
            spool.mkdir()
            stack.start_collector(
                name="collector", server_url=url, spool_dirs=[spool], state_dir=root / "state",
                token_file=root / "token", torch_dumps=False,
            )  # fmt: skip
            env = {
                k: v for k, v in os.environ.items() if not k.startswith(("FLIGHTDECK_", "MASTER_", "RANK"))
            }
            env.update(
                MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE=str(args.ranks),
                FLIGHTDECK_AGENT_SPOOL_DIR=str(spool), FLIGHTDECK_AGENT_JOB="healthy", OMP_NUM_THREADS="1",
                PYTHONPATH=str(REPO) + os.pathsep + env.get("PYTHONPATH", ""),
            )  # fmt: skip
            cmd = [sys.executable, "-m", "flightdeck.launch.demo.worker", "--steps", str(args.steps)]
            cmd += ["--step-s", str(args.step_s)]
            procs = [
                subprocess.Popen(
                    cmd,
                    env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
                for r in range(args.ranks)
            ]
            lags: list[float] = []
            seen: set[tuple[int, int]] = set()
            db = root / "data" / "flightdeck.db"
            while any(pr.poll() is None for pr in procs):
                time.sleep(0.2)
                if not db.exists():
                    continue
                try:
                    with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1) as conn:
                        rows = conn.execute(
                            "SELECT rank, last_snapshot_ns, received_ns FROM ranks"
                        ).fetchall()
                except sqlite3.Error:
                    continue
                for rank, snap, received in rows:
                    if (rank, snap) not in seen:
                        seen.add((rank, snap))
                        lags.append((received - snap) / 1e9)
            codes = [pr.wait() for pr in procs]
        finally:
            stack.stop()
        created: dict[tuple[str, int], list[int]] = {}
        gaps: list[float] = []
        for path in sorted((spool / "healthy" / "0").glob("rank_*.final.pkl")):
            dump = read_dump_file(path)
            times = []
            for e in dump.entries:
                if not e.is_p2p:
                    created.setdefault((e.group, e.collective_seq_id), []).append(e.time_created_ns)
                    times.append(e.time_created_ns)
            times.sort()
            gaps += [(b - a) / 1e9 for a, b in itertools.pairwise(times)]
        skews = [(max(v) - min(v)) / 1e9 for v in created.values() if len(v) > 1]
    print(f"job: {args.ranks} ranks, {args.steps} steps of {args.step_s} s, exit codes {codes}")
    if skews:
        print(
            f"arrival skew over {len(skews)} collectives: median {statistics.median(skews) * 1000:.1f} ms, "
            f"p99 {pct(skews, 0.99) * 1000:.1f} ms, max {max(skews) * 1000:.1f} ms"
        )
    if gaps:
        print(
            f"gap between a rank's collectives: median {statistics.median(gaps) * 1000:.1f} ms, "
            f"p99 {pct(gaps, 0.99) * 1000:.1f} ms, max {max(gaps) * 1000:.1f} ms"
        )
    if lags:
        print(
            f"snapshot -> stored ({len(lags)} snapshots seen): median {statistics.median(lags):.2f} s, "
            f"p99 {pct(lags, 0.99):.2f} s, max {max(lags):.2f} s"
        )
    return 0 if codes and all(c == 0 for c in codes) else 1


if __name__ == "__main__":
    raise SystemExit(main())
