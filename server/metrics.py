"""The server's Prometheus metrics (exactly the names in docs/metrics.md), on an injected registry.

Ingest counters are ordinary prometheus_client metrics updated as requests happen. Everything per
job, per collector and per NIXL agent is computed at scrape time by `StateCollector` from the
in-memory state, so a job's series appear and vanish with the job and nothing is double-booked.

One module over 500 lines: it declares every series of docs/metrics.md in one place (the docs
test reads them), and the scrape-time collector that fills them from the same state.
"""

from __future__ import annotations

import platform
import threading
from collections import Counter as Tally
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from flightdeck.analysis.findings import CONFIG_KINDS, MISMATCH_KINDS
from flightdeck.runtime_tuning import allocator_in_use
from flightdeck.server.export import ExportPolicy, StoreFacts
from flightdeck.server.live import SKEW_BUCKETS, LiveDiagnosis
from flightdeck.server.models import JOB_STATUSES

NS = 1_000_000_000
#: Buckets (seconds) of `flightdeck_ingest_latency_seconds`.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
#: Batches per group-commit transaction.
GROUP_BUCKETS = (1, 2, 4, 8, 16, 32, 64)


@dataclass(slots=True)
class SharedState:
    """State outside the live diagnosis that the scrape reads: collectors, NIXL agents, counters."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    #: collector (token name) -> epoch ns of its last accepted batch.
    collector_push_ns: dict[str, int] = field(default_factory=dict)
    #: (host, agent) -> (source, totals over all counter runs, latest sample wire dict).
    nixl: dict[tuple[str, str], tuple[str, dict[str, Any], dict[str, Any]]] = field(default_factory=dict)
    #: finding kind -> findings opened since this process started.
    findings_opened: Tally[str] = field(default_factory=Tally)

    def set_nixl(
        self, host: str, agent: str, source: str, totals: dict[str, Any], sample: dict[str, Any]
    ) -> None:
        """Record an agent's totals; NIXL's own counters (mp) win over our ring sums for one agent."""
        with self.lock:
            old = self.nixl.get((host, agent))
            if old is None or source == "mp" or old[0] != "mp":
                self.nixl[(host, agent)] = (source, totals, sample)


class _Count:
    """A thread-safe monotonic counter (exported by `StateCollector`, so no `_created` series)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        """Add `amount` (>= 0)."""
        with self._lock:
            self.value += amount


class _LabeledCount:
    """Counters by one label value, with the known values present from the start (at 0)."""

    def __init__(self, values: Iterable[str]) -> None:
        self._children = {v: _Count() for v in values}
        self._lock = threading.Lock()

    def labels(self, value: str) -> _Count:
        """The counter of one label value."""
        with self._lock:
            child = self._children.get(value)
            if child is None:
                child = self._children[value] = _Count()
            return child

    def values(self) -> dict[str, float]:
        """label value -> count."""
        with self._lock:
            return {k: c.value for k, c in self._children.items()}


class _Hist:
    """A thread-safe histogram with fixed buckets."""

    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets = buckets
        self._lock = threading.Lock()
        self.counts = [0] * (len(buckets) + 1)
        self.total = 0.0

    def observe(self, v: float) -> None:
        """Add one observation."""
        i = next((k for k, b in enumerate(self.buckets) if v <= b), len(self.buckets))
        with self._lock:
            self.counts[i] += 1
            self.total += v

    def snapshot(self) -> tuple[list[int], float]:
        """(non-cumulative counts with +Inf last, sum)."""
        with self._lock:
            return list(self.counts), self.total

    def family(self, name: str, doc: str) -> HistogramMetricFamily:
        """The histogram as an unlabelled metric family."""
        counts, total = self.snapshot()
        return HistogramMetricFamily(name, doc, buckets=_cumulative(self.buckets, counts), sum_value=total)


class IngestMetrics:
    """The request-path metrics: counters and the latency histogram.

    Plain objects exported by `StateCollector` rather than prometheus_client's Counter: those add
    `*_created` series, which are not in docs/metrics.md, and turning them off is process-global.
    """

    def __init__(self) -> None:
        self.batches = _LabeledCount(("accepted", "duplicate", "rejected", "throttled", "error"))
        self.entries = _Count()
        self.latency = _Hist(LATENCY_BUCKETS)
        self.rejects = _LabeledCount(("auth", "schema", "scope", "too_large"))
        #: Progress digest requests (`POST /api/v1/digest`) by outcome.
        self.digests = _LabeledCount(("accepted", "rejected"))
        self.db_errors = _Count()
        #: Snapshots and NIXL samples left out of batches for a value the store cannot hold.
        self.refused_snapshots = _Count()
        #: Requests answered 500 (a bug: each has an error id in its answer and one log line).
        self.server_errors = _Count()
        self.group_batches = _Hist(GROUP_BUCKETS)
        self.diagnosis = _Hist(LATENCY_BUCKETS)
        #: Requests waiting for an in-flight slot now (set by the ingest service: its admission).
        self.queued: Callable[[], int] = lambda: 0

    def collect(self) -> Iterable[Metric]:
        """The ingest metric families."""
        batches = CounterMetricFamily(
            "flightdeck_ingest_batches", "Ingest requests by outcome.", labels=["outcome"]
        )
        for k, v in sorted(self.batches.values().items()):
            batches.add_metric([k], v)
        rejects = CounterMetricFamily(
            "flightdeck_ingest_rejects", "Rejected batches by reason.", labels=["reason"]
        )
        for k, v in sorted(self.rejects.values().items()):
            rejects.add_metric([k], v)
        digests = CounterMetricFamily(
            "flightdeck_ingest_digests", "Progress digest requests by outcome.", labels=["outcome"]
        )
        for k, v in sorted(self.digests.values().items()):
            digests.add_metric([k], v)
        entries = CounterMetricFamily(
            "flightdeck_ingest_entries", "Collective entries accepted.", value=self.entries.value
        )
        latency = self.latency.family(
            "flightdeck_ingest_latency_seconds", "Ingest request received to rows committed."
        )
        errors = CounterMetricFamily(
            "flightdeck_db_errors",
            "Database errors while ingesting or diagnosing.",
            value=self.db_errors.value,
        )
        group = self.group_batches.family(
            "flightdeck_ingest_group_size_batches",
            "Batches applied per ingest transaction (concurrent batches share one: group commit).",
        )
        diagnosis = self.diagnosis.family(
            "flightdeck_diagnosis_duration_seconds",
            "One live diagnosis of one job: analysis, findings stored, gauges.",
        )
        queued = GaugeMetricFamily(
            "flightdeck_ingest_queued_requests",
            "Ingest requests waiting for an in-flight slot.",
            value=float(self.queued()),
        )
        refused = CounterMetricFamily(
            "flightdeck_ingest_refused_snapshots",
            "Snapshots and NIXL samples refused alone (the rest of their batch applied).",
            value=self.refused_snapshots.value,
        )
        server_errors = CounterMetricFamily(
            "flightdeck_http_server_errors",
            "Requests answered 500: unexpected errors, each logged once with its error id.",
            value=self.server_errors.value,
        )
        yield from (
            batches,
            digests,
            entries,
            latency,
            rejects,
            errors,
            group,
            diagnosis,
            queued,
            refused,
            server_errors,
        )


def _hist(name: str, doc: str, labels: list[str]) -> HistogramMetricFamily:
    return HistogramMetricFamily(name, doc, labels=labels)


def _cumulative(bounds: Iterable[float], counts: list[int]) -> list[tuple[str, float]]:
    out: list[tuple[str, float]] = []
    acc = 0
    for b, c in zip(bounds, counts, strict=False):
        acc += c
        out.append((repr(float(b)), float(acc)))
    out.append(("+Inf", float(sum(counts))))  # counts has one more element: the +Inf bucket
    return out


class StateCollector(Collector):
    """Per-job, per-collector and NIXL metrics, computed from in-memory state at scrape time.

    `policy` says which of them this process exports (several replicas: a job's from its owner,
    the cluster-wide ones from the leader; alone: all). `facts` is the store's view of collector
    tokens (a revoked one is not exported) and, with replicas, of the NIXL agents; without it the
    collectors are exported from this process's own memory only.
    """

    def __init__(
        self,
        *,
        live: LiveDiagnosis,
        shared: SharedState,
        ingest: IngestMetrics,
        clock: Callable[[], int],
        facts: StoreFacts | None = None,
        policy: ExportPolicy | None = None,
    ) -> None:
        self._ingest = ingest
        self._live = live
        self._shared = shared
        self._clock = clock
        self._facts = facts
        self._policy = policy if policy is not None else ExportPolicy(None)

    def collect(self) -> Iterable[Metric]:
        """Yield the metric families (called by the registry on every scrape)."""
        now_ns = self._clock()
        yield from self._ingest.collect()
        yield from self._jobs(now_ns)
        yield from self._collectors(now_ns)
        yield from self._nixl()

    def _jobs(self, now_ns: int) -> Iterable[Metric]:
        jobs = GaugeMetricFamily("flightdeck_jobs", "Jobs by status.", labels=["status"])
        hang = GaugeMetricFamily(
            "flightdeck_job_hang_active",
            "1 while a hang finding is open for the group.",
            labels=["job", "group"],
        )
        mismatch = GaugeMetricFamily(
            "flightdeck_job_mismatch_active",
            "1 while a mismatch finding (any kind) is open for the group.",
            labels=["job", "group"],
        )
        oldest = GaugeMetricFamily(
            "flightdeck_job_oldest_unfinished_elapsed_seconds",
            "Age of the oldest collective not finished on every member rank.",
            labels=["job", "group"],
        )
        culprits = GaugeMetricFamily(
            "flightdeck_job_culprit_ranks",
            "Culprit ranks of the open hang/mismatch finding.",
            labels=["job", "group"],
        )
        waiting = GaugeMetricFamily(
            "flightdeck_job_waiting_ranks", "Ranks waiting in the stuck collective.", labels=["job", "group"]
        )
        lost = GaugeMetricFamily(
            "flightdeck_job_ranks_lost",
            "Ranks whose snapshots stopped while others continue.",
            labels=["job"],
        )
        config_skew = GaugeMetricFamily(
            "flightdeck_job_config_skew_active",
            "1 while a configuration finding of the kind (version_skew, config_skew) is open for the job.",
            labels=["job", "kind"],
        )
        open_ = GaugeMetricFamily("flightdeck_job_findings_open", "Open findings.", labels=["job", "kind"])
        opened = CounterMetricFamily(
            "flightdeck_job_findings", "Findings opened since start.", labels=["kind"]
        )
        colls = CounterMetricFamily(
            "flightdeck_job_collectives",
            "Collectives seen (on the lowest member rank).",
            labels=["job", "group", "op"],
        )
        skew = _hist(
            "flightdeck_job_arrival_skew_seconds",
            "Last minus first arrival per collective.",
            ["job", "group"],
        )
        lag = GaugeMetricFamily(
            "flightdeck_job_straggler_lag_seconds",
            "Median arrival lag of a straggler rank.",
            labels=["job", "rank"],
        )
        seen = GaugeMetricFamily(
            "flightdeck_rank_last_seen_age_seconds",
            "Seconds since the rank's last snapshot.",
            labels=["job", "rank"],
        )
        by_status: Tally[str] = Tally({s: 0 for s in JOB_STATUSES})
        # Two attempts of one job share the `job` label: the newest attempt speaks for it.
        newest: dict[str, Any] = {}
        policy = self._policy
        for js in self._live.jobs_snapshot():
            by_status[js.status] += 1
            if not policy.job(js.job_id):
                continue  # its owner exports it
            cur = newest.get(js.name)
            if cur is None or js.attempt > cur.attempt:
                newest[js.name] = js
        if policy.leads():
            for status, n in sorted(by_status.items()):
                jobs.add_metric([status], n)
        for name, js in sorted(newest.items()):
            report = js.report
            hang_groups: dict[str, Any] = {}
            mm_groups: dict[str, Any] = {}
            lost_ranks: set[int] = set()
            open_kinds: Tally[str] = Tally()
            # Until its first diagnosis after a restart, a job's open findings as stored (so an
            # open incident is exported from the first scrape on: neither resolved nor re-fired);
            # after it, those kept as stored while a job on digests awaits its entries.
            # An ended job's gauges read 0 at once (its findings closed as ended), until its
            # series go `ended_series_s` later (`LiveDiagnosis` drops its state).
            findings = [*report.findings, *js.restored] if report is not None else js.restored
            ended = js.ended_at_ns is not None
            if not ended and js.status != "finished":
                for f in findings:
                    open_kinds[f.kind] += 1
                    g = f.process_group or ""
                    if f.kind in ("hang", "state_mismatch"):
                        hang_groups.setdefault(g, f)
                    elif f.kind in MISMATCH_KINDS:
                        mm_groups.setdefault(g, f)
                    elif f.kind == "rank_lost":
                        lost_ranks.update(f.culprit_ranks)
                    elif f.kind == "straggler":
                        for r in f.culprit_ranks:
                            lag.add_metric([name, str(r)], f.elapsed_s or 0.0)
            groups = sorted(set(js.oldest_unfinished_ns) | set(hang_groups) | set(mm_groups) | set(js.skew))
            for g in groups:
                hang.add_metric([name, g], 1.0 if g in hang_groups else 0.0)
                mismatch.add_metric([name, g], 1.0 if g in mm_groups else 0.0)
                f = mm_groups.get(g) or hang_groups.get(g)
                culprits.add_metric([name, g], float(len(f.culprit_ranks)) if f else 0.0)
                waiting.add_metric([name, g], float(len(f.waiting_ranks)) if f else 0.0)
                t0 = None if ended else js.oldest_unfinished_ns.get(g)
                oldest.add_metric([name, g], max(0.0, (now_ns - t0) / NS) if t0 is not None else 0.0)
            lost.add_metric([name], float(len(lost_ranks)))
            if ended and report is not None:
                for kind in sorted({f.kind for f in report.findings}):
                    open_.add_metric([name, kind], 0.0)
            for kind, n in sorted(open_kinds.items()):
                open_.add_metric([name, kind], float(n))
            if report is not None:
                for kind in sorted(CONFIG_KINDS):
                    config_skew.add_metric([name, kind], 1.0 if open_kinds[kind] else 0.0)
            for (g, op), n in sorted(js.collectives.items()):
                colls.add_metric([name, g, op], float(n))
            for g, h in sorted(js.skew.items()):
                skew.add_metric([name, g], _cumulative(SKEW_BUCKETS, h.counts), h.total)
            if not ended:  # an ended rank is not late: its age would only grow
                for r, t in sorted(js.rank_seen_ns.items()):
                    seen.add_metric([name, str(r)], max(0.0, (now_ns - t) / NS))
        with self._shared.lock:
            kinds = dict(self._shared.findings_opened)
        for kind, n in sorted(kinds.items()):
            opened.add_metric([kind], float(n))
        yield from (
            jobs,
            hang,
            mismatch,
            oldest,
            culprits,
            waiting,
            lost,
            config_skew,
            open_,
            opened,
            colls,
            skew,
            lag,
            seen,
        )

    def _collectors(self, now_ns: int) -> Iterable[Metric]:
        age = GaugeMetricFamily(
            "flightdeck_collector_last_push_age_seconds",
            "Seconds since the collector's last accepted batch.",
            labels=["collector"],
        )
        if not self._policy.leads():
            yield age  # the leader exports every collector, once
            return
        with self._shared.lock:
            pushes = dict(self._shared.collector_push_ns)
        if self._facts is not None:
            # Revoked tokens are left out (read from the store every few seconds: any process may
            # have revoked it); otherwise the later of this process's and the store's last push
            # (with replicas a collector's batches land on any of them). A token created since
            # the last read is known from its pushes here.
            stored, revoked = self._facts.collectors()
            for name, last in stored.items():
                if last is not None:
                    pushes[name] = max(last, pushes.get(name, last))
            pushes = {name: t for name, t in pushes.items() if name not in revoked}
        for name, t in sorted(pushes.items()):
            age.add_metric([name], max(0.0, (now_ns - t) / NS))
        yield age

    def _nixl(self) -> Iterable[Metric]:
        labels = ["host", "agent"]
        tx_b = CounterMetricFamily(
            "flightdeck_nixl_tx_bytes", "Bytes written by transfers this agent initiated.", labels=labels
        )
        rx_b = CounterMetricFamily(
            "flightdeck_nixl_rx_bytes", "Bytes read by transfers this agent initiated.", labels=labels
        )
        tx_r = CounterMetricFamily("flightdeck_nixl_tx_requests", "Completed WRITE requests.", labels=labels)
        rx_r = CounterMetricFamily("flightdeck_nixl_rx_requests", "Completed READ requests.", labels=labels)
        xfer = _hist("flightdeck_nixl_xfer_time_seconds", "Post to completion time per transfer.", labels)
        post = _hist("flightdeck_nixl_post_time_seconds", "Post start to backend submission time.", labels)
        errors = CounterMetricFamily(
            "flightdeck_nixl_errors", "Failed transfers by NIXL status.", labels=[*labels, "kind"]
        )
        dropped = CounterMetricFamily(
            "flightdeck_nixl_events_dropped", "Telemetry events NIXL dropped.", labels=labels
        )
        mem = GaugeMetricFamily(
            "flightdeck_nixl_memory_registered_bytes", "Registered minus deregistered memory.", labels=labels
        )
        agents: list[tuple[tuple[str, str], tuple[str, dict[str, Any], dict[str, Any]]]] = []
        if not self._policy.leads():
            pass  # the leader exports every agent, once
        elif self._policy.clustered and self._facts is not None:
            # Replicas each hear from some agents: the leader exports them all from the store.
            agents = sorted((k, (f.source, f.totals, f.sample)) for k, f in self._facts.nixl().items())
        else:
            with self._shared.lock:
                agents = sorted(self._shared.nixl.items())
        for (host, agent), (_source, totals, sample) in agents:
            lv = [host, agent]
            tx_b.add_metric(lv, float(totals.get("tx_bytes", 0)))
            rx_b.add_metric(lv, float(totals.get("rx_bytes", 0)))
            tx_r.add_metric(lv, float(totals.get("tx_requests", 0)))
            rx_r.add_metric(lv, float(totals.get("rx_requests", 0)))
            dropped.add_metric(lv, float(totals.get("events_dropped", 0)))
            for kind, n in sorted((totals.get("errors") or {}).items()):
                errors.add_metric([*lv, kind], float(n))
            for fam, key in ((xfer, "xfer_time"), (post, "post_time")):
                h = totals.get(key)
                if h:
                    bounds_s = [b / 1e6 for b in h["bounds_us"]]
                    fam.add_metric(lv, _cumulative(bounds_s, list(h["counts"])), h["sum_us"] / 1e6)
            mem.add_metric(
                lv,
                float(
                    int(sample.get("memory_registered_bytes", 0))
                    - int(sample.get("memory_deregistered_bytes", 0))
                ),
            )
        yield from (tx_b, rx_b, tx_r, rx_r, xfer, post, errors, dropped, mem)


#: Outcomes of `flightdeck_webhook_deliveries_total`.
WEBHOOK_OUTCOMES = ("delivered", "failed", "dropped")


class WebhookMetrics(Collector):
    """The webhook sender's metrics: delivery outcomes of this process and the outbox depth (all
    processes: it is read from the database by the sender, at most once per poll)."""

    def __init__(self) -> None:
        self.deliveries = _LabeledCount(WEBHOOK_OUTCOMES)
        self.depth = 0

    def collect(self) -> Iterable[Metric]:
        """The webhook metric families."""
        deliveries = CounterMetricFamily(
            "flightdeck_webhook_deliveries",
            "Webhook delivery attempts and give-ups by outcome.",
            labels=["outcome"],
        )
        for k, v in sorted(self.deliveries.values().items()):
            deliveries.add_metric([k], v)
        depth = GaugeMetricFamily(
            "flightdeck_webhook_outbox_depth_deliveries",
            "Webhook deliveries waiting in the outbox.",
            value=float(self.depth),
        )
        yield from (deliveries, depth)


class BuildInfo(Collector):
    """`flightdeck_build_info`: 1, labelled with the running version, so a dashboard can show what
    each replica runs and an upgrade shows up as a change of series."""

    def collect(self) -> Iterable[Metric]:
        """The build-info family."""
        from flightdeck import __version__

        info = GaugeMetricFamily(
            "flightdeck_build_info",
            "Version of the Flightdeck server and of the Python running it, and the allocator of "
            "its objects (always 1).",
            labels=["version", "python", "allocator"],
        )
        info.add_metric([__version__, platform.python_version(), allocator_in_use()], 1.0)
        yield info


def register_process_metrics(registry: CollectorRegistry) -> None:
    """Add `flightdeck_build_info` and the standard `process_*` series (CPU seconds, resident
    memory, open file descriptors, start time; from /proc on Linux) to `registry`."""
    registry.register(BuildInfo())
    ProcessCollector(registry=registry)
