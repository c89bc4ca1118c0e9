"""What the collector re-ships of a rank: `collector.delta.diff` on real dumps."""

from __future__ import annotations

import dataclasses
import pickle
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from flightdeck.collector.delta import RankState, diff, merge_progress, progress
from flightdeck.collector.frdump import load_raw, read_dump_file
from flightdeck.collector.incremental import IncrementalReader, read_changed
from flightdeck.records import RankDump

if TYPE_CHECKING:
    from tests.test_collector_fixtures import FR_DATA, AgentStandIn
else:
    from test_collector_fixtures import FR_DATA, AgentStandIn


def real(name: str, scenario: str = "healthy_2") -> RankDump:
    return read_dump_file(FR_DATA / scenario / name)


def unfinished(d: RankDump) -> RankDump:
    """The same ring as it looked earlier: nothing retired yet, taken a second before."""
    return dataclasses.replace(
        d,
        entries=[dataclasses.replace(e, retired=False) for e in d.entries],
        snapshot_time_ns=(d.snapshot_time_ns or 0) - 1_000_000_000,
    )


def test_first_snapshot_ships_everything_and_the_same_again_nothing() -> None:
    d = real("rank_0.pkl")
    changed, state = diff(None, d)
    assert changed == d.entries
    again, state2 = diff(state, d)
    assert again == [] and state2 == state


def test_only_progressed_entries_are_shipped() -> None:
    later = real("rank_0.pkl")
    earlier = unfinished(later)
    _, state = diff(None, earlier)
    changed, _ = diff(state, later)
    assert [e.record_id for e in changed] == [e.record_id for e in later.entries if e.retired]
    assert all(e.retired for e in changed)


def test_frames_reship_an_entry_and_a_late_older_snapshot_never_regresses() -> None:
    periodic, final = real("rank_0.pkl"), real("rank_0.final.pkl")
    assert not any(e.frames for e in periodic.entries) and all(e.frames for e in final.entries)
    _, state = diff(None, final)
    # An older periodic snapshot read after the final one: nothing to ship (no progress, no frames).
    changed, state2 = diff(state, unfinished(periodic))
    assert changed == []
    assert state2.last_time_ns == state.last_time_ns
    # An older snapshot with frames the newer lacked: shipped, but with the progress already shipped.
    _, p_state = diff(None, periodic)
    old_with_frames = dataclasses.replace(
        unfinished(final), snapshot_time_ns=(periodic.snapshot_time_ns or 0) - 1
    )
    changed, _ = diff(p_state, old_with_frames)
    shared = {e.record_id for e in periodic.entries}
    by_id = {e.record_id: e for e in changed}
    assert shared <= set(by_id)
    assert all(by_id[r].frames and by_id[r].retired for r in shared if r in by_id)


def test_a_new_process_behind_the_same_file_is_shipped_again() -> None:
    d = real("rank_0.pkl")
    _, state = diff(None, d)
    restarted = dataclasses.replace(
        d,
        entries=[dataclasses.replace(e, time_created_ns=e.time_created_ns + 10**12) for e in d.entries],
        snapshot_time_ns=(d.snapshot_time_ns or 0) + 10**12,
    )
    changed, _ = diff(state, restarted)
    assert len(changed) == len(d.entries)


def test_wrapped_ring_forgets_what_fell_out() -> None:
    d = real("rank_0.pkl", "wrapped")
    assert d.wrapped
    _, state = diff(None, d)
    assert state.floor == d.entries[0].record_id
    assert set(state.entries) == {e.record_id for e in d.entries}
    assert RankState.decode(state.encode()) == state


def test_progress_merges_per_component() -> None:
    e = real("rank_0.final.pkl").entries[0]
    p = progress(e)
    assert p & 8  # frames
    assert merge_progress(0b0010, 0b0100) == 0b0110  # completed + retired
    with pytest.raises(ValueError, match="corrupt"):
        RankState.decode(b"not zlib")


def test_incremental_read_matches_the_full_reader_and_falls_back_on_odd_entries(tmp_path: Path) -> None:
    src = FR_DATA / "healthy_4" / "rank_2.final.pkl"
    full = read_dump_file(src)
    got = read_changed(src, identify=lambda head: None, max_bytes=1 << 24)
    assert got.dump.entries == full.entries and got.total_entries == len(full.entries)
    assert (got.dump.job, got.dump.kind, got.oldest_record_id) == (
        full.job,
        full.kind,
        full.entries[0].record_id,
    )
    # Only the progressed entries are normalized on the next read.
    _, state = diff(None, unfinished(full))
    got = read_changed(src, identify=lambda head: state, max_bytes=1 << 24)
    assert [e.record_id for e in got.dump.entries] == [e.record_id for e in full.entries if e.retired]
    # A record id the fast path cannot trust: the full reader normalizes every entry instead.
    raw = load_raw(src.read_bytes())
    raw["entries"][0]["record_id"] = str(raw["entries"][0]["record_id"])
    odd = tmp_path / "rank_2.pkl"
    odd.write_bytes(pickle.dumps(raw))
    got = read_changed(odd, identify=lambda head: None, max_bytes=1 << 24)
    assert [e.record_id for e in got.dump.entries] == [e.record_id for e in full.entries]


def test_reader_with_memory_ships_what_the_full_reader_ships(tmp_path: Path) -> None:
    """The ring moves on (entries finish, the oldest leave, new ones come): the reader that compares
    with the previous version ships exactly what a full scan and plan ship, and an unchanged ring
    rewritten (a hung rank) ships nothing but its new snapshot time."""
    agent = AgentStandIn(FR_DATA / "wrapped" / "rank_0.pkl", tmp_path / "rank_0.pkl")
    entries = agent.entries
    ahead = entries[-6:]  # kept back, enqueued later as new collectives
    del entries[-6:]
    reader = IncrementalReader()
    state: RankState | None = None
    for step in range(5):
        agent.finish(2)
        if step in (1, 3):
            entries[:] = entries[3:] + ahead[:3]  # 3 leave the ring, 3 new enter
            ahead = ahead[3:]
        agent.write()
        shipped = state

        def identify(head: RankDump, shipped: RankState | None = shipped) -> RankState | None:
            return shipped

        full = read_changed(agent.target, identify=identify, max_bytes=1 << 24)
        got = reader.read(agent.target, identify=identify, max_bytes=1 << 24)
        assert got.dump.entries == full.dump.entries, step
        assert (got.state, got.oldest_record_id, got.total_entries) == (
            full.state,
            full.oldest_record_id,
            full.total_entries,
        )
        assert got.dump.snapshot_time_ns == agent.time_ns and got.dump.job == full.dump.job
        state = got.state
    assert state is not None and state.floor == entries[0]["record_id"]

    agent.write()  # same ring, new sidecar: nothing to ship, the snapshot time moves on
    got = reader.read(agent.target, identify=lambda head: state, max_bytes=1 << 24)
    assert got.dump.entries == [] and got.total_entries == len(entries)
    assert got.state.last_time_ns == agent.time_ns and got.state.entries == state.entries
    assert got.dump.wrapped and got.oldest_record_id == entries[0]["record_id"]
    # Another reader (another process, or a state from elsewhere) reads it in full: nothing either.
    assert read_changed(agent.target, identify=lambda head: state, max_bytes=1 << 24).dump.entries == []
