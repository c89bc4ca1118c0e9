"""NIXL samples (`flightdeck/nixl_records.py`) on the wire and the readers' `Accumulator`
(`flightdeck/readers/nixl.py`): a JSON round trip of real samples, bad wire samples and
histograms refused clearly, `le` buckets."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from flightdeck.collector.nixl_consumer import OwnerFinder, RingDirectory
from flightdeck.nixl_records import Histogram, NixlSample
from flightdeck.readers.nixl import EVENT_TYPE_IDS, Accumulator
from flightdeck.readers.nixl_mp import read_mp_dir
from flightdeck.readers.nixl_ring import read_ring
from tests.support.nixl_fixtures import DATA, copy_fixture


def _sample() -> NixlSample:
    acc = Accumulator()
    for type_id, value in read_ring(DATA / "ring-1.5.1" / "initiator", consume=False).events:
        acc.add(type_id, value)
    return acc.sample(
        host="h",
        agent="a",
        pid=1,
        local_rank=0,
        source="ring",
        read_time_ns=5,
        run="r",
        format_version=4,
        writer_alive=True,
        restarts=0,
        ring_full_reads=0,
    )


def test_wire_round_trip_through_json(tmp_path: Path) -> None:
    ring = copy_fixture("ring-1.5.1", tmp_path)
    for s in (
        RingDirectory(ring, host="h", owner_finder=OwnerFinder(tmp_path)).poll()[0]
        + read_mp_dir(copy_fixture("mp-1.5.1", tmp_path), host="h")[0]
    ):
        assert NixlSample.from_wire(json.loads(json.dumps(s.to_wire()))) == s


def _wire_with(**changes: Any) -> dict[str, Any]:
    w = _sample().to_wire()
    for k, v in changes.items():
        if v is ...:
            del w[k]
        else:
            w[k] = v
    return w


BAD_WIRE: dict[str, tuple[object, str]] = {
    "not an object": ([], r"nixl sample: expected an object, got list"),
    "no version": ({}, r"unsupported wire version None"),
    "wire version": (_wire_with(v=2), r"unsupported wire version 2"),
    "missing field": (_wire_with(tx_bytes=...), r"tx_bytes must be a non-negative integer, got None"),
    "negative": (_wire_with(rx_bytes=-1), r"rx_bytes must be a non-negative integer, got -1"),
    "bool for int": (_wire_with(tx_requests=True), r"tx_requests must be a non-negative integer"),
    "source": (_wire_with(source="http"), r"source must be 'mp' or 'ring'"),
    "error kind": (_wire_with(errors={"Not Found": 1}), r"bad error kind 'Not Found'"),
    "agent": (_wire_with(agent=""), r"agent must not be empty"),
    "alive": (_wire_with(writer_alive="yes"), r"writer_alive must be a boolean or null"),
}


@pytest.mark.parametrize("case", sorted(BAD_WIRE))
def test_bad_wire_sample_is_refused_clearly(case: str) -> None:
    raw, message = BAD_WIRE[case]
    with pytest.raises(ValueError, match=message):
        NixlSample.from_wire(raw)


@pytest.mark.parametrize(
    ("hist", "message"),
    [
        ({"bounds_us": [1, 2], "counts": [1, 0], "sum_us": 1, "count": 1}, r"expected 3 bucket counts"),
        ({"bounds_us": [2, 1], "counts": [0, 0, 0], "sum_us": 0, "count": 0}, r"strictly increasing"),
        ({"bounds_us": [1], "counts": [1, 1], "sum_us": 3, "count": 1}, r"count 1 differs from .* 2"),
        (
            {"bounds_us": [1], "counts": [0, -1], "sum_us": 0, "count": 0},
            r"counts\[1\] must be a non-negative",
        ),
        ({"bounds_us": "1", "counts": [0], "sum_us": 0, "count": 0}, r"bounds_us must be a list"),
    ],
)
def test_bad_wire_histogram_is_refused_clearly(hist: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        NixlSample.from_wire(_wire_with(xfer_time=hist))


def test_accumulator_le_buckets() -> None:
    acc = Accumulator((10.0, 100.0))
    for v in (0, 10, 11, 100, 101):
        acc.add(EVENT_TYPE_IDS["agent_xfer_time"], v)
    assert acc.histogram(EVENT_TYPE_IDS["agent_xfer_time"]) == Histogram((10.0, 100.0), (2, 2, 1), 222, 5)
