"""What a NIXL agent did recently: rates, new errors and transfer-time quantiles between samples.

Pure functions over `NixlSample.to_wire()` dicts of one agent (host, agent, source), oldest first;
the server's store keeps a bounded history of them (`nixl_samples`), the web pages and the API
show the result. Counters are cumulative within a counter lifetime (`run`); a change of `run` or a
counter that went down is a reset, and the increase across it is the new value (what the counter
counted since the reset), as Prometheus' `increase()` treats a counter reset.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

#: Seconds of history the rates are taken over (the newest sample and the samples before it).
RATE_WINDOW_S = 60.0

#: The quantiles shown for transfer and post times.
QUANTILES = (0.5, 0.9, 0.99)

_RATE_KEYS = ("tx_bytes", "rx_bytes", "tx_requests", "rx_requests")


def histogram_quantile(q: float, bounds: Sequence[float], counts: Sequence[int]) -> float | None:
    """The q-quantile of a histogram with non-cumulative `counts` (last bucket +Inf), linearly
    interpolated within the bucket as Prometheus' histogram_quantile does; None when empty.
    A quantile in the +Inf bucket is reported as the highest finite bound."""
    total = sum(counts)
    if total == 0 or not bounds:
        return None
    target = q * total
    seen = 0.0
    for i, c in enumerate(counts):
        if c and seen + c >= target:
            if i >= len(bounds):
                return float(bounds[-1])
            lo = 0.0 if i == 0 else float(bounds[i - 1])
            return lo + (float(bounds[i]) - lo) * ((target - seen) / c)
        seen += c
    return float(bounds[-1])


@dataclass(frozen=True, slots=True)
class Quantiles:
    """Quantiles (µs) of the observations of a histogram, and how many there were."""

    count: int
    p50_us: float | None
    p90_us: float | None
    p99_us: float | None

    @classmethod
    def of(cls, bounds: Sequence[float], counts: Sequence[int]) -> Quantiles:
        """The `QUANTILES` of a histogram (non-cumulative counts, +Inf last)."""
        p50, p90, p99 = (histogram_quantile(q, bounds, counts) for q in QUANTILES)
        return cls(count=int(sum(counts)), p50_us=p50, p90_us=p90, p99_us=p99)


@dataclass(frozen=True, slots=True)
class NixlWindow:
    """What one agent did between its oldest and newest sample of a window."""

    #: read_time_ns of the first and last sample, and the seconds between them (> 0).
    start_ns: int
    end_ns: int
    seconds: float
    tx_bytes_per_s: float
    rx_bytes_per_s: float
    tx_requests_per_s: float
    rx_requests_per_s: float
    #: Failed operations in the window, by kind (kinds without new failures left out).
    errors: dict[str, int] = field(default_factory=dict)
    #: Telemetry events NIXL dropped in the window.
    events_dropped: int = 0
    #: Transfer (post → completion) and post times of the transfers completed in the window.
    xfer_time: Quantiles | None = None
    post_time: Quantiles | None = None
    #: Counter resets inside the window (agent or collector restarts).
    resets: int = 0

    def to_json(self) -> dict[str, Any]:
        """A plain JSON-able dict (the API's `window` object)."""
        out: dict[str, Any] = {
            "start_s": self.start_ns / 1e9,
            "end_s": self.end_ns / 1e9,
            "seconds": self.seconds,
            "tx_bytes_per_s": self.tx_bytes_per_s,
            "rx_bytes_per_s": self.rx_bytes_per_s,
            "tx_requests_per_s": self.tx_requests_per_s,
            "rx_requests_per_s": self.rx_requests_per_s,
            "errors": dict(sorted(self.errors.items())),
            "events_dropped": self.events_dropped,
            "resets": self.resets,
        }
        for name, qs in (("xfer_time_us", self.xfer_time), ("post_time_us", self.post_time)):
            out[name] = (
                None
                if qs is None
                else {"count": qs.count, "p50": qs.p50_us, "p90": qs.p90_us, "p99": qs.p99_us}
            )
        return out


def _is_reset(prev: Mapping[str, Any], cur: Mapping[str, Any]) -> bool:
    """Whether `cur` starts a new counter lifetime after `prev` (new run, or a counter went down)."""
    if prev.get("run") != cur.get("run"):
        return True
    return any(int(cur.get(k) or 0) < int(prev.get(k) or 0) for k in (*_RATE_KEYS, "events_dropped"))


def _hist_increase(prev: Mapping[str, Any] | None, cur: Mapping[str, Any] | None) -> list[int] | None:
    """Bucket-wise increase of a histogram; None when `cur` has none. `prev` None: a reset."""
    if not cur:
        return None
    counts = [int(c) for c in cur.get("counts") or []]
    if prev is None or prev.get("bounds_us") != cur.get("bounds_us"):
        return counts
    old = [int(c) for c in prev.get("counts") or []]
    if len(old) != len(counts) or any(c < o for c, o in zip(counts, old, strict=True)):
        return counts
    return [c - o for c, o in zip(counts, old, strict=True)]


def window_stats(samples: Sequence[Mapping[str, Any]]) -> NixlWindow | None:
    """Rates and increases over `samples` (one agent, oldest first); None with fewer than two
    samples or no time between the first and the last.

    Increases are summed over consecutive pairs, so a reset in the middle loses nothing that a
    sample saw. Histogram quantiles come from the bucket-wise increase, i.e. they describe the
    transfers of the window, not of the agent's whole life.
    """
    ordered = sorted(samples, key=lambda s: int(s.get("read_time_ns") or 0))
    if len(ordered) < 2:
        return None
    start, end = int(ordered[0].get("read_time_ns") or 0), int(ordered[-1].get("read_time_ns") or 0)
    if end <= start:
        return None
    inc = dict.fromkeys(_RATE_KEYS, 0)
    dropped = resets = 0
    errors: dict[str, int] = {}
    hists: dict[str, tuple[list[float], list[int]]] = {}
    for prev, cur in itertools.pairwise(ordered):
        reset = _is_reset(prev, cur)
        resets += reset
        base: Mapping[str, Any] = {} if reset else prev
        for k in _RATE_KEYS:
            inc[k] += int(cur.get(k) or 0) - int(base.get(k) or 0)
        dropped += int(cur.get("events_dropped") or 0) - int(base.get("events_dropped") or 0)
        old_errors = base.get("errors") or {}
        for kind, n in (cur.get("errors") or {}).items():
            d = int(n) - int(old_errors.get(kind, 0))
            if d < 0:  # a kind's count went down without the others: treat that kind as reset
                d = int(n)
            if d:
                errors[str(kind)] = errors.get(str(kind), 0) + d
        for h in ("xfer_time", "post_time"):
            cur_h = cur.get(h)
            d_counts = _hist_increase(None if reset else base.get(h), cur_h)
            if d_counts is None or cur_h is None:
                continue
            bounds = [float(b) for b in cur_h.get("bounds_us") or []]
            have = hists.get(h)
            if have is not None and have[0] == bounds:
                hists[h] = (bounds, [a + b for a, b in zip(have[1], d_counts, strict=True)])
            else:
                hists[h] = (bounds, d_counts)  # a new bucket layout: only the newest part counts
    seconds = (end - start) / 1e9
    return NixlWindow(
        start_ns=start,
        end_ns=end,
        seconds=seconds,
        tx_bytes_per_s=inc["tx_bytes"] / seconds,
        rx_bytes_per_s=inc["rx_bytes"] / seconds,
        tx_requests_per_s=inc["tx_requests"] / seconds,
        rx_requests_per_s=inc["rx_requests"] / seconds,
        errors=errors,
        events_dropped=dropped,
        xfer_time=Quantiles.of(*hists["xfer_time"]) if "xfer_time" in hists else None,
        post_time=Quantiles.of(*hists["post_time"]) if "post_time" in hists else None,
        resets=resets,
    )
