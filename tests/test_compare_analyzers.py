"""bench/compare_analyzers.py reads PyTorch's analyzer output and judges verdicts as defined.

PyTorch's real output is taken from the committed `torchfrtrace.txt` of the gloo jobs (recorded by
tests/fr_jobs/generate.py), so the parser is held against what fr_trace really prints.
"""

from __future__ import annotations

import json
from pathlib import Path

from bench.compare_analyzers import BEGIN, END, Verdict, judge, parse_torch, write_section

FR = Path(__file__).parent / "data" / "fr"


def _runs(job: str) -> list[str]:
    """The outputs of the raw and the repaired run in a job's torchfrtrace.txt."""
    text = (FR / job / "torchfrtrace.txt").read_text()
    parts = text.split("\npython -m torch.distributed.flight_recorder.fr_trace")
    return [parts[0], *parts[1:]]


def _expected(job: str) -> dict[str, object]:
    exp: dict[str, object] = json.loads((FR / job / "scenario.json").read_text())["expected"]
    return exp


def test_a_crash_is_read_as_a_crash_and_judged_wrong() -> None:
    raw = parse_torch(_runs("skip")[0])
    assert raw.crashed and raw.kind is None
    assert "KeyError" in raw.text
    assert judge(raw, _expected("skip")) == "wrong"


def test_missing_ranks_read_as_a_hang_with_those_culprits() -> None:
    v = parse_torch(_runs("skip")[1])
    assert (v.kind, v.group, v.seq, v.culprits) == ("hang", "0", 12, [2])
    assert judge(v, _expected("skip")) == "right"


def test_error_lines_give_the_mismatch_kind_and_culprit() -> None:
    v = parse_torch(_runs("op_order")[1])
    assert (v.kind, v.seq, v.culprits) == ("collective_type_mismatch", 12, [1])
    assert judge(v, _expected("op_order")) == "right"


def test_blaming_the_aborted_rank_is_wrong_and_naming_the_rank_at_another_seq_is_culprit_only() -> None:
    size = parse_torch(_runs("size_mismatch")[1])
    assert size.kind == "hang" and size.culprits != [3]
    assert judge(size, _expected("size_mismatch")) == "wrong"
    assert judge(Verdict("x", "hang", "0", 12, [2]), _expected("sigkill")) == "culprit"


def test_healthy_is_right_only_without_any_finding() -> None:
    exp = _expected("healthy_4")
    assert judge(parse_torch(_runs("healthy_4")[1]), exp) == "right"
    assert judge(Verdict("crash", crashed=True), exp) == "wrong"
    assert judge(Verdict("x", "straggler", None, None, [3]), exp) == "wrong"


def test_write_section_replaces_only_the_generated_part(tmp_path: Path) -> None:
    doc = tmp_path / "c.md"
    doc.write_text(f"intro\n\n{BEGIN}\nold table\n{END}\n\nnotes\n")
    write_section(doc, "new table\n")
    assert doc.read_text() == f"intro\n\n{BEGIN}\nnew table\n{END}\n\nnotes\n"
