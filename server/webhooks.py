"""Webhook delivery from a durable outbox: every opened or resolved finding is POSTed as JSON to
the configured URLs, at least once.

The diagnosis writes one outbox row per (event, URL) in the transaction that opens or resolves the
finding (`WebhookSender.enqueue`): a crash or a restart loses no event, and a change that was rolled
back sends none. One sender thread per server process claims due rows with a lease (on PostgreSQL
with `FOR UPDATE SKIP LOCKED`, so two processes never send the same row at once), POSTs them and
records the outcome. Each event has a stable id, in the body (`id`) and in the `Idempotency-Key`
and `X-Flightdeck-Event-Id` headers: receivers de-duplicate on it, since a crash between a POST and
its record sends the event again.

Failed deliveries (connection errors, 429, 502, 503, 504) are retried with jittered exponential
backoff that honours Retry-After, within `webhook_max_attempts` and `webhook_deadline_s` from the
event. Other answers (a 4xx saying the payload is wrong) are final: the same body again cannot help.
"""

from __future__ import annotations

import logging
import random
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from flightdeck.retry import parse_retry_after, retry_delay_s
from flightdeck.server import store
from flightdeck.server.db import Database
from flightdeck.server.metrics import WebhookMetrics
from flightdeck.server.settings import ServerSettings

log = logging.getLogger(__name__)

NS = 1_000_000_000
RETRY_STATUS = frozenset({429, 502, 503, 504})
#: Deliveries claimed per database round trip.
CLAIM_BATCH = 16
#: A claim outlives the POST timeout by this much before another sender may take the row.
LEASE_MARGIN_S = 5.0


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one attempt leaves: `delivered`, `dropped`, or `pending` again at `due_ns`."""

    state: str
    due_ns: int | None = None
    error: str | None = None


def event_payload(
    *, event_id: str, event: store.FindingEvent, job: str, attempt: int, now_ns: int
) -> dict[str, Any]:
    """The JSON body of one finding event."""
    return {
        "id": event_id,
        "event": event.event,
        "created_at_s": now_ns / NS,
        "job": job,
        "attempt": attempt,
        "finding": {**event.data, "id": event.row_id},
    }


class WebhookSender:
    """Writes finding events to the outbox and delivers them from one background thread.

    `clock` (epoch ns) times the outbox: due times, leases and deadlines are compared across
    server processes, so it is the wall clock, not the server's injectable diagnosis clock.
    """

    def __init__(
        self,
        *,
        settings: ServerSettings,
        db: Database,
        client: httpx.Client,
        metrics: WebhookMetrics | None = None,
        on_db_error: Callable[[], None] = lambda: None,
        clock: Callable[[], int] = time.time_ns,
        jitter: Callable[[], float] = random.random,
        schema_problem: Callable[[BaseException], str | None] | None = None,
    ) -> None:
        """`schema_problem`: whether a failed step is explained by a vanished schema
        (`SchemaGuard.explains`), which is then not logged as a failure of the sender."""
        self._settings = settings
        self._schema_problem = schema_problem
        self._urls = list(settings.webhook_urls)
        self._db = db
        self._client = client
        self.metrics = metrics if metrics is not None else WebhookMetrics()
        self._on_db_error = on_db_error
        self._clock = clock
        self._jitter = jitter
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def enabled(self) -> bool:
        """Whether any URL is configured."""
        return bool(self._urls)

    def now_ns(self) -> int:
        """The outbox clock (epoch ns)."""
        return self._clock()

    def enqueue(
        self, *, session: Session, job: str, attempt: int, events: Sequence[store.FindingEvent]
    ) -> list[str]:
        """Write `events` to the outbox, one row per URL, in the caller's transaction (the one that
        opened or resolved the findings); returns the event ids. Call `notify` after the commit."""
        if not self._urls or not events:
            return []
        now = self._clock()
        deadline = now + int(self._settings.webhook_deadline_s * NS)
        ids: list[str] = []
        rows: list[dict[str, Any]] = []
        for ev in events:
            event_id = str(uuid.uuid4())
            ids.append(event_id)
            payload = event_payload(event_id=event_id, event=ev, job=job, attempt=attempt, now_ns=now)
            rows.extend(
                {
                    "event_id": event_id,
                    "url": url,
                    "payload": payload,
                    "created_ns": now,
                    "due_ns": now,
                    "deadline_ns": deadline,
                }
                for url in self._urls
            )
        store.add_webhook_deliveries(session=session, deliveries=rows)
        return ids

    def notify(self) -> None:
        """Wake the sender now (new events were committed), rather than at its next poll."""
        self._wake.set()

    def start(self) -> None:
        """Start the delivery thread."""
        if not self._urls or self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="flightdeck-webhooks", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the delivery thread; undelivered events stay in the outbox for the next start."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None

    def pending(self) -> int:
        """Deliveries to this process's URLs waiting in the outbox (of every server process)."""
        with self._db.read() as session:
            return store.webhook_outbox_status(session=session, urls=self._urls)[0]

    def _run(self) -> None:
        poll = self._settings.webhook_poll_interval_s
        while not self._stop.is_set():
            self._wake.clear()
            try:
                wait = self.step()
            except OperationalError:
                self._on_db_error()
                wait = poll
            except Exception as exc:  # the worker must not die; a bug here would silence every alert
                if self._schema_problem is None or self._schema_problem(exc) is None:
                    log.exception("webhook sender step failed")
                wait = poll
            if wait > 0:
                self._wake.wait(wait)

    def step(self) -> float:
        """Claim the due deliveries, post them, record the outcomes; returns the seconds until
        the next delivery is due (at most the poll interval)."""
        poll = self._settings.webhook_poll_interval_s
        # A read first: an idle sender must not take SQLite's write lock at every poll.
        with self._db.read() as session:
            depth, due = store.webhook_outbox_status(session=session, urls=self._urls)
        self.metrics.depth = depth
        if due is None or due > self._clock():
            return poll if due is None else min(poll, (due - self._clock()) / NS)
        claim = uuid.uuid4().hex
        lease_ns = int((self._settings.webhook_timeout_s + LEASE_MARGIN_S) * NS)
        with self._db.write() as session, session.begin():
            claimed = store.claim_webhook_deliveries(
                session=session,
                urls=self._urls,
                now_ns=self._clock(),
                limit=CLAIM_BATCH,
                lease_ns=lease_ns,
                claim=claim,
            )
        if not claimed:
            return min(poll, 0.05)  # due, but another process is claiming it right now
        for k, d in enumerate(claimed):
            if self._stop.is_set():
                with self._db.write() as session, session.begin():
                    store.release_webhook_deliveries(
                        session=session,
                        row_ids=[c.row_id for c in claimed[k:]],
                        claim=claim,
                        now_ns=self._clock(),
                    )
                return 0.0
            outcome = self._attempt(d)
            with self._db.write() as session, session.begin():
                kept = store.settle_webhook_delivery(
                    session=session,
                    row_id=d.row_id,
                    claim=claim,
                    state=outcome.state,
                    now_ns=self._clock(),
                    due_ns=outcome.due_ns,
                    error=outcome.error,
                )
            if not kept:
                log.warning(
                    "webhook %s event %s: lease expired before the outcome was recorded", d.url, d.event_id
                )
            self.metrics.deliveries.labels("failed" if outcome.state == "pending" else outcome.state).inc()
        with self._db.read() as session:
            depth, due = store.webhook_outbox_status(session=session, urls=self._urls)
        self.metrics.depth = depth
        if len(claimed) == CLAIM_BATCH:
            return 0.0  # more may be due already
        if due is None:
            return poll
        return min(poll, max(0.0, (due - self._clock()) / NS))

    def _attempt(self, d: store.ClaimedDelivery) -> Outcome:
        s = self._settings
        if self._clock() > d.deadline_ns:
            log.warning(
                "webhook %s event %s: deadline passed before it could be sent: dropped", d.url, d.event_id
            )
            return Outcome("dropped", error="deadline passed")
        retry_after: float | None = None
        headers = {"Idempotency-Key": d.event_id, "X-Flightdeck-Event-Id": d.event_id}
        try:
            resp = self._client.post(d.url, json=d.payload, headers=headers, timeout=s.webhook_timeout_s)
        except httpx.HTTPError as exc:
            reason = f"{type(exc).__name__}: {exc}"
        else:
            if resp.status_code < 300:
                return Outcome("delivered")
            if resp.status_code not in RETRY_STATUS:
                log.warning("webhook %s answered %s: not retried", d.url, resp.status_code)
                return Outcome("dropped", error=f"HTTP {resp.status_code}")
            reason = f"HTTP {resp.status_code}"
            retry_after = parse_retry_after(resp.headers.get("retry-after"), now_s=self._clock() / NS)
        delay = retry_delay_s(  # jittered: receivers coming back are not stampeded
            d.attempts,
            base_s=s.webhook_backoff_initial_s,
            max_s=s.webhook_backoff_max_s,
            jitter=self._jitter(),
            retry_after_s=retry_after,
            retry_after_max_s=s.webhook_backoff_max_s,
        )
        due = self._clock() + int(delay * NS)
        if d.attempts >= s.webhook_max_attempts or due > d.deadline_ns:
            log.warning("webhook %s failed %d times (%s): event dropped", d.url, d.attempts, reason)
            return Outcome("dropped", error=reason)
        return Outcome("pending", due_ns=due, error=reason)
