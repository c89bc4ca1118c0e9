"""Typed NIXL transfer-telemetry records: what the collector ships for each NIXL agent.

The readers (`flightdeck.readers.nixl_mp` for `prometheus_mp` store files,
`flightdeck.readers.nixl_ring` for ring files) turn NIXL's binary formats into `NixlSample`s;
the collector ships them (see `NixlSample.to_wire` / `NixlSample.from_wire`); the server turns them
into the `flightdeck_nixl_*` metrics. Nothing here knows about files, event ids or byte layouts.

A sample is cumulative: within one counter lifetime, identified by (host, agent, source, run), no
counter or histogram bucket ever decreases, so the server can take differences between samples.
"""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass
from typing import Any, Literal

Source = Literal["mp", "ring"]

NIXL_WIRE_VERSION = 1

#: Error kinds are label values (`flightdeck_nixl_errors_total{kind}`): keep them short and tame.
_KIND_RE = re.compile(r"^[a-z][a-z0-9_]{0,63}$")


@dataclass(frozen=True, slots=True)
class Histogram:
    """A latency histogram in microseconds, Prometheus-style but with non-cumulative counts."""

    #: Finite upper bounds (µs) of the buckets, strictly increasing; +Inf is implicit.
    bounds_us: tuple[float, ...]
    #: Observations per bucket, `len(bounds_us) + 1` of them; the last is the +Inf bucket.
    counts: tuple[int, ...]
    #: Sum of all observed values (µs).
    sum_us: int
    #: Number of observations (the sum of `counts`).
    count: int

    def __post_init__(self) -> None:
        _check_histogram(self.bounds_us, self.counts, self.sum_us, self.count, "histogram")

    def to_wire(self) -> dict[str, Any]:
        """Encode as a plain JSON-able dict."""
        return {
            "bounds_us": list(self.bounds_us),
            "counts": list(self.counts),
            "sum_us": self.sum_us,
            "count": self.count,
        }

    @classmethod
    def from_wire(cls, raw: object, *, where: str = "histogram") -> Histogram:
        """Decode `to_wire` output; raises ValueError naming the bad field."""
        d = _dict(raw, where)
        bounds_raw = _list(d, "bounds_us", where)
        bounds: list[float] = []
        for i, b in enumerate(bounds_raw):
            if isinstance(b, bool) or not isinstance(b, int | float):
                raise ValueError(f"{where}: bounds_us[{i}] must be a number, got {b!r}")
            bounds.append(float(b))
        counts_raw = _list(d, "counts", where)
        counts = tuple(_nonneg(c, f"{where}: counts[{i}]") for i, c in enumerate(counts_raw))
        return cls(
            bounds_us=tuple(bounds),
            counts=counts,
            sum_us=_nonneg(d.get("sum_us"), f"{where}: sum_us"),
            count=_nonneg(d.get("count"), f"{where}: count"),
        )

    @classmethod
    def empty(cls, bounds_us: tuple[float, ...]) -> Histogram:
        """A histogram with the given bounds and no observations."""
        return cls(bounds_us=bounds_us, counts=(0,) * (len(bounds_us) + 1), sum_us=0, count=0)


@dataclass(frozen=True, slots=True)
class NixlSample:
    """Cumulative transfer telemetry of one NIXL agent (one process) as read at `read_time_ns`."""

    #: The collector's host name (the same name its flight-recorder records carry).
    host: str
    #: NIXL agent name (ring source: the file name; mp source: the store header).
    agent: str
    #: Process that owns the agent; None when a ring file's owner could not be found.
    pid: int | None
    #: The owner's `LOCAL_RANK`; None when unset, unreadable or not an integer.
    local_rank: int | None
    #: "mp": a `prometheus_mp` store file (NIXL's own counters); "ring": our sums of ring events.
    source: Source
    #: When the collector read the data (epoch ns); ring events carry no time since format v2.
    read_time_ns: int
    #: Counter lifetime: counters never decrease for the same (host, agent, source, run).
    #: mp: "<run_ns>.<instance>" of the store file; ring: the collector's consumer instance.
    run: str
    #: Format version of what was read: the mp schema version, or the ring TELEMETRY_VERSION.
    format_version: int
    #: Bytes of completed WRITEs / READs this agent initiated (the passive side counts nothing).
    tx_bytes: int
    rx_bytes: int
    #: Completed WRITE / READ requests this agent initiated.
    tx_requests: int
    rx_requests: int
    #: Bytes passed to registerMem / deregisterMem.
    memory_registered_bytes: int
    memory_deregistered_bytes: int
    #: Failed operations by NIXL status, kind without the `agent_err_` prefix (e.g. "not_found"),
    #: sorted by kind, zero counts left out.
    errors: tuple[tuple[str, int], ...]
    #: Events NIXL dropped from its staging queue (format v4 and later).
    events_dropped: int
    #: Post → completion time per transfer (µs).
    xfer_time: Histogram
    #: Post start → backend submission time per transfer (µs).
    post_time: Histogram
    #: mp: whether the writer process still holds its lock; ring: True when the owning process was
    #: found, None when not (it may be gone, or its /proc entries unreadable).
    writer_alive: bool | None = None
    #: Ring only: agent restarts seen (NIXL reset the ring positions, or re-created the file).
    restarts: int = 0
    #: Ring only: reads that found the ring full, so NIXL may have discarded events unseen.
    ring_full_reads: int = 0
    #: Ring only: events whose type or name this reader does not know (counted, not interpreted).
    unknown_events: int = 0

    def __post_init__(self) -> None:
        if self.source not in ("mp", "ring"):
            raise ValueError(f"nixl sample: source must be 'mp' or 'ring', got {self.source!r}")
        if not self.agent:
            raise ValueError("nixl sample: agent must not be empty")
        kinds = [k for k, _ in self.errors]
        if kinds != sorted(set(kinds)):
            raise ValueError(f"nixl sample: error kinds must be unique and sorted, got {kinds}")
        for kind, n in self.errors:
            if not _KIND_RE.match(kind):
                raise ValueError(f"nixl sample: bad error kind {kind!r}")
            if n <= 0:
                raise ValueError(f"nixl sample: error count for {kind!r} must be positive, got {n}")

    @property
    def errors_by_kind(self) -> dict[str, int]:
        """The error counts as a dict (a copy)."""
        return dict(self.errors)

    @property
    def memory_registered_net_bytes(self) -> int:
        """Registered minus deregistered bytes (`flightdeck_nixl_memory_registered_bytes`)."""
        return self.memory_registered_bytes - self.memory_deregistered_bytes

    @property
    def key(self) -> tuple[str, str, int | None, int | None]:
        """Who the sample describes: (host, agent, pid, local_rank)."""
        return (self.host, self.agent, self.pid, self.local_rank)

    def to_wire(self) -> dict[str, Any]:
        """Encode as a plain JSON-able dict (keys are the field names, plus `v`)."""
        return {
            "v": NIXL_WIRE_VERSION,
            "host": self.host,
            "agent": self.agent,
            "pid": self.pid,
            "local_rank": self.local_rank,
            "source": self.source,
            "read_time_ns": self.read_time_ns,
            "run": self.run,
            "format_version": self.format_version,
            "tx_bytes": self.tx_bytes,
            "rx_bytes": self.rx_bytes,
            "tx_requests": self.tx_requests,
            "rx_requests": self.rx_requests,
            "memory_registered_bytes": self.memory_registered_bytes,
            "memory_deregistered_bytes": self.memory_deregistered_bytes,
            "errors": dict(self.errors),
            "events_dropped": self.events_dropped,
            "xfer_time": self.xfer_time.to_wire(),
            "post_time": self.post_time.to_wire(),
            "writer_alive": self.writer_alive,
            "restarts": self.restarts,
            "ring_full_reads": self.ring_full_reads,
            "unknown_events": self.unknown_events,
        }

    @classmethod
    def from_wire(cls, raw: object) -> NixlSample:
        """Decode `to_wire` output; raises ValueError with a message naming the bad field.

        Unknown keys are ignored so that a newer collector can add fields; a different `v` is
        refused because the meaning of existing fields may have changed.
        """
        d = _dict(raw, "nixl sample")
        if d.get("v") != NIXL_WIRE_VERSION:
            raise ValueError(f"nixl sample: unsupported wire version {d.get('v')!r}")
        source = d.get("source")
        if source not in ("mp", "ring"):
            raise ValueError(f"nixl sample: source must be 'mp' or 'ring', got {source!r}")
        errors_raw = _dict(d.get("errors"), "nixl sample: errors")
        errors: list[tuple[str, int]] = []
        for kind, n in sorted(errors_raw.items()):
            if not isinstance(kind, str) or not _KIND_RE.match(kind):
                raise ValueError(f"nixl sample: bad error kind {kind!r}")
            count = _nonneg(n, f"nixl sample: errors[{kind!r}]")
            if count:
                errors.append((kind, count))
        alive = d.get("writer_alive")
        if alive is not None and not isinstance(alive, bool):
            raise ValueError(f"nixl sample: writer_alive must be a boolean or null, got {alive!r}")
        return cls(
            host=_str(d, "host"),
            agent=_str(d, "agent"),
            pid=_opt_nonneg(d.get("pid"), "nixl sample: pid"),
            local_rank=_opt_nonneg(d.get("local_rank"), "nixl sample: local_rank"),
            source="mp" if source == "mp" else "ring",
            read_time_ns=_nonneg(d.get("read_time_ns"), "nixl sample: read_time_ns"),
            run=_str(d, "run"),
            format_version=_nonneg(d.get("format_version"), "nixl sample: format_version"),
            tx_bytes=_nonneg(d.get("tx_bytes"), "nixl sample: tx_bytes"),
            rx_bytes=_nonneg(d.get("rx_bytes"), "nixl sample: rx_bytes"),
            tx_requests=_nonneg(d.get("tx_requests"), "nixl sample: tx_requests"),
            rx_requests=_nonneg(d.get("rx_requests"), "nixl sample: rx_requests"),
            memory_registered_bytes=_nonneg(
                d.get("memory_registered_bytes"), "nixl sample: memory_registered_bytes"
            ),
            memory_deregistered_bytes=_nonneg(
                d.get("memory_deregistered_bytes"), "nixl sample: memory_deregistered_bytes"
            ),
            errors=tuple(errors),
            events_dropped=_nonneg(d.get("events_dropped"), "nixl sample: events_dropped"),
            xfer_time=Histogram.from_wire(d.get("xfer_time"), where="nixl sample: xfer_time"),
            post_time=Histogram.from_wire(d.get("post_time"), where="nixl sample: post_time"),
            writer_alive=alive,
            restarts=_nonneg(d.get("restarts", 0), "nixl sample: restarts"),
            ring_full_reads=_nonneg(d.get("ring_full_reads", 0), "nixl sample: ring_full_reads"),
            unknown_events=_nonneg(d.get("unknown_events", 0), "nixl sample: unknown_events"),
        )


# --- validation helpers --------------------------------------------------------------------------


def _check_histogram(
    bounds: tuple[float, ...], counts: tuple[int, ...], sum_us: int, count: int, where: str
) -> None:
    if not all(math.isfinite(b) for b in bounds):
        raise ValueError(f"{where}: bounds_us must be finite (+Inf is implicit), got {list(bounds)}")
    if any(a >= b for a, b in itertools.pairwise(bounds)):
        raise ValueError(f"{where}: bounds_us must be strictly increasing, got {list(bounds)}")
    if len(counts) != len(bounds) + 1:
        raise ValueError(
            f"{where}: expected {len(bounds) + 1} bucket counts for {len(bounds)} bounds "
            f"(the last is +Inf), got {len(counts)}"
        )
    if any(c < 0 for c in counts) or sum_us < 0:
        raise ValueError(f"{where}: counts and sum must not be negative")
    if sum(counts) != count:
        raise ValueError(f"{where}: count {count} differs from the sum of the bucket counts {sum(counts)}")


def _dict(raw: object, where: str) -> dict[Any, Any]:
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: expected an object, got {type(raw).__name__}")
    return raw


def _list(d: dict[Any, Any], key: str, where: str) -> list[Any]:
    v = d.get(key)
    if not isinstance(v, list):
        raise ValueError(f"{where}: {key} must be a list, got {type(v).__name__}")
    return v


def _str(d: dict[Any, Any], key: str) -> str:
    v = d.get(key)
    if not isinstance(v, str):
        raise ValueError(f"nixl sample: {key} must be a string, got {type(v).__name__}")
    return v


def _nonneg(v: object, what: str) -> int:
    # bool is an int subclass; JSON true must not pass for 1.
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ValueError(f"{what} must be a non-negative integer, got {v!r}")
    return v


def _opt_nonneg(v: object, what: str) -> int | None:
    return None if v is None else _nonneg(v, what)
