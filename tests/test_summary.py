"""The per-rank summary folded snapshot by snapshot, as the server does, against the summary of
the rank's merged dump, as `flightdeck analyze` does."""

from __future__ import annotations

import pytest

from flightdeck.analysis.summary import RankSummary, add_entries, summarize
from flightdeck.readers.frdump import merge
from flightdeck.records import META_FIELDS, RankDump, meta_of
from flightdeck.wire import Snapshot, snapshot_from_dump
from tests.support.server_batches import scenario_dumps


@pytest.mark.parametrize("scenario", ["skip", "healthy_4", "size_mismatch"])
def test_a_later_snapshot_without_frames_takes_no_frames_away(scenario: str) -> None:
    # The skip ranks' periodic snapshot re-sends the stuck collective without frames after their
    # stall snapshot sent it with them: the tail keeps them, as merging the dumps does.
    for rank, dumps in scenario_dumps(scenario).items():
        ordered = sorted(dumps, key=lambda d: d.snapshot_time_ns or 0)
        folded = summarize(ordered[0])
        for d in ordered[1:]:
            add_entries(folded, d.entries)
        merged = summarize(merge(ordered))
        assert folded.tracks.keys() == merged.tracks.keys()
        for g, track in merged.tracks.items():
            want = [(e.collective_seq_id, e.state, e.frames) for e in track.tail]
            got = [(e.collective_seq_id, e.state, e.frames) for e in folded.tracks[g].tail]
            assert got == want, (scenario, rank, g)


def test_every_shape_of_a_rank_carries_all_of_its_metadata() -> None:
    # A file's dump, the wire's snapshot and the diagnosis's summary each hold `RankMeta`'s
    # fields, and a copy from one to the next keeps every one.
    for cls in (RankDump, Snapshot, RankSummary):
        assert set(META_FIELDS) <= set(cls.__dataclass_fields__), cls
    for dumps in scenario_dumps("kill_in_subgroup").values():
        for d in dumps:
            assert meta_of(summarize(d)) == meta_of(d)
            assert meta_of(snapshot_from_dump(d)) == meta_of(d)
