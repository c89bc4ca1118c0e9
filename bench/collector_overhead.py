"""Collector overhead: `python -m bench.collector_overhead [--seconds 60] [--ranks 8] [--rings 4]`.

1. Reader throughput: `read_dump_file` on a real 2,000-entry gloo dump with frames (MB/s).
2. The collector as a real process (`python -m flightdeck collector --config ...`) tailing `--ranks`
   ranks whose agent snapshots every 2 s (simulated here: a real 2,000-entry dump rewritten
   atomically, sidecar first, with the ring advancing ~50 collectives per snapshot and earlier ones
   retiring), plus `--rings` NIXL ring files (format v4) fed by a simulated producer, pushing to a
   local HTTP sink. Reports the collector's CPU (% of one core, from /proc/<pid>/stat) and RSS.

Targets: < 2 % of one core and < 80 MB RSS.
"""

from __future__ import annotations

import argparse
import copy
import gzip
import json
import os
import pickle
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from bench.collector_fixtures import REPO_ROOT, real_dumps
from flightdeck.readers.fr.decode import load_raw
from flightdeck.readers.fr.files import read_dump_file
from flightdeck.spool import RING_META_KEY, RingSplitter, sidecar_path, snapshot_name

TICKS = os.sysconf("SC_CLK_TCK")
PER_SNAPSHOT = 50  # collectives a rank enqueues between two snapshots (25/s)


def reader_throughput(path: Path, seconds: float = 3.0) -> tuple[float, int, float]:
    """(MB/s, entries, ms per read) of read_dump_file on one file."""
    size = path.stat().st_size
    n, start = 0, time.perf_counter()
    entries = 0
    while time.perf_counter() - start < seconds:
        entries = len(read_dump_file(path).entries)
        n += 1
    wall = time.perf_counter() - start
    return size * n / wall / 1e6, entries, wall / n * 1e3


class _Sink(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    batches = 0
    entries = 0
    nixl = 0
    body_bytes = 0

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        doc = json.loads(gzip.decompress(raw))
        cls = type(self)
        cls.batches += 1
        cls.body_bytes += len(raw)
        cls.entries += sum(s["entries"]["n"] for s in doc["snapshots"])
        cls.nixl += len(doc["nixl"])
        data = b'{"accepted": true}'
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class Rank:
    """A simulated agent: a real ring rewritten every interval with progress."""

    def __init__(
        self,
        raw: dict[str, Any],
        meta: dict[str, Any],
        path: Path,
        rank: int,
        frames: bool,
        full_every_s: float,
    ) -> None:
        self.raw = copy.deepcopy(raw)
        if not frames:  # the agent's periodic snapshots are taken without stacks
            for e in self.raw["entries"]:
                e.pop("frames", None)
        self.meta = dict(meta, rank=rank, job="bench", attempt=0)
        self.path = path
        self.template = self.raw["entries"][-PER_SNAPSHOT:]
        self.rank = rank
        self.splitter = RingSplitter(full_every_s)

    def step(self) -> None:
        entries = self.raw["entries"]
        for e in entries[-2 * PER_SNAPSHOT :]:
            e["retired"] = True  # the previous snapshot's collectives finished
        last = entries[-1]
        new = []
        for i, t in enumerate(self.template):
            e = dict(t)
            e["record_id"] = last["record_id"] + 1 + i
            e["collective_seq_id"] = last["collective_seq_id"] + 1 + i
            e["time_created_ns"] = time.time_ns()
            e["retired"] = False
            new.append(e)
        self.raw["entries"] = entries[len(new) :] + new  # the ring drops its oldest
        now = time.time_ns()
        # What the agent writes: the whole ring every `full_every_s`, its recent changes between.
        part = self.splitter.split(self.raw, pickle.dumps(self.raw, protocol=4), now)
        recent = part.ring is not None
        path = (
            self.path.with_name(snapshot_name(self.rank, "periodic", recent=recent)) if recent else self.path
        )
        meta = dict(self.meta, snapshot_time_ns=now, **{RING_META_KEY: part.ring})
        self._write(sidecar_path(path), json.dumps(meta).encode())
        self._write(path, part.data)
        self.splitter.written(part, now)

    @staticmethod
    def _write(path: Path, data: bytes) -> None:
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)


class Ring:
    """A simulated NIXL producer: v4 ring file, transfer events appended as the consumer frees slots."""

    CAP = 4096

    def __init__(self, path: Path) -> None:
        self.path = path
        with open(path, "wb") as f:
            f.write(struct.pack("<QQiiQQ", 0, 0, 4, 4, self.CAP, self.CAP - 1))
            f.write(bytes(16 * self.CAP))

    def emit(self, transfers: int) -> None:
        with open(self.path, "r+b") as f:
            head = f.read(16)
            write_pos, read_pos = struct.unpack("<QQ", head)
            for _ in range(transfers):
                for etype, value in ((7, 12), (6, 340), (0, 65536), (2, 1)):
                    if (write_pos + 1) & (self.CAP - 1) == read_pos:
                        break  # full: NIXL drops silently
                    f.seek(40 + write_pos * 16)
                    f.write(struct.pack("<IIQ", etype, 0, value))
                    write_pos = (write_pos + 1) & (self.CAP - 1)
            f.seek(0)
            f.write(struct.pack("<Q", write_pos))


def proc_cpu_rss(pid: int) -> tuple[float, int, int]:
    """(cpu seconds, RSS kB, peak RSS kB) of a process."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / TICKS
    rss = hwm = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1])
            elif line.startswith("VmHWM:"):
                hwm = int(line.split()[1])
    return cpu, rss, hwm


def overhead(
    seconds: float,
    n_ranks: int,
    n_rings: int,
    *,
    frames: bool,
    interval_s: float = 2.0,
    full_every_s: float = 30.0,
) -> dict[str, float]:
    """Run the collector against simulated ranks and rings; returns the measured figures."""
    dumps = real_dumps()
    raw = load_raw(dumps[0].read_bytes())
    meta = {"flightdeck_snapshot": 1, "kind": "periodic", "world_size": n_ranks, "host": "bench", "pid": 1}
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Sink)
    sthread = threading.Thread(target=server.serve_forever, daemon=True)
    sthread.start()
    tmp = Path(tempfile.mkdtemp(prefix="fd-bench-"))
    try:
        spool = tmp / "spool" / "bench" / "0"
        spool.mkdir(parents=True)
        rings_dir = tmp / "nixl"
        rings_dir.mkdir()
        ranks = [Rank(raw, meta, spool / f"rank_{r}.pkl", r, frames, full_every_s) for r in range(n_ranks)]
        rings = [Ring(rings_dir / f"agent{i}") for i in range(n_rings)]
        for r in ranks:
            r.step()
        cfg = tmp / "collector.toml"
        cfg.write_text(
            f'server_url = "http://127.0.0.1:{server.server_address[1]}"\n'
            f'spool_dirs = ["{tmp / "spool"}"]\n'
            "torch_dump_prefixes = []\n"
            f'state_dir = "{tmp / "state"}"\n'
            + (f'nixl_telemetry_dir = "{rings_dir}"\n' if n_rings else "")
            + 'metrics_listen = ""\nhost = "bench"\npush_interval_s = 2.0\n'
        )
        env = {k: v for k, v in os.environ.items() if not k.startswith("FLIGHTDECK_")}
        env["PYTHONPATH"] = str(REPO_ROOT)
        proc = subprocess.Popen(
            [sys.executable, "-m", "flightdeck", "collector", "--config", str(cfg), "--log-level", "WARNING"],
            env=env,
        )
        try:
            warmup = 2 * interval_s + 1
            t_end = time.monotonic() + warmup + seconds
            measured: tuple[float, float] | None = None
            next_snap = time.monotonic() + interval_s
            while time.monotonic() < t_end:
                now = time.monotonic()
                if measured is None and now >= t_end - seconds:
                    measured = (now, proc_cpu_rss(proc.pid)[0])
                if now >= next_snap:
                    next_snap += interval_s
                    for r in ranks:
                        r.step()
                for ring in rings:
                    ring.emit(5)  # 50 transfers/s per agent at this 0.1 s cadence
                time.sleep(0.1)
            cpu_end, rss, hwm = proc_cpu_rss(proc.pid)
            assert measured is not None
            wall = time.monotonic() - measured[0]
            cpu_pct = 100.0 * (cpu_end - measured[1]) / wall
        finally:
            proc.terminate()
            proc.wait(30)
        return {
            "cpu_pct_one_core": cpu_pct,
            "rss_mb": rss / 1024,
            "peak_rss_mb": hwm / 1024,
            "batches": _Sink.batches,
            "entries": _Sink.entries,
            "nixl_samples": _Sink.nixl,
            "gzip_kb_per_s": _Sink.body_bytes / 1024 / (warmup + seconds),
            "exit_code": proc.returncode,
        }
    finally:
        server.shutdown()
        server.server_close()
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    """Run both measurements and print them."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--ranks", type=int, default=8)
    p.add_argument("--rings", type=int, default=4)
    p.add_argument(
        "--frames", action="store_true", help="periodic snapshots with stacks (the agent writes them without)"
    )
    p.add_argument(
        "--full-every",
        type=float,
        default=30.0,
        help="seconds between whole-ring snapshots, recent changes in between (the agent's "
        "full_every_s; 0: the whole ring every time, as before)",
    )
    args = p.parse_args()
    path = real_dumps()[0]
    mbs, n, ms = reader_throughput(path)
    print(
        f"reader: {mbs:.1f} MB/s on {path.stat().st_size / 1e3:.0f} kB, {n} entries with frames ({ms:.2f} ms/read)"
    )
    res = overhead(args.seconds, args.ranks, args.rings, frames=args.frames, full_every_s=args.full_every)
    print(
        f"collector ({args.ranks} ranks x {n} entries{' with frames' if args.frames else ''} every 2 s, "
        f"whole ring every {args.full_every:g} s, "
        f"{args.rings} NIXL rings, {args.seconds:.0f} s): "
        f"CPU {res['cpu_pct_one_core']:.2f} % of one core, RSS {res['rss_mb']:.1f} MB "
        f"(peak {res['peak_rss_mb']:.1f} MB); shipped {res['entries']:.0f} entries and "
        f"{res['nixl_samples']:.0f} NIXL samples in {res['batches']:.0f} batches "
        f"({res['gzip_kb_per_s']:.1f} kB/s gzip); exit {res['exit_code']:.0f}"
    )


if __name__ == "__main__":
    main()
