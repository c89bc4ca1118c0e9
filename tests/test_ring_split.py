"""When the agent writes the whole ring and when only its recent changes (`flightdeck.spool`)."""

from __future__ import annotations

import pickle
from typing import Any

from flightdeck.readers.fr.decode import load_raw
from flightdeck.spool import MIN_RECENT_ENTRIES, RingSplitter
from tests.support.collector_fixtures import FR_DATA

S = 1_000_000_000


def ring() -> dict[str, Any]:
    """A real gloo ring (the wrapped scenario), everything finished."""
    raw = load_raw((FR_DATA / "wrapped" / "rank_0.pkl").read_bytes())
    for e in raw["entries"]:
        e["retired"] = True
    return raw


def enqueue(raw: dict[str, Any], n: int, *, drop: int = 0) -> None:
    """`n` new unfinished collectives; the `drop` oldest leave the ring."""
    entries = raw["entries"]
    last = entries[-1]
    for i in range(1, n + 1):
        entries.append(dict(last, record_id=last["record_id"] + i, retired=False))
    del entries[:drop]


def test_whole_ring_first_then_only_new_and_unfinished_entries() -> None:
    raw = ring()
    raw["entries"][-1]["retired"] = False  # still in flight at the whole snapshot
    splitter = RingSplitter(full_every_s=30)
    data = pickle.dumps(raw)
    part = splitter.split(raw, data, 0)
    assert (part.kind, part.data, part.ring) == ("full", data, None)
    splitter.written(part, 0)
    in_flight = raw["entries"][-1]["record_id"]

    enqueue(raw, 3, drop=2)
    part = splitter.split(raw, pickle.dumps(raw), 2 * S)
    assert part.kind == "recent" and part.ring is not None
    got = pickle.loads(part.data)
    ids = [e["record_id"] for e in raw["entries"]]
    # The entry unfinished at the whole snapshot (it may have finished since) and the new ones.
    assert [e["record_id"] for e in got["entries"]] == [in_flight, *ids[-3:]]
    assert part.ring == {"first": ids[0], "entries": len(ids), "base_time_ns": 0}
    assert {k: v for k, v in got.items() if k != "entries"} == {
        k: v for k, v in raw.items() if k != "entries"
    }
    splitter.written(part, 2 * S)  # a recent file is no base: the next one still starts from 0
    assert splitter.split(raw, b"", 4 * S).ring == {"first": ids[0], "entries": len(ids), "base_time_ns": 0}


def test_whole_ring_again_when_due_or_when_the_changes_are_a_large_part_of_it() -> None:
    raw = ring()
    splitter = RingSplitter(full_every_s=30)
    splitter.written(splitter.split(raw, b"w", 0), 0)
    assert splitter.split(raw, b"w", 30 * S).kind == "full"  # due
    enqueue(raw, MIN_RECENT_ENTRIES + 1)
    assert splitter.split(raw, b"w", 2 * S).kind == "full"  # more changed than the recent file may hold
    assert RingSplitter(full_every_s=0).split(raw, b"w", 0).kind == "full"  # the old format, always whole


def test_entries_it_cannot_vouch_for_are_written_whole() -> None:
    raw = ring()
    splitter = RingSplitter(full_every_s=30)
    splitter.written(splitter.split(raw, b"w", 0), 0)
    raw["entries"][0]["record_id"] = "7"
    part = splitter.split(raw, b"odd", 2 * S)
    assert (part.kind, part.data) == ("full", b"odd")
    splitter.written(part, 2 * S)
    assert splitter.base_time_ns is None  # and no base for recent files until a usable ring
    assert splitter.split({"entries": []}, b"empty", 4 * S).kind == "full"
