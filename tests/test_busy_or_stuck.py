"""Busy or stuck, end to end on real processes: a 3-rank gloo job under
`torchrun -m flightdeck.agent` -> `flightdeck collector` -> `flightdeck server` (SQLite, its
webhook outbox posting to a receiver here).

Rank 0 either keeps computing and writing (a checkpoint save) or blocks on a queue while ranks 1-2
wait in a barrier. The server runs with its shipped `stall_after_s` (5 s) and the agents and the
collector with their default intervals; only the ceiling test lowers one setting (labelled). Times
from the fault to the finding are printed (`-s`), never asserted.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from flightdeck.launch.demo.ranks import free_port
from tests.support.api_client import get, job_report
from tests.support.cli import FLIGHTDECK, clean_env, collector_env, create_token
from tests.support.server_process import ServerProcess
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
torch = pytest.importorskip("torch", reason="these tests run a real gloo job")

JOB_SCRIPT = Path(__file__).parent / "support" / "progress_job.py"
REPO = Path(__file__).resolve().parents[1]


@dataclass
class Receiver:
    """Webhook events (`finding.opened` / `finding.resolved` bodies) as they arrive."""

    events: list[dict[str, Any]] = field(default_factory=list)
    arrived: list[float] = field(default_factory=list)

    def opened(self, kind: str) -> list[dict[str, Any]]:
        """The findings opened of `kind`, in order of arrival."""
        return [
            e["finding"]
            for e in self.events
            if e["event"] == "finding.opened" and e["finding"]["kind"] == kind
        ]


@contextlib.contextmanager
def receiver() -> Iterator[tuple[Receiver, str]]:
    """A webhook receiver on 127.0.0.1: (what it got, its URL)."""
    got = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            got.events.append(json.loads(body))
            got.arrived.append(time.monotonic())
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield got, f"http://127.0.0.1:{httpd.server_address[1]}/hook"
    finally:
        httpd.shutdown()
        httpd.server_close()


@dataclass
class Stack:
    """A running server and collector watching `spool`."""

    base: str
    token: str
    spool: Path
    hooks: Receiver


@contextlib.contextmanager
def control_plane(tmp_path: Path, *, digests: bool = False, **server_settings: str) -> Iterator[Stack]:
    """`flightdeck server` (shipped defaults, plus `server_settings`) and `flightdeck collector`;
    `digests`: the collector puts this 3-rank job on progress digests (`digest_from_ranks` 1: the
    default, 2,048, would put only large jobs there), as it does a large job's ranks."""
    env = clean_env()
    with receiver() as (hooks, url):
        server_env = {
            **env,
            "FLIGHTDECK_SERVER_DATA_DIR": str(tmp_path / "data"),
            "FLIGHTDECK_SERVER_WEBHOOK_URLS": json.dumps([url]),
            **{f"FLIGHTDECK_SERVER_{k.upper()}": v for k, v in server_settings.items()},
        }
        (tmp_path / "data").mkdir()
        with ServerProcess(server_env, tmp_path / "server.log") as server:
            token = create_token(server.env, "busy")
            (tmp_path / "token").write_text(token)
            spool = tmp_path / "spool"
            spool.mkdir()
            collector_vars = collector_env(env, server.url, tmp_path, spool)
            if digests:
                collector_vars["FLIGHTDECK_COLLECTOR_DIGEST_FROM_RANKS"] = "1"
            server.start()
            with open(tmp_path / "collector.log", "wb") as log:
                collector = subprocess.Popen(
                    [*FLIGHTDECK, "collector"], env=collector_vars, stdout=log, stderr=subprocess.STDOUT
                )
            try:
                yield Stack(server.url, token, spool, hooks)
            finally:
                collector.send_signal(signal.SIGTERM)
                try:
                    collector.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    collector.kill()
                    collector.wait()


@dataclass
class Job:
    """A running torchrun job: its process (a session of its own) and its output."""

    proc: subprocess.Popen[bytes]
    log: Path

    def text(self) -> str:
        """Everything the ranks printed so far."""
        return self.log.read_bytes().decode(errors="replace")

    def kill(self) -> None:
        """Kill torchrun and its ranks: its session, and the ranks by their command line (torch
        starts each rank in a session of its own, and a rank blocked in a collective outlives
        torchrun)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)
        mark = f"--out\0{self.log.parent}\0".encode()
        for pid in filter(str.isdigit, os.listdir("/proc")):
            with contextlib.suppress(OSError):
                if mark in Path(f"/proc/{pid}/cmdline").read_bytes():
                    os.kill(int(pid), signal.SIGKILL)


@contextlib.contextmanager
def torchrun(stack: Stack, tmp_path: Path, job: str, *args: str) -> Iterator[Job]:
    """`torchrun --nproc-per-node 3 -m flightdeck.agent tests/support/progress_job.py ARGS` with the agent's
    default settings, spooling where the collector watches."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("FLIGHTDECK_", "TORCHELASTIC_", "MASTER_", "RANK", "WORLD_SIZE", "LOCAL_RANK"))
    }
    env.update(
        FLIGHTDECK_AGENT_SPOOL_DIR=str(stack.spool),
        FLIGHTDECK_AGENT_JOB=job,
        OMP_NUM_THREADS="1",
        PYTHONPATH=str(REPO) + os.pathsep + env.get("PYTHONPATH", ""),
    )
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "3", "--nnodes", "1"]
    cmd += ["--master-addr", "127.0.0.1", "--master-port", str(free_port()), "--monitor-interval", "0.5"]
    cmd += ["-m", "flightdeck.agent", str(JOB_SCRIPT), "--out", str(tmp_path), *args]
    log = tmp_path / f"{job}.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    running = Job(proc, log)
    try:
        yield running
    finally:
        # Even when torchrun has exited: a rank blocked in a collective outlives it, in its group.
        running.kill()


def _findings(stack: Stack, job: str, kind: str) -> list[dict[str, Any]]:
    report = job_report(stack.base, job, stack.token) or {}
    return [f for f in report.get("findings", []) if f["kind"] == kind]


def _history(stack: Stack, job: str) -> list[dict[str, Any]]:
    status, body = get(f"{stack.base}/api/v1/jobs/{job}/findings", stack.token)
    assert status == 200, body
    return list(json.loads(body)["findings"])


@pytest.mark.parametrize("digests", [False, True], ids=["entries", "digests"])
def test_a_busy_rank_is_slow_not_hung_and_the_job_goes_on(tmp_path: Path, digests: bool) -> None:
    """Rank 0 computes and writes for 15 s (3x stall_after) while ranks 1-2 wait in the barrier:
    a slow_rank finding names rank 0 and save_checkpoint; no hang, ever; the job then finishes.
    The same whether the collector ships every entry or the job is on digests."""
    with (
        control_plane(tmp_path, digests=digests) as stack,
        torchrun(stack, tmp_path, "busy-job", "--fault", "busy", "--busy-s", "15") as job,
    ):
        wait_until(lambda: "fault: busy in save_checkpoint" in job.text(), 120, "the busy phase", 0.05)
        busy_at = time.monotonic()
        slow = wait_until(lambda: _findings(stack, "busy-job", "slow_rank"), 60, "the slow_rank finding")[0]
        print(
            f"\n[busy, {'digests' if digests else 'entries'}] slow_rank finding in the API "
            f"{time.monotonic() - busy_at:.1f} s after the busy phase began"
        )
        assert slow["culprit_ranks"] == [0] and slow["waiting_ranks"] == [1, 2]
        assert slow["op"] == "barrier" and slow["process_group"] == "0"
        assert "rank 0 is busy in save_checkpoint (progress_job.py:" in slow["detail"], slow["detail"]
        assert "ranks 1, 2 wait in barrier (group 0, collective_seq_id" in slow["detail"]
        assert any(f["name"] == "save_checkpoint" for f in slow["culprit_frames"]), slow["culprit_frames"]
        # What a user would copy off the nodes while it is slow, for `flightdeck analyze`: well
        # past stall_after (offline, "now" is the newest snapshot in the copy).
        wait_until(
            lambda: any((f["elapsed_s"] or 0) >= 8 for f in _findings(stack, "busy-job", "slow_rank")),
            30,
            "8 s of waiting",
        )
        copy = tmp_path / "copied"
        shutil.copytree(stack.spool / "busy-job", copy, ignore=shutil.ignore_patterns(".*"))
        assert job.proc.wait(timeout=120) == 0, job.text()[-3000:]
        assert "fault over" in job.text()
        # Everything the server ever opened for the job, and every webhook it sent: no hang.
        wait_until(lambda: stack.hooks.opened("slow_rank"), 30, "the slow_rank webhook")
        history = _history(stack, "busy-job")
        kinds = {f["kind"] for f in history}
        assert "slow_rank" in kinds and "hang" not in kinds and "rank_lost" not in kinds, history
        assert not stack.hooks.opened("hang")
        # Once the job went on, the slow finding was resolved.
        wait_until(lambda: not _findings(stack, "busy-job", "slow_rank"), 30, "the slow finding resolved")
    # Offline, the same rule on the copied sidecars (judged as of their newest snapshot).
    res = subprocess.run(
        [*FLIGHTDECK, "analyze", "--format", "json", str(copy)], capture_output=True, text=True, timeout=120
    )
    offline = json.loads(res.stdout)["findings"]
    assert [f["kind"] for f in offline if f["kind"] in ("hang", "slow_rank")] == ["slow_rank"], offline
    assert offline[0]["culprit_ranks"] == [0] and "save_checkpoint" in offline[0]["detail"]


@pytest.mark.parametrize("digests", [False, True], ids=["entries", "digests"])
def test_a_blocked_rank_is_a_hang_whose_first_finding_names_its_line(tmp_path: Path, digests: bool) -> None:
    """Rank 0 blocks on an empty queue: a hang after stall_after, and the first hang finding the
    server opened (its webhook) already names next_batch and its line; on digests too."""
    line = next(
        i for i, text in enumerate(JOB_SCRIPT.read_text().splitlines(), 1) if "return source.get()" in text
    )
    with (
        control_plane(tmp_path, digests=digests) as stack,
        torchrun(stack, tmp_path, "blocked-job", "--fault", "block") as job,
    ):
        wait_until(lambda: "fault: blocked in next_batch" in job.text(), 120, "the block", 0.05)
        blocked_at = time.monotonic()
        wait_until(lambda: stack.hooks.opened("hang"), 60, "the hang webhook", 0.05)
        first = stack.hooks.opened("hang")[0]
        print(
            f"\n[block, {'digests' if digests else 'entries'}] first hang webhook "
            f"{time.monotonic() - blocked_at:.1f} s after the block (stall_after 5 s)"
        )
        assert first["culprit_ranks"] == [0] and first["waiting_ranks"] == [1, 2]
        assert first["op"] == "barrier" and first["elapsed_s"] >= 5.0
        assert f"Its main thread is in next_batch (progress_job.py:{line})" in first["detail"], first[
            "detail"
        ]
        assert {"name": "next_batch", "filename": str(JOB_SCRIPT), "line": line} in first["culprit_frames"]
        assert job.proc.poll() is None  # still blocked: the job waits on rank 0


def test_slow_past_the_ceiling_is_a_hang(tmp_path: Path) -> None:
    """LOWERED CEILING (FLIGHTDECK_SERVER_SLOW_CEILING_S=8, shipped: half the group's timeout): rank 0 busy
    for 20 s is slow first, then a hang once the others have waited 8 s."""
    with (
        control_plane(tmp_path, slow_ceiling_s="8") as stack,
        torchrun(stack, tmp_path, "ceiling-job", "--fault", "busy", "--busy-s", "20") as job,
    ):
        wait_until(lambda: "fault: busy in save_checkpoint" in job.text(), 120, "the busy phase", 0.05)
        hang = wait_until(lambda: stack.hooks.opened("hang"), 60, "the hang webhook")[0]
        assert hang["culprit_ranks"] == [0] and hang["elapsed_s"] >= 8.0
        assert "still working, but it has kept the others waiting" in hang["detail"], hang["detail"]
        assert "longer than the configured ceiling (8 s)" in hang["detail"]
        assert any(f["name"] == "save_checkpoint" for f in hang["culprit_frames"]), hang["culprit_frames"]
        # Slow before the ceiling (between stall_after 5 s and 8 s).
        assert stack.hooks.opened("slow_rank"), stack.hooks.events
        assert job.proc.wait(timeout=120) == 0, job.text()[-3000:]
