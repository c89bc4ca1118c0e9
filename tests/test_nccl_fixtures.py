"""`flightdeck analyze` on NCCL-shaped dumps (tests/data/nccl), against each case's definition.

No GPU here: the dumps come from `tests.nccl_fixtures`, a model of what ProcessGroupNCCL and the
nccl2 flight-recorder hook write (see docs/comparison.md, "NCCL dumps: what differs from gloo").
Each case's scenario.json holds the verdict that follows from its definition. Dumps are copied before they are analyzed, so
their file times are fresh, as in a user's copy.
"""

from __future__ import annotations

import io
import json
import pickle
import shutil
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

import pytest

from flightdeck.analysis import summarize
from flightdeck.analysis.summary import add_entries
from flightdeck.cli import main
from flightdeck.readers.fr.decode import load_raw
from flightdeck.readers.fr.files import read_dump_file
from flightdeck.readers.fr.parse import parse_dump
from tests.nccl_fixtures.cases import CASES
from tests.nccl_fixtures.generate import main as generate

DATA = Path(__file__).parent / "data" / "nccl"
NAMES = sorted(p.parent.name for p in DATA.glob("*/scenario.json"))


def _analyze(path: Path) -> tuple[int, dict[str, Any], str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(["analyze", "--format", "json", str(path)])
    return code, json.loads(out.getvalue()) if out.getvalue() else {}, err.getvalue()


def _copy(src: Path, dst: Path) -> Path:
    dst.mkdir(parents=True)
    for f in sorted(src.iterdir()):
        shutil.copyfile(f, dst / f.name)  # fresh file times, as a user's copy has
    return dst


def test_every_case_is_committed() -> None:
    assert sorted(CASES) == NAMES


def test_committed_fixtures_are_what_the_generator_writes(tmp_path: Path) -> None:
    with redirect_stdout(io.StringIO()):
        assert generate(["--out", str(tmp_path)]) == 0
    committed = sorted(p.relative_to(DATA) for p in DATA.rglob("*") if p.is_file())
    fresh = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file())
    assert committed == fresh
    for rel in committed:
        assert (DATA / rel).read_bytes() == (tmp_path / rel).read_bytes(), rel


@pytest.mark.parametrize("fmt", ["pickle", "json"])
@pytest.mark.parametrize("name", NAMES)
def test_verdict_matches_the_definition(name: str, fmt: str, tmp_path: Path) -> None:
    doc = json.loads((DATA / name / "scenario.json").read_text())
    exp = doc["expected"]
    code, verdict, err = _analyze(_copy(DATA / name / fmt, tmp_path / fmt))
    assert err == ""
    assert verdict["ranks"]["expected"] == doc["world_size"]
    assert verdict["ranks"]["with_dump"] == doc["ranks_with_dump"]
    if exp["healthy"]:
        assert verdict["healthy"], verdict["findings"]
        assert code == 0
        return
    assert code == 1
    root = verdict["findings"][0]
    assert root["consequence_of"] is None, root["detail"]
    assert root["kind"] == exp["kind"], root["detail"]
    assert root["process_group"] == exp["process_group"], root["detail"]
    assert root["collective_seq_id"] == exp["collective_seq_id"], root["detail"]
    assert root["culprit_ranks"] == exp["culprit_ranks"], root["detail"]
    assert root["op"] == exp["op"], root["detail"]
    if "p2p_seq_id" in doc:
        assert f"p2p_seq_id {doc['p2p_seq_id']}" in root["detail"]
    kinds = [f["kind"] for f in verdict["findings"][1:]]
    for kind in exp["also"]:
        assert kind in kinds, verdict["findings"]
    # Whatever follows the root cause is marked as following from it (or from another finding).
    for f in verdict["findings"][1:]:
        assert f["kind"] == "missing_dump" or f["consequence_of"] is not None, f["detail"]


def _raw(name: str, fmt: str, rank: int) -> dict[str, Any]:
    suffix = ".json" if fmt == "json" else ""
    return load_raw((DATA / name / fmt / f"comm_lib_trace_rank_{rank}{suffix}").read_bytes())


@pytest.mark.parametrize("fmt", ["pickle", "json"])
def test_reader_keeps_nccl_states_times_and_durations(fmt: str) -> None:
    raw = _raw("nccl_hang", fmt, 0)
    dump = parse_dump(raw, rank=0, source="x")
    assert dump.warnings == ()
    done, stuck = dump.entries[-2], dump.entries[-1]
    assert (done.state, done.retired) == ("completed", True)
    assert done.time_started_ns is not None and done.time_completed_ns is not None
    assert done.duration_ms == 2.0
    assert (stuck.state, stuck.retired, stuck.time_completed_ns, stuck.duration_ms) == (
        "started",
        False,
        None,
        None,
    )
    assert stuck.time_started_ns is not None and stuck.timeout_ms == 600_000
    assert dump.groups["0"].ranks == (0, 1, 2, 3)  # NCCL fills pg_config
    assert dump.backend == "nccl" and dump.comm_lib_version == "2.27.5"


@pytest.mark.parametrize("fmt", ["pickle", "json"])
def test_reader_without_timing_sees_scheduled_then_completed(fmt: str) -> None:
    dump = parse_dump(_raw("nccl_hang_no_timing", fmt, 1), rank=1, source="x")
    assert {e.state for e in dump.entries[:-1]} == {"completed"}
    stuck = dump.entries[-1]
    assert (stuck.state, stuck.time_started_ns, stuck.duration_ms) == ("scheduled", None, None)
    assert all(e.duration_ms is None and e.time_started_ns is None for e in dump.entries)


@pytest.mark.parametrize("fmt", ["pickle", "json"])
def test_reader_knows_the_nccl2_backend(fmt: str) -> None:
    dump = parse_dump(_raw("nccl2_hang", fmt, 0), rank=0, source="x")
    assert dump.warnings == ()  # no "unknown backend"
    assert dump.backend == "nccl2"
    # The hook records without CUDA events: completion is `retired`, the state stays scheduled.
    assert {e.state for e in dump.entries} == {"scheduled"}
    assert [e.finished for e in dump.entries[-2:]] == [True, False]


@pytest.mark.parametrize("fmt", ["pickle", "json"])
def test_coalesced_groups_fold_into_what_the_ranks_agreed_to(fmt: str) -> None:
    raw = _raw("nccl_coalesced_healthy", fmt, 0)
    dump = parse_dump(raw, rank=0, source="x")
    # 3 broadcasts + end -> one entry; the batch's 2 p2p ops stay, its end goes.
    assert len(dump.entries) == len(raw["entries"]) - 3 - 1
    coll = next(e for e in dump.entries if e.collective_seq_id == 11)
    assert (coll.op, coll.raw_op, coll.state) == ("broadcast", "nccl:broadcast", "completed")
    assert coll.input_sizes == ((128,), (128,), (128,))
    assert coll.input_dtypes == ("Float",) * 3
    fast = next(e for e in dump.entries if e.op == "all_reduce_coalesced")
    assert fast.input_sizes == ((16,), (32,), (64,))
    batch = [e for e in dump.entries if e.is_p2p]
    assert [e.op for e in batch] == ["send", "recv"]
    assert {e.p2p_seq_id for e in batch} == {1}
    # NCCL leaves the batch's ops scheduled; they take the end entry's completion.
    raw_states = {
        e["state"] for e in raw["entries"] if e["is_p2p"] and "coalesced" not in e["profiling_name"]
    }
    assert raw_states == {"scheduled"}
    assert {e.state for e in batch} == {"completed"}


def test_an_end_entry_read_alone_updates_the_folded_group(tmp_path: Path) -> None:
    """The live path: a collector that ships only changed entries sends a coalesced group's end
    entry again without its ops; the summary keeps the ops' signature and takes the new state."""
    path = DATA / "nccl_coalesced_hang" / "pickle" / "comm_lib_trace_rank_0"
    raw = pickle.loads(path.read_bytes())
    summary = summarize(read_dump_file(path))
    before = summary.tracks["0"].fps.tolist()
    end = dict(raw["entries"][-1], state="completed", retired=True)
    later = parse_dump(dict(raw, entries=[end]), rank=0, source=str(path))
    assert [e.op for e in later.entries] == ["coalesced"]  # the reader cannot fold it alone
    add_entries(summary, later.entries)
    track = summary.tracks["0"]
    assert track.fps.tolist() == before
    tip = track.tail[-1]
    assert (tip.op, tip.state, tip.input_sizes) == ("broadcast", "completed", ((128,), (128,), (128,)))


def test_pytorch_analyzer_name_check_rejects_nccl2() -> None:
    """Why docs/comparison.md shows PyTorch's analyzer failing on nccl2 dumps: its Op parser only
    accepts a fixed set of backend prefixes, and this torch's set has no nccl2."""
    types = pytest.importorskip("torch.distributed.flight_recorder.components.types")
    event = _raw("nccl2_hang", "pickle", 0)["entries"][0]
    with pytest.raises(AssertionError, match="nccl2"):
        types.Op(event, {"0": {0, 1, 2, 3}}, "0")


@pytest.mark.parametrize("fmt", ["pickle", "json"])
def test_pg_status_is_read_by_group_name(fmt: str) -> None:
    # pg_status is keyed by the per-process pg_id (rank 2 builds group "2" second, as rank 0 builds
    # group "1"), with string values in JSON dumps; the reader gives it by group name, as ints.
    dump = parse_dump(_raw("nccl_healthy", fmt, 2), rank=2, source="x")
    assert set(dump.pg_status) == {"0", "2"}
    enq, started, done = dump.pg_status["0"]
    assert enq == done == max(e.collective_seq_id for e in dump.entries if e.group == "0")
    assert started == enq  # with timing
    no_timing = parse_dump(_raw("nccl_hang_no_timing", fmt, 0), rank=0, source="x")
    assert no_timing.pg_status == {"0": (12, -1, 11)}
    summary = summarize(no_timing)
    assert summary.pg_status == {"0": (12, -1, 11)}


def test_hang_detail_quotes_the_culprits_pg_status(tmp_path: Path) -> None:
    _code, verdict, _err = _analyze(_copy(DATA / "nccl_hang" / "json", tmp_path / "j"))
    assert "pg_status for this group: last enqueued 11, last completed 11" in verdict["findings"][0]["detail"]


def test_a_stuck_receiver_is_not_taken_for_a_sender_with_the_wrong_peer(tmp_path: Path) -> None:
    """Rank 1 sends to ranks 2 and 3 every step. At step 4 rank 2 never posts its recv (it is in
    collective 12): rank 1 blocks in its send to 2 and never reaches its send to 3, for which rank 3
    already waits. Rank 1 talked to both before, so it did not pick a wrong peer: rank 2 is the root."""
    from tests.nccl_fixtures.model import P2P, Coll, Group, RankPlan, record

    def step(r: int) -> list[Any]:
        return {1: [P2P("send", 2), P2P("send", 3)], 2: [P2P("recv", 1)], 3: [P2P("recv", 1)]}.get(r, [])

    groups = {"0": Group("0", "default_pg", (0, 1, 2, 3))}
    ar = [Coll("all_reduce") for _ in range(3)]
    for r in range(4):
        ops = [op for _ in range(3) for op in (*step(r), *ar)] + [Coll("all_reduce")] * 2
        tail = {1: P2P("send", 2), 3: P2P("recv", 1)}.get(r, Coll("all_reduce"))
        dump, _ = record(r, RankPlan((*ops, tail), stuck_at=len(ops)), groups)
        (tmp_path / f"comm_lib_trace_rank_{r}").write_bytes(pickle.dumps(dump, protocol=2))
    _code, verdict, _err = _analyze(tmp_path)
    root = verdict["findings"][0]
    assert (root["kind"], root["op"], root["culprit_ranks"], root["waiting_ranks"]) == (
        "hang",
        "send",
        [2],
        [1],
    )
    assert all(f["kind"] != "p2p_mismatch" for f in verdict["findings"])
    assert all(f["consequence_of"] is not None for f in verdict["findings"][1:])


def test_folded_groups_survive_the_wire_as_the_live_server_reads_them() -> None:
    """The collector ships normalized entries; the server rebuilds them (deriving the op from the
    raw name) and folds them into the same summary the offline analysis builds."""
    from flightdeck.analysis.summary import RankSummary
    from flightdeck.wire import Batch, decode_batch, encode_batch, snapshot_from_dump

    for name in ("nccl_coalesced_healthy", "nccl_coalesced_hang", "nccl_p2p_wrong_peer"):
        for rank in range(4):
            dump = read_dump_file(DATA / name / "pickle" / f"comm_lib_trace_rank_{rank}")
            offline = summarize(dump)
            live = RankSummary(rank=rank, source="wire")
            doc = json.loads(json.dumps(encode_batch(Batch("b", "h", "v", 1, [snapshot_from_dump(dump)]))))
            add_entries(live, decode_batch(doc).snapshots[0].entries)
            for g, t in offline.tracks.items():
                lt = live.tracks[g]
                assert (lt.seqs, lt.fps) == (t.seqs, t.fps), (name, rank, g)
                assert [(e.op, e.state, e.peer, e.p2p_seq_id) for e in lt.p2p] == [
                    (e.op, e.state, e.peer, e.p2p_seq_id) for e in t.p2p
                ]
                assert [(e.op, e.state, e.input_sizes) for e in lt.tail] == [
                    (e.op, e.state, e.input_sizes) for e in t.tail
                ]
