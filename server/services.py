"""Everything one server process shares between requests and workers (`Services`), and how it is
built (`build_services`): the database opened and its schema checked, the state loaded, the
components wired. `flightdeck.server.app.create_app` puts it behind the routes; the routes take it
from `request.app.state.services`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx
from prometheus_client import CollectorRegistry
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.orm import Session

from flightdeck.server import store
from flightdeck.server.db import Database, connect
from flightdeck.server.decode_gate import DecodeGate
from flightdeck.server.errors import UnavailableError
from flightdeck.server.export import ExportPolicy, StoreFacts
from flightdeck.server.ingest import IngestService
from flightdeck.server.live import JobState, LiveDiagnosis
from flightdeck.server.metrics import (
    IngestMetrics,
    SharedState,
    StateCollector,
    WebhookMetrics,
    register_process_metrics,
)
from flightdeck.server.schema import SchemaGuard, ensure_schema, wait_for_database
from flightdeck.server.settings import ServerSettings
from flightdeck.server.webhooks import WebhookSender

log = logging.getLogger(__name__)

NS = 1_000_000_000


@dataclass(slots=True)
class Services:
    """Everything one server process shares between requests and workers."""

    settings: ServerSettings
    db: Database
    clock: Callable[[], int]
    registry: CollectorRegistry
    metrics: IngestMetrics
    shared: SharedState
    live: LiveDiagnosis
    #: Held by `live`'s worker while it steps; `ingest` waits on it before decoding a batch.
    decode_gate: DecodeGate
    webhooks: WebhookSender
    ingest: IngestService
    owns_client: bool
    http_client: httpx.Client
    schema: SchemaGuard
    _retention_stop: threading.Event = field(default_factory=threading.Event)
    _retention_thread: threading.Thread | None = None

    def start(self) -> None:
        """Start the background workers."""
        self.live.start()
        self.webhooks.start()
        self._retention_stop.clear()
        self._retention_thread = threading.Thread(
            target=self._retention_loop, name="flightdeck-retention", daemon=True
        )
        self._retention_thread.start()

    def stop(self) -> None:
        """Stop the workers; close what this process opened."""
        self._retention_stop.set()
        if self._retention_thread is not None:
            self._retention_thread.join(5)
            self._retention_thread = None
        self.live.stop()
        self.webhooks.stop()

    def close(self) -> None:
        """Stop everything and release the database and the HTTP client."""
        self.stop()
        if self.owns_client:
            self.http_client.close()
        self.db.dispose()

    def run_retention(self) -> int:
        """Delete entries, NIXL history samples and finished webhook deliveries older than
        `retention_days` now; returns how many entries went."""
        before = self.clock() - int(self.settings.retention_days * 86400 * NS)
        # The outbox runs on the wall clock (see WebhookSender): its cut-off is taken from it.
        outbox_before = self.webhooks.now_ns() - int(self.settings.retention_days * 86400 * NS)
        with self.db.write() as session, session.begin():
            store.delete_nixl_samples_before(session=session, before_ns=before)
            store.prune_webhook_outbox(session=session, before_ns=outbox_before)
            return store.delete_entries_before(session=session, before_ns=before)

    def trim_entries(self) -> int:
        """Apply the `entries_per_rank` window to the active jobs this process diagnoses."""
        keep = self.settings.entries_per_rank
        if keep is None:
            return 0
        now_ns = self.clock()
        owned = self.live.cluster.owned if self.live.cluster is not None else None
        deleted = 0
        for js in self.live.jobs_snapshot():
            if (now_ns - js.last_seen_ns) / NS > self.settings.job_idle_s:
                continue
            if owned is not None and js.job_id not in owned:
                continue  # its owner trims it
            with self.db.write() as session, session.begin():
                deleted += store.trim_entries(session=session, job_id=js.job_id, keep_per_rank=keep)
        return deleted

    def _retention_loop(self) -> None:
        s = self.settings
        step = (
            s.retention_interval_s
            if s.entries_per_rank is None
            else min(s.retention_interval_s, s.trim_interval_s)
        )
        next_retention = time.monotonic() + s.retention_interval_s
        while not self._retention_stop.wait(step):
            try:
                if s.entries_per_rank is not None:
                    n = self.trim_entries()
                    if n:
                        log.info("window: trimmed %d entries", n)
                if time.monotonic() >= next_retention:
                    next_retention = time.monotonic() + s.retention_interval_s
                    n = self.run_retention()
                    if n:
                        log.info("retention: deleted %d entries", n)
            except OperationalError:
                self.metrics.db_errors.inc()
            except Exception as exc:
                if self.schema.explains(exc) is None:
                    log.exception("retention failed")

    def schema_reason(self) -> str | None:
        """Why the schema cannot be served now (None: fine, or the database is unreachable)."""
        try:
            return self.schema.check(failed=True)
        except DBAPIError:
            return None

    def forget_database(self) -> None:
        """The schema went away: drop what this process holds of the old database's rows."""
        self.ingest.forget()
        self.live.forget_all()

    def db_unavailable(self) -> UnavailableError:
        """The answer to a request that hit a locked or unreachable database: transient, so it
        says when to come back (counted in the database errors)."""
        self.metrics.db_errors.inc()
        return UnavailableError("database unavailable", retry_after_s=self.settings.retry_after_s)

    def on_finding_events(self, js: JobState, events: list[store.FindingEvent]) -> None:
        """Count opened findings and wake the webhook sender (the events are in its outbox, written
        with the findings by `record_finding_events`)."""
        with self.shared.lock:
            for ev in events:
                if ev.event == "finding.opened":
                    self.shared.findings_opened[ev.kind] += 1
        self.webhooks.notify()

    def record_finding_events(self, session: Session, js: JobState, events: list[store.FindingEvent]) -> None:
        """Write the events to the webhook outbox in the transaction that changed the findings."""
        self.webhooks.enqueue(session=session, job=js.name, attempt=js.attempt, events=events)


def build_services(
    settings: ServerSettings,
    *,
    clock: Callable[[], int] = time.time_ns,
    registry: CollectorRegistry | None = None,
    http_client: httpx.Client | None = None,
    report: Callable[[str], None] = log.warning,
) -> Services:
    """Open the database (waiting up to `db_startup_timeout_s` for it, one `report` line per
    failed attempt), check its schema (migrating it when `effective_migrate`), load the state,
    wire the components (no threads yet). Raises `schema.DatabaseUnreachableError` or
    `schema.SchemaError` with a one-line reason."""
    db = connect(settings.effective_database_url, busy_timeout_s=settings.db_busy_timeout_s)
    try:
        wait_for_database(
            db, url=settings.effective_database_url, deadline_s=settings.db_startup_timeout_s, report=report
        )
        ensure_schema(db, migrate_if_needed=settings.effective_migrate)
    except Exception:
        db.dispose()
        raise
    reg = registry if registry is not None else CollectorRegistry()
    metrics = IngestMetrics()
    shared = SharedState()
    client = http_client if http_client is not None else httpx.Client(timeout=settings.webhook_timeout_s)
    holder: list[Services] = []
    schema = SchemaGuard(
        db, on_lost=lambda: holder[0].forget_database(), migrate_if_needed=settings.effective_migrate
    )
    webhook_metrics = WebhookMetrics()
    webhooks = WebhookSender(
        settings=settings,
        db=db,
        client=client,
        metrics=webhook_metrics,
        on_db_error=metrics.db_errors.inc,
        schema_problem=schema.explains,
    )

    def on_events(js: JobState, events: list[store.FindingEvent]) -> None:
        holder[0].on_finding_events(js, events)

    def record_events(session: Session, js: JobState, events: list[store.FindingEvent]) -> None:
        holder[0].record_finding_events(session, js, events)

    decode_gate = DecodeGate()
    live = LiveDiagnosis(
        db=db,
        settings=settings,
        clock=clock,
        on_events=on_events,
        on_db_error=metrics.db_errors.inc,
        decode_gate=decode_gate,
        record_events=record_events,
        observe_duration=metrics.diagnosis.observe,
        schema_problem=schema.explains,
    )
    live.load()
    with db.read() as session:
        for tok in store.list_tokens(session=session):
            if tok.last_push_ns is not None and tok.revoked_at_ns is None:
                shared.collector_push_ns[tok.name] = tok.last_push_ns
        for a in store.nixl_agents(session=session):
            shared.set_nixl(a.host, a.agent, a.source, store.nixl_totals(a), a.sample)
    # Before the first scrape can be answered (the app serves only once this returns): the open
    # findings are loaded (`live.load` above), and with replicas this process knows whether it
    # leads, so that no scrape sees an open incident resolved or a cluster-wide series twice.
    if live.cluster is not None:
        live.cluster.lead()
    facts = StoreFacts(db=db, on_db_error=metrics.db_errors.inc, read_nixl=settings.cluster)
    facts.refresh(force=True)
    reg.register(
        StateCollector(
            live=live,
            shared=shared,
            ingest=metrics,
            clock=clock,
            facts=facts,
            policy=ExportPolicy(live.cluster),
        )
    )
    reg.register(webhook_metrics)
    register_process_metrics(reg)
    ingest = IngestService(
        db=db,
        settings=settings,
        clock=clock,
        metrics=metrics,
        shared=shared,
        live=live,
        decode_gate=decode_gate,
        schema=schema,
    )
    services = Services(
        settings=settings,
        db=db,
        clock=clock,
        registry=reg,
        metrics=metrics,
        shared=shared,
        live=live,
        decode_gate=decode_gate,
        webhooks=webhooks,
        ingest=ingest,
        owns_client=http_client is None,
        http_client=client,
        schema=schema,
    )
    holder.append(services)
    return services
