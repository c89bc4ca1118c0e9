"""A small gloo job to be stopped by a signal, run with the agent as the user would:

    torchrun --nproc-per-node 2 -m flightdeck.agent tests/support/signal_job.py --stuck-rank 1

Every rank meets the others in `--steps` all-reduces; then rank `--stuck-rank` enters one more
all-reduce that nobody else joins (blocked in gloo's C++ wait, where no Python signal handler
runs) while the others sleep in Python. Each rank prints `hung` (flushed) once there. With
`--own-handler CODE` each rank installs a SIGTERM handler before `init_process_group` (so before
the agent) that prints `job handler ran` and exits with CODE; with `--ignore-sigterm` SIGTERM is
ignored (SIG_IGN) from the start.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from datetime import timedelta
from types import FrameType


def _own_handler(code: int) -> None:
    def handler(signum: int, frame: FrameType | None) -> None:
        print(f"job handler ran: {signal.Signals(signum).name}", flush=True)
        sys.exit(code)

    signal.signal(signal.SIGTERM, handler)


def main() -> int:
    """Join the job (env://), run the steps, then hang as told until a signal ends it."""
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--stuck-rank", type=int, default=-1, help="-1: every rank sleeps in Python")
    p.add_argument("--own-handler", type=int, default=None, metavar="CODE")
    p.add_argument("--ignore-sigterm", action="store_true")
    p.add_argument("--pg-timeout-s", type=float, default=300.0)
    args = p.parse_args()
    if args.own_handler is not None:
        _own_handler(args.own_handler)
    if args.ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=args.pg_timeout_s))
    rank = dist.get_rank()
    x = torch.ones(8)
    for _ in range(args.steps):
        dist.all_reduce(x)
    print("hung", flush=True)
    if rank == args.stuck_rank:
        dist.all_reduce(x)  # nobody joins: blocked until the group's timeout
    else:
        while True:
            time.sleep(0.1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
