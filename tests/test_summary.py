"""The per-rank summary folded snapshot by snapshot, as the server does, against the summary of
the rank's merged dump, as `flightdeck analyze` does."""

from __future__ import annotations

import pytest

from flightdeck.analysis.summary import add_entries, summarize
from flightdeck.readers.fr.merge import merge
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
