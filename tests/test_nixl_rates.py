"""`flightdeck.nixl_rates` on real samples of the committed NIXL 1.5.1 prometheus_mp store.

The store (tests/data/nixl/mp-1.5.1, written by a real nixl agent pair) holds NIXL's own
cumulative counters; read at two times it gives two samples of one counter run. The server-side
path (ingest, history, API, page) is tested in tests/test_server_web.py.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from flightdeck.nixl_rates import histogram_quantile, window_stats
from flightdeck.nixl_records import NixlSample
from flightdeck.readers.nixl_mp import read_mp_dir

MP = Path(__file__).resolve().parent / "data" / "nixl" / "mp-1.5.1"
NS = 1_000_000_000
T0 = 1_800_000_000 * NS


def initiator(at_ns: int) -> NixlSample:
    """The initiator agent's sample, read at `at_ns`."""
    samples, errors = read_mp_dir(MP, host="h", clock=lambda: at_ns)
    assert errors == []
    return next(s for s in samples if s.agent == "initiator")


def test_one_sample_has_no_window() -> None:
    assert window_stats([initiator(T0).to_wire()]) is None
    same_time = [initiator(T0).to_wire(), initiator(T0).to_wire()]
    assert window_stats(same_time) is None


def test_nothing_new_between_two_reads() -> None:
    a, b = initiator(T0), initiator(T0 + 30 * NS)
    assert a.tx_requests > 0 and a.xfer_time.count > 0
    w = window_stats([b.to_wire(), a.to_wire()])  # any order: sorted by read time
    assert w is not None
    assert (w.seconds, w.tx_bytes_per_s, w.rx_requests_per_s, w.resets) == (30.0, 0.0, 0.0, 0)
    assert w.errors == {} and w.events_dropped == 0
    assert w.xfer_time is not None and w.xfer_time.count == 0 and w.xfer_time.p50_us is None


def test_counter_going_down_is_a_reset_and_counts_from_zero() -> None:
    # What a restarted writer reusing the run id would look like: the counters start over.
    a, b = initiator(T0), initiator(T0 + 10 * NS)
    restarted = dataclasses.replace(b, tx_bytes=4096, tx_requests=1)
    w = window_stats([a.to_wire(), restarted.to_wire()])
    assert w is not None and w.resets == 1
    assert w.tx_bytes_per_s == 4096 / 10 and w.tx_requests_per_s == 1 / 10
    # After a reset the histogram counts from zero too: the quantiles are of the new run's buckets.
    xfer = b.xfer_time
    assert w.xfer_time is not None and w.xfer_time.count == xfer.count
    assert w.xfer_time.p99_us == histogram_quantile(0.99, xfer.bounds_us, xfer.counts)
    assert w.to_json()["xfer_time_us"]["count"] == xfer.count
