"""Step-time overhead of the Flightdeck agent on a small gloo training loop.

`python bench/agent_overhead.py [--seconds 30] [--interval-s 1.0]` runs 2 ranks on 127.0.0.1, each
step doing some matmuls and an all_reduce of a 2 MiB tensor, alternately without and with the agent
(interleaved rounds, so that machine drift hits both alike), and prints both step times and the
overhead.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
WORLD = 2
NUMEL = 512 * 1024  # float32: 2 MiB per all_reduce


def rank_main(args: argparse.Namespace) -> None:
    """One rank: warm up, then time steps for `--round-s` seconds; rank 0 prints step times (JSON)."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    if args.agent:
        import flightdeck.agent

        flightdeck.agent.start(interval_s=args.interval_s)
    weights = torch.randn(256, 256)
    grads = torch.ones(NUMEL)

    def step() -> None:
        x = torch.randn(64, 256)
        for _ in range(8):
            x = torch.tanh(x @ weights)
        dist.all_reduce(grads)

    for _ in range(5):
        step()
    # Both ranks must run the same number of steps: rank 0 decides when the round ends, and
    # broadcasts "continue" every 10 steps (a tiny extra collective, identical in both modes).
    flag = torch.ones(1)
    times: list[float] = []
    end = time.monotonic() + args.round_s
    while True:
        for _ in range(10):
            t0 = time.perf_counter()
            step()
            times.append(time.perf_counter() - t0)
        flag.fill_(1.0 if time.monotonic() < end else 0.0)
        dist.broadcast(flag, src=0)
        if flag.item() == 0.0:
            break
    if dist.get_rank() == 0:
        print(json.dumps(times))
    dist.destroy_process_group()


def run_round(agent: bool, round_s: float, interval_s: float, spool: Path) -> list[float]:
    """Run one round of both ranks; the step times rank 0 measured."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(
        os.environ,
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        WORLD_SIZE=str(WORLD),
        OMP_NUM_THREADS="1",
        FLIGHTDECK_AGENT_SPOOL_DIR=str(spool),
        FLIGHTDECK_AGENT_JOB=f"bench-{port}",
        PYTHONPATH=str(REPO_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
    )
    cmd = [
        sys.executable,
        __file__,
        "--rank-main",
        "--round-s",
        str(round_s),
        "--interval-s",
        str(interval_s),
    ]
    cmd += ["--agent"] if agent else []
    procs = [
        subprocess.Popen(cmd, env=dict(env, RANK=str(r)), stdout=subprocess.PIPE, text=True)
        for r in range(WORLD)
    ]
    outs = [p.communicate(timeout=round_s + 120)[0] for p in procs]
    if any(p.returncode for p in procs):
        raise RuntimeError(f"a rank failed: {[p.returncode for p in procs]}")
    times: list[float] = json.loads(outs[0].strip().splitlines()[-1])
    return times


def main() -> int:
    """Interleave rounds without and with the agent; print step times and the overhead."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0, help="total timed seconds, both modes")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per mode")
    parser.add_argument("--interval-s", type=float, default=1.0)
    parser.add_argument("--rank-main", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--agent", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--round-s", type=float, default=5.0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank_main:
        rank_main(args)
        return 0
    round_s = args.seconds / (2 * args.rounds)
    results: dict[bool, list[float]] = {False: [], True: []}
    with tempfile.TemporaryDirectory(prefix="fd-bench-") as spool:
        for _ in range(args.rounds):
            for agent in (False, True):
                results[agent] += run_round(agent, round_s, args.interval_s, Path(spool))
        snapshots = len(list(Path(spool).rglob("rank_*.pkl")))
    base, with_agent = (statistics.mean(results[m]) * 1e3 for m in (False, True))
    base_med, agent_med = (statistics.median(results[m]) * 1e3 for m in (False, True))
    print(f"world {WORLD} (gloo, 127.0.0.1), all_reduce {NUMEL * 4 / 2**20:.0f} MiB + matmuls per step")
    print(f"agent interval {args.interval_s} s, {args.rounds} interleaved rounds of {round_s:.1f} s per mode")
    print(f"without agent: {len(results[False])} steps, mean {base:.3f} ms, median {base_med:.3f} ms")
    print(f"with agent:    {len(results[True])} steps, mean {with_agent:.3f} ms, median {agent_med:.3f} ms")
    mean_pct, median_pct = 100 * (with_agent / base - 1), 100 * (agent_med / base_med - 1)
    print(f"overhead: mean {mean_pct:+.2f} %, median {median_pct:+.2f} %")
    print(f"(agent spool files left at exit: {snapshots})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
