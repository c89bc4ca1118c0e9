"""How fast a killed job ends on the server, and whether a restart moves its history (issue 20).

Real processes only: `flightdeck up` (server + collector) on temporary folders, and a 4-rank gloo
job under a real `torchrun -m flightdeck.agent` whose rank 0 blocks in its data loader while the
others wait in a barrier (tests/support/progress_job.py --fault block). Once the server says `hung`,
torchrun gets SIGTERM (it forwards it to the ranks: the agent writes their final snapshots, the
collector reports their processes gone). Printed:

- seconds from the SIGTERM to the job's status `failed` with every per-job gauge at 0
  (`flightdeck_job_hang_active` and the others of the job; target < 30 s);
- the job's `last_seen` and `first_seen` drift, and whether its findings changed, after
  `flightdeck up` is stopped and started again on the same folders (target 0, unchanged).

    python -m bench.job_end [--stall-after 5] [--settle-s 10] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import httpx

from flightdeck.launch.demo.ranks import free_port

REPO = Path(__file__).resolve().parents[1]
JOB = "bench-job-end"
#: The per-job gauges that must read 0 once the job has ended.
GAUGES = (
    "flightdeck_job_hang_active",
    "flightdeck_job_mismatch_active",
    "flightdeck_job_culprit_ranks",
    "flightdeck_job_waiting_ranks",
    "flightdeck_job_ranks_lost",
    "flightdeck_job_findings_open",
    "flightdeck_job_oldest_unfinished_elapsed_seconds",
)
T = TypeVar("T")


def wait_for(what: str, cond: Callable[[], T | None], timeout_s: float, poll_s: float = 0.1) -> T:
    """Poll `cond` until it returns something truthy; raise after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = cond()
        if got:
            return got
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(poll_s)


def job_doc(base: str) -> dict[str, Any] | None:
    """GET /api/v1/jobs/<JOB>, None while unknown."""
    try:
        r = httpx.get(f"{base}/api/v1/jobs/{JOB}", timeout=5)
    except httpx.HTTPError:
        return None
    doc: dict[str, Any] | None = r.json() if r.status_code == 200 else None
    return doc


def findings(base: str) -> list[dict[str, Any]]:
    """Every finding episode of the job."""
    out: list[dict[str, Any]] = httpx.get(f"{base}/api/v1/jobs/{JOB}/findings", timeout=5).json()["findings"]
    return out


def job_gauges(base: str) -> dict[str, float]:
    """The job's per-job gauge samples on /metrics (`name{labels}` -> value)."""
    text = httpx.get(f"{base}/metrics", timeout=5).text
    out = {}
    for line in text.splitlines():
        m = re.match(r"^(\w+)\{([^}]*)\} (\S+)$", line)
        if m and m.group(1) in GAUGES and f'job="{JOB}"' in m.group(2):
            out[f"{m.group(1)}{{{m.group(2)}}}"] = float(m.group(3))
    return out


def start_up(root: Path, port: int, stall_after_s: float, log: Any) -> subprocess.Popen[bytes]:
    """`flightdeck up` on `root`'s folders (the same ones on every start)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLIGHTDECK_")}
    env["TORCH_FR_DUMP_TEMP_FILE"] = str(root / "torch" / "comm_lib_trace_rank_")
    env["XDG_CACHE_HOME"] = str(root / "cache")
    cmd = [sys.executable, "-m", "flightdeck", "up", "--port", str(port), "--data-dir", str(root / "data")]
    cmd += ["--spool-dir", str(root / "spool"), "--stall-after", str(stall_after_s)]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    base = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"flightdeck up exited with {proc.returncode}")
        try:
            return httpx.get(f"{base}/healthz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    wait_for("flightdeck up", healthy, 120, 0.2)
    return proc


def start_job(root: Path, log: Any) -> subprocess.Popen[bytes]:
    """torchrun with 4 gloo ranks under the agent; rank 0 blocks in next_batch at step 4."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLIGHTDECK_")}
    env.update(
        FLIGHTDECK_AGENT_SPOOL_DIR=str(root / "spool"),
        FLIGHTDECK_AGENT_JOB=JOB,
        TORCH_FR_DUMP_TEMP_FILE=str(root / "torch" / "comm_lib_trace_rank_"),
        PYTHONPATH=os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]),
    )
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "4"]
    cmd += [
        "--master-port",
        str(free_port()),
        "-m",
        "flightdeck.agent",
        str(REPO / "tests" / "support" / "progress_job.py"),
    ]
    cmd += ["--steps", "100000", "--fault", "block", "--fault-at-step", "4", "--out", str(root)]
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=root)


def stop(proc: subprocess.Popen[bytes], timeout_s: float = 60) -> None:
    """SIGTERM, then SIGKILL after `timeout_s`."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def main(argv: list[str] | None = None) -> int:
    """Run the scenario; print the figures as JSON lines; 0 when both targets are met."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--stall-after", type=float, default=5.0, help="the server's hang threshold (s)")
    p.add_argument("--settle-s", type=float, default=10.0, help="seconds to watch after the restart")
    p.add_argument("--keep", type=Path, default=None, help="run in this folder and keep it (logs)")
    args = p.parse_args(argv)
    root = args.keep or Path(tempfile.mkdtemp(prefix="fd-job-end-"))
    root.mkdir(parents=True, exist_ok=True)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    up_log = open(root / "up.log", "ab")  # noqa: SIM115 (closed in finally)
    job_log = open(root / "job.log", "ab")  # noqa: SIM115
    up = job = None
    result: dict[str, Any] = {"stall_after_s": args.stall_after}
    try:
        up = start_up(root, port, args.stall_after, up_log)
        job = start_job(root, job_log)
        wait_for("the hang", lambda: (d := job_doc(base)) is not None and d["status"] == "hung", 180, 0.2)
        result["gauges_while_hung"] = job_gauges(base)
        sigterm = time.monotonic()
        job.send_signal(signal.SIGTERM)

        def ended() -> bool:
            d = job_doc(base)
            g = job_gauges(base)
            return d is not None and d["status"] == "failed" and bool(g) and not any(g.values())

        wait_for("failed with gauges at 0", ended, 120, 0.05)
        result["sigterm_to_failed_gauges_0_s"] = round(time.monotonic() - sigterm, 2)
        job.wait(60)
        result["torchrun_exit"] = job.returncode
        time.sleep(2.0)  # a few push intervals: whatever is still on its way arrives
        before, hist_before = job_doc(base), findings(base)
        assert before is not None
        result["ended"] = {k: before[k] for k in ("status", "first_seen_s", "last_seen_s", "ended_at_s")}
        result["findings"] = [
            (h["kind"], h["resolution"], h["finding"].get("elapsed_s")) for h in hist_before
        ]

        stop(up)
        up = start_up(root, port, args.stall_after, up_log)
        time.sleep(args.settle_s)
        after, hist_after = job_doc(base), findings(base)
        assert after is not None
        result["last_seen_drift_s"] = round(after["last_seen_s"] - before["last_seen_s"], 3)
        result["first_seen_drift_s"] = round(after["first_seen_s"] - before["first_seen_s"], 3)
        result["status_after_restart"] = after["status"]
        result["findings_unchanged"] = hist_after == hist_before
        ok = (
            result["sigterm_to_failed_gauges_0_s"] < 30
            and result["last_seen_drift_s"] == 0
            and result["first_seen_drift_s"] == 0
            and result["findings_unchanged"]
        )
        result["targets_met"] = ok
        print(json.dumps(result, indent=1))
        return 0 if ok else 1
    finally:
        for proc in (job, up):
            if proc is not None:
                stop(proc)
        up_log.close()
        job_log.close()
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
