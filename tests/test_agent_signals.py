"""The agent's final snapshot on SIGTERM and SIGINT: real gloo jobs, real signals, real torchrun.

A rank blocked in a collective runs no Python signal handler; the agent's watcher writes the
snapshot anyway and ends the process as the signal's default action would. The exit status of
every rank (and of torchrun) is what it is without the agent; a handler the job installed first
still runs.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

import pytest

from flightdeck import agent as agent_mod
from flightdeck.launch.demo.ranks import free_port
from tests.fr_jobs.dumps import load_dump, load_sidecar

JOB_SCRIPT = Path(__file__).parent / "support" / "signal_job.py"
REPO = Path(__file__).resolve().parents[1]


# --- the hooks in this process (fast) -------------------------------------------------------------


def test_start_installs_signal_handlers_and_stop_restores_them(tmp_path: Path) -> None:
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    agent = agent_mod.Agent(agent_mod.AgentConfig(spool_dir=tmp_path, interval_s=0.05))
    agent.start()
    try:
        for s in before:
            assert signal.getsignal(s) not in (before[s], None)
    finally:
        agent.stop()
    assert {s: signal.getsignal(s) for s in before} == before
    # The wakeup fd is given back too.
    assert signal.set_wakeup_fd(-1) == -1


def test_stop_leaves_a_handler_the_job_installed_after_the_agent(tmp_path: Path) -> None:
    before = signal.getsignal(signal.SIGTERM)

    def job_handler(signum: int, frame: FrameType | None) -> None:
        pass

    agent = agent_mod.Agent(agent_mod.AgentConfig(spool_dir=tmp_path, interval_s=0.05))
    agent.start()
    try:
        signal.signal(signal.SIGTERM, job_handler)
        agent.stop()
        assert signal.getsignal(signal.SIGTERM) is job_handler
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGTERM, before)


def test_an_agent_started_off_the_main_thread_installs_no_handler(tmp_path: Path) -> None:
    before = signal.getsignal(signal.SIGTERM)
    agent = agent_mod.Agent(agent_mod.AgentConfig(spool_dir=tmp_path, interval_s=0.05))
    t = threading.Thread(target=agent.start)
    t.start()
    t.join()
    try:
        assert signal.getsignal(signal.SIGTERM) == before
    finally:
        agent.stop()


# --- real jobs (slow) -----------------------------------------------------------------------------


def _env(spool: Path, job: str, *, agent: bool) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("FLIGHTDECK_", "TORCHELASTIC_", "MASTER_", "RANK", "WORLD_SIZE", "LOCAL_RANK"))
    }
    env.update(
        FLIGHTDECK_AGENT_SPOOL_DIR=str(spool),
        FLIGHTDECK_AGENT_JOB=job,
        FLIGHTDECK_AGENT_INTERVAL_S="0.2",
        FLIGHTDECK_AGENT_ENABLED="1" if agent else "0",
        OMP_NUM_THREADS="1",
        PYTHONPATH=str(REPO) + os.pathsep + env.get("PYTHONPATH", ""),
    )
    return env


def _wait_ready(
    logs: list[Path], count: int, spool: Path | None, ranks: int, proc_alive: list[subprocess.Popen[bytes]]
) -> None:
    """Until every rank printed `hung` and (with the agent) spooled a periodic snapshot."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        text = "".join(p.read_text(errors="replace") for p in logs if p.exists())
        spooled = spool is None or all((spool / f"rank_{r}.pkl").exists() for r in range(ranks))
        if text.count("hung") >= count and spooled:
            time.sleep(0.5)  # the blocked rank is inside its all-reduce by now
            return
        dead = [p.args for p in proc_alive if p.poll() is not None]
        assert not dead, (dead, text)
        time.sleep(0.2)
    raise AssertionError(f"job never got ready: {text}")


@contextlib.contextmanager
def _torchrun(
    tmp_path: Path, job: str, *args: str, agent: bool
) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--nnodes", "1"]
    cmd += ["--master-addr", "127.0.0.1", "--master-port", str(free_port()), "--monitor-interval", "0.5"]
    cmd += ["-m", "flightdeck.agent", str(JOB_SCRIPT), *args]
    log = tmp_path / f"{job}.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            cmd,
            env=_env(tmp_path / "spool", job, agent=agent),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=REPO,
        )
    try:
        yield proc, log
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)


@contextlib.contextmanager
def _ranks(
    tmp_path: Path, job: str, *args: str, world: int = 2
) -> Iterator[tuple[list[subprocess.Popen[bytes]], list[Path]]]:
    """The ranks as separate interpreters (no launcher), so their own exit statuses are seen."""
    port = free_port()
    procs: list[subprocess.Popen[bytes]] = []
    logs: list[Path] = []
    try:
        for rank in range(world):
            env = _env(tmp_path / "spool", job, agent=True)
            env.update(
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(port),
                WORLD_SIZE=str(world),
                RANK=str(rank),
                LOCAL_RANK=str(rank),
            )
            logs.append(tmp_path / f"{job}-{rank}.log")
            with open(logs[-1], "wb") as out:
                procs.append(
                    subprocess.Popen(
                        [sys.executable, "-m", "flightdeck.agent", str(JOB_SCRIPT), *args],
                        env=env,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        cwd=REPO,
                    )
                )
        yield procs, logs
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def _final(spool: Path, rank: int) -> dict[str, object]:
    path = spool / f"rank_{rank}.final.pkl"
    assert path.exists(), sorted(p.name for p in spool.iterdir())
    meta = load_sidecar(path)
    assert meta["kind"] == "final" and meta["rank"] == rank
    load_dump(path)  # a whole, readable dump
    return meta


@pytest.mark.slow
def test_torchrun_sigterm_leaves_a_final_snapshot_of_every_rank(tmp_path: Path) -> None:
    """Rank 1 blocked in an all-reduce, rank 0 asleep in Python; SIGTERM to torchrun, which
    forwards it to the ranks. Without the agent, the same job, side by side, for the exit status."""
    with (
        _torchrun(tmp_path, "sig-agent", "--stuck-rank", "1", agent=True) as (with_agent, log),
        _torchrun(tmp_path, "sig-plain", "--stuck-rank", "1", agent=False) as (plain, plain_log),
    ):
        spool = tmp_path / "spool" / "sig-agent" / "0"
        _wait_ready([log], 2, spool, 2, [with_agent])
        _wait_ready([plain_log], 2, None, 2, [plain])
        with_agent.send_signal(signal.SIGTERM)
        plain.send_signal(signal.SIGTERM)
        code, plain_code = with_agent.wait(90), plain.wait(90)
    text = log.read_text(errors="replace")
    assert code == plain_code, (code, plain_code, text)
    # Every rank ended within torchrun's grace: none had to be SIGKILLed.
    assert "forcefully exiting" not in text, text
    for rank in (0, 1):
        meta = _final(spool, rank)
        assert meta["exception"] == "terminated by SIGTERM", meta["exception"]
        assert meta["thread_stacks"]
    assert not (tmp_path / "spool" / "sig-plain").exists()


@pytest.mark.slow
def test_a_rank_ends_as_it_would_without_the_agent(tmp_path: Path) -> None:
    """Each rank signalled as a launcher does: SIGTERM kills both (the blocked one too) with
    status -SIGTERM; SIGINT's KeyboardInterrupt ends the sleeping one with -SIGINT, as Python does."""
    with _ranks(tmp_path, "sig-ranks", "--stuck-rank", "1") as (procs, logs):
        spool = tmp_path / "spool" / "sig-ranks" / "0"
        _wait_ready(logs, 2, spool, 2, procs)
        # The blocked rank first: its peer's exit would end its all-reduce with an error.
        procs[1].send_signal(signal.SIGTERM)
        assert procs[1].wait(60) == -signal.SIGTERM, logs[1].read_text()
        procs[0].send_signal(signal.SIGINT)
        assert procs[0].wait(60) == -signal.SIGINT, logs[0].read_text()
    assert _final(spool, 0)["exception"] == "interrupted by SIGINT"
    meta = _final(spool, 1)
    assert meta["exception"] == "terminated by SIGTERM"
    # The blocked rank's snapshot shows the all-reduce it was in, still pending.
    pending = [e for e in load_dump(spool / "rank_1.final.pkl")["entries"] if not e["retired"]]
    assert [e["profiling_name"] for e in pending] == ["gloo:all_reduce"], pending
    assert "blocked in native code" in logs[1].read_text()


@pytest.mark.slow
def test_the_jobs_own_sigterm_handler_still_runs(tmp_path: Path) -> None:
    with _ranks(tmp_path, "sig-own", "--own-handler", "7") as (procs, logs):
        spool = tmp_path / "spool" / "sig-own" / "0"
        _wait_ready(logs, 2, spool, 2, procs)
        for p in procs:
            p.send_signal(signal.SIGTERM)
        codes = [p.wait(60) for p in procs]
    assert codes == [7, 7], [log.read_text() for log in logs]
    for rank, log in enumerate(logs):
        assert "job handler ran: SIGTERM" in log.read_text()
        # The handler's sys.exit ran atexit, whose final snapshot keeps what ended the rank.
        assert _final(spool, rank)["exception"] == "terminated by SIGTERM"


@pytest.mark.slow
def test_an_ignored_sigterm_is_recorded_and_stays_ignored(tmp_path: Path) -> None:
    with _ranks(tmp_path, "sig-ign", "--ignore-sigterm", world=1) as (procs, logs):
        spool = tmp_path / "spool" / "sig-ign" / "0"
        _wait_ready(logs, 1, spool, 1, procs)
        procs[0].send_signal(signal.SIGTERM)
        final = spool / "rank_0.final.pkl"
        deadline = time.monotonic() + 60
        while not final.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _final(spool, 0)["exception"] == "terminated by SIGTERM"
        taken = load_sidecar(final)["snapshot_time_ns"]

        def periodic_after() -> bool:
            # The whole ring or its recent changes, whichever the agent wrote last.
            times = [
                load_sidecar(p)["snapshot_time_ns"]
                for p in (spool / "rank_0.pkl", spool / "rank_0.recent.pkl")
                if p.exists()
            ]
            return bool(max(times) > taken)

        while not periodic_after() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert periodic_after()  # the rank goes on, and so do its snapshots
        assert procs[0].poll() is None
