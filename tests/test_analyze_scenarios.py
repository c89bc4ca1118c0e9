"""`flightdeck analyze` on the committed dumps of real gloo jobs, against each scenario's definition.

Each `tests/data/fr/<scenario>/scenario.json` says what the job did wrong (which rank, which
collective), written from the scenario's program by the generator (tests/fr_jobs), not from any
analyzer. The verdict's root cause must match it: with the agent's metadata, and again from the
bare PyTorch dumps alone (renamed as PyTorch names them, no sidecars), as a user would have them.
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

DATA = Path(__file__).parent / "data" / "fr"
SCENARIOS = sorted(p.parent.name for p in DATA.glob("*/scenario.json"))
#: Verdicts that need the agent's metadata (snapshot times, final snapshots) to be drawn.
NEEDS_METADATA = {"rank_lost"}


def _expected(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((DATA / name / "scenario.json").read_text())
    return doc


def _analyze(*args: str) -> tuple[int, dict[str, Any], str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(["analyze", "--format", "json", *args])
    return code, json.loads(out.getvalue()) if out.getvalue() else {}, err.getvalue()


def _check(verdict: dict[str, Any], code: int, exp: dict[str, Any]) -> None:
    if exp["healthy"]:
        assert verdict["healthy"], verdict["findings"]
        assert code == 0
        return
    assert code == 1
    assert not verdict["healthy"]
    root = verdict["findings"][0]
    assert root["consequence_of"] is None
    assert root["kind"] == exp["kind"], root["detail"]
    assert root["culprit_ranks"] == exp["culprit_ranks"], root["detail"]
    if exp["kind"] != "straggler":
        assert root["process_group"] == exp["process_group"], root["detail"]
    if exp.get("collective_seq_id") is not None and exp["kind"] not in NEEDS_METADATA:
        assert root["collective_seq_id"] == exp["collective_seq_id"], root["detail"]
    if exp.get("op") and exp["kind"] not in NEEDS_METADATA:
        assert root["op"] == exp["op"], root["detail"]
    assert root["detail"]


def _skip_raw(doc: dict[str, Any]) -> None:
    if doc.get("dump_mode", "agent") != "agent":
        pytest.skip("raw PyTorch dumps (no agent): tests/test_analyze_evidence.py")


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_verdict_with_agent_metadata(scenario: str) -> None:
    exp = _expected(scenario)
    _skip_raw(exp)
    code, verdict, err = _analyze(str(DATA / scenario))
    assert err == ""
    assert verdict["ranks"]["expected"] == exp["world_size"]
    _check(verdict, code, exp["expected"])


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_verdict_from_bare_pytorch_dumps(scenario: str, tmp_path: Path) -> None:
    exp = _expected(scenario)
    _skip_raw(exp)
    if exp["expected"]["kind"] in NEEDS_METADATA:
        pytest.skip("a lost rank is told by snapshot times and final snapshots, which only the agent writes")
    # The newest dump of each rank, named like PyTorch's own dump files, without metadata.
    for rank in range(exp["world_size"]):
        for name in (f"rank_{rank}.final.pkl", f"rank_{rank}.stall.pkl", f"rank_{rank}.pkl"):
            src = DATA / scenario / name
            if src.exists():
                shutil.copyfile(src, tmp_path / f"comm_lib_trace_rank_{rank}")
                break
    code, verdict, _ = _analyze(str(tmp_path), "--world-size", str(exp["world_size"]))
    _check(verdict, code, exp["expected"])


def test_bad_files_get_one_line_each_and_the_rest_is_analyzed(tmp_path: Path) -> None:
    for rank in range(4):
        shutil.copyfile(DATA / "skip" / f"rank_{rank}.final.pkl", tmp_path / f"rank_{rank}")
    (tmp_path / "rank_4").write_bytes(b"")  # empty
    (tmp_path / "rank_5").write_bytes((DATA / "skip" / "rank_0.pkl").read_bytes()[:300])  # truncated
    (tmp_path / "rank_6").write_bytes(b"not a dump at all")
    code, verdict, err = _analyze(str(tmp_path), "--world-size", "4")
    lines = err.strip().splitlines()
    assert len(lines) == 3
    assert any("rank_4" in x and "empty" in x for x in lines)
    assert any("rank_5" in x and "Truncated" in x for x in lines)
    assert any("rank_6" in x and "NotADump" in x for x in lines)
    assert code == 1
    assert verdict["findings"][0]["culprit_ranks"] == [2]


def test_missing_dump_is_reported_and_diagnosis_goes_on(tmp_path: Path) -> None:
    for rank in (0, 1, 3):
        shutil.copyfile(DATA / "skip" / f"rank_{rank}.final.pkl", tmp_path / f"rank_{rank}")
    code, verdict, _ = _analyze(str(tmp_path), "--world-size", "4")
    assert code == 1
    assert verdict["ranks"]["without_dump"] == [2]
    kinds = [f["kind"] for f in verdict["findings"]]
    assert kinds[0] == "hang"
    assert "missing_dump" in kinds
    hang = verdict["findings"][0]
    assert hang["culprit_ranks"] == [2]
    assert "left no dump" in hang["detail"]


def test_unusable_input_exits_2(tmp_path: Path) -> None:
    (tmp_path / "rank_0").write_bytes(b"garbage")
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        assert main(["analyze", str(tmp_path)]) == 2
    assert "no usable flight-recorder dump" in err.getvalue()


def test_text_verdict_names_culprit_and_call_site() -> None:
    out = io.StringIO()
    with redirect_stdout(out):
        code = main(["analyze", str(DATA / "skip")])
    text = out.getvalue()
    assert code == 1
    first = text.splitlines()[2]
    assert first.startswith("#1 ROOT CAUSE HANG: group 0 (default_pg), seq 12, all_reduce")
    assert "rank 2" in text and "never entered it" in text
    assert "worker.py" in text and "sync_grads" in text
