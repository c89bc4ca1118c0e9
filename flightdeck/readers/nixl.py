"""NIXL transfer telemetry: what the ring and `prometheus_mp` readers share.

Exceptions::

    NixlError                 base of everything the NIXL readers raise
    ├── NixlFormatError       a file is not (or not yet, or no longer) what NIXL writes
    └── NixlAccessError       a file cannot be opened as needed (permissions)

The readers live in `flightdeck.readers.nixl_mp` (NIXL's own cumulative store files, preferred
when present; reading them changes nothing) and `flightdeck.readers.nixl_ring` (the per-agent
ring files; reading them consumes events). Both produce `flightdeck.nixl_records.NixlSample`.
Facts about the formats come from docs/nixl-telemetry.md (shared docs) and real NIXL 1.0.1 – 1.5.1
files under tests/data/nixl.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable
from typing import TypedDict

from flightdeck.nixl_records import Histogram, NixlSample, Source


class NixlError(Exception):
    """Base class of the NIXL readers' errors."""


class NixlFormatError(NixlError):
    """A telemetry file has the wrong magic, version, size or layout; nothing was written to it."""


class NixlAccessError(NixlError):
    """A telemetry file cannot be opened: ring files (0644) must be writable by the collector,
    `prometheus_mp` stores (0600) readable, so it runs as the workload's user or as root."""


#: NIXL's event types (`nixl_telemetry_event_type_t`), indexed by id; the same order is used for
#: the slots of a `prometheus_mp` store and for the event ids of ring formats 2 (1.2.x) to 4.
EVENT_TYPES: tuple[str, ...] = (
    "agent_tx_bytes",
    "agent_rx_bytes",
    "agent_tx_requests_num",
    "agent_rx_requests_num",
    "agent_memory_registered",
    "agent_memory_deregistered",
    "agent_xfer_time",
    "agent_xfer_post_time",
    "agent_err_not_posted",
    "agent_err_invalid_param",
    "agent_err_backend",
    "agent_err_not_found",
    "agent_err_mismatch",
    "agent_err_not_allowed",
    "agent_err_repost_active",
    "agent_err_unknown",
    "agent_err_not_supported",
    "agent_err_remote_disconnect",
    "agent_err_canceled",
    "agent_err_no_telemetry",
    "agent_telemetry_events_dropped",
)
TX_BYTES, RX_BYTES, TX_REQUESTS, RX_REQUESTS, MEM_REG, MEM_DEREG, XFER_TIME, POST_TIME = range(8)
FIRST_ERROR, LAST_ERROR = 8, 19
EVENTS_DROPPED = 20
EVENT_TYPE_IDS: dict[str, int] = {name: i for i, name in enumerate(EVENT_TYPES)}

#: Error kind per error event id: the event name without the `agent_err_` prefix.
ERROR_KINDS: dict[int, str] = {
    i: EVENT_TYPES[i].removeprefix("agent_err_") for i in range(FIRST_ERROR, LAST_ERROR + 1)
}

#: NIXL's default histogram bounds (µs), as the 1.5.1 `prometheus_mp` exporter writes them into
#: every store header (bucket count 18). Ring events are raw values, so the ring consumer buckets
#: them itself; using NIXL's bounds keeps both sources' histograms comparable.
DEFAULT_BUCKET_BOUNDS_US: tuple[float, ...] = (
    10.0,
    25.0,
    50.0,
    100.0,
    250.0,
    500.0,
    1_000.0,
    2_500.0,
    5_000.0,
    10_000.0,
    25_000.0,
    50_000.0,
    100_000.0,
    250_000.0,
    500_000.0,
    1_000_000.0,
    5_000_000.0,
    10_000_000.0,
)


def event_type_id(name: str) -> int | None:
    """The event id for an event name of ring formats 1 and 2 (1.1.x); None when unknown.

    Those releases write transfer events under their `agent_*` names but errors under the status
    name (`NIXL_ERR_NOT_FOUND`, seen in real 1.0.1 and 1.1.0 files), so both spellings map here.
    """
    i = EVENT_TYPE_IDS.get(name)
    if i is None and name.startswith("NIXL_ERR_"):
        i = EVENT_TYPE_IDS.get("agent_err_" + name.removeprefix("NIXL_ERR_").lower())
    return i


class Accumulator:
    """Cumulative counters and histograms built from per-operation ring events.

    Every ring event value is per operation (bytes of one transfer, 1 per request, µs of one
    transfer), so counters are sums and the two time events feed histograms.
    """

    __slots__ = ("_bounds", "_hist", "_hist_sum", "sums", "unknown")

    def __init__(self, bounds_us: tuple[float, ...] = DEFAULT_BUCKET_BOUNDS_US) -> None:
        Histogram.empty(bounds_us)  # validates the bounds once, up front
        self._bounds = bounds_us
        #: Sum of values per event id (for the two time events: the histogram sums).
        self.sums = [0] * len(EVENT_TYPES)
        self._hist = {XFER_TIME: [0] * (len(bounds_us) + 1), POST_TIME: [0] * (len(bounds_us) + 1)}
        self._hist_sum = 0
        #: Events whose id or name is not in EVENT_TYPES.
        self.unknown = 0

    def add(self, type_id: int, value: int) -> None:
        """Account one event; ids outside EVENT_TYPES are counted as unknown."""
        if not 0 <= type_id < len(EVENT_TYPES):
            self.unknown += 1
            return
        self.sums[type_id] += value
        hist = self._hist.get(type_id)
        if hist is not None:
            # Prometheus `le` buckets: a value equal to a bound belongs to that bound's bucket.
            hist[bisect_left(self._bounds, value)] += 1

    def add_many(self, events: list[tuple[int, int]]) -> None:
        """Account events in order; the same as `add` for each, with the loop kept tight because
        this is where a busy ring's collector time goes."""
        sums = self.sums
        n_types = len(sums)
        xfer = self._hist[XFER_TIME]
        post = self._hist[POST_TIME]
        bounds = self._bounds
        unknown = 0
        for type_id, value in events:
            if 0 <= type_id < n_types:
                sums[type_id] += value
                if type_id == XFER_TIME:
                    xfer[bisect_left(bounds, value)] += 1
                elif type_id == POST_TIME:
                    post[bisect_left(bounds, value)] += 1
            else:
                unknown += 1
        self.unknown += unknown

    def histogram(self, type_id: int) -> Histogram:
        """The histogram of XFER_TIME or POST_TIME so far."""
        counts = self._hist[type_id]
        return Histogram(
            bounds_us=self._bounds, counts=tuple(counts), sum_us=self.sums[type_id], count=sum(counts)
        )

    def sample(
        self,
        *,
        host: str,
        agent: str,
        pid: int | None,
        local_rank: int | None,
        source: Source,
        read_time_ns: int,
        run: str,
        format_version: int,
        writer_alive: bool | None,
        restarts: int,
        ring_full_reads: int,
    ) -> NixlSample:
        """The cumulative sample for everything accounted so far."""
        return NixlSample(
            host=host,
            agent=agent,
            pid=pid,
            local_rank=local_rank,
            source=source,
            read_time_ns=read_time_ns,
            run=run,
            format_version=format_version,
            **sample_counters(self.sums, self.histogram),
            writer_alive=writer_alive,
            restarts=restarts,
            ring_full_reads=ring_full_reads,
            unknown_events=self.unknown,
        )


class SampleCounters(TypedDict):
    """The `NixlSample` fields that both readers take from per-event-type sums and histograms."""

    tx_bytes: int
    rx_bytes: int
    tx_requests: int
    rx_requests: int
    memory_registered_bytes: int
    memory_deregistered_bytes: int
    errors: tuple[tuple[str, int], ...]
    events_dropped: int
    xfer_time: Histogram
    post_time: Histogram


def sample_counters(
    sums: list[int] | tuple[int, ...], histogram: Callable[[int], Histogram]
) -> SampleCounters:
    """A sample's counters from per-event-id sums (EVENT_TYPES order) and a reader's
    histogram of an event type."""
    return SampleCounters(
        tx_bytes=sums[TX_BYTES],
        rx_bytes=sums[RX_BYTES],
        tx_requests=sums[TX_REQUESTS],
        rx_requests=sums[RX_REQUESTS],
        memory_registered_bytes=sums[MEM_REG],
        memory_deregistered_bytes=sums[MEM_DEREG],
        errors=errors_from_sums(sums),
        events_dropped=sums[EVENTS_DROPPED],
        xfer_time=histogram(XFER_TIME),
        post_time=histogram(POST_TIME),
    )


def errors_from_sums(sums: list[int] | tuple[int, ...]) -> tuple[tuple[str, int], ...]:
    """Non-zero error counts by kind, sorted by kind, from per-event-id sums."""
    return tuple(sorted((ERROR_KINDS[i], sums[i]) for i in ERROR_KINDS if sums[i]))


def parse_local_rank(raw: str | bytes | None) -> int | None:
    """`LOCAL_RANK` as an int; None when absent, empty or not a non-negative integer."""
    if raw is None:
        return None
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    text = text.strip()
    return int(text) if text.isascii() and text.isdigit() else None
