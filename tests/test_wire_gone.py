"""The batch's `gone` list: ranks whose process the collector saw exit, round trip and checks."""

from __future__ import annotations

import copy

import pytest

from flightdeck.wire import MAX_GONE, Batch, GoneRank, WireError, decode_batch, encode_batch


def _batch(gone: list[GoneRank]) -> Batch:
    return Batch("b-1", "node-a", "0.1", 1_800_000_000_000_000_000, [], [], gone)


def test_gone_round_trips_and_is_left_out_when_empty() -> None:
    g = GoneRank("job-a", 0, 3, 4242, 1_800_000_000_000_000_123)
    doc = encode_batch(_batch([g]))
    assert doc["gone"] == [g.to_json()]
    assert decode_batch(doc).gone == [g]
    empty = encode_batch(_batch([]))
    assert "gone" not in empty
    assert decode_batch(empty).gone == []


@pytest.mark.parametrize(
    ("key", "value", "says"),
    [
        ("job", "", "must not be empty"),
        ("job", "a\x1b[31m", "control character"),
        ("job", 7, "expected a string"),
        ("rank", -1, "batch.gone[0].rank"),
        ("rank", True, "batch.gone[0].rank"),
        ("pid", 2**63, "batch.gone[0].pid"),
        ("attempt", 2**31, "batch.gone[0].attempt"),
        ("gone_at_ns", "now", "batch.gone[0].gone_at_ns"),
    ],
)
def test_a_bad_gone_value_is_refused_with_its_place(key: str, value: object, says: str) -> None:
    doc = encode_batch(_batch([GoneRank("job-a", 0, 3, 4242, 1)]))
    bad = copy.deepcopy(doc)
    bad["gone"][0][key] = value
    with pytest.raises(WireError, match=says.replace("[", r"\[").replace("]", r"\]")):
        decode_batch(bad)


@pytest.mark.slow
def test_gone_list_is_bounded() -> None:
    doc = encode_batch(_batch([GoneRank("job-a", 0, 1, 2, 3)]))
    doc["gone"] = doc["gone"] * (MAX_GONE + 1)
    with pytest.raises(WireError, match="more than"):
        decode_batch(doc)
    doc["gone"] = {"job": "x"}
    with pytest.raises(WireError, match="expected a list"):
        decode_batch(doc)
