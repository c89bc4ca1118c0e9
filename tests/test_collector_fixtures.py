"""The agent stand-in of the collector tests writes dumps the reader reads."""

from __future__ import annotations

from pathlib import Path

from flightdeck.readers.fr.files import read_dump_file
from tests.support.collector_fixtures import FR_DATA, AgentStandIn


def test_stand_in_writes_dumps_the_reader_reads_with_advanced_states(tmp_path: Path) -> None:
    src = FR_DATA / "healthy_2" / "rank_0.pkl"
    agent = AgentStandIn(src, tmp_path / "rank_0.pkl")
    agent.write()
    first = read_dump_file(tmp_path / "rank_0.pkl")
    assert first.entries and not any(e.retired for e in first.entries)
    assert first.job == "healthy_2" and first.kind == "periodic"
    done = agent.finish(3)
    agent.write()
    second = read_dump_file(tmp_path / "rank_0.pkl")
    assert [e.record_id for e in second.entries if e.retired] == done
    assert (second.snapshot_time_ns or 0) > (first.snapshot_time_ns or 0)
