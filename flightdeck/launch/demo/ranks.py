"""Start ranks of the demo job as separate interpreters.

Separate interpreters (not torch.multiprocessing) because multiprocessing children leave through
`os._exit`, which skips atexit, and so would never write the agent's final snapshot.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

#: Variables a launcher sets that must not leak from the caller into the demo's ranks.
_LAUNCHER_PREFIXES = ("FLIGHTDECK_", "TORCHELASTIC_", "SLURM_", "MASTER_", "RANK", "WORLD_SIZE", "LOCAL_RANK")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on `host` that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


@dataclass(frozen=True, slots=True)
class JobSpec:
    """Where the job rendezvouses and what every rank runs."""

    job: str
    world_size: int
    master_addr: str
    master_port: int
    spool_dir: Path
    worker_args: Sequence[str] = ()
    #: the agent's FLIGHTDECK_AGENT_INTERVAL_S; None: the agent's default (the agent has no hang
    #: threshold: that is the server's FLIGHTDECK_SERVER_STALL_AFTER_S alone)
    interval_s: float | None = 1.0
    extra_env: Mapping[str, str] = field(default_factory=dict)


def rank_env(spec: JobSpec, rank: int, local_rank: int, spool_dir: Path | None = None) -> dict[str, str]:
    """The environment of one rank: the caller's, minus launcher variables, plus the job's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_LAUNCHER_PREFIXES)}
    env.update(
        MASTER_ADDR=spec.master_addr,
        MASTER_PORT=str(spec.master_port),
        WORLD_SIZE=str(spec.world_size),
        RANK=str(rank),
        LOCAL_RANK=str(local_rank),
        FLIGHTDECK_AGENT_SPOOL_DIR=str(spool_dir or spec.spool_dir),
        FLIGHTDECK_AGENT_JOB=spec.job,
        OMP_NUM_THREADS="1",
    )
    if spec.interval_s is not None:
        env["FLIGHTDECK_AGENT_INTERVAL_S"] = str(spec.interval_s)
    env.update(spec.extra_env)
    return env


def start_rank(
    spec: JobSpec,
    rank: int,
    *,
    local_rank: int | None = None,
    spool_dir: Path | None = None,
    prefix: Sequence[str] = (),
    log: IO[bytes] | None = None,
) -> subprocess.Popen[bytes]:
    """Start one rank (`prefix` runs it elsewhere, e.g. `ip netns exec HOST`); output to `log`."""
    cmd = [*prefix, sys.executable, "-m", "flightdeck.launch.demo.worker", *spec.worker_args]
    env = rank_env(spec, rank, rank if local_rank is None else local_rank, spool_dir)
    return subprocess.Popen(cmd, env=env, stdout=log or subprocess.DEVNULL, stderr=subprocess.STDOUT)


def start_ranks(
    spec: JobSpec, ranks: Iterable[int], logs: Mapping[int, IO[bytes]]
) -> dict[int, subprocess.Popen[bytes]]:
    """Start `ranks` on this host, each logging to `logs[rank]`."""
    return {rank: start_rank(spec, rank, log=logs.get(rank)) for rank in ranks}


def stop_all(procs: Iterable[subprocess.Popen[bytes]], timeout_s: float = 5.0) -> None:
    """Kill what is still running (SIGCONT first, so that a stopped process can die) and reap it."""
    procs = list(procs)
    for proc in procs:
        if proc.poll() is None:
            for sig in (signal.SIGCONT, signal.SIGKILL):
                try:
                    proc.send_signal(sig)
                except ProcessLookupError:
                    break
    for proc in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=timeout_s)
