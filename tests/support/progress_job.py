"""A small gloo training loop for the busy-or-stuck tests, run as the user would:

    torchrun --nproc-per-node 3 -m flightdeck.agent tests/support/progress_job.py --fault busy --busy-s 15

Every step all ranks meet in a barrier and all-reduce. At step `--fault-at-step` rank 0 commits:

- `busy`: `save_checkpoint` computes and writes a file for `--busy-s` seconds, the way a checkpoint
  save looks (CPU time and file writes, its stack moving), then the job goes on to its last step;
- `block`: `next_batch` waits on a queue nobody fills (a dead data-loader worker): no CPU, the same
  stack, until killed.

The others wait in the step's barrier meanwhile. Each rank prints `step N` and the fault's marker
line (flushed), so a test can time the fault.
"""

from __future__ import annotations

import argparse
import os
import queue
import sys
import time
from datetime import timedelta
from pathlib import Path


def save_checkpoint(path: Path, seconds: float) -> int:
    """Compute and write for `seconds`: returns the bytes written."""
    import torch

    w = torch.randn(128, 128)
    written = 0
    deadline = time.monotonic() + seconds
    with open(path, "wb") as f:
        while time.monotonic() < deadline:
            w = torch.tanh(w @ w.T / 128.0)
            written += f.write(w.numpy().tobytes())
            if written % (1 << 20) < 65536:
                f.flush()
                os.fsync(f.fileno())
    return written


def next_batch(source: queue.Queue[object]) -> object:
    """The next batch from the loader's queue (the `block` fault: nobody ever fills it)."""
    return source.get()


def main() -> int:
    """Join the job (env://), train `--steps` steps, commit the fault on rank 0."""
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--fault", choices=("none", "busy", "block"), default="none")
    p.add_argument("--fault-at-step", type=int, default=4)
    p.add_argument("--busy-s", type=float, default=15.0)
    p.add_argument("--step-s", type=float, default=0.2)
    p.add_argument("--pg-timeout-s", type=float, default=120.0)
    p.add_argument("--out", type=Path, default=Path("."))
    args = p.parse_args()
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=args.pg_timeout_s))
    rank = dist.get_rank()
    x = torch.ones(8)
    for step in range(args.steps):
        print(f"step {step}", flush=True)
        if rank == 0 and step == args.fault_at_step:
            if args.fault == "busy":
                print("fault: busy in save_checkpoint", flush=True)
                n = save_checkpoint(args.out / f"ckpt_{rank}.bin", args.busy_s)
                print(f"fault over: wrote {n} bytes", flush=True)
            elif args.fault == "block":
                print("fault: blocked in next_batch", flush=True)
                next_batch(queue.Queue())
        dist.barrier()
        dist.all_reduce(x)
        time.sleep(args.step_s)
    print("done", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
