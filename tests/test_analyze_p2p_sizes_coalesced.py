"""`flightdeck analyze` on real gloo jobs with p2p, all_to_all, reduce_scatter, coalesced
collectives and a 16-rank TP x PP x DP layout (issue 26), each from a copy of its dumps.

The dumps are those of `tests/fr_jobs` (committed under `tests/data/fr/<scenario>/`); the expected
verdict in each `scenario.json` is derived from the scenario's definition, never from an analyzer.
Every test analyzes a copy made now (fresh file times, as `scp` or `kubectl cp` leave them): with
the agent's sidecars, as bare PyTorch pickles, and as PyTorch's own JSON dumps of the same rings.
"""

from __future__ import annotations

import io
import json
import shutil
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

import pytest

from flightdeck.cli import main
from tests.support.clock import FakeClock

DATA = Path(__file__).parent / "data" / "fr"
JOBS = [
    "p2p_skip_send",
    "p2p_wrong_peer",
    "a2a_uneven",
    "a2a_short_send",
    "reduce_scatter_size",
    "coalesced_healthy",
    "coalesced_hang",
    "tp_pp_dp_healthy",
    "tp_pp_dp_hang",
    "tp_pp_dp_pp_skip_send",
]
FAULT_KINDS = {
    "hang",
    "collective_type_mismatch",
    "size_mismatch",
    "dtype_mismatch",
    "state_mismatch",
    "p2p_mismatch",
    "rank_lost",
}


def _doc(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((DATA / name / "scenario.json").read_text())
    return doc


def _analyze(*args: str) -> tuple[int, dict[str, Any]]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(["analyze", "--format", "json", *args])
    return code, json.loads(out.getvalue())


def _check(code: int, verdict: dict[str, Any], exp: dict[str, Any]) -> None:
    if exp["healthy"]:
        assert not [f for f in verdict["findings"] if f["kind"] in FAULT_KINDS], verdict["findings"]
        assert verdict["healthy"], verdict["findings"]
        assert code == 0
        return
    assert code == 1
    root = verdict["findings"][0]
    assert root["consequence_of"] is None
    assert root["kind"] == exp["kind"], root["detail"]
    assert root["process_group"] == exp["process_group"], root["detail"]
    assert root["collective_seq_id"] == exp["collective_seq_id"], root["detail"]
    assert root["op"] == exp["op"], root["detail"]
    assert root["culprit_ranks"] == exp["culprit_ranks"], root["detail"]
    # A rank stranded by the culprit is named as blocked (waiting), never as a culprit.
    for r in exp.get("blocked_ranks", []):
        assert r in root["waiting_ranks"], root["detail"]
    # Every other finding follows from the root cause.
    for f in verdict["findings"][1:]:
        if f["kind"] in FAULT_KINDS:
            assert f["consequence_of"] is not None, f["detail"]


def _copy_spool(name: str, dst: Path) -> None:
    for src in sorted((DATA / name).glob("rank_*")):
        shutil.copy(src, dst / src.name)  # not copy2: fresh file times


@pytest.mark.parametrize("name", JOBS)
def test_copied_spool_with_sidecars(name: str, tmp_path: Path) -> None:
    _copy_spool(name, tmp_path)
    code, verdict = _analyze(str(tmp_path))
    assert verdict["ranks"]["expected"] == _doc(name)["world_size"]
    _check(code, verdict, _doc(name)["expected"])


@pytest.mark.parametrize("name", JOBS)
def test_copied_bare_pytorch_pickles(name: str, tmp_path: Path) -> None:
    doc = _doc(name)
    for rank in range(doc["world_size"]):
        for suffix in (".final.pkl", ".stall.pkl", ".pkl"):
            src = DATA / name / f"rank_{rank}{suffix}"
            if src.exists():
                shutil.copy(src, tmp_path / f"comm_lib_trace_rank_{rank}")
                break
    code, verdict = _analyze(str(tmp_path), "--world-size", str(doc["world_size"]))
    _check(code, verdict, doc["expected"])


@pytest.mark.parametrize("name", JOBS)
def test_copied_pytorch_json_dumps(name: str, tmp_path: Path) -> None:
    doc = _doc(name)
    found = sorted((DATA / name / "pytorch_json").glob("r*.json"))
    assert found, "the job wrote no JSON dumps"
    for src in found:
        shutil.copy(src, tmp_path / f"rank_{src.stem.removeprefix('r')}.json")
    code, verdict = _analyze(str(tmp_path), "--world-size", str(doc["world_size"]))
    _check(code, verdict, doc["expected"])


def test_layout_groups_are_non_contiguous() -> None:
    """The 16-rank job's DP and PP groups are strided rank sets, as Megatron builds them."""
    code, verdict = _analyze(str(DATA / "tp_pp_dp_hang"))
    assert code == 1
    root = verdict["findings"][0]
    meta = json.loads((DATA / "tp_pp_dp_hang" / "rank_9.final.pkl.meta.json").read_text())
    members = meta["groups"][root["process_group"]]["ranks"]
    assert members == [9, 11, 13, 15]
    assert sorted(root["waiting_ranks"]) == [11, 13, 15]


@pytest.mark.slow
@pytest.mark.parametrize(
    "name", ["p2p_skip_send", "a2a_short_send", "tp_pp_dp_pp_skip_send", "coalesced_healthy"]
)
def test_live_server_reaches_the_same_verdict(name: str, database_url: str, clock: FakeClock) -> None:
    """The server folds the same snapshots (as a collector ships them) into its live summaries."""
    from tests.support.server_app import make_server
    from tests.support.server_batches import scenario_dumps, snapshots

    dumps = sorted(
        (d for ds in scenario_dumps(name).values() for d in ds), key=lambda d: d.snapshot_time_ns or 0
    )
    clock.now_ns = max(d.snapshot_time_ns or 0 for d in dumps) + 1_000_000_000
    server = make_server(database_url, clock)
    try:
        assert server.push(snapshots(dumps)).status_code == 200
        server.diagnose()
        doc = server.job(name)
        exp = _doc(name)["expected"]
        if exp["healthy"]:
            assert doc["findings"] == []
            return
        root = doc["findings"][0]
        got = (root["kind"], root["process_group"], root["collective_seq_id"], root["culprit_ranks"])
        assert got == (exp["kind"], exp["process_group"], exp["collective_seq_id"], exp["culprit_ranks"])
    finally:
        server.svc.close()


@pytest.mark.parametrize(
    "name", ["p2p_skip_send", "p2p_wrong_peer", "coalesced_hang", "tp_pp_dp_hang", "tp_pp_dp_pp_skip_send"]
)
def test_copied_dumps_taken_during_the_hang(name: str, tmp_path: Path) -> None:
    """Only what was dumped while the job hung (the stall snapshot, else the last periodic one), as
    bare pickles: the same root cause as from the dumps written at exit."""
    doc = _doc(name)
    for rank in range(doc["world_size"]):
        for suffix in (".stall.pkl", ".pkl"):
            src = DATA / name / f"rank_{rank}{suffix}"
            if src.exists():
                shutil.copy(src, tmp_path / f"comm_lib_trace_rank_{rank}")
                break
    code, verdict = _analyze(str(tmp_path), "--world-size", str(doc["world_size"]))
    _check(code, verdict, doc["expected"])
