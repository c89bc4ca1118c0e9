"""What the senders and the sampler observed, and the run's figures window by window."""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class Stats:
    """What the senders observed."""

    start: float
    #: Every delivered batch: (seconds since start, request s, first try -> ok s, snapshot time
    #: -> delivered s, entries, bytes).
    delivered: list[tuple[float, float, float, float, int, int]] = field(default_factory=list)
    entries: int = 0
    batches: int = 0
    bytes_sent: int = 0
    #: `--digests`: every answered digest request: (seconds since start, request s, bytes,
    #: whether the answer asked for the job's entries).
    digests: list[tuple[float, float, int, bool]] = field(default_factory=list)
    digest_bytes: int = 0
    #: Answers asking for spans' entries too (a mismatch round).
    span_answers: int = 0
    #: Seconds since start of each 429 and 503 answer.
    throttled: list[float] = field(default_factory=list)
    unavailable: list[float] = field(default_factory=list)
    errors: int = 0
    late_ticks: int = 0
    #: Fault index -> (seconds from the fault until the poller saw its finding, the finding's kind).
    found: dict[int, tuple[float, str]] = field(default_factory=dict)
    #: Every finding episode of the job at the end (the findings API's objects).
    findings: list[dict[str, Any]] = field(default_factory=list)
    #: One per `--window-s` boundary (and the start and the end), from `sample`.
    samples: list[Sample] = field(default_factory=list)
    #: `--kill-owner-at`: which server was killed when, and how long until another diagnosed.
    failover: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class Sample:
    """Resources at one moment of the run."""

    t: float  # seconds since start
    server_cpu_s: list[float]
    #: The servers' highest RSS since the sample before (sampled every second) and now.
    server_rss_peak: list[int]
    server_rss: list[int]
    generator_cpu_s: float
    #: The database's backends: CPU seconds, memory (bytes; `pg_backends`), how many.
    pg_cpu_s: float = 0.0
    pg_mem: int = 0
    pg_backends: int = 0
    db_bytes: int = 0
    machine: tuple[float, float] = (0.0, 0.0)


def pct(values: list[float], p: float) -> float:
    """The p-th percentile (nearest rank) of `values`, 0 when empty."""
    if not values:
        return 0.0
    s = sorted(values)
    return s[min(len(s) - 1, int(p / 100 * len(s)))]


def windows(stats: Stats, ranks: int, end_s: float, window_s: float) -> list[dict[str, Any]]:
    """The run window by window: delivered entries/s, request and delivery latency, delivery lag,
    wire bytes per rank-second (ingest and digests) and 429s by delivery time; with digests, their
    rate, request latency, bytes and answers asking for the entries; resources from the samples."""
    out = []
    samples = sorted(stats.samples, key=lambda s: s.t)
    bounds = [s.t for s in samples]
    if not bounds or bounds[-1] < end_s - 0.5:
        bounds.append(end_s)
    by_window: list[list[tuple[float, float, float, float, int, int]]] = [[] for _ in bounds]
    for row in stats.delivered:
        by_window[min(bisect.bisect_right(bounds, row[0]), len(bounds) - 1)].append(row)
    digests: list[list[tuple[float, float, int, bool]]] = [[] for _ in bounds]
    for d in stats.digests:
        digests[min(bisect.bisect_right(bounds, d[0]), len(bounds) - 1)].append(d)
    lo = 0.0
    for w, hi in enumerate(bounds):
        if hi <= lo:
            continue
        rows, span = by_window[w], hi - lo
        req = [r[1] for r in rows]
        dly = [r[2] for r in rows]
        lag = [r[3] for r in rows]
        win: dict[str, Any] = {
            "t_s": round(hi, 1),
            "entries_per_s": round(sum(r[4] for r in rows) / span),
            "batches_per_s": round(len(rows) / span, 1),
            "request_ms": [round(pct(req, p) * 1000) for p in (50, 90, 99)],
            "delivery_ms": [round(pct(dly, p) * 1000) for p in (50, 99)],
            "lag_s": [round(pct(lag, p), 2) for p in (50, 99, 100)],
            "bytes_per_rank_per_s": round(
                (sum(r[5] for r in rows) + sum(d[2] for d in digests[w])) / span / ranks
            ),
            "throttled_429": sum(lo <= t < hi for t in stats.throttled),
        }
        if stats.digests:
            win["digests_per_s"] = round(len(digests[w]) / span, 1)
            win["digest_request_ms"] = [
                round(pct([d[1] for d in digests[w]], p) * 1000, 1) for p in (50, 90, 99)
            ]
            win["digest_bytes_per_rank_per_s"] = round(sum(d[2] for d in digests[w]) / span / ranks, 1)
            win["detail_answers"] = sum(d[3] for d in digests[w])
        now = next((s for s in samples if s.t == hi), None)
        before = next((s for s in reversed(samples) if s.t <= lo), None)
        if now is not None and before is not None:
            win["server_cpu"] = [
                round((b - a) / span, 2) for a, b in zip(before.server_cpu_s, now.server_cpu_s, strict=True)
            ]
            win["server_rss_mib"] = [round(m / 2**20) for m in now.server_rss_peak]
            win["generator_cpu"] = round((now.generator_cpu_s - before.generator_cpu_s) / span, 2)
            if now.pg_backends:
                win["postgres_cpu"] = round((now.pg_cpu_s - before.pg_cpu_s) / span, 2)
                win["postgres_mem_mib"] = round(now.pg_mem / 2**20)
            if now.db_bytes:
                win["db_mib"] = round(now.db_bytes / 2**20, 1)
        out.append(win)
        lo = hi
    return out
