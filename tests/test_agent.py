"""The in-job agent: config, progress detection, and real gloo jobs spooling real snapshots."""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Any

import pytest

from flightdeck import agent as agent_mod
from flightdeck.agent import AgentConfig
from flightdeck.agent import settings as agent_settings
from flightdeck.agent.progress import STACKS_AFTER_S, ProgressSampler, progress_of
from flightdeck.env_names import LegacyEnvWarning
from tests.fr_jobs.dumps import load_dump, load_sidecar
from tests.fr_jobs.runner import JobResult, run_job
from tests.fr_jobs.scenarios import TEST_SCENARIOS

SIDECAR_TYPES: dict[str, Any] = {
    "flightdeck_snapshot": int,
    "kind": str,
    "job": str,
    "attempt": int,
    "rank": int,
    "world_size": int,
    "local_rank": (int, type(None)),
    "host": str,
    "pid": int,
    "torch_version": str,
    "backend": str,
    "snapshot_time_ns": int,
    "interval_s": float,
    "stacks_after_s": float,
    "groups": dict,
    "exception": (str, type(None)),
    "thread_stacks": (list, type(None)),
    "last_progress_ns": (int, type(None)),
    "config": dict,
    "progress": dict,
    "ring": (dict, type(None)),
}


def check_sidecar(path: Path, *, kind: str, rank: int, job: str, world_size: int) -> dict[str, Any]:
    """Assert the sidecar of dump `path` follows the file contract; return it."""
    meta = load_sidecar(path)
    assert set(meta) == set(SIDECAR_TYPES), sorted(set(meta) ^ set(SIDECAR_TYPES))
    for key, typ in SIDECAR_TYPES.items():
        assert isinstance(meta[key], typ), (key, meta[key])
    assert meta["flightdeck_snapshot"] == 1
    assert (meta["kind"], meta["rank"], meta["job"], meta["world_size"]) == (kind, rank, job, world_size)
    assert meta["attempt"] == 0 and meta["backend"] == "gloo" and meta["local_rank"] == rank
    assert meta["groups"]["0"] == {"desc": "default_pg", "ranks": list(range(world_size))}
    assert (meta["thread_stacks"] is None) == (kind == "periodic")
    config = meta["config"]
    assert config["torch_version"] == meta["torch_version"] and config["python_version"]
    assert (
        config["groups"]["0"]["backend"] == "cpu:gloo,cuda:gloo" and config["groups"]["0"]["timeout_ms"] > 0
    )
    assert all(name.startswith(("TORCH_", "NCCL_")) for name in config["env"])
    # Every snapshot says whether the main thread is working (Linux: its CPU time from /proc).
    progress = meta["progress"]
    assert isinstance(progress["sampled_ns"], int) and isinstance(progress["cpu_ns"], int)
    assert progress["state"] and len(progress["stack_fp"]) == 16 and progress["frames"]
    return meta


def main_stack(meta: dict[str, Any]) -> list[str]:
    """Function names on the main thread's stack, innermost first."""
    stacks = meta["thread_stacks"] or []
    main = next(s for s in stacks if s["thread_name"] == "MainThread")
    return [f["name"] for f in main["frames"]]


# --- config and progress (fast) -------------------------------------------------------------------


def test_config_from_agent_prefixed_env() -> None:
    env = {
        "FLIGHTDECK_AGENT_SPOOL_DIR": "/x",
        "FLIGHTDECK_AGENT_INTERVAL_S": "0.5",
        "FLIGHTDECK_AGENT_FULL_EVERY_S": "10",
        "FLIGHTDECK_AGENT_JOB": "j1",
    }
    with warnings.catch_warnings():
        warnings.simplefilter("error", LegacyEnvWarning)
        cfg = AgentConfig.from_env(env)
        assert not AgentConfig.from_env({"FLIGHTDECK_AGENT_ENABLED": "0"}).enabled
    assert cfg == AgentConfig(spool_dir=Path("/x"), interval_s=0.5, full_every_s=10.0, job="j1")


def test_agent_old_names_warn_and_the_new_one_wins() -> None:
    with pytest.warns(
        LegacyEnvWarning, match="FLIGHTDECK_SPOOL_DIR is deprecated, set FLIGHTDECK_AGENT_SPOOL_DIR"
    ):
        assert AgentConfig.from_env({"FLIGHTDECK_SPOOL_DIR": "/old"}).spool_dir == Path("/old")
    with pytest.warns(LegacyEnvWarning, match="FLIGHTDECK_AGENT is deprecated, set FLIGHTDECK_AGENT_ENABLED"):
        assert not AgentConfig.from_env({"FLIGHTDECK_AGENT": "0"}).enabled
    both = {"FLIGHTDECK_JOB": "old", "FLIGHTDECK_AGENT_JOB": "new"}
    with pytest.warns(
        LegacyEnvWarning, match="FLIGHTDECK_JOB is ignored because FLIGHTDECK_AGENT_JOB is set"
    ):
        assert AgentConfig.from_env(both).job == "new"


def test_config_from_env_and_overrides() -> None:
    env = {
        "FLIGHTDECK_AGENT_SPOOL_DIR": "/x",
        "FLIGHTDECK_AGENT_INTERVAL_S": "0.5",
        "FLIGHTDECK_AGENT_FULL_EVERY_S": "10",
    }
    cfg = AgentConfig.from_env(env, job="j1")
    assert cfg == AgentConfig(spool_dir=Path("/x"), interval_s=0.5, full_every_s=10.0, job="j1")
    # A long interval is no error: every snapshot is then the whole ring.
    assert AgentConfig.from_env({"FLIGHTDECK_AGENT_INTERVAL_S": "60"})
    assert AgentConfig.from_env({}) == AgentConfig()
    assert not AgentConfig.from_env({"FLIGHTDECK_AGENT_ENABLED": "0"}).enabled


@pytest.mark.parametrize(
    "env",
    [
        {"FLIGHTDECK_AGENT_INTERVAL_S": "fast"},
        {"FLIGHTDECK_AGENT_INTERVAL_S": "0"},
        {"FLIGHTDECK_AGENT_INTERVAL_S": "nan"},
        {"FLIGHTDECK_STALL_AFTER_S": "soon"},
        {"FLIGHTDECK_AGENT_ENABLED": "maybe"},
        {"FLIGHTDECK_AGENT_FULL_EVERY_S": "-1"},
        {"FLIGHTDECK_AGENT_FULL_EVERY_S": "nan"},
        {"FLIGHTDECK_AGENT_JOB": "///"},
    ],
)
def test_config_rejects_bad_values(env: dict[str, str]) -> None:
    with pytest.raises(ValueError):
        AgentConfig.from_env(env)


def test_agent_stall_after_is_deprecated_and_ignored(caplog: pytest.LogCaptureFixture) -> None:
    """The server owns the threshold: the agent accepts its old variable, says so once, and
    writes its stack snapshot after the fixed STACKS_AFTER_S whatever it says."""
    monkey = pytest.MonkeyPatch()
    monkey.setattr(agent_settings, "_deprecation_logged", False)
    try:
        with caplog.at_level(logging.WARNING, logger="flightdeck.agent"):
            cfg = AgentConfig.from_env(
                {"FLIGHTDECK_STALL_AFTER_S": "120", "FLIGHTDECK_AGENT_INTERVAL_S": "5"}
            )
            AgentConfig.from_env({"FLIGHTDECK_STALL_AFTER_S": "1"})
    finally:
        monkey.undo()
    assert cfg.interval_s == 5.0  # no longer checked against the interval
    said = [r.getMessage() for r in caplog.records if "FLIGHTDECK_STALL_AFTER_S" in r.getMessage()]
    assert len(said) == 1 and "deprecated and ignored" in said[0], said
    assert STACKS_AFTER_S == 2.0


@pytest.mark.slow
def test_progress_sampler_tells_a_busy_thread_from_a_sleeping_one() -> None:
    """Real threads, real /proc: one computes, one blocks on an event; the sampler sees CPU time
    grow (and the stack move) only for the first."""
    stop = threading.Event()
    spinning = [True]

    def spin() -> None:
        x = 0
        while spinning[0]:  # no call inside: the innermost frame is always spin's
            x += 1

    busy = threading.Thread(target=spin, name="busy")
    asleep = threading.Thread(target=stop.wait, name="asleep")
    busy.start()
    asleep.start()
    try:
        samplers = {t.name: ProgressSampler(time.time_ns, thread=t) for t in (busy, asleep)}
        firsts = {n: s.sample() for n, s in samplers.items()}
        time.sleep(1.0)
        lasts = {n: s.sample() for n, s in samplers.items()}
    finally:
        spinning[0] = False
        stop.set()
        busy.join()
        asleep.join()
    assert firsts["busy"].active_ns is None and firsts["busy"].since_ns == firsts["busy"].sampled_ns
    assert lasts["busy"].active_ns == lasts["busy"].sampled_ns
    assert lasts["busy"].cpu_ns is not None and lasts["busy"].cpu_ns > (firsts["busy"].cpu_ns or 0)
    assert lasts["busy"].frames[0].name == "spin"
    assert lasts["asleep"].active_ns is None and lasts["asleep"].state == "S"
    assert lasts["asleep"].stack_fp == firsts["asleep"].stack_fp
    assert samplers["asleep"].idle_s(lasts["asleep"].sampled_ns) >= 0.4


def test_progress_uses_retired_and_completed() -> None:
    entries = [
        {"record_id": 0, "state": "scheduled", "retired": True, "time_created_ns": 10},
        {"record_id": 1, "state": "completed", "retired": False, "time_created_ns": 20},
        {"record_id": 2, "state": "scheduled", "retired": False, "time_created_ns": 30},
        {"record_id": 3, "state": "started", "retired": False, "time_created_ns": 40},
    ]
    assert progress_of({"entries": entries}) == (1, 30)
    assert progress_of({"entries": entries[:2]}) == (1, None)
    assert progress_of({}) == (-1, None)


def test_start_is_idempotent_and_stop_restores_hooks(tmp_path: Path) -> None:
    hook = sys.excepthook
    first = agent_mod.start(spool_dir=tmp_path, interval_s=0.05)
    try:
        assert first is not None
        assert agent_mod.start(spool_dir=tmp_path / "other") is first
        assert sys.excepthook != hook
    finally:
        agent_mod.stop()
    assert sys.excepthook == hook
    # torch.distributed is not initialized in this process: the agent waits and writes nothing.
    assert list(tmp_path.iterdir()) == []


# --- real gloo jobs (slow) ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def healthy_job(tmp_path_factory: pytest.TempPathFactory) -> JobResult:
    spool = tmp_path_factory.mktemp("spool")
    return run_job(TEST_SCENARIOS["t_healthy"], spool, interval_s=0.2, compute_s=0.05, deadline_s=30)


@pytest.fixture(scope="module")
def hung_job(tmp_path_factory: pytest.TempPathFactory) -> JobResult:
    spool = tmp_path_factory.mktemp("spool")
    # Rank 0 blocks for pg_timeout_s: its stall snapshot is written 2 s in, and a dump under load
    # (CI on a shared 2-core machine) took most of the 2 s left at 4 s, so 8 (rank 1 leaves after
    # rank 0 timed out, so that the exception is the timeout's).
    return run_job(
        TEST_SCENARIOS["t_skip"],
        spool,
        interval_s=0.2,
        pg_timeout_s=8.0,
        leave_s=10.0,
        deadline_s=40,
    )


@pytest.mark.slow
def test_healthy_job_spools_periodic_and_final_snapshots(healthy_job: JobResult) -> None:
    assert healthy_job.returncodes == {0: 0, 1: 0}, healthy_job.stderr
    names = sorted(p.name for p in healthy_job.spool.iterdir())
    expected = []
    for r in (0, 1):
        expected += [
            f"rank_{r}.final.pkl",
            f"rank_{r}.final.pkl.meta.json",
            f"rank_{r}.pkl",
            f"rank_{r}.pkl.meta.json",
            f"rank_{r}.recent.pkl",
            f"rank_{r}.recent.pkl.meta.json",
        ]
    assert names == sorted(expected)  # no stall file, no leftover temporary file
    n_ops = len(TEST_SCENARIOS["t_healthy"].ops)
    for r in (0, 1):
        periodic = healthy_job.spool / f"rank_{r}.pkl"
        whole_meta = check_sidecar(periodic, kind="periodic", rank=r, job="t_healthy", world_size=2)
        assert whole_meta["ring"] is None
        whole = load_dump(periodic)["entries"]
        assert all("frames" not in e for e in whole)
        # Between whole rings (every 30 s by default) the agent writes the ring's recent changes:
        # with the last whole ring they make up the ring as it was at the recent snapshot.
        recent_path = healthy_job.spool / f"rank_{r}.recent.pkl"
        recent_meta = check_sidecar(recent_path, kind="periodic", rank=r, job="t_healthy", world_size=2)
        ring = recent_meta["ring"]
        assert ring["base_time_ns"] == whole_meta["snapshot_time_ns"] < recent_meta["snapshot_time_ns"]
        recent = load_dump(recent_path)["entries"]
        assert 0 < len(recent) <= ring["entries"]
        ids = {e["record_id"] for e in whole} | {e["record_id"] for e in recent}
        assert ids == set(range(ring["first"], ring["first"] + ring["entries"]))
        unfinished = {e["record_id"] for e in whole if not e["retired"]}
        assert unfinished <= {e["record_id"] for e in recent}
        final = healthy_job.spool / f"rank_{r}.final.pkl"
        meta = check_sidecar(final, kind="final", rank=r, job="t_healthy", world_size=2)
        assert meta["exception"] is None
        entries = load_dump(final)["entries"]
        # Every program op is one entry, all retired; frames show the worker's call chain.
        assert [e["collective_seq_id"] for e in entries] == list(range(1, n_ops + 1))
        assert all(e["retired"] for e in entries)
        assert all(e["process_group"] == ("0", "default_pg") for e in entries)
        first_reduce = next(e for e in entries if e["profiling_name"] == "gloo:all_reduce")
        names_in_stack = [f["name"] for f in first_reduce["frames"]]
        assert (
            names_in_stack.index("reduce_bucket")
            < names_in_stack.index("sync_grads")
            < names_in_stack.index("train_step")
        )


@pytest.mark.slow
def test_blocked_rank_writes_stall_snapshot_with_stacks(hung_job: JobResult) -> None:
    # Rank 1 skipped the 4th all_reduce and left; rank 0 blocked in it until the 4 s timeout.
    assert hung_job.returncodes == {0: 1, 1: 0}, hung_job.stderr
    stall = hung_job.spool / "rank_0.stall.pkl"
    meta = check_sidecar(stall, kind="stall", rank=0, job="t_skip", world_size=2)
    stack = main_stack(meta)
    # Taken while the main thread was still inside the collective.
    assert stack[:3] == ["all_reduce", "wrapper", "reduce_bucket"], stack
    assert meta["last_progress_ns"] is not None
    assert meta["snapshot_time_ns"] - meta["last_progress_ns"] >= 1.0e9
    pending = [e for e in load_dump(stall)["entries"] if not e["retired"]]
    assert len(pending) == 1 and pending[0]["frames"], pending
    assert pending[0]["collective_seq_id"] == TEST_SCENARIOS["t_skip"].expected()["collective_seq_id"]
    # The rank that skipped the op has nothing pending, but it went quiet for longer than
    # stall_after: its stall snapshot shows where it is instead of the collective.
    quiet = check_sidecar(
        hung_job.spool / "rank_1.stall.pkl", kind="stall", rank=1, job="t_skip", world_size=2
    )
    assert "commit" in main_stack(quiet), main_stack(quiet)
    assert all(e["retired"] for e in load_dump(hung_job.spool / "rank_1.stall.pkl")["entries"])


@pytest.mark.slow
def test_final_snapshot_carries_the_exception(hung_job: JobResult) -> None:
    final = hung_job.spool / "rank_0.final.pkl"
    meta = check_sidecar(final, kind="final", rank=0, job="t_skip", world_size=2)
    assert meta["exception"] is not None
    assert meta["exception"].startswith("RuntimeError") and "Timed out" in meta["exception"]
    # The main thread's stack is where the exception was raised, not the hook's.
    assert "reduce_bucket" in main_stack(meta)
    assert meta["snapshot_time_ns"] > load_sidecar(hung_job.spool / "rank_0.stall.pkl")["snapshot_time_ns"]
    entries = load_dump(final)["entries"]
    assert all(e["retired"] for e in entries)  # a failed op is retired too
    # Written twice, fast without frames, then with them: the file left is the complete one.
    assert all(e.get("frames") for e in entries)
    left = check_sidecar(
        hung_job.spool / "rank_1.final.pkl", kind="final", rank=1, job="t_skip", world_size=2
    )
    assert left["exception"] is None


@pytest.mark.slow
def test_failing_dump_function_never_breaks_the_job(tmp_path: Path) -> None:
    result = run_job(TEST_SCENARIOS["t_healthy"], tmp_path, interval_s=0.1, agent="inject-failing")
    assert result.returncodes == {0: 0, 1: 0}, result.stderr
    for rank in (0, 1):
        log = result.stderr[rank]
        # The failure is logged once, although the agent retried every 0.1 s and at exit.
        assert log.count("RuntimeError: injected dump failure") == 1, log
        assert log.count("(logged once)") == 1, log
        assert f"rank {rank}: agent snapshots written: 0" in log
    assert not result.spool.exists() or not any(result.spool.glob("*.pkl"))


def test_sidecar_json_is_sorted_and_plain() -> None:
    # The committed samples are produced by the agent; their sidecars must parse as plain JSON.
    sample = Path(__file__).parent / "data" / "fr" / "skip" / "rank_0.stall.pkl.meta.json"
    if not sample.exists():
        pytest.skip("sample data not generated")
    text = sample.read_text()
    assert text == json.dumps(json.loads(text), sort_keys=True)


def test_agent_logs_once_where_it_writes(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A real one-rank gloo group in this process: the first snapshot logs (INFO) the directory
    and the spool a collector must watch; later ones say nothing more."""
    import torch.distributed as dist

    store = dist.HashStore()  # type: ignore[attr-defined]
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    agent = agent_mod.Agent(AgentConfig(spool_dir=tmp_path / "spool", job="logged"))
    try:
        with caplog.at_level(logging.INFO, logger="flightdeck.agent"):
            agent.snapshot("periodic")
            agent.snapshot("periodic")
    finally:
        agent.stop()
        dist.destroy_process_group()
    said = [r.getMessage() for r in caplog.records if "writes its snapshots to" in r.getMessage()]
    where = tmp_path / "spool" / "logged" / "0"
    assert said == [
        f"flightdeck agent: rank 0 writes its snapshots to {where} (spool {tmp_path / 'spool'}; a "
        "collector must watch that spool: its spool_dirs)"
    ]
    assert agent.snapshots_written == 2 and (where / "rank_0.pkl").is_file()
