"""Configuration and version skew (issue 9) on real 4-rank gloo jobs, through the real agent, the
real reader, the analysis and a real server (in-process app on real SQLite / PostgreSQL).

Versions cannot differ between the ranks of one machine, so they are SIMULATED: rank 3 of the
skewed job starts with FLIGHTDECK_TEST_VERSION_OVERRIDE (a test-only agent hook), which replaces
the versions in its configuration report and marks the report `simulated`. Everything else that
differs (flight-recorder ring size, group timeouts, dump-on-timeout, env values) is real: the
ranks really start with those settings and the agent reads them from torch and the environment.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from flightdeck.analysis import Report, diagnose, summarize
from flightdeck.analysis.findings import CONFIG_KINDS
from flightdeck.readers.fr.files import discover, read_dump_file
from flightdeck.readers.fr.merge import merge
from flightdeck.records import RankDump
from flightdeck.wire import snapshot_from_dump
from tests.fr_jobs.config_worker import run_config_job
from tests.support.clock import FakeClock
from tests.support.server_app import Server, make_server

NS = 1_000_000_000
SECRET = "hf_Zx8Qm2Lr7Tb4Wn9Kc3Vy6Pd1Gs5Jh0Af"  # looks like an access token (not a real one)

#: rank -> env it starts with. Rank 0: dump-on-timeout off, a secret in a TORCH_* var, and its pair
#: group at new_group's 30-min default (its partner rank 1 passes 20 s); rank 1: a token-looking
#: value; rank 2: flight recorder off; rank 3: ring "sized in bytes", a longer world timeout, and
#: simulated torch 2.15 on Python 3.10.
SKEW_ENV: dict[int, dict[str, str]] = {
    0: {"TORCH_NCCL_DUMP_ON_TIMEOUT": "0", "TORCH_HUB_TOKEN": "abc", "NCCL_SOCKET_IFNAME": "lo"},
    1: {"NCCL_SOCKET_IFNAME": "lo", "TORCH_FR_DUMP_TEMP_FILE": SECRET, "FDTEST_PAIR_TIMEOUT_S": "20"},
    2: {"TORCH_FR_BUFFER_SIZE": "0", "FDTEST_PAIR_TIMEOUT_S": "20", "NCCL_SOCKET_IFNAME": "lo"},
    3: {
        "TORCH_FR_BUFFER_SIZE": "4194304",
        "FDTEST_WORLD_TIMEOUT_S": "40",
        "FDTEST_PAIR_TIMEOUT_S": "20",
        "NCCL_SOCKET_IFNAME": "lo",
        "FLIGHTDECK_TEST_VERSION_OVERRIDE": json.dumps(
            {"torch_version": "2.15.0", "python_version": "3.10.14"}
        ),
    },
}
UNIFORM_ENV: dict[int, dict[str, str]] = {
    r: {"TORCH_FR_BUFFER_SIZE": "2000", "FDTEST_PAIR_TIMEOUT_S": "20", "NCCL_SOCKET_IFNAME": "lo"}
    for r in range(4)
}


def _run(name: str, spool: Path, rank_env: dict[int, dict[str, str]]) -> dict[int, RankDump]:
    result = run_config_job(name, spool, rank_env=rank_env)
    print(f"{name}: 4 ranks in {result.wall_s:.1f} s")
    assert result.returncodes == {0: 0, 1: 0, 2: 0, 3: 0}, result.stderr
    by_rank: dict[int, list[RankDump]] = {}
    for p in discover([result.spool]):
        d = read_dump_file(p)
        by_rank.setdefault(d.rank, []).append(d)
    return {r: merge(ds) for r, ds in sorted(by_rank.items())}


@pytest.fixture(scope="module")
def skewed(tmp_path_factory: pytest.TempPathFactory) -> dict[int, RankDump]:
    """The skewed job's merged dumps, per rank."""
    return _run("cfgskew", tmp_path_factory.mktemp("spool"), SKEW_ENV)


@pytest.fixture(scope="module")
def uniform(tmp_path_factory: pytest.TempPathFactory) -> dict[int, RankDump]:
    """The uniform job's merged dumps, per rank."""
    return _run("cfguniform", tmp_path_factory.mktemp("spool"), UNIFORM_ENV)


def _report(dumps: dict[int, RankDump]) -> Report:
    summaries = [summarize(d) for d in dumps.values()]
    now = max(d.snapshot_time_ns or 0 for d in dumps.values())
    return diagnose(summaries, now_ns=now)


def _config(report: dict[str, Any] | Report) -> dict[str, dict[str, Any]]:
    """setting[@group] -> the config finding's JSON."""
    findings = report.to_json()["findings"] if isinstance(report, Report) else report["findings"]
    out = {}
    for f in findings:
        if f["kind"] in CONFIG_KINDS:
            setting = (f["expected"] or f["actual"])["setting"]
            key = f"{setting}@{f['process_group']}" if f["process_group"] else setting
            assert key not in out, key
            out[key] = f
    return out


@pytest.mark.slow
def test_agent_reports_what_each_rank_runs_with(skewed: dict[int, RankDump]) -> None:
    cfg = {r: d.config for r, d in skewed.items()}
    assert all(c is not None for c in cfg.values())
    c0, c1, c2, c3 = (cfg[r] for r in range(4))
    assert c0 is not None and c1 is not None and c2 is not None and c3 is not None
    assert c0.dump_on_timeout is False and c1.dump_on_timeout is True
    assert (c0.fr_buffer_size, c0.fr_buffer_size_var) == (2000, None)  # torch's default
    assert (c2.fr_buffer_size, c2.fr_buffer_size_var) == (0, "TORCH_FR_BUFFER_SIZE")
    assert c3.fr_buffer_size == 4194304
    assert not skewed[2].entries and skewed[0].entries  # FR really off on rank 2
    timeouts = {r: {g.name: g.timeout_ms for g in c.groups} for r, c in cfg.items() if c is not None}
    assert timeouts[0] == {"0": 20_000, "1": 1_800_000}  # new_group's default: 30 min
    assert timeouts[1] == {"0": 20_000, "1": 20_000}
    assert timeouts[2] == {"0": 20_000, "2": 20_000}
    assert timeouts[3] == {"0": 40_000, "2": 20_000}
    assert {g.backend for g in c0.groups} == {"cpu:gloo,cuda:gloo"}
    assert (c3.torch_version, c3.python_version, c3.simulated) == ("2.15.0", "3.10.14", True)
    assert c0.torch_version == skewed[0].torch_version and not c0.simulated
    env0, env1 = dict(c0.env), dict(c1.env)
    assert env0["TORCH_HUB_TOKEN"] == "<redacted>"  # secret by name
    assert env1["TORCH_FR_DUMP_TEMP_FILE"] == "<redacted>"  # secret by its looks
    assert env0["NCCL_SOCKET_IFNAME"] == "lo" and env0["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "0"
    assert all(k.startswith(("TORCH_", "NCCL_")) for c in cfg.values() if c is not None for k, _ in c.env)
    raw = "".join(p.read_text() for p in Path(skewed[0].source).parent.glob("*.meta.json"))
    assert SECRET not in raw and "FDTEST_" not in raw  # never a secret, never an unrelated variable


@pytest.mark.slow
def test_skewed_job_gives_every_expected_finding(skewed: dict[int, RankDump]) -> None:
    report = _report(skewed)
    found = _config(report)
    print("\n".join(f"{k}: {f['detail']}" for k, f in found.items()))
    assert set(found) == {
        "torch_version",
        "python_version",
        "python_floor",
        "fr_disabled",
        "fr_buffer_size",
        "fr_buffer_bytes",
        "timeout_ms@0",
        "timeout_ms@1",
        "timeout_vs_job@1",
        "dump_on_timeout",
    }
    assert found["torch_version"]["kind"] == "version_skew"
    assert found["torch_version"]["culprit_ranks"] == [3]
    assert found["torch_version"]["expected"]["ranks"] == [0, 1, 2]
    assert found["torch_version"]["actual"]["sides"] == [
        {"value": "2.15.0", "ranks": [3], "hosts": [skewed[3].host]}
    ]
    assert found["python_floor"]["culprit_ranks"] == [3]
    assert found["fr_disabled"]["kind"] == "config_skew"
    assert found["fr_disabled"]["culprit_ranks"] == [2]
    assert found["fr_buffer_size"]["culprit_ranks"] == [3]  # 2000 on ranks 0, 1 vs 4194304
    assert found["fr_buffer_bytes"]["culprit_ranks"] == [3]
    assert found["timeout_ms@0"]["culprit_ranks"] == [3]
    assert found["timeout_ms@0"]["expected"]["value"] == "20 s"
    # Pair group 1: rank 0 at 30 min, rank 1 at 20 s: no majority, both named; rank 0 is far off.
    assert found["timeout_ms@1"]["expected"] is None and found["timeout_ms@1"]["culprit_ranks"] == [0, 1]
    assert found["timeout_vs_job@1"]["culprit_ranks"] == [0]
    assert found["dump_on_timeout"]["culprit_ranks"] == [0]
    for f in found.values():
        assert all(c["host"] == skewed[c["rank"]].host for c in f["culprits"])


@pytest.mark.slow
def test_uniform_job_gives_none(uniform: dict[int, RankDump]) -> None:
    assert all(d.config is not None for d in uniform.values())
    report = _report(uniform)
    assert _config(report) == {}
    assert not [f for f in report.findings if f.kind not in ("straggler",)], report.to_json()


@pytest.mark.slow
def test_flightdeck_analyze_reports_the_skew_offline(skewed: dict[int, RankDump]) -> None:
    """`flightdeck analyze` on the spool: the same findings, in the JSON and in the text verdict."""
    import subprocess
    import sys

    spool = str(Path(skewed[0].source).parent)
    cmd = [sys.executable, "-m", "flightdeck", "analyze", spool]
    doc = json.loads(subprocess.run([*cmd, "--format", "json"], capture_output=True, timeout=120).stdout)
    assert set(_config(doc)) == set(_config(_report(skewed)))
    text = subprocess.run(cmd, capture_output=True, timeout=120, text=True).stdout
    print(text)
    assert "VERSION SKEW: torch_version" in text and "CONFIG SKEW: group 1 (pair01), timeout_ms" in text
    assert "ROOT CAUSE VERSION SKEW" not in text and "ROOT CAUSE CONFIG SKEW" not in text


@pytest.fixture
def server(database_url: str, clock: FakeClock) -> Iterator[Server]:
    """A server on a fresh database (SQLite file or PostgreSQL schema)."""
    with make_server(database_url, clock) as srv:
        yield srv


@pytest.mark.slow
def test_server_stores_configs_and_opens_resolves_findings(
    server: Server, skewed: dict[int, RankDump], uniform: dict[int, RankDump]
) -> None:
    from flightdeck.server import store

    # As a live server sees the job while it runs: periodic snapshots, all ranks taken together.
    t = max(d.snapshot_time_ns or 0 for d in skewed.values())
    snaps = [snapshot_from_dump(replace(d, kind="periodic", snapshot_time_ns=t)) for d in skewed.values()]
    server.clock.now_ns = max(s.snapshot_time_ns for s in snaps) + NS
    assert server.push(snaps).status_code == 200
    server.diagnose()
    doc = server.job("cfgskew")
    found = _config(doc)
    assert set(found) == set(_config(_report(skewed)))  # the live server agrees with the offline analysis
    assert doc["status"] == "running"  # configuration alone never makes a job hung
    get = server.svc.registry.get_sample_value
    assert get("flightdeck_job_config_skew_active", {"job": "cfgskew", "kind": "version_skew"}) == 1
    assert get("flightdeck_job_config_skew_active", {"job": "cfgskew", "kind": "config_skew"}) == 1
    job_id = server.svc.live.jobs_snapshot()[0].job_id
    with server.svc.db.read() as session:
        stored = store.rank_configs(session=session, job_id=job_id)
    assert stored == {r: d.config for r, d in skewed.items()}
    hist = server.client.get("/api/v1/jobs/cfgskew/findings").json()["findings"]
    opened = {h["id"] for h in hist}
    assert len(opened) == len(found)
    server.clock.advance(1)
    server.push([replace(s, snapshot_time_ns=s.snapshot_time_ns + NS, entries=[]) for s in snaps])
    server.diagnose()  # seen again: updated, not reopened
    assert {h["id"] for h in server.client.get("/api/v1/jobs/cfgskew/findings").json()["findings"]} == opened
    # Every rank restarts with the uniform settings (new reports for the same job): all resolve.
    server.clock.advance(1)
    fixed = [
        snapshot_from_dump(
            replace(d, kind="periodic", config=uniform[r].config, snapshot_time_ns=server.clock())
        )
        for r, d in skewed.items()
    ]
    assert server.push(fixed).status_code == 200
    server.diagnose()
    assert _config(server.job("cfgskew")) == {}
    hist = server.client.get("/api/v1/jobs/cfgskew/findings").json()["findings"]
    assert {h["id"] for h in hist} == opened and not any(h["open"] for h in hist)
    assert get("flightdeck_job_config_skew_active", {"job": "cfgskew", "kind": "version_skew"}) == 0


@pytest.mark.slow
def test_server_flags_jobs_sharing_checkpoints_across_214_and_215(
    server: Server, uniform: dict[int, RankDump]
) -> None:
    """Two jobs with one FLIGHTDECK_AGENT_CHECKPOINT_DIR: a trainer on (simulated) torch 2.15 and an
    evaluator on 2.14.1. Both get a `checkpoint_compat` finding naming the other job."""

    def as_job(job: str, version: str) -> list[Any]:
        out = []
        for d in uniform.values():
            assert d.config is not None
            cfg = replace(d.config, torch_version=version, checkpoint_dir="/ckpt/run7", simulated=True)
            out.append(snapshot_from_dump(replace(d, kind="periodic", config=cfg), job=job))
        return out

    trainer, evaluator = as_job("trainer", "2.15.0"), as_job("evaluator", "2.14.1")
    server.clock.now_ns = max(s.snapshot_time_ns for s in trainer + evaluator) + NS
    assert server.push(trainer).status_code == 200
    assert server.push(evaluator).status_code == 200
    server.diagnose()
    ev, tr = _config(server.job("evaluator")), _config(server.job("trainer"))
    assert ev["checkpoint_compat"]["actual"]["peer_job"] == "trainer"
    assert ev["checkpoint_compat"]["culprit_ranks"] == [0, 1, 2, 3]
    assert tr["checkpoint_compat"]["actual"]["peer_job"] == "evaluator"
    assert "torch_version" not in ev  # uniform within each job
