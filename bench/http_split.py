"""What splitting the same HTTP requests over two server processes costs by itself on this machine.

A bare ASGI app under uvicorn (httptools and uvloop, as `flightdeck server` runs) parses each
request's JSON body and answers a small JSON document; nothing else. The requests come as the
load generator's digests do at 16,384 ranks (`bench/loadgen --digests`): 2,048 hosts, one
request every 2 s each at its own phase, each over its own keep-alive connection (the load
generator's `Connection`), host h to process h mod n. Runs alternate one and two processes and
report the processes' CPU over the same window of each run, the medians, and the ratio of two
processes' CPU to one's: the part of the two-process figure in docs/capacity.md that comes from
the split alone, not from Flightdeck's work.

    python bench/http_split.py [--hosts 2048] [--interval 2] [--seconds 30] [--runs 3] [--cpus 1]

`--cpus 1` pins every server process to CPU 1 (the generator to the other CPUs); `--cpus 0,1`
gives each process a CPU of its own (process i gets CPU i mod the list). The pins tell apart
what the processes' moves between CPUs and their sharing of one CPU cost.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere
from bench.loadgen.resources import proc_cpu_s
from bench.loadgen.transport import Connection
from flightdeck.launch.demo.ranks import free_port

#: A digest request's size at 16,384 ranks on 2,048 hosts (the load generator: 292 B a request).
BODY = orjson.dumps({"host": "h", "blocks": [{"rank": r, "n": [r * 7, r * 11, r * 13]} for r in range(8)]})


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Parse the body, answer a small JSON document with its length (as the digest route does)."""
    if scope["type"] != "http":
        return
    parts = []
    while True:
        message = await receive()
        parts.append(message.get("body", b""))
        if not message.get("more_body"):
            break
    doc = orjson.loads(b"".join(parts))
    out = orjson.dumps({"ranks": len(doc.get("blocks", [])), "detail": []})
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(out)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": out})


def serve(port: int, cpu: int | None) -> None:
    """Run the bare app on 127.0.0.1:`port` (pinned to `cpu` if given)."""
    import uvicorn

    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    uvicorn.run(
        app, host="127.0.0.1", port=port, log_level="warning", access_log=False, timeout_keep_alive=60
    )


def wait_listening(port: int, timeout_s: float = 30.0) -> None:
    """Return once something accepts connections on 127.0.0.1:`port`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"no server on port {port} after {timeout_s:g} s")


async def drive(ports: list[int], pids: list[int], args: argparse.Namespace) -> dict[str, Any]:
    """Send the requests for `args.warmup` + `args.seconds`; the processes' CPU over the last part."""
    conns = [Connection(f"http://127.0.0.1:{ports[h % len(ports)]}") for h in range(args.hosts)]
    headers = {"content-type": "application/json"}
    done, errors = [0], [0]
    pending: set[asyncio.Task[None]] = set()

    async def post(h: int) -> None:
        try:
            await conns[h].post("/api/v1/digest", headers, BODY)
            done[0] += 1
        except OSError:
            errors[0] += 1

    start = time.monotonic()
    cpu0: list[float] | None = None
    t0 = n0 = 0.0
    k = 0
    while time.monotonic() - start < args.warmup + args.seconds:
        for h in range(args.hosts):
            delay = start + (k + h / args.hosts) * args.interval - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            task = asyncio.ensure_future(post(h))
            pending.add(task)
            task.add_done_callback(pending.discard)
        k += 1
        if cpu0 is None and time.monotonic() - start >= args.warmup:
            cpu0, t0, n0 = [proc_cpu_s(p) for p in pids], time.monotonic(), done[0]
    assert cpu0 is not None
    cpu = [(proc_cpu_s(p) - c) / (time.monotonic() - t0) for p, c in zip(pids, cpu0, strict=True)]
    rate = (done[0] - n0) / (time.monotonic() - t0)
    await asyncio.gather(*pending, return_exceptions=True)
    for c in conns:
        c.close()
    total = sum(cpu)
    return {
        "processes": len(ports),
        "cpu": [round(c, 3) for c in cpu],
        "cpu_total": round(total, 3),
        "requests_per_s": round(rate),
        "us_cpu_per_request": round(total / rate * 1e6) if rate else None,
        "errors": errors[0],
    }


def run(n: int, args: argparse.Namespace) -> dict[str, Any]:
    """One run with `n` server processes."""
    ports = [free_port() for _ in range(n)]
    cmd = [sys.executable, __file__, "--serve"]
    cpus = args.cpus or []
    pins = [["--cpu", str(cpus[i % len(cpus)])] if cpus else [] for i in range(n)]
    procs = [subprocess.Popen([*cmd, str(p), *pin]) for p, pin in zip(ports, pins, strict=True)]
    try:
        for p in ports:
            wait_listening(p)
        return asyncio.run(drive(ports, [p.pid for p in procs], args))
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=30)


def main() -> None:
    """Alternate runs of one and two processes; print each run and the medians as JSON."""
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--hosts", type=int, default=2048, help="simulated hosts (one connection each)")
    ap.add_argument("--interval", type=float, default=2.0, help="seconds between a host's requests")
    ap.add_argument("--seconds", type=float, default=30.0, help="measured seconds of each run")
    ap.add_argument("--warmup", type=float, default=6.0, help="seconds sent before the measured ones")
    ap.add_argument("--runs", type=int, default=3, help="runs of each process count")
    ap.add_argument(
        "--cpus",
        type=lambda v: [int(x) for x in v.split(",")],
        default=None,
        help="pin server process i to CPU i mod this list (e.g. 1, or 0,1)",
    )
    ap.add_argument("--serve", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--cpu", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve is not None:
        serve(args.serve, args.cpu)
        return
    if args.cpus:
        # The generator keeps off the servers' CPUs where others are left.
        others = os.sched_getaffinity(0) - set(args.cpus)
        if others:
            os.sched_setaffinity(0, others)
    runs: dict[int, list[dict[str, Any]]] = {1: [], 2: []}
    for _ in range(args.runs):
        for n in (1, 2):
            r = run(n, args)
            runs[n].append(r)
            print(json.dumps(r), flush=True)
    one = statistics.median(r["cpu_total"] for r in runs[1])
    two = statistics.median(r["cpu_total"] for r in runs[2])
    print(
        json.dumps(
            {
                "median_cpu_one_process": one,
                "median_cpu_two_processes": two,
                "two_over_one": round(two / one, 2) if one else None,
                "pinned_cpus": args.cpus,
            }
        )
    )


if __name__ == "__main__":
    main()
