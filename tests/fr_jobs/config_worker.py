"""A small real gloo job whose ranks may start with different settings (issue 9: config skew).

`python -m flightdeck.agent -m tests.fr_jobs.config_worker --steps N` runs one rank: env://
rendezvous with the world timeout `FDTEST_WORLD_TIMEOUT_S` (default 20 s), the pair groups of
`scenarios.PAIRS` created with `FDTEST_PAIR_TIMEOUT_S` (unset: `new_group`'s own default, 30 min,
which is exactly the mistake the config-skew rules catch), then a few all-reduces on both.
`run_config_job` starts all ranks with per-rank environment overrides and waits for them.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path

from flightdeck.launch.demo.ranks import free_port
from tests.fr_jobs.runner import REPO_ROOT, JobResult
from tests.fr_jobs.scenarios import PAIRS


def main(argv: list[str] | None = None) -> int:
    """One rank: join, create the pair groups, all-reduce on the world and the rank's pair."""
    import torch
    import torch.distributed as dist

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    world_timeout = timedelta(seconds=float(os.environ.get("FDTEST_WORLD_TIMEOUT_S", "20")))
    dist.init_process_group("gloo", timeout=world_timeout)
    rank = dist.get_rank()
    pair_timeout = os.environ.get("FDTEST_PAIR_TIMEOUT_S")
    mine = None
    for desc, members in PAIRS:
        kwargs = {"timeout": timedelta(seconds=float(pair_timeout))} if pair_timeout else {}
        group = dist.new_group(list(members), group_desc=desc, **kwargs)  # type: ignore[arg-type]
        if rank in members:
            mine = group
    for _ in range(args.steps):
        t = torch.ones(64)
        dist.all_reduce(t)
        dist.all_reduce(t, group=mine)
        time.sleep(0.05)
    # Let the agent take a periodic snapshot with the groups still registered.
    time.sleep(float(os.environ.get("FLIGHTDECK_AGENT_INTERVAL_S", "0.3")) * 2)
    dist.barrier()
    dist.destroy_process_group()
    return 0


def run_config_job(
    name: str,
    spool_dir: Path,
    *,
    world_size: int = 4,
    rank_env: Mapping[int, Mapping[str, str]] | None = None,
    steps: int = 8,
    interval_s: float = 0.3,
    deadline_s: float = 90.0,
) -> JobResult:
    """Run every rank under the agent's launcher, rank r with `rank_env[r]` on top of the base env."""
    port = free_port()
    base = {
        k: v for k, v in os.environ.items() if not k.startswith(("FLIGHTDECK_", "TORCHELASTIC_", "SLURM_"))
    }
    # Only what this test sets: the runner's environment must not leak TORCH_*/NCCL_* settings in.
    base = {k: v for k, v in base.items() if not k.startswith(("TORCH_", "NCCL_"))}
    base.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        WORLD_SIZE=str(world_size),
        FLIGHTDECK_AGENT_SPOOL_DIR=str(spool_dir),
        FLIGHTDECK_AGENT_JOB=name,
        FLIGHTDECK_AGENT_INTERVAL_S=str(interval_s),
        PYTHONPATH=str(REPO_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        OMP_NUM_THREADS="1",
    )
    cmd = [
        sys.executable,
        "-m",
        "flightdeck.agent",
        "-m",
        "tests.fr_jobs.config_worker",
        "--steps",
        str(steps),
    ]
    procs: dict[int, subprocess.Popen[bytes]] = {}
    logs: dict[int, tempfile._TemporaryFileWrapper[bytes]] = {}
    start = time.monotonic()
    try:
        for rank in range(world_size):
            env = dict(base, RANK=str(rank), LOCAL_RANK=str(rank), **(rank_env or {}).get(rank, {}))
            logs[rank] = tempfile.NamedTemporaryFile(prefix=f"cfg-rank{rank}-", suffix=".log")  # noqa: SIM115
            procs[rank] = subprocess.Popen(
                cmd, env=env, cwd=REPO_ROOT, stdout=logs[rank], stderr=subprocess.STDOUT
            )
        codes: dict[int, int | None] = {}
        for rank, proc in procs.items():
            try:
                codes[rank] = proc.wait(timeout=max(deadline_s - (time.monotonic() - start), 0.1))
            except subprocess.TimeoutExpired:
                codes[rank] = None
        out = {}
        for rank, log in logs.items():
            log.seek(0)
            out[rank] = log.read().decode(errors="replace")
        return JobResult(codes, out, time.monotonic() - start, spool_dir / name / "0")
    finally:
        for proc in procs.values():  # past the deadline: only the processes we started
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                proc.wait()
        for log in logs.values():
            log.close()


if __name__ == "__main__":
    raise SystemExit(main())
