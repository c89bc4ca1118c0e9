"""`flightdeck analyze` vs PyTorch's `torchfrtrace` on a 1,024-rank x 2,000-entry job, in one run.

The job is synthesized from a real gloo dump (tests/data/fr/healthy_4): its entries, call sites and
frames are repeated into a 2,000-entry ring per rank, written as pickles the way PyTorch writes
them (with a valid pg_config, so that torchfrtrace can read them at all). One rank (the culprit)
never enters the last collective. Prints wall time and peak RSS (whole process tree) of both, the
unpickling floor (the same files only read and restrictedly unpickled, by as many worker processes
as `flightdeck analyze` uses, in a fresh interpreter) and the ratio of `flightdeck analyze` to it,
and the load average before and after.

    python bench/analyze_scale.py [--ranks 1024] [--entries 2000] [--culprit 637] [--skip-torch]
        [--workers N] [--repeat N]

Both commands start from byte-compiled modules (compiled once per run, before measuring). The
bench says which pass reads the entries (C where flightdeck.readers.fr._rows is built: `python
setup.py build_ext --inplace`; FLIGHTDECK_READER_PURE_PYTHON=1 measures the Python pass).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import pickle
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "tests" / "data" / "fr" / "healthy_4" / "rank_0.final.pkl"


def _load_source() -> dict[str, Any]:
    from flightdeck.readers.fr.decode import load_raw

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


def _children(pid: int) -> list[int] | None:
    """The child processes of `pid` from /proc/PID/task/*/children; None where the kernel does not
    give that file (then the whole process table is scanned)."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    out: list[int] = []
    for t in tasks:
        try:
            with open(f"/proc/{pid}/task/{t}/children") as fh:
                out.extend(int(c) for c in fh.read().split())
        except FileNotFoundError:
            if not os.path.exists(f"/proc/{pid}/task/{t}"):
                continue  # the thread ended
            return None
        except OSError:
            continue
    return out


def _tree_rss_kb(pid: int) -> int:
    """RSS of a process and all its descendants, from /proc.

    The tree is walked through each process's children files (a few reads every 50 ms), not by
    reading every process's stat: on a 2-core machine that scan competed with the measured
    workers for CPU.
    """
    total, stack = 0, [pid]
    while stack:
        p = stack.pop()
        kids = _children(p)
        if kids is None:
            return _tree_rss_kb_scan(pid)
        stack.extend(kids)
        total += _rss_kb(p)
    return total


def _rss_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _tree_rss_kb_scan(pid: int) -> int:
    """`_tree_rss_kb` by scanning the whole process table (kernels without children files)."""
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
        total += _rss_kb(p)
    return total


def _unpickle(path: str) -> int:
    """Read one file and unpickle it as the reader does (restricted), nothing more."""
    from flightdeck.readers.fr.decode import safe_loads
    from flightdeck.readers.fr.files import read_dump_bytes

    data, _st = read_dump_bytes(Path(path))
    return len(safe_loads(data).get("entries") or [])


def unpickle_only(paths: list[str], workers: int) -> int:
    """The unpickling floor: every file read and restrictedly unpickled by `workers` forked
    processes, handed out as `flightdeck analyze` hands out ranks; returns the entries read."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    if workers <= 1 or len(paths) < 16:
        return sum(map(_unpickle, paths))
    ctx = multiprocessing.get_context("fork")
    with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
        return sum(pool.map(_unpickle, paths, chunksize=max(1, len(paths) // (workers * 8))))


def _compile_once(cache: Path) -> None:
    """Byte-compile what both commands import, into a cache of this run (`PYTHONPYCACHEPREFIX`),
    before either is measured: an installed package has compiled bytecode, and a checkout run
    with PYTHONDONTWRITEBYTECODE would otherwise compile flightdeck's modules on every start
    (~0.1 s, more of it for analyze, which imports more)."""
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    os.environ["PYTHONPYCACHEPREFIX"] = str(cache)
    warm = "import flightdeck.cli, flightdeck.analyze_cmd, flightdeck.analysis, flightdeck.readers.fr.files"
    subprocess.run([sys.executable, "-c", warm], check=True)


def _rows_pass() -> str:
    """Which pass `flightdeck analyze`'s readers use, as its process sees it: "C" where
    flightdeck.readers.fr._rows is built, "Python" without it or with
    FLIGHTDECK_READER_PURE_PYTHON set."""
    code = "from flightdeck.readers.fr import signatures; print(signatures.ROWS_PASS)"
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()


def _load() -> str:
    with open("/proc/loadavg") as fh:
        return " ".join(fh.read().split()[:3])


def measure(cmd: list[str], timeout_s: float) -> tuple[float, float, int, int, str]:
    """Run a command; returns (wall seconds, CPU seconds of its process tree, peak tree RSS in MB,
    exit code, output tail).

    The CPU seconds (user + system of the command and the processes it waited for) say what the
    work cost where the wall time also says how much of the machine others were using.
    """
    start = time.monotonic()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        peak = 0
        while proc.poll() is None:
            peak = max(peak, _tree_rss_kb(proc.pid))
            if time.monotonic() - start > timeout_s:
                proc.kill()
                proc.wait()
                return timeout_s, _cpu_since(before), peak // 1024, -9, "timed out"
            time.sleep(0.05)
        wall = time.monotonic() - start
        log.seek(0)
        tail = log.read()[-600:].decode(errors="replace")
    return wall, _cpu_since(before), peak // 1024, proc.returncode, tail


def _cpu_since(before: resource.struct_rusage) -> float:
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime


def main() -> int:
    """Build the job, run both analyzers, print the comparison."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--entries", type=int, default=2000)
    ap.add_argument("--culprit", type=int, default=637)
    ap.add_argument("--skip-torch", action="store_true", help="do not run torchfrtrace")
    ap.add_argument("--torch-timeout", type=float, default=900.0)
    ap.add_argument(
        "--workers",
        type=int,
        default=min(os.cpu_count() or 1, 8),
        help="reader processes of flightdeck analyze and of the unpickling floor (default: its default)",
    )
    ap.add_argument("--repeat", type=int, default=1, help="runs of floor and analyze (medians printed)")
    ap.add_argument("--unpickle-only", type=Path, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.unpickle_only is not None:  # the floor's own process (see unpickle_only)
        paths = sorted(str(p) for p in args.unpickle_only.iterdir() if p.name.startswith("rank_"))
        print(unpickle_only(paths, args.workers))
        return 0
    print(f"load average before: {_load()}")
    with (
        tempfile.TemporaryDirectory(prefix="fd-bench-") as tmp,
        tempfile.TemporaryDirectory(prefix="fd-bench-pyc-") as pyc,
    ):
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
            "--workers",
            str(args.workers),
        ]
        floor_cmd = [sys.executable, str(Path(__file__).resolve()), "--unpickle-only", str(d)]
        floor_cmd += ["--workers", str(args.workers)]
        _compile_once(Path(pyc))
        print(f"flightdeck analyze reads the entries with the {_rows_pass()} pass")
        walls, fwalls, cpus, fcpus = [], [], [], []
        for run in range(1, args.repeat + 1):
            # Floor and analyze alternate, so that a change in the machine's load falls on both.
            fwall, fcpu, frss, fcode, ftail = measure(floor_cmd, 600)
            wall, cpu, rss, code, _tail = measure(fd_cmd, 600)
            walls.append(wall)
            fwalls.append(fwall)
            cpus.append(cpu)
            fcpus.append(fcpu)
            tag = f"[run {run}, load {_load()}] " if args.repeat > 1 else ""
            print(
                f"{tag}flightdeck analyze: {wall:.2f} s wall, {cpu:.2f} s CPU, peak RSS {rss} MB, "
                f"exit {code}, {size / 1e6 / wall:.0f} MB/s ({args.workers} reader processes)"
            )
            print(
                f"{tag}unpickling floor:   {fwall:.2f} s wall, {fcpu:.2f} s CPU, peak RSS {frss} MB, "
                f"exit {fcode} (read + restricted unpickling only, {args.workers} processes); "
                f"analyze / floor: {wall / fwall:.2f}x wall, {cpu / fcpu:.2f}x CPU"
            )
            if fcode != 0:
                print("  floor failed: " + ftail.strip()[-300:])
        if args.repeat > 1:
            med = statistics.median
            print(
                f"median of {args.repeat}: analyze {med(walls):.2f} s wall, {med(cpus):.2f} s CPU; "
                f"floor {med(fwalls):.2f} s wall, {med(fcpus):.2f} s CPU; analyze / floor "
                f"{med(w / f for w, f in zip(walls, fwalls, strict=True)):.2f}x wall, "
                f"{med(c / f for c, f in zip(cpus, fcpus, strict=True)):.2f}x CPU"
            )
        out = subprocess.run(fd_cmd, capture_output=True, text=True, check=False)
        verdict = json.loads(out.stdout)
        root = verdict["findings"][0]
        print(
            f"  verdict: {root['kind']} culprit {root['culprit_ranks']} group {root['process_group']} "
            f"seq {root['collective_seq_id']} ({'right' if root['culprit_ranks'] == [args.culprit] else 'WRONG'})"
        )
        if args.skip_torch:
            print(f"load average after: {_load()}")
            return 0
        tt_cmd = [sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", "-p", "rank_", str(d)]
        twall, tcpu, trss, tcode, ttail = measure(tt_cmd, args.torch_timeout)
        label = f"{twall:.2f} s" if tcode != -9 else f"> {args.torch_timeout:.0f} s (killed)"
        print(f"torchfrtrace:       {label} wall, {tcpu:.2f} s CPU, peak RSS {trss} MB, exit {tcode}")
        print("  its last words: " + " | ".join(ttail.strip().splitlines()[-3:])[:400])
        print(
            f"speed-up: {twall / wall:.1f}x wall, {tcpu / cpu:.1f}x CPU"
            + (" (at least)" if tcode == -9 else "")
        )
        print(f"load average after: {_load()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
