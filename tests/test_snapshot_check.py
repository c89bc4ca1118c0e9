"""The collector's check of one snapshot and the server's validation refuse the same things, by the
one set of rules in `flightdeck.limits`: each item of issue 21's "garbage is stored" list, on a real
healthy job's snapshot, is refused by `check_snapshot` (the collector quarantines the file alone) and,
sent as it is, by `decode_checked` (the server's 422 names it); a copied dump renamed to another rank
never becomes that rank.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from flightdeck.limits import MAX_FRAME_TEXT, MAX_THREAD, MAX_WORLD_SIZE
from flightdeck.readers.fr.errors import NotADumpError
from flightdeck.readers.fr.files import read_dump_file
from flightdeck.records import Frame
from flightdeck.server.validation import decode_checked
from flightdeck.snapshot_check import SnapshotError, check_snapshot
from flightdeck.wire import Snapshot, encode_batch, snapshot_from_dump
from tests.support.collector_fixtures import FR_DATA
from tests.support.server_batches import make_batch, scenario_dumps, snapshots


def _healthy() -> Snapshot:
    """healthy_4's rank 1, latest snapshot, as the collector makes it."""
    return snapshots([scenario_dumps("healthy_4")[1][-1]])[0]


def _entries(**fields: Any) -> Callable[[Snapshot], None]:
    def edit(s: Snapshot) -> None:
        s.entries = [replace(e, **fields) for e in s.entries]

    return edit


def _first_entry(**fields: Any) -> Callable[[Snapshot], None]:
    def edit(s: Snapshot) -> None:
        s.entries[0] = replace(s.entries[0], **fields)

    return edit


#: issue 21's list (and its neighbours): an edit of a healthy snapshot, the field both refusals name.
GARBAGE: dict[str, tuple[Callable[[Snapshot], None], tuple[str, str]]] = {
    "negative_attempt": (lambda s: setattr(s, "attempt", -1), ("attempt", ".attempt")),
    "attempt_over_int32": (lambda s: setattr(s, "attempt", 2**31), ("attempt", ".attempt")),
    "negative_world_size": (lambda s: setattr(s, "world_size", -4), ("world_size", ".world_size")),
    "world_size_0": (lambda s: setattr(s, "world_size", 0), ("world_size", ".world_size")),
    "world_size_over_max": (
        lambda s: setattr(s, "world_size", MAX_WORLD_SIZE + 1),
        ("world_size", ".world_size"),
    ),
    "rank_not_below_world": (lambda s: setattr(s, "rank", 4), ("rank", ".rank")),
    "negative_record_id": (_first_entry(record_id=-1), ("entries.record_id", ".rid")),
    "negative_time_created": (_first_entry(time_created_ns=-1), ("entries.time_created_ns", ".tc")),
    "negative_time_started": (_entries(time_started_ns=-1), ("entries.time_started_ns", ".ts")),
    "negative_snapshot_time": (
        lambda s: setattr(s, "snapshot_time_ns", -1),
        ("snapshot_time_ns", ".snapshot_time_ns"),
    ),
    "ansi_in_job": (lambda s: setattr(s, "job", "bad\x1b[31mjob"), ("job", ".job")),
    "ansi_in_host": (lambda s: setattr(s, "host", "node\x1b]0;x\x07"), ("host", ".host")),
    "ansi_in_group": (_entries(group="0\x1b[2J"), ("entries.group", ".g")),
    "ansi_in_op": (_entries(raw_op="nccl:all_reduce\x1b[0m"), ("entries.op", "op")),
    "nul_in_frame": (
        lambda s: setattr(s, "entries", [replace(e, frames=(Frame("f\x00", "a.py", 1),)) for e in s.entries]),
        ("frames", "frame"),
    ),
    "too_many_dimensions": (_entries(input_sizes=((1,) * 65,)), ("entries.sizes", "dimensions")),
}


@pytest.mark.parametrize("case", sorted(GARBAGE))
def test_the_collector_and_the_server_refuse_the_same_garbage(case: str) -> None:
    edit, (field, server_field) = GARBAGE[case]
    snap = _healthy()
    edit(snap)
    with pytest.raises(SnapshotError) as caught:
        check_snapshot(snap)
    assert str(caught.value).startswith(field), caught.value
    # The same snapshot (unnormalized), sent as it is: the server's validation refuses it alone.
    sent = _healthy()
    edit(sent)
    batch, refused = decode_checked(encode_batch(make_batch([_healthy(), sent], sent_at_ns=2 * 10**18)))
    assert [r.index for r in refused] == [1], (case, refused)
    assert server_field in refused[0].reason, (case, refused[0].reason)
    assert len(batch.snapshots) == 1


def test_a_healthy_snapshot_passes_both_and_shown_text_is_normalized_alike() -> None:
    snap = _healthy()
    long_frame = Frame("n" * (MAX_FRAME_TEXT + 10), "file.py", 3)
    snap.entries = [replace(e, thread_name="t" * 200, frames=(long_frame,)) for e in snap.entries]
    snap.exception = "boom\x1b[31m\x00"
    check_snapshot(snap)
    assert {e.thread_name for e in snap.entries} == {"t" * MAX_THREAD}
    assert {len(e.frames[0].name) for e in snap.entries} == {MAX_FRAME_TEXT}
    assert snap.exception == "boom\ufffd[31m\ufffd"
    batch, refused = decode_checked(encode_batch(make_batch([snap], sent_at_ns=2 * 10**18)))
    assert refused == [] and batch.snapshots[0].exception == snap.exception


def _copy(src: Path, dest: Path, *, sidecar: bool) -> Path:
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dest)  # fresh file times, as a user's copy
    if sidecar:
        shutil.copyfile(src.with_name(src.name + ".meta.json"), dest.with_name(dest.name + ".meta.json"))
    return dest


def test_a_dump_copied_as_rank_21_never_becomes_rank_21(tmp_path: Path) -> None:
    """`cp rank_1.pkl rank_21.pkl` in a 4-rank job's directory. Without its sidecar, the rank comes
    from the name, but the dump's own pg_config (gloo's unnamed default group, members 0..3) says
    rank 21 is none of its ranks: the file is refused (the collector quarantines it). With its
    sidecar copied too, the sidecar's rank (1) wins over the name: it is rank 1 again, a duplicate
    the store merges. A sidecar that names rank 21 in a world of 4, or rank 21 with no world size
    but process groups of members 0..3, is refused."""
    src = FR_DATA / "healthy_4" / "rank_1.pkl"
    with pytest.raises(
        NotADumpError, match=r"rank 21 \(from the file name\) is a member of none of its pg_config"
    ):
        read_dump_file(_copy(src, tmp_path / "bare" / "rank_21.pkl", sidecar=False))
    assert read_dump_file(_copy(src, tmp_path / "bare" / "rank_1.pkl", sidecar=False)).rank == 1
    with_sidecar = read_dump_file(_copy(src, tmp_path / "a" / "rank_21.pkl", sidecar=True))
    assert with_sidecar.rank == 1 and with_sidecar.job == "healthy_4"
    check_snapshot(snapshot_from_dump(with_sidecar))  # a valid rank 1 snapshot, nothing fake

    snap = snapshot_from_dump(with_sidecar)
    snap.rank = 21  # the sidecar edited to say 21, world size 4
    with pytest.raises(SnapshotError, match=r"rank: 21 is not in \[0, 4\)"):
        check_snapshot(snap)

    snap = snapshot_from_dump(with_sidecar)
    snap.rank, snap.world_size = 21, None  # no world size: the groups tell
    assert snap.groups["0"].ranks == (0, 1, 2, 3)
    with pytest.raises(SnapshotError, match="member of none of its dump's process groups"):
        check_snapshot(snap)
