"""The collector's own Prometheus metrics (documented in docs/metrics.md, "Collector").

Counters are plain prometheus_client objects on an injected registry; the queue gauges are computed
at scrape time from the durable queue by `QueueCollector`, so they can never drift from it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from flightdeck.collector.queue import QueueStats

NAMESPACE = "flightdeck_collector"


class QueueCollector(Collector):
    """Queue depth, bytes and push lag, read from the queue when scraped."""

    def __init__(self, stats: Callable[[], QueueStats], clock_ns: Callable[[], int]) -> None:
        self._stats = stats
        self._clock_ns = clock_ns

    def collect(self) -> Iterator[Metric]:
        """Yield the gauges (called by the registry on every scrape)."""
        s = self._stats()
        yield GaugeMetricFamily(
            f"{NAMESPACE}_queue_depth_batches", "Batches waiting to be sent.", value=s.depth
        )
        yield GaugeMetricFamily(
            f"{NAMESPACE}_queue_bytes", "Bytes of queued (gzipped) batches.", value=s.nbytes
        )
        lag = 0.0 if s.oldest_created_ns is None else max(0.0, (self._clock_ns() - s.oldest_created_ns) / 1e9)
        yield GaugeMetricFamily(
            f"{NAMESPACE}_push_lag_seconds", "Age of the oldest unsent batch (0 when none).", value=lag
        )
        yield GaugeMetricFamily(
            f"{NAMESPACE}_disk_full",
            "1 while the disk under state_dir is full (reserve released, new batches held back), else 0.",
            value=1 if s.disk_full else 0,
        )
        yield GaugeMetricFamily(
            f"{NAMESPACE}_dead_letter_batches",
            "Batches the server refused, kept in the dead-letter table.",
            value=s.dead_letters,
        )


class CollectorMetrics:
    """Every metric the collector exports, registered on `registry`."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.files_seen = Counter(
            "files_seen",
            "Dump file versions read (a rewritten file counts again).",
            namespace=NAMESPACE,
            registry=registry,
        )
        self.parse_errors = Counter(
            "parse_errors",
            "Files that were stable and still unreadable, by reason.",
            ["reason"],
            namespace=NAMESPACE,
            registry=registry,
        )
        self.files_skipped = Counter(
            "files_skipped",
            "Paths where a dump belongs that are no regular file (never opened), by what they are.",
            ["reason"],
            namespace=NAMESPACE,
            registry=registry,
        )
        self.quarantined = Counter(
            "quarantined",
            "Files moved or copied into the quarantine directory.",
            namespace=NAMESPACE,
            registry=registry,
        )
        self.entries_enqueued = Counter(
            "entries_enqueued",
            "Collective entries put into batches (new or changed).",
            namespace=NAMESPACE,
            registry=registry,
        )
        self.nixl_samples = Counter(
            "nixl_samples", "NIXL samples put into batches.", namespace=NAMESPACE, registry=registry
        )
        self.nixl_ring_full_reads = Counter(
            "nixl_ring_full_reads",
            "Reads of a NIXL ring file that found it full (NIXL silently discards new events then).",
            namespace=NAMESPACE,
            registry=registry,
        )
        self.nixl_unknown_events = Counter(
            "nixl_unknown_events",
            "NIXL ring events of a type this collector does not know (not accounted).",
            namespace=NAMESPACE,
            registry=registry,
        )
        self.gone_ranks = Counter(
            "gone_ranks",
            "Ranks reported gone: the process their snapshots name no longer runs on this host.",
            namespace=NAMESPACE,
            registry=registry,
        )
        self.heartbeats = Counter(
            "heartbeats",
            "Empty batches queued because nothing else was for heartbeat_s.",
            namespace=NAMESPACE,
            registry=registry,
        )
        self.spool_dirs_removed = Counter(
            "spool_dirs_removed",
            "Spool directories of ended jobs removed after spool_retention_s.",
            namespace=NAMESPACE,
            registry=registry,
        )
        self.batches_enqueued = Counter(
            "batches_enqueued",
            "Batches written to the durable queue.",
            namespace=NAMESPACE,
            registry=registry,
        )
        self.enqueue_refused = Counter(
            "enqueue_refused",
            "Flushes not queued because the queue was full, by what was held back.",
            ["kind"],
            namespace=NAMESPACE,
            registry=registry,
        )
        self.batches_sent = Counter(
            "batches_sent",
            "Batches the server accepted (2xx, duplicates included).",
            namespace=NAMESPACE,
            registry=registry,
        )
        self.batches_duplicate = Counter(
            "batches_duplicate",
            "Accepted batches the server already had (resent after a lost answer).",
            namespace=NAMESPACE,
            registry=registry,
        )
        self.batches_failed = Counter(
            "batches_failed",
            "Failed send attempts, by reason.",
            ["reason"],
            namespace=NAMESPACE,
            registry=registry,
        )
        self.auth_failures = Counter(
            "auth_failures",
            "Sends the server refused for the token (HTTP 401/403); the batches stay queued.",
            namespace=NAMESPACE,
            registry=registry,
        )
        self.token_rejected = Gauge(
            "token_rejected",
            "1 while the server rejects the collector's token (nothing is sent), else 0.",
            namespace=NAMESPACE,
            registry=registry,
        )
        self.dead_lettered = Counter(
            "dead_lettered", "Batches moved to the dead-letter table.", namespace=NAMESPACE, registry=registry
        )
        self.digest_requests = Counter(
            "digest_requests",
            "Progress digest requests (POST /api/v1/digest, ranks of jobs of digest_from_ranks ranks "
            "or more), by outcome.",
            ["outcome"],
            namespace=NAMESPACE,
            registry=registry,
        )
        for outcome in ("sent", "failed"):
            self.digest_requests.labels(outcome=outcome)  # exported at 0 before the first request
        self.snapshots_held_back = Counter(
            "snapshots_held_back",
            "Snapshots of ranks on digests not shipped (no detail round for their job); what was "
            "read is recorded as shipped all the same.",
            namespace=NAMESPACE,
            registry=registry,
        )
        self.loop_errors = Counter(
            "loop_errors",
            "Unexpected errors caught in the collector's loops (a bug: see the log).",
            ["loop"],
            namespace=NAMESPACE,
            registry=registry,
        )

    def watch_queue(self, stats: Callable[[], QueueStats], clock_ns: Callable[[], int]) -> QueueCollector:
        """Register the scrape-time queue gauges."""
        collector = QueueCollector(stats, clock_ns)
        self.registry.register(collector)
        return collector


class MetricsServer:
    """`/metrics` on host:port for one registry, in a daemon thread; `close` stops it."""

    def __init__(self, registry: CollectorRegistry, host: str, port: int) -> None:
        self._server: WSGIServer
        self._thread: threading.Thread
        self._server, self._thread = start_http_server(port, addr=host, registry=registry)

    @property
    def port(self) -> int:
        """The bound port (useful when 0 was asked for)."""
        return int(self._server.server_port)

    def close(self) -> None:
        """Stop serving and join the thread."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5.0)
