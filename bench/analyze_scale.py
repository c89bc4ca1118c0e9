"""`flightdeck analyze` vs PyTorch's `torchfrtrace` on a 1,024-rank x 2,000-entry job, in one run.

The job is synthesized from a real gloo dump (tests/data/fr/healthy_4): its entries, call sites and
frames are repeated into a 2,000-entry ring per rank, written as pickles the way PyTorch writes
them (with a valid pg_config, so that torchfrtrace can read them at all). One rank (the culprit)
never enters the last collective. Prints wall time and peak RSS (whole process tree) of both.

    python bench/analyze_scale.py [--ranks 1024] [--entries 2000] [--culprit 637] [--skip-torch]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import pickle
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "tests" / "data" / "fr" / "healthy_4" / "rank_0.final.pkl"


def _load_source() -> dict[str, Any]:
    from flightdeck.collector.frdump import load_raw

    return load_raw(SOURCE.read_bytes())


def build(out: Path, ranks: int, entries: int, culprit: int) -> int:
    """Write the synthetic job; returns the total bytes written."""
    src = _load_source()
    # Ops whose sizes depend on the world size (all_gather's output) would not be valid at 1,024 ranks.
    templates = [
        e
        for e in src["entries"]
        if e["process_group"][0] == "0" and e.get("frames") and "gather" not in e["profiling_name"]
    ]
    if not templates:
        raise SystemExit(f"{SOURCE} has no default-group entries with frames")
    t0 = time.time_ns() - entries * 10_000_000
    total = 0
    pg_config = {"0": {"name": "0", "desc": "default_pg", "ranks": json.dumps(list(range(ranks)))}}
    for r in range(ranks):
        n = entries - 1 if r == culprit else entries
        ring = []
        for i in range(n):
            tpl = templates[i % len(templates)]
            e = dict(tpl)  # shallow: frames and size lists are shared, as pickle memoizes them
            e["record_id"] = i
            e["collective_seq_id"] = i + 1
            e["op_id"] = i + 1
            e["time_created_ns"] = t0 + i * 10_000_000 + (r % 7) * 1000
            e["retired"] = i < entries - 1
            e["state"] = "scheduled"
            e["process_group"] = ("0", "default_pg")
            e["pg_id"] = 0
            ring.append(e)
        dump = {
            "version": src["version"],
            "pg_config": pg_config,
            "pg_status": copy.deepcopy(src.get("pg_status", {})),
            "comm_lib_version": src.get("comm_lib_version", ""),
            "entries": ring,
        }
        data = pickle.dumps(dump, protocol=pickle.HIGHEST_PROTOCOL)
        (out / f"rank_{r}").write_bytes(data)
        total += len(data)
    return total


def _tree_rss_kb(pid: int) -> int:
    """RSS of a process and all its descendants, from /proc."""
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as fh:
                ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(d))
    total, stack = 0, [pid]
    while stack:
        p = stack.pop()
        stack.extend(children.get(p, []))
        try:
            with open(f"/proc/{p}/status") as fh:
                for line in fh:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
        except OSError:
            pass
    return total


def measure(cmd: list[str], timeout_s: float) -> tuple[float, int, int, str]:
    """Run a command; returns (wall seconds, peak tree RSS in MB, exit code, output tail)."""
    start = time.monotonic()
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        peak = 0
        while proc.poll() is None:
            peak = max(peak, _tree_rss_kb(proc.pid))
            if time.monotonic() - start > timeout_s:
                proc.kill()
                proc.wait()
                return timeout_s, peak // 1024, -9, "timed out"
            time.sleep(0.05)
        wall = time.monotonic() - start
        log.seek(0)
        tail = log.read()[-600:].decode(errors="replace")
    return wall, peak // 1024, proc.returncode, tail


def main() -> int:
    """Build the job, run both analyzers, print the comparison."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--entries", type=int, default=2000)
    ap.add_argument("--culprit", type=int, default=637)
    ap.add_argument("--skip-torch", action="store_true", help="do not run torchfrtrace")
    ap.add_argument("--torch-timeout", type=float, default=900.0)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="fd-bench-") as tmp:
        d = Path(tmp)
        t = time.monotonic()
        size = build(d, args.ranks, args.entries, args.culprit)
        print(
            f"synthesized {args.ranks} ranks x {args.entries} entries with frames: "
            f"{size / 1e6:.0f} MB in {time.monotonic() - t:.1f} s"
        )
        fd_cmd = [
            sys.executable,
            "-m",
            "flightdeck",
            "analyze",
            str(d),
            "--format",
            "json",
            "--now",
            str(time.time() + 60),
        ]
        wall, rss, code, _tail = measure(fd_cmd, 600)
        print(
            f"flightdeck analyze: {wall:.2f} s wall, peak RSS {rss} MB, exit {code}, "
            f"{size / 1e6 / wall:.0f} MB/s"
        )
        out = subprocess.run(fd_cmd, capture_output=True, text=True, check=False)
        verdict = json.loads(out.stdout)
        root = verdict["findings"][0]
        print(
            f"  verdict: {root['kind']} culprit {root['culprit_ranks']} group {root['process_group']} "
            f"seq {root['collective_seq_id']} ({'right' if root['culprit_ranks'] == [args.culprit] else 'WRONG'})"
        )
        if args.skip_torch:
            return 0
        tt_cmd = [sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", "-p", "rank_", str(d)]
        twall, trss, tcode, ttail = measure(tt_cmd, args.torch_timeout)
        label = f"{twall:.2f} s" if tcode != -9 else f"> {args.torch_timeout:.0f} s (killed)"
        print(f"torchfrtrace:       {label} wall, peak RSS {trss} MB, exit {tcode}")
        print("  its last words: " + " | ".join(ttail.strip().splitlines()[-3:])[:400])
        print(f"speed-up: {twall / wall:.1f}x" + (" (at least)" if tcode == -9 else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
