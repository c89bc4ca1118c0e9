"""One rank of the demo job: `python -m flightdeck.launch.demo.worker [--fault KIND --fault-rank R ...]`.

A small training loop over gloo (env:// rendezvous: MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE)
with the Flightdeck agent started right after `init_process_group`. Two process groups take part,
like data parallelism with a sharded optimizer: every step all-reduces a gradient bucket over the
world, and every `gather_every` steps each half of the job all-gathers its metrics.

Faults the rank `--fault-rank` commits at step `--fault-at-step`:

- `stall`: it blocks in its data loader for `--stall-s` seconds (a hung storage read or kernel);
  the others wait in the step's all-reduce. (`SIGSTOP` from outside is the other way to stall.)
- `crash`: it kills itself with SIGKILL, leaving no exit handler to run.
- `mismatch`: it takes another code path: an all-gather where the others all-reduce.
- `busy`: not a fault: it saves a checkpoint for `--busy-s` seconds (computing and writing a file,
  as a real save does) while the others wait in a barrier; then every rank goes on training. The
  job's process-group timeout is then at least `busy_pg_timeout_s(--busy-s)` (600 s, or 3 x the
  busy time when longer): the server treats a rank still busy after half the group's timeout (its
  default slow ceiling) as hung, and gloo aborts the barrier at the timeout itself, so a 120 s
  timeout would turn a 90 s save into a hang at 60 s and an abort at 120 s.
- `none`: nothing; healthy runs, and faults injected from outside (SIGSTOP, link down).

Each rank prints `step N` (flushed) as it starts step N, so an outside injector can time a fault.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time
from datetime import timedelta
from typing import Any

FAULTS = ("none", "stall", "crash", "mismatch", "busy")
#: The process-group timeout when `--pg-timeout-s` is not given (and there is no busy phase).
PG_TIMEOUT_S = 120.0


def busy_pg_timeout_s(busy_s: float) -> float:
    """The least process-group timeout for a busy phase of `busy_s` seconds.

    The server's default slow ceiling is half the group's timeout: past it a busy rank is reported
    as hung (and pages). 3 x the busy time keeps the ceiling 1.5 x the phase away, with room for a
    loaded machine; never under 600 s, so that the shipped 90 s and 3-minute scenarios share one.
    """
    return max(600.0, 3.0 * busy_s)


def pg_timeout_s(args: argparse.Namespace) -> float:
    """The job's process-group timeout: `--pg-timeout-s`, else PG_TIMEOUT_S, raised for `busy` to
    `busy_pg_timeout_s` (a given timeout too short for the busy phase is raised, with a warning)."""
    timeout = PG_TIMEOUT_S if args.pg_timeout_s is None else args.pg_timeout_s
    if args.fault == "busy" and timeout < 2.0 * args.busy_s:
        if args.pg_timeout_s is not None:
            print(
                f"--pg-timeout-s {timeout:g} is under twice --busy-s {args.busy_s:g}: the busy rank would "
                f"be a hang at half of it; using {busy_pg_timeout_s(args.busy_s):g} s",
                file=sys.stderr,
                flush=True,
            )
        timeout = busy_pg_timeout_s(args.busy_s)
    return timeout


class Trainer:
    """The state of one rank: its groups and the model-ish tensors it computes with."""

    def __init__(self, args: argparse.Namespace) -> None:
        import torch
        import torch.distributed as dist

        self.args = args
        self.rank = dist.get_rank()
        world = dist.get_world_size()
        half = max(world // 2, 1)
        halves = [list(range(0, half)), list(range(half, world))] if world > 1 else [[0]]
        self.shard_group: Any = None
        # new_group is collective over the world: every rank creates every group, in order.
        for index, members in enumerate(h for h in halves if h):
            group = dist.new_group(
                members, timeout=timedelta(seconds=pg_timeout_s(args)), group_desc=f"shard{index}"
            )
            if self.rank in members:
                self.shard_group = group
        self.weights = torch.randn(64, 64)

    def load_batch(self, step: int) -> Any:
        """Read the next batch; the `stall` fault blocks here, as a hung storage read would."""
        import torch

        if self._faulty(step, "stall"):
            print(
                f"rank {self.rank}: stalling in load_batch for {self.args.stall_s}s",
                file=sys.stderr,
                flush=True,
            )
            time.sleep(self.args.stall_s)
        return torch.randn(32, 64)

    def forward_backward(self, batch: Any) -> Any:
        """A little real compute, then a pause standing in for the rest of the step."""
        import torch

        x = batch
        for _ in range(4):
            x = torch.tanh(x @ self.weights)
        time.sleep(self.args.step_s)
        return x.sum(dim=0)

    def sync_grads(self, grads: Any, step: int) -> None:
        """Average the gradient bucket over the world (the `mismatch` rank all-gathers instead)."""
        import torch
        import torch.distributed as dist

        if self._faulty(step, "mismatch"):
            print(f"rank {self.rank}: taking another code path (all_gather)", file=sys.stderr, flush=True)
            out = torch.empty(grads.numel() * dist.get_world_size(), dtype=grads.dtype)
            dist.all_gather_into_tensor(out, grads)
            return
        dist.all_reduce(grads)

    def gather_metrics(self, loss: Any) -> None:
        """All-gather the step's loss within this rank's shard group."""
        import torch
        import torch.distributed as dist

        size = dist.get_world_size(self.shard_group)
        out = torch.empty(size, dtype=torch.float32)
        dist.all_gather_into_tensor(out, loss.reshape(1).float(), group=self.shard_group)

    def save_checkpoint(self, step: int) -> None:
        """The `busy` step: the busy rank computes and writes for `--busy-s` s, then all meet in a
        barrier (the way a rank-0 checkpoint save looks to the others)."""
        import torch.distributed as dist

        a = self.args
        if self._faulty(step, "busy"):
            print(f"rank {self.rank}: busy in save_checkpoint for {a.busy_s}s", file=sys.stderr, flush=True)
            _busy_writing(self.weights, a.busy_s)
            print(f"rank {self.rank}: checkpoint saved", file=sys.stderr, flush=True)
        dist.barrier()

    def train_step(self, step: int) -> None:
        """One step: batch, compute, gradient sync, and now and then a metrics gather."""
        if self.args.fault == "busy" and step == self.args.fault_at_step:
            self.save_checkpoint(step)
        if self._faulty(step, "crash"):
            print(f"rank {self.rank}: crashing (SIGKILL)", file=sys.stderr, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        grads = self.forward_backward(self.load_batch(step))
        self.sync_grads(grads, step)
        if step % self.args.gather_every == 0:
            self.gather_metrics(grads.sum())

    def _faulty(self, step: int, kind: str) -> bool:
        a = self.args
        return bool(a.fault == kind and self.rank == a.fault_rank and step == a.fault_at_step)


def _busy_writing(weights: Any, seconds: float) -> None:
    """Compute and write a checkpoint-sized file over and over for `seconds` (CPU time grows, the
    stack changes, the file is rewritten: bounded at 1 MiB, in a temporary directory)."""
    import torch

    deadline = time.monotonic() + seconds
    with tempfile.TemporaryDirectory(prefix="flightdeck-demo-ckpt-") as tmp:
        path = os.path.join(tmp, "checkpoint.bin")
        w = weights
        while time.monotonic() < deadline:
            for _ in range(8):
                w = torch.tanh(w @ weights)
            with open(path, "wb") as f:
                chunk = w.numpy().tobytes()  # 16 KiB
                for _ in range(64):
                    f.write(chunk)
                f.flush()
                os.fsync(f.fileno())


def build_parser() -> argparse.ArgumentParser:
    """The worker's options (the demo command and the acceptance harness pass them through)."""
    p = argparse.ArgumentParser(
        prog="python -m flightdeck.launch.demo.worker", description=__doc__.splitlines()[0]
    )
    p.add_argument("--steps", type=int, default=60, help="training steps to run")
    p.add_argument("--step-s", type=float, default=0.1, help="seconds of pretend compute per step")
    p.add_argument("--gather-every", type=int, default=5, help="all-gather metrics every N steps")
    p.add_argument("--fault", choices=FAULTS, default="none", help="the fault to commit")
    p.add_argument("--fault-rank", type=int, default=1, help="the rank that commits it")
    p.add_argument("--fault-at-step", type=int, default=10, help="the step at which it does")
    p.add_argument("--stall-s", type=float, default=3600.0, help="how long a `stall` blocks")
    p.add_argument("--busy-s", type=float, default=90.0, help="how long the `busy` rank saves")
    p.add_argument(
        "--pg-timeout-s",
        type=float,
        default=None,
        help=f"process-group timeout (s; default {PG_TIMEOUT_S:g}; with --fault busy at least twice --busy-s)",
    )
    p.add_argument("--no-agent", action="store_true", help="run without the Flightdeck agent")
    return p


def main(argv: list[str] | None = None) -> int:
    """Join the job (env://), start the agent, train; exit 0 when every step ran."""
    args = build_parser().parse_args(argv)
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=pg_timeout_s(args)))
    if not args.no_agent:
        import flightdeck.agent

        flightdeck.agent.start()
    trainer = Trainer(args)
    for step in range(args.steps):
        print(f"step {step}", flush=True)
        trainer.train_step(step)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
