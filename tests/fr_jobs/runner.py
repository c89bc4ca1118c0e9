"""Start the ranks of a scenario job as separate interpreters and wait for them, within a deadline.

Separate interpreters (not torch.multiprocessing) because multiprocessing children leave through
`os._exit`, which skips atexit, and so would never write the agent's final snapshot.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from flightdeck.launch.demo.ranks import free_port
from tests.fr_jobs.scenarios import Scenario

REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True, slots=True)
class JobResult:
    """What the ranks did: exit codes (negative: killed by that signal; None: killed by us)."""

    returncodes: dict[int, int | None]
    stderr: dict[int, str]
    wall_s: float
    spool: Path


def run_job(
    scenario: Scenario,
    spool_dir: Path,
    *,
    interval_s: float = 0.4,
    pg_timeout_s: float = 6.0,
    leave_s: float | None = None,
    compute_s: float = 0.03,
    deadline_s: float = 45.0,
    agent: str = "launcher",
    extra_env: Mapping[str, str] | None = None,
) -> JobResult:
    """Run every rank of `scenario` with the agent spooling into `spool_dir/<scenario>/0/`.

    Each rank also writes PyTorch's own JSON dump on its way out to `spool_dir/<scenario>.json/`.
    A scenario's own `pg_timeout_s` / `deadline_s` replace the defaults (big jobs on small machines).
    A scenario with raw dumps (`dump_mode` "exit" / "timed") runs without the agent; its ranks write
    PyTorch's own dumps into `spool_dir/<scenario>/raw/`, which is then the result's `spool`.
    """
    if scenario.pg_timeout_s is not None:
        pg_timeout_s = scenario.pg_timeout_s
    if scenario.deadline_s is not None:
        deadline_s = max(deadline_s, scenario.deadline_s)
    port = free_port()
    raw = scenario.dump_mode != "agent"
    if raw:
        agent = "none"
    base_env = {
        k: v for k, v in os.environ.items() if not k.startswith(("FLIGHTDECK_", "TORCHELASTIC_", "SLURM_"))
    }
    base_env.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        WORLD_SIZE=str(scenario.world_size),
        TORCH_FR_BUFFER_SIZE=str(scenario.fr_buffer_size),
        FLIGHTDECK_AGENT_SPOOL_DIR=str(spool_dir),
        FLIGHTDECK_AGENT_JOB=scenario.name,
        FLIGHTDECK_AGENT_INTERVAL_S=str(interval_s),
        PYTHONPATH=str(REPO_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        OMP_NUM_THREADS="1",
        FDTEST_JSON_DIR=str(spool_dir / f"{scenario.name}.json"),
    )
    raw_dir = spool_dir / scenario.name / "raw"
    if raw:
        base_env["FDTEST_RAW_DIR"] = str(raw_dir)
    base_env.update(extra_env or {})
    worker = [
        "-m",
        "tests.fr_jobs.worker",
        "--scenario",
        scenario.name,
        "--pg-timeout-s",
        str(pg_timeout_s),
        "--leave-s",
        str(leave_s if leave_s is not None else pg_timeout_s + 3.0),
        "--compute-s",
        str(compute_s),
        "--agent",
        agent,
        *(["--pair-timeout-s", str(scenario.pair_timeout_s)] if scenario.pair_timeout_s else []),
    ]
    cmd = [sys.executable, *(["-m", "flightdeck.agent"] if agent == "launcher" else []), *worker]
    procs: dict[int, subprocess.Popen[bytes]] = {}
    logs: dict[int, tempfile._TemporaryFileWrapper[bytes]] = {}
    start = time.monotonic()
    try:
        for rank in range(scenario.world_size):
            env = dict(base_env, RANK=str(rank), LOCAL_RANK=str(rank))
            logs[rank] = tempfile.NamedTemporaryFile(prefix=f"rank{rank}-", suffix=".log")  # noqa: SIM115
            procs[rank] = subprocess.Popen(
                cmd, env=env, cwd=REPO_ROOT, stdout=logs[rank], stderr=subprocess.STDOUT
            )
        codes: dict[int, int | None] = {}
        for rank, proc in procs.items():
            left = deadline_s - (time.monotonic() - start)
            try:
                codes[rank] = proc.wait(timeout=max(left, 0.1))
            except subprocess.TimeoutExpired:
                codes[rank] = None
        stderr = {}
        for rank, log in logs.items():
            log.seek(0)
            stderr[rank] = log.read().decode(errors="replace")
        spool = raw_dir if raw else spool_dir / scenario.name / "0"
        return JobResult(codes, stderr, time.monotonic() - start, spool)
    finally:
        for proc in procs.values():  # stragglers past the deadline: only the processes we started
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                proc.wait()
        for log in logs.values():
            log.close()
