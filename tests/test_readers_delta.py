"""What the collector re-ships of a rank: `readers.delta.diff` on real dumps."""

from __future__ import annotations

import dataclasses
import pickle
from collections.abc import Callable
from pathlib import Path

import pytest

from flightdeck.readers.delta import RankState, diff, merge_progress, progress
from flightdeck.readers.fr.decode import load_raw
from flightdeck.readers.fr.files import read_dump_file
from flightdeck.readers.fr.merge import merge
from flightdeck.readers.incremental import IncrementalReader, read_changed
from flightdeck.records import RankDump
from flightdeck.spool import RingSplitter
from tests.support.collector_fixtures import FR_DATA, AgentStandIn


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


def shipped_as(state: RankState | None) -> Callable[[RankDump], RankState | None]:
    """An `identify` for the reader that says `state` was shipped for the rank."""
    return lambda head: state


def test_whole_rings_and_recent_changes_ship_what_whole_rings_every_time_ship(tmp_path: Path) -> None:
    """The agent writes the whole ring only now and then and its recent changes in between
    (`flightdeck.spool`): the collector ships exactly what it ships when every snapshot is the
    whole ring, keeps the same state, and knows where the ring begins and how long it is."""
    whole_every = AgentStandIn(FR_DATA / "wrapped" / "rank_0.pkl", tmp_path / "a" / "rank_0.pkl")
    split = AgentStandIn(FR_DATA / "wrapped" / "rank_0.pkl", tmp_path / "b" / "rank_0.pkl")
    for d in (tmp_path / "a", tmp_path / "b"):
        d.mkdir()
    splitter = RingSplitter(full_every_s=3.0)
    ahead = [e for e in split.entries[-9:]]
    for agent in (whole_every, split):
        del agent.entries[-9:]
    reader_a, reader_b = IncrementalReader(), IncrementalReader()
    state_a: RankState | None = None
    state_b: RankState | None = None
    kinds = []
    for step in range(8):
        for agent in (whole_every, split):
            agent.finish(2)
            if step in (1, 2, 5):
                agent.entries[:] = agent.entries[3:] + [dict(e) for e in ahead[:3]]  # 3 leave, 3 enter
        if step in (1, 2, 5):
            ahead = ahead[3:]
        whole_every.write()
        path = split.write_split(splitter)
        kinds.append(path.name)
        a = reader_a.read(whole_every.target, identify=shipped_as(state_a), max_bytes=1 << 24)
        b = reader_b.read(path, identify=shipped_as(state_b), max_bytes=1 << 24)
        assert [(e.record_id, e.retired) for e in b.dump.entries] == [
            (e.record_id, e.retired) for e in a.dump.entries
        ], step
        assert b.state.entries == a.state.entries and b.state.floor == a.state.floor, step
        assert (b.oldest_record_id, b.total_entries, b.dump.wrapped) == (
            a.oldest_record_id,
            a.total_entries,
            a.dump.wrapped,
        )
        state_a, state_b = a.state, b.state
    assert kinds.count("rank_0.pkl") == 3 and kinds.count("rank_0.recent.pkl") == 5, kinds

    # A collector that starts now (nothing shipped) reads both files, oldest first: it ships the
    # ring as it is, as the whole ring read once would.
    whole_every.write()
    split.write_split(splitter)
    fresh = IncrementalReader()
    state: RankState | None = None
    shipped: dict[int, bool] = {}
    for name in ("rank_0.pkl", "rank_0.recent.pkl"):
        got = fresh.read(split.target.with_name(name), identify=shipped_as(state), max_bytes=1 << 24)
        shipped.update({e.record_id: e.retired for e in got.dump.entries})
        state = got.state
    ref = read_changed(whole_every.target, identify=lambda head: None, max_bytes=1 << 24)
    assert shipped == {e.record_id: e.retired for e in ref.dump.entries}
    assert state is not None and state.entries == ref.state.entries
    # The offline reader merges the two files into the same ring.
    merged = merge(
        [read_dump_file(split.target), read_dump_file(split.target.with_name("rank_0.recent.pkl"))]
    )
    oldest = ref.oldest_record_id or 0
    assert [(e.record_id, e.retired) for e in merged.entries if e.record_id >= oldest] == [
        (e.record_id, e.retired) for e in ref.dump.entries
    ]
    assert merged.ring_first is None
