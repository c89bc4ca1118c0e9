"""Sends queued batches to the server's `POST /api/v1/ingest`, oldest first, one at a time.

One batch at a time and strictly in order, because a later batch of a rank carries more progress
for the same entries than an earlier one, and the server upserts: reordering could regress them.

Answers:
- 2xx (including `{"duplicate": true}` for a batch_id the server already has): delivered, removed.
- connection errors, timeouts, 429, 502, 503, 504: retried with jittered exponential backoff that
  honours `Retry-After`, within `deadline_s` per delivery; after it the batch stays at the head of
  the queue and the next delivery starts (so a server that is down for hours loses nothing).
- 401, 403: the server refuses the collector's token (revoked, mistyped, rotated), not the batch.
  Nothing is dead-lettered: the batches stay queued, one ERROR line says so (once per episode),
  `flightdeck_collector_token_rejected` is 1, and sending is retried after a long, capped backoff
  (`auth_retry_max_s`); a changed token (token_file) is tried at once, without a restart.
  `drain(give_up_on_auth=True)` (`--once`) stops at the first rejection instead: `token_rejection`
  says why, the batches stay queued.
- any other 4xx: the server refuses the batch itself; it goes to the dead-letter table with the
  server's message and is never retried by itself (`flightdeck collector --requeue-dead-letters`).
- 422 that says the rest was applied (`"applied": true` and the `refused` snapshots and NIXL samples
  by index, one reason each): only the refused ones go to the dead-letter table, as a batch of their
  own; the batch is acknowledged. When the answer lists fewer refusals than it counts, the whole
  batch is dead-lettered (requeueing it re-applies the rest, which changes nothing). A server that
  answers 422 for the whole batch (older servers, or every snapshot refused) dead-letters it whole.
- anything else (500, 501, ...): counted per batch; after `max_attempts` it is dead-lettered too, so
  one batch that crashes the server cannot block the queue for ever.
"""

from __future__ import annotations

import enum
import gzip
import json
import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from flightdeck.collector.metrics import CollectorMetrics
from flightdeck.collector.queue import DurableQueue, QueuedBatch
from flightdeck.retry import backoff_s, parse_retry_after, retry_delay_s
from flightdeck.wire import BATCH_AGE_HEADER

log = logging.getLogger(__name__)

RETRY_STATUSES = frozenset({429, 502, 503, 504})
#: The server refuses the token, not the batch: keep the batch, fix the token.
AUTH_STATUSES = frozenset({401, 403})
#: First wait after the token was refused; doubles up to auth_retry_max_s.
AUTH_BACKOFF_BASE_S = 10.0
#: While waiting out an auth backoff, how often a token_file is looked at for a new token.
TOKEN_RECHECK_S = 5.0
#: Bounds of the backoff between attempts (seconds).
BACKOFF_BASE_S = 0.5
BACKOFF_MAX_S = 30.0
#: A Retry-After longer than this is treated as this (a server saying "come back in a day" should
#: not stall a collector that long without another look).
RETRY_AFTER_MAX_S = 300.0


class Outcome(enum.Enum):
    """How one delivery of a batch ended."""

    DELIVERED = "delivered"
    DEAD_LETTERED = "dead_lettered"
    #: Not delivered yet (retryable failures until the deadline, or stopping): still queued.
    PENDING = "pending"


@dataclass(frozen=True, slots=True)
class _Answer:
    retry: bool
    reason: str
    status: int | None
    message: str
    retry_after_s: float | None = None
    #: A 422 that applied the rest: the refused (snapshot indexes, NIXL indexes, reasons).
    refused: tuple[tuple[int, ...], tuple[int, ...], str] | None = None


def refused_part(body: bytes, snapshots: tuple[int, ...], nixl: tuple[int, ...]) -> tuple[bytes, int] | None:
    """The gzipped batch of only the refused snapshots and NIXL samples of `body` (same tables, a
    batch_id of its own), and its entry count; None when `body` or an index is not what was sent."""
    try:
        doc = json.loads(gzip.decompress(body))
        snaps, samples = doc["snapshots"], doc.get("nixl") or []
        part = dict(
            doc,
            batch_id=f"{str(doc['batch_id'])[:100]}-refused",
            snapshots=[snaps[i] for i in snapshots],
            nixl=[samples[i] for i in nixl],
        )
    except (OSError, ValueError, KeyError, IndexError, TypeError, EOFError):
        return None
    entries = 0
    for snap in part["snapshots"]:
        e = snap.get("entries") if isinstance(snap, dict) else None
        entries += e.get("n", 0) if isinstance(e, dict) else len(e) if isinstance(e, list) else 0
    return gzip.compress(json.dumps(part).encode(), compresslevel=3), int(entries)


def _refusals(resp: httpx.Response) -> tuple[tuple[int, ...], tuple[int, ...], str] | None:
    """From a 422 that applied the rest of the batch: the refused snapshot and NIXL indexes and their
    reasons; None when it did not say so, or listed fewer refusals than it counted."""
    try:
        doc = resp.json()
    except ValueError:
        return None
    if not isinstance(doc, dict) or doc.get("applied") is not True:
        return None
    listed = doc.get("refused")
    if not isinstance(listed, list) or not listed or not all(isinstance(r, dict) for r in listed):
        return None
    count = doc.get("refused_count", len(listed))
    if count != len(listed):
        return None
    snaps: list[int] = []
    samples: list[int] = []
    reasons: list[str] = []
    for r in listed:
        i = r.get("snapshot", r.get("nixl"))
        if type(i) is not int or i < 0:
            return None
        (snaps if "snapshot" in r else samples).append(i)
        who = "/".join(str(r[k]) for k in ("job", "attempt", "rank", "host") if r.get(k) is not None)
        reasons.append(f"{'snapshot' if 'snapshot' in r else 'nixl'} {i} ({who}): {r.get('reason')}")
    return tuple(snaps), tuple(samples), "; ".join(reasons)


class Pusher:
    """Delivers the queue's batches; `run` is the body of the pusher thread."""

    def __init__(
        self,
        queue: DurableQueue,
        *,
        client: httpx.Client,
        url: str,
        token: str | None,
        metrics: CollectorMetrics,
        deadline_s: float = 60.0,
        request_timeout_s: float = 10.0,
        max_attempts: int = 10,
        backoff_base_s: float = BACKOFF_BASE_S,
        backoff_max_s: float = BACKOFF_MAX_S,
        monotonic: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        rng: random.Random | None = None,
        stop: threading.Event | None = None,
        token_source: Callable[[], str | None] | None = None,
        auth_backoff_max_s: float = 300.0,
    ) -> None:
        self.queue = queue
        self.client = client
        self.url = url
        self.metrics = metrics
        self.deadline_s = deadline_s
        self.request_timeout_s = request_timeout_s
        self.max_attempts = max_attempts
        self.backoff_base_s = backoff_base_s
        self.backoff_max_s = backoff_max_s
        self.monotonic = monotonic
        self.wall_clock = wall_clock
        self.rng = rng or random.Random()
        self.stop = stop or threading.Event()
        self.headers = {
            "Content-Type": "application/json",
            "Content-Encoding": "gzip",
        }
        self._token = token
        if token:
            self.headers["Authorization"] = f"Bearer {token}"
        #: Reads the token again (token_file) while the server rejects the current one.
        self.token_source = token_source
        self.auth_backoff_max_s = auth_backoff_max_s
        #: Consecutive retryable failures: drives the backoff across deliveries of the head batch.
        self._failures = 0
        #: Consecutive token rejections, and no request before this monotonic time.
        self._auth_failures = 0
        self._auth_until = 0.0
        #: (HTTP status, server's message) of the last token rejection; None once accepted again.
        self.token_rejection: tuple[int | None, str] | None = None

    # --- the thread ---------------------------------------------------------------------------

    def run(self) -> None:
        """Deliver batches until `stop` is set; never raises (errors are logged, then retried)."""
        while not self.stop.is_set():
            try:
                batch = self.queue.peek()
                if batch is None:
                    self.queue.ready.wait(1.0)
                    continue
                self.deliver(batch, deadline=self.monotonic() + self.deadline_s)
            except Exception:  # the thread must outlive any bug: log it and go on after a pause
                log.exception("pusher: unexpected error; retrying in 1 s")
                self.stop.wait(1.0)

    def drain(self, *, timeout_s: float, give_up_on_auth: bool = False) -> bool:
        """Deliver queued batches until the queue is empty or `timeout_s` passed; True when empty.

        Used by `--once` and at shutdown, from the calling thread (the pusher thread is stopped).
        `give_up_on_auth`: return False at once when the server rejects the token (`--once`: no
        waiting for a token that a one-shot run will not get; `token_rejection` says why).
        """
        end = self.monotonic() + timeout_s
        # Our own stop event: the thread's is already set when draining at shutdown.
        stop = threading.Event()
        while True:
            batch = self.queue.peek()
            if batch is None:
                return True
            if self.monotonic() >= end:
                return False
            self.deliver(batch, deadline=end, stop=stop, give_up_on_auth=give_up_on_auth)
            if give_up_on_auth and self.token_rejection is not None:
                return False

    # --- one batch ----------------------------------------------------------------------------

    def deliver(
        self,
        batch: QueuedBatch,
        *,
        deadline: float,
        stop: threading.Event | None = None,
        give_up_on_auth: bool = False,
    ) -> Outcome:
        """Send one batch, retrying retryable failures until `deadline` (monotonic seconds).

        `stop` (default: the pusher's own) cuts the waits between attempts short;
        `give_up_on_auth`: a rejected token ends the delivery (PENDING) instead of waiting.
        """
        stop = stop or self.stop
        while True:
            if self._auth_until > self.monotonic() and not self._wait_auth(deadline, stop):
                return Outcome.PENDING
            # How long it waited here: the server judges the job as of its data (analysis/lateness.py).
            age_ms = max(0.0, self.wall_clock() * 1e3 - batch.created_ns / 1e6)
            headers = dict(
                self.headers, **{"Idempotency-Key": batch.batch_id, BATCH_AGE_HEADER: f"{age_ms:.0f}"}
            )
            answer = self._post(batch, headers, deadline)
            if answer is None:
                self._failures = 0
                if self._auth_failures:
                    log.info("the server accepts the collector token again; sending the queued batches")
                    self._auth_failures = 0
                    self.token_rejection = None
                    self.metrics.token_rejected.set(0)
                self.queue.ack(batch.seq)
                self.metrics.batches_sent.inc()
                return Outcome.DELIVERED
            if answer.refused is not None and self._dead_letter_refused(batch, answer):
                return Outcome.DELIVERED
            self.metrics.batches_failed.labels(reason=answer.reason).inc()
            if answer.reason == "auth":
                self._token_rejected(answer)
                if give_up_on_auth:
                    return Outcome.PENDING
                continue
            if not answer.retry:
                attempts = self.max_attempts
                if answer.reason == "server_error":
                    attempts = self.queue.count_attempt(batch.seq)
                if attempts >= self.max_attempts:
                    log.error(
                        "batch %s (%d entries) refused by the server (HTTP %s): %s; moved to the "
                        "dead-letter table",
                        batch.batch_id,
                        batch.entries,
                        answer.status,
                        answer.message,
                    )
                    self.queue.dead_letter(batch.seq, status=answer.status, message=answer.message)
                    self.metrics.dead_lettered.inc()
                    self._failures = 0
                    return Outcome.DEAD_LETTERED
                log.warning(
                    "batch %s: HTTP %s (%s), attempt %d of %d",
                    batch.batch_id,
                    answer.status,
                    answer.message,
                    attempts,
                    self.max_attempts,
                )
            self._failures += 1
            delay = self._backoff(answer.retry_after_s)
            if self.monotonic() + delay > deadline:
                log.warning(
                    "batch %s not delivered within the deadline (%s); it stays queued",
                    batch.batch_id,
                    answer.message,
                )
                self.metrics.batches_failed.labels(reason="deadline").inc()
                # Wait out what is left, so that a down server is not hammered by fresh deliveries.
                stop.wait(max(0.0, min(delay, deadline - self.monotonic())))
                return Outcome.PENDING
            if stop.wait(delay):
                return Outcome.PENDING

    def _dead_letter_refused(self, batch: QueuedBatch, answer: _Answer) -> bool:
        """The server applied the batch but for the snapshots it refused: those go to the dead-letter
        table alone and the batch is acknowledged. False when the refused part cannot be cut out."""
        assert answer.refused is not None
        snaps, samples, reasons = answer.refused
        part = refused_part(batch.body, snaps, samples)
        if part is None:
            return False
        body, entries = part
        log.error(
            "batch %s: the server applied it but refused %d snapshots and %d NIXL samples (HTTP 422): "
            "%s; those alone moved to the dead-letter table",
            batch.batch_id,
            len(snaps),
            len(samples),
            reasons[:2000],
        )
        self.queue.dead_letter(
            batch.seq,
            status=answer.status,
            message=reasons,
            part=(f"{batch.batch_id[:100]}-refused", entries, body),
        )
        self.metrics.dead_lettered.inc()
        self.metrics.batches_sent.inc()
        self._failures = 0
        return True

    def _token_rejected(self, answer: _Answer) -> None:
        """The server refused the token: keep everything queued, say so once, back off long."""
        self._auth_failures += 1
        self.token_rejection = (answer.status, answer.message)
        self.metrics.auth_failures.inc()
        self.metrics.token_rejected.set(1)
        delay = backoff_s(
            self._auth_failures,
            base_s=AUTH_BACKOFF_BASE_S,
            max_s=self.auth_backoff_max_s,
            jitter=self.rng.random(),
        )
        self._auth_until = self.monotonic() + delay
        if self._auth_failures == 1:
            log.error(
                "server rejected the collector token: HTTP %s %s; nothing is sent until it is accepted "
                "(%d batches stay queued, none are dropped; retrying every %.0f s at most); fix token or "
                "token_file in the collector settings (a new token_file is picked up without a restart)",
                answer.status,
                answer.message,
                self.queue.stats().depth,
                self.auth_backoff_max_s,
            )
        else:
            log.debug("token still rejected (HTTP %s); next try in %.0f s", answer.status, delay)

    def _wait_auth(self, deadline: float, stop: threading.Event) -> bool:
        """Wait out the auth backoff (looking for a new token); False when `deadline` or `stop` came first."""
        while True:
            now = self.monotonic()
            if self._auth_until <= now:
                return True
            if self._reload_token():
                self._auth_until = now
                return True
            if now >= deadline:
                return False
            if stop.wait(min(self._auth_until - now, deadline - now, TOKEN_RECHECK_S)):
                return False

    def _reload_token(self) -> bool:
        """Read the token again; True when it changed (then it is used from now on)."""
        if self.token_source is None:
            return False
        try:
            token = self.token_source()
        except Exception as exc:  # an unreadable or empty token_file: keep the current token
            log.debug("cannot read the token again: %s", exc)
            return False
        if token == self._token:
            return False
        log.info("the collector token changed; trying it now")
        self._token = token
        if token:
            self.headers["Authorization"] = f"Bearer {token}"
        else:
            self.headers.pop("Authorization", None)
        return True

    def _backoff(self, retry_after_s: float | None) -> float:
        """The wait before the next attempt; a Retry-After is a floor, not a suggestion."""
        return retry_delay_s(
            self._failures,
            base_s=self.backoff_base_s,
            max_s=self.backoff_max_s,
            jitter=self.rng.random(),
            retry_after_s=retry_after_s,
            retry_after_max_s=RETRY_AFTER_MAX_S,
        )

    def _post(self, batch: QueuedBatch, headers: dict[str, str], deadline: float) -> _Answer | None:
        """One request; None when the server took the batch, else what went wrong."""
        timeout = max(0.1, min(self.request_timeout_s, deadline - self.monotonic()))
        try:
            resp = self.client.post(self.url, content=batch.body, headers=headers, timeout=timeout)
        except httpx.TimeoutException as exc:
            return _Answer(True, "timeout", None, f"timeout: {exc}")
        except httpx.TransportError as exc:
            return _Answer(True, "connection", None, f"{type(exc).__name__}: {exc}")
        status = resp.status_code
        if 200 <= status < 300:
            if _is_duplicate(resp):
                self.metrics.batches_duplicate.inc()
                log.debug("batch %s: the server already had it", batch.batch_id)
            return None
        message = _message(resp)
        if status in RETRY_STATUSES:
            reason = "throttled" if status == 429 else "unavailable"
            ra = parse_retry_after(resp.headers.get("Retry-After"), now_s=self.wall_clock())
            return _Answer(True, reason, status, message, ra)
        if status in AUTH_STATUSES:
            return _Answer(True, "auth", status, message)
        if status == 422:
            return _Answer(False, "rejected", status, message, refused=_refusals(resp))
        if 400 <= status < 500:
            return _Answer(False, "rejected", status, message)
        return _Answer(False, "server_error", status, message)


def _is_duplicate(resp: httpx.Response) -> bool:
    try:
        doc = resp.json()
    except ValueError:
        return False
    return isinstance(doc, dict) and doc.get("duplicate") is True


def _message(resp: httpx.Response) -> str:
    """The server's explanation: `detail` of a JSON error body, else the start of the text."""
    try:
        doc = resp.json()
    except ValueError:
        doc = None
    if isinstance(doc, dict) and "detail" in doc:
        return str(doc["detail"])[:2000]
    text = resp.text.strip()
    return text[:2000] or resp.reason_phrase or f"HTTP {resp.status_code}"
