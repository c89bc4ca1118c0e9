"""The flight-recorder reader on real dumps and on hostile or broken files."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import pytest

from flightdeck.readers.fr.columns import _columnar_entries
from flightdeck.readers.fr.decode import SafeUnpickler, load_raw, safe_loads
from flightdeck.readers.fr.errors import (
    DumpTooLargeError,
    NotADumpError,
    TruncatedDumpError,
    UnsafePickleError,
    UnsupportedVersionError,
)
from flightdeck.readers.fr.files import discover, read_dump_file
from flightdeck.readers.fr.merge import merge
from flightdeck.readers.fr.normalize import _Ctx, _entry
from flightdeck.readers.fr.parse import parse_dump
from flightdeck.records import Entry, Frame
from flightdeck.spool import rank_from_name

DATA = Path(__file__).parent / "data" / "fr"
SKIP = DATA / "skip"


def _raw_bytes(path: Path) -> bytes:
    return path.read_bytes()


class _Boom:
    """Unpickling this would create a file: the test checks that it never happens."""

    def __init__(self, target: str) -> None:
        self.target = target

    def __reduce__(self) -> tuple[object, tuple[str, str]]:
        return (open, (self.target, "w"))


def test_malicious_pickle_is_refused_without_running_it(tmp_path: Path) -> None:
    target = tmp_path / "pwned"
    evil = pickle.dumps({"version": "2.10", "entries": [_Boom(str(target))]})
    with pytest.raises(UnsafePickleError, match=r"io\.open"):
        safe_loads(evil)
    assert not target.exists()


def test_safe_unpickler_builds_plain_data() -> None:
    doc = {"a": [1, 2.5, None, True], "b": ("x", b"y"), "c": {"d": "e"}}
    import io

    assert SafeUnpickler(io.BytesIO(pickle.dumps(doc))).load() == doc


def test_real_dump_reads_as_normalized_records() -> None:
    dump = read_dump_file(SKIP / "rank_0.stall.pkl")
    assert dump.rank == 0
    assert dump.version.startswith("2.")
    assert dump.job == "skip"
    assert dump.kind == "stall"
    assert dump.world_size == 4
    assert dump.entries, "a stall snapshot holds entries"
    e = dump.entries[-1]
    assert e.backend == "gloo"
    assert e.group == "0"
    assert e.op == "all_reduce"
    assert e.state == "scheduled"  # gloo never reports another state
    assert not e.retired  # the stall snapshot was taken while rank 0 waited in it
    assert e.frames, "stall snapshots carry stack frames"
    assert dump.groups["0"].desc == "default_pg"
    assert dump.groups["0"].ranks == (0, 1, 2, 3)
    assert any(t.thread_name == "MainThread" for t in dump.thread_stacks)
    # Records are sorted by record id and sequence ids grow within a group.
    seqs = [x.collective_seq_id for x in dump.entries if x.group == "0"]
    assert seqs == sorted(seqs)


def test_raw_gloo_dump_without_metadata_repairs_groups(tmp_path: Path) -> None:
    # A raw gloo dump: pg_config is the placeholder {"": {...}}; identity comes from process_group.
    raw = load_raw(_raw_bytes(SKIP / "rank_1.pkl"))
    assert set(raw["pg_config"]) == {""} or all(v.get("ranks") for v in raw["pg_config"].values())
    copy = tmp_path / "host-a.comm_lib_trace_rank_1"
    copy.write_bytes(_raw_bytes(SKIP / "rank_1.pkl"))
    dump = read_dump_file(copy)
    assert dump.rank == 1
    assert dump.job is None and dump.kind == "dump"
    assert "" not in dump.groups
    assert dump.groups["0"].desc == "default_pg"
    assert dump.snapshot_time_ns is not None  # the file's mtime stands in


def test_json_and_pickle_of_the_same_buffer_agree(tmp_path: Path) -> None:
    raw = load_raw(_raw_bytes(SKIP / "rank_3.final.pkl"))
    # A JSON dump differs from a pickle the way PyTorch's writer differs: lists for tuples, no frames,
    # 0 instead of None for missing NCCL timestamps, string pg_status values.
    jraw = json.loads(json.dumps(raw, default=list))
    for e in jraw["entries"]:
        e.pop("frames", None)
        e["time_discovered_started_ns"] = e["time_discovered_started_ns"] or 0
        e["time_discovered_completed_ns"] = e["time_discovered_completed_ns"] or 0
    jpath = tmp_path / "rank_3.json"
    jpath.write_text(json.dumps(jraw))
    a = parse_dump(raw, rank=3, source="p")
    b = read_dump_file(jpath)
    assert [
        (e.record_id, e.group, e.collective_seq_id, e.op, e.input_sizes, e.retired) for e in a.entries
    ] == [(e.record_id, e.group, e.collective_seq_id, e.op, e.input_sizes, e.retired) for e in b.entries]
    assert all(e.time_started_ns is None for e in b.entries)
    assert all(not e.frames for e in b.entries)


@pytest.mark.parametrize(
    ("name", "rank"),
    [
        ("comm_lib_trace_rank_3", 3),
        ("nccl_trace_rank_12", 12),
        ("rank_3", 3),
        ("rank_3.json", 3),
        ("node17-comm_lib_trace_rank_7", 7),
        ("rank_5.stall.pkl", 5),
        ("rank_5.stall.pkl.meta.json", None),
        ("README.md", None),
    ],
)
def test_rank_from_file_name(name: str, rank: int | None) -> None:
    assert rank_from_name(name) == rank


def test_truncated_pickle(tmp_path: Path) -> None:
    data = _raw_bytes(SKIP / "rank_0.pkl")
    with pytest.raises(TruncatedDumpError):
        load_raw(data[: len(data) // 2])


def test_truncated_json() -> None:
    with pytest.raises(TruncatedDumpError):
        load_raw(b'{"version": "2.10", "entries": [{"record_id": 1')


def test_empty_garbage_and_wrong_shapes() -> None:
    with pytest.raises(TruncatedDumpError, match="empty"):
        load_raw(b"")
    with pytest.raises(NotADumpError):
        load_raw(b"\x00\x01garbage")
    with pytest.raises(NotADumpError, match="version"):
        load_raw(pickle.dumps({"hello": "world"}))
    with pytest.raises(NotADumpError, match="list"):
        load_raw(pickle.dumps([1, 2, 3]))


@pytest.mark.parametrize("version", ["1.9", "3.0", "10.1"])
def test_wrong_version_is_refused(version: str) -> None:
    with pytest.raises(UnsupportedVersionError, match=version.replace(".", r"\.")):
        load_raw(pickle.dumps({"version": version, "entries": []}))


def test_any_2x_version_and_unknown_backend_read_with_a_warning() -> None:
    raw = load_raw(_raw_bytes(SKIP / "rank_0.pkl"))
    raw["version"] = "2.4"
    for e in raw["entries"]:
        e["profiling_name"] = e["profiling_name"].replace("gloo:", "mybackend:")
    dump = parse_dump(raw, rank=0, source="x")
    assert dump.entries and dump.entries[0].backend == "mybackend"
    assert any("unknown backend 'mybackend'" in w for w in dump.warnings)


def test_too_large(tmp_path: Path) -> None:
    p = tmp_path / "rank_0"
    p.write_bytes(_raw_bytes(SKIP / "rank_0.pkl"))
    with pytest.raises(DumpTooLargeError):
        read_dump_file(p, max_bytes=100)


def test_merge_keeps_frames_and_newest_state() -> None:
    stall = read_dump_file(SKIP / "rank_0.stall.pkl")
    final = read_dump_file(SKIP / "rank_0.final.pkl")
    periodic = read_dump_file(SKIP / "rank_0.pkl")
    merged = merge([periodic, final, stall])
    assert merged.kind == "final"
    assert merged.exception is not None and "RuntimeError" in merged.exception
    last = merged.entries[-1]
    assert last.retired  # gloo retires the op when it fails; the final snapshot is newest
    assert last.frames
    ids = [e.record_id for e in merged.entries]
    assert ids == sorted(set(ids))


def test_discover_skips_sidecars_and_temp_files(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    for name in ("rank_0.pkl", "rank_0.pkl.meta.json", ".rank_1.pkl.tmp", "rank_2.pkl.tmp", "notes.txt"):
        (tmp_path / "a" / name).write_bytes(b"x")
    assert [p.name for p in discover([tmp_path])] == ["rank_0.pkl"]


def test_each_field_of_a_dump_entry_lands_in_its_entry_field(monkeypatch: pytest.MonkeyPatch) -> None:
    # `_entry` (the per-entry fast path) and `_columnar_entries` build Entry by position: every
    # value differs from the others of its type, so a field passed in the wrong place shows.
    raw: dict[str, Any] = {
        "record_id": 11,
        "process_group": ["pg7", "desc"],
        "collective_seq_id": 12,
        "p2p_seq_id": 13,
        "op_id": 14,
        "profiling_name": "nccl:send 0->3",
        "is_p2p": True,
        "input_sizes": [[2, 3]],
        "output_sizes": [[4]],
        "input_dtypes": ["Float"],
        "output_dtypes": ["Half"],
        "state": "started",
        "retired": False,
        "time_created_ns": 15,
        "time_discovered_started_ns": 16,
        "time_discovered_completed_ns": 17,
        "duration_ms": 1.5,
        "timeout_ms": 18,
        "thread_name": "pt_main",
        "frames": [{"name": "step", "filename": "train.py", "line": 19}],
    }
    expected = Entry(
        record_id=11,
        group="pg7",
        collective_seq_id=12,
        p2p_seq_id=13,
        op_id=14,
        backend="nccl",
        op="send",
        raw_op="nccl:send 0->3",
        is_p2p=True,
        input_sizes=((2, 3),),
        output_sizes=((4,),),
        input_dtypes=("Float",),
        output_dtypes=("Half",),
        state="started",
        retired=False,
        time_created_ns=15,
        time_started_ns=16,
        time_completed_ns=17,
        duration_ms=1.5,
        timeout_ms=18,
        thread_name="pt_main",
        peer=3,
        frames=(Frame("step", "train.py", 19),),
    )

    def no_fallback(raw: dict[str, Any], ctx: _Ctx, rank: int) -> Entry:
        raise AssertionError("the fast path declined a well-formed entry")

    monkeypatch.setattr("flightdeck.readers.fr.normalize._entry_slow", no_fallback)
    assert _entry(raw, _Ctx(), 0) == expected
    assert _columnar_entries([raw], _Ctx()) == [expected]
