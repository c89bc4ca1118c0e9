"""Webhook delivery: every opened or resolved finding is POSTed as JSON to the configured URLs.

`publish` never blocks (a bounded queue; beyond it events are dropped and logged), so neither
ingest nor the diagnosis waits on a slow receiver. One worker thread delivers; failed deliveries
(connection errors, 429, 502, 503, 504) are retried with jittered exponential backoff that honours
Retry-After, within `webhook_max_attempts` and an overall `webhook_deadline_s`. Other answers
(a 4xx saying the payload is wrong) are not retried: sending the same body again cannot help.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import queue
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from flightdeck.server.settings import ServerSettings

log = logging.getLogger(__name__)

RETRY_STATUS = frozenset({429, 502, 503, 504})


@dataclass(order=True, slots=True)
class _Delivery:
    due: float
    seq: int
    url: str = field(compare=False)
    payload: dict[str, Any] = field(compare=False)
    deadline: float = field(compare=False)
    attempt: int = field(default=0, compare=False)


class WebhookSender:
    """Delivers finding events to the webhook URLs from one background thread."""

    def __init__(
        self,
        *,
        settings: ServerSettings,
        client: httpx.Client,
        monotonic: Callable[[], float] = time.monotonic,
        jitter: Callable[[], float] = random.random,
    ) -> None:
        self._settings = settings
        self._urls = list(settings.webhook_urls)
        self._client = client
        self._mono = monotonic
        self._jitter = jitter
        self._queue: queue.Queue[dict[str, Any]] = queue.Queue(maxsize=settings.webhook_queue_size)
        self._heap: list[_Delivery] = []
        self._seq = itertools.count()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: Deliveries that succeeded / were given up (for tests and logs).
        self.delivered = 0
        self.dropped = 0

    @property
    def enabled(self) -> bool:
        """Whether any URL is configured."""
        return bool(self._urls)

    def publish(self, payload: dict[str, Any]) -> None:
        """Queue an event for every URL; never blocks."""
        if not self._urls:
            return
        try:
            self._queue.put_nowait(payload)
        except queue.Full:
            self.dropped += len(self._urls)
            log.warning("webhook queue full: dropped %s event", payload.get("event"))

    def start(self) -> None:
        """Start the delivery thread."""
        if not self._urls or self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="flightdeck-webhooks", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the delivery thread (pending deliveries are abandoned)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None

    def pending(self) -> int:
        """Deliveries not yet done (queued or waiting for a retry)."""
        return self._queue.qsize() + len(self._heap)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._step()
            except Exception:  # the worker must not die; a bug here would silence every alert
                log.exception("webhook worker step failed")
                time.sleep(0.1)

    def _step(self) -> None:
        now = self._mono()
        wait = 0.5 if not self._heap else max(0.0, min(0.5, self._heap[0].due - now))
        try:
            payload = self._queue.get(timeout=wait) if wait > 0 else self._queue.get_nowait()
        except queue.Empty:
            payload = None
        now = self._mono()
        if payload is not None:
            for url in self._urls:
                heapq.heappush(
                    self._heap,
                    _Delivery(now, next(self._seq), url, payload, now + self._settings.webhook_deadline_s),
                )
        while self._heap and self._heap[0].due <= self._mono() and not self._stop.is_set():
            self._attempt(heapq.heappop(self._heap))

    def _attempt(self, d: _Delivery) -> None:
        d.attempt += 1
        retry_after: float | None = None
        try:
            resp = self._client.post(d.url, json=d.payload, timeout=self._settings.webhook_timeout_s)
        except httpx.HTTPError as exc:
            reason = f"{type(exc).__name__}: {exc}"
        else:
            if resp.status_code < 300:
                self.delivered += 1
                return
            if resp.status_code not in RETRY_STATUS:
                self.dropped += 1
                log.warning("webhook %s answered %s: not retried", d.url, resp.status_code)
                return
            reason = f"HTTP {resp.status_code}"
            retry_after = _retry_after(resp.headers.get("retry-after"))
        s = self._settings
        backoff = min(s.webhook_backoff_max_s, s.webhook_backoff_initial_s * 2 ** (d.attempt - 1))
        delay = backoff * (0.5 + self._jitter() / 2)  # jitter: receivers coming back are not stampeded
        if retry_after is not None:
            delay = max(delay, min(retry_after, s.webhook_backoff_max_s))
        due = self._mono() + delay
        if d.attempt >= s.webhook_max_attempts or due > d.deadline:
            self.dropped += 1
            log.warning("webhook %s failed %d times (%s): event dropped", d.url, d.attempt, reason)
            return
        d.due = due
        heapq.heappush(self._heap, d)


def _retry_after(raw: str | None) -> float | None:
    if not raw:
        return None
    try:
        return max(0.0, float(raw))
    except ValueError:
        return None  # an HTTP date: rare for webhooks; the backoff applies
