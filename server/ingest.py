"""Ingest: authenticate a collector, bound the body, decode the batch, apply it with others (group commit).

Called from the route in a worker thread (everything here blocks: gzip, JSON, SQL). The route
holds an in-flight slot of `admission.Admission` around it: a flood of pushes first waits in a
bounded queue on the event loop (no thread, body unread) and gets 429 with Retry-After only when
`max_queued_ingests` already wait or the wait passes `ingest_queue_timeout_s`, never an
ever-growing pile of threads and open transactions.

One module over 500 lines: one request's path, authentication to commit, whose steps share the
batch, its budget and its error answers; admission (`admission.py`), validation
(`validation.py`) and the SQL (`store/`) are apart.
"""

from __future__ import annotations

import gzip
import hashlib
import logging
import math
import secrets
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import anyio
import orjson
from sqlalchemy.exc import DBAPIError, OperationalError

from flightdeck.runtime_tuning import GC_PAUSE
from flightdeck.server import store
from flightdeck.server.admission import Admission, Refused
from flightdeck.server.db import Database
from flightdeck.server.decode_gate import DecodeGate
from flightdeck.server.errors import (
    AuthError,
    BusyError,
    ForbiddenError,
    InvalidBatchError,
    PayloadTooLargeError,
    UnavailableError,
    UnsupportedEncodingError,
)
from flightdeck.server.group_commit import GroupCommit, Pending
from flightdeck.server.live import LiveDiagnosis
from flightdeck.server.metrics import IngestMetrics, SharedState
from flightdeck.server.schema import SchemaGuard
from flightdeck.server.settings import ServerSettings
from flightdeck.server.token_scope import TokenScope
from flightdeck.server.validation import decode_checked
from flightdeck.wire import Batch, Refusal, WireError

log = logging.getLogger(__name__)


def _loads(data: bytes) -> Any:
    # orjson: 3-4x faster than the standard library on batches of thousands of small objects;
    # parsing is the largest cost of ingest after decoding.
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise InvalidBatchError(f"body: not JSON ({exc})") from None


def _batch_age_s(header: str | None) -> float | None:
    """Seconds from `BATCH_AGE_HEADER`; None when absent or not a sane number."""
    try:
        ms = float(header) if header else math.nan
    except ValueError:
        return None
    return ms / 1e3 if 0 <= ms < 1e10 else None


def _bearer_hash(authorization: str | None) -> str | None:
    """The token hash of an `Authorization: Bearer <token>` header; None if it is not one."""
    scheme, _, token = (authorization or "").partition(" ")
    return hash_token(token.strip()) if scheme.lower() == "bearer" and token.strip() else None


#: Prefix of collector tokens: recognisable in logs and by secret scanners.
TOKEN_PREFIX = "fdk_"  # noqa: S105 (a prefix, not a secret)


def new_token() -> str:
    """A fresh random collector token (shown once; only its hash is stored)."""
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def hash_token(token: str) -> str:
    """SHA-256 (hex) of a token: tokens are random, so a plain hash cannot be brute-forced."""
    return hashlib.sha256(token.encode()).hexdigest()


def gunzip_limited(data: bytes, limit: int) -> bytes:
    """Decompress gzip `data`, refusing output above `limit` bytes without ever producing it."""
    d = zlib.decompressobj(wbits=31)
    try:
        out = d.decompress(data, limit + 1)
    except zlib.error as exc:
        raise InvalidBatchError(f"body: not valid gzip ({exc})") from None
    if len(out) > limit or d.unconsumed_tail:
        raise PayloadTooLargeError(f"decompressed body exceeds {limit} bytes")
    if not d.eof:
        raise InvalidBatchError("body: truncated gzip stream")
    return out


#: Entries per group commit. Small batches (a host's few hundred entries) share transactions;
#: big ones go alone, so that one is decoded while another is written (two 8,000-entry batches
#: in one transaction were slower than one after the other: nothing overlapped).
GROUP_MAX_ENTRIES = 10_000


#: The scope of an unscoped token (and of unauthenticated ingest).
UNSCOPED = TokenScope()


@dataclass(frozen=True, slots=True)
class Sender:
    """The authenticated collector that sent a batch, as its token names it (None id:
    unauthenticated ingest allowed by settings). Not `flightdeck.collector.daemon.Collector`, the
    daemon itself, nor a Prometheus collector."""

    id: int | None
    name: str
    #: What the token may write (unscoped: anything).
    scope: TokenScope = UNSCOPED


@dataclass(frozen=True, slots=True)
class _Request:
    """A decoded batch waiting for its group's transaction."""

    batch: Batch
    collector: Sender
    #: The gzip body, for the cluster feed (empty when not in a cluster).
    feed_body: bytes
    #: perf_counter() when the request arrived.
    started: float
    #: The collector's `BATCH_AGE_HEADER` in seconds, if it sent a sane one.
    age_s: float | None


class IngestService:
    """Applies ingest requests; shared by all requests of one server process."""

    def __init__(
        self,
        *,
        db: Database,
        settings: ServerSettings,
        clock: Callable[[], int],
        metrics: IngestMetrics,
        shared: SharedState,
        live: LiveDiagnosis,
        decode_gate: DecodeGate,
        schema: SchemaGuard | None = None,
    ) -> None:
        """`decode_gate`: waited on before decoding a batch (the diagnosis worker goes first);
        `schema`: asked why, when a statement fails (a missing schema is answered 503 with
        the reason, not as an error of the batch)."""
        self._db = db
        self._schema = schema
        self._settings = settings
        self._clock = clock
        self._metrics = metrics
        self._shared = shared
        self._live = live
        self._decode_gate = decode_gate
        #: In-flight slots and the queue of requests waiting for one (see admission.py).
        self.admission = Admission(
            settings.max_inflight_ingests,
            max_queued=settings.max_queued_ingests,
            timeout_s=settings.ingest_queue_timeout_s,
        )
        metrics.queued = lambda: self.admission.queued
        #: Worker threads of the in-flight requests (see `ingest_http.ingest_request`).
        self.threads = anyio.CapacityLimiter(settings.max_inflight_ingests)
        #: Concurrent batches share transactions. SQLite has one writer; on its own it would make
        #: threads take turns in BEGIN IMMEDIATE, whose busy handler polls with sleeps of up to
        #: 100 ms. PostgreSQL gets two, so one group's rows are built while the other's are written
        #: (at 4,096 ranks four made smaller transactions and were slower, and one left the
        #: database waiting: docs/dev/performance-history.md, "Seventh session").
        self._group: GroupCommit[_Request] = GroupCommit(
            self._write, writers=1 if db.dialect == "sqlite" else 2, max_weight=GROUP_MAX_ENTRIES
        )
        #: Row ids this process already knows (signatures, hosts, groups, recently touched jobs).
        self._cache = store.IngestCache()
        #: token hash -> (its collector, clock when the database last confirmed it): valid tokens
        #: only, so it holds at most one entry per token (`auth_cache_s`).
        self._tokens: dict[str, tuple[Sender, int]] = {}
        #: Token hashes being checked against the database now (one query per token at a time).
        self._refreshing: set[str] = set()
        self._auth_lock = threading.Lock()

    def _write(self, group: list[Pending[_Request]]) -> None:
        """Apply a group of decoded batches in one transaction, then hand them to the diagnosis
        in commit order (GroupCommit's writer: runs on one of the waiting request threads)."""
        now_ns = self._clock()
        try:
            with self._db.write() as session, session.begin():
                results, learned = store.ingest_batches(
                    session=session,
                    batches=[(p.item.batch, p.item.collector.id) for p in group],
                    now_ns=now_ns,
                    cache=self._cache,
                    # A scoped token reports only its host's ranks gone (the store checks where
                    # each rank runs).
                    gone_hosts=[p.item.collector.scope.host for p in group],
                )
                if self._settings.cluster:
                    # For the processes that own these jobs' diagnosis (read back in commit order).
                    received_ns = self._clock()
                    for p, r in zip(group, results, strict=True):
                        if not r.duplicate and r.jobs:
                            r.feed_ids = store.add_feed(
                                session=session,
                                job_ids=r.jobs,
                                body=p.item.feed_body,
                                received_ns=received_ns,
                            )
                nixl = any(p.item.batch.nixl for p, r in zip(group, results, strict=True) if not r.duplicate)
                nixl_rows = (
                    [
                        (a.host, a.agent, a.source, store.nixl_totals(a), a.sample)
                        for a in store.nixl_agents(session=session)
                    ]
                    if nixl
                    else []
                )
        except OperationalError as exc:
            reason = self._schema_reason(exc)
            for p in group:
                p.error = self._unavailable(reason)
            return
        except Exception as exc:
            # The PostgreSQL writers also run raw psycopg statements, whose errors SQLAlchemy
            # does not wrap: a missing table there is told by its SQLSTATE.
            db_error = isinstance(exc, DBAPIError) or _missing_object(exc)
            reason = self._schema_reason(exc) if db_error else None
            if reason is not None:  # e.g. "relation does not exist": the schema went away
                for p in group:
                    p.error = self._unavailable(reason)
                return
            if len(group) == 1:
                raise
            # One bad batch must not fail the others of its group: apply each on its own.
            for p in group:
                try:
                    self._write([p])
                except Exception as exc:
                    p.error = exc
            return
        self._cache.learn(learned)  # committed: its ids exist
        self._metrics.group_batches.observe(len(group))
        for host, agent, source, totals, sample in nixl_rows:
            self._shared.set_nixl(host, agent, source, totals, sample)
        for p, r in zip(group, results, strict=True):
            p.result = r
            if r.duplicate:
                continue
            req = p.item
            with self._shared.lock:
                if req.collector.id is not None:
                    self._shared.collector_push_ns[req.collector.name] = now_ns
            # How old the batch is: a collector emptying its queue after an outage sends old ones,
            # and one waiting on a server that falls behind sends them late. Its queue time plus
            # ours is free of clock skew; without that header, the sender's clock is trusted.
            if req.age_s is None:
                lag, skew_free = (now_ns - req.batch.sent_at_ns) / 1e9, False
            else:
                lag, skew_free = req.age_s + time.perf_counter() - req.started, True
            self._live.submit(r, source=req.batch.collector_host, lag_s=lag, skew_free=skew_free)
        self._live.wake()

    def cached(self, authorization: str | None) -> Sender | None:
        """The collector of a token verified less than `auth_cache_s` ago, else None (no I/O:
        the route calls this on the event loop and `authenticate` in a thread only on a miss)."""
        token_hash = _bearer_hash(authorization)
        return None if token_hash is None else self._cached(token_hash)

    def _cached(self, token_hash: str) -> Sender | None:
        hit = self._tokens.get(token_hash)
        if hit is None:
            return None
        if self._clock() - hit[1] < self._settings.auth_cache_s * 1e9 or token_hash in self._refreshing:
            # While one request asks the database again, the others use the answer it replaces:
            # when the cache expired under load, every request arriving in that moment queried
            # (and overflowed the connection pool: new connections cost more than the query).
            return hit[0]
        return None

    def authenticate(self, authorization: str | None) -> Sender:
        """The collector a `Authorization: Bearer <token>` header belongs to; AuthError if none."""
        if not authorization:
            if self._settings.allow_unauthenticated_ingest:
                return Sender(None, "anonymous")
            self._reject("auth")
            raise AuthError("missing bearer token")
        token_hash = _bearer_hash(authorization)
        if token_hash is None:
            self._reject("auth")
            raise AuthError("expected 'Authorization: Bearer <token>'")
        with self._auth_lock:
            hit = self._cached(token_hash)
            if hit is not None:
                return hit
            self._refreshing.add(token_hash)
        now_ns = self._clock()
        try:
            with self._db.read() as session:
                row = store.active_token(session=session, token_hash=token_hash)
            found = (
                None if row is None else Sender(row.id, row.name, TokenScope.of(row.host, row.job_patterns))
            )
            if found is None:
                self._tokens.pop(token_hash, None)
            else:
                self._tokens[token_hash] = (found, now_ns)
        except DBAPIError as exc:
            reason = self._schema_reason(exc)
            if reason is None and not isinstance(exc, OperationalError):
                raise
            self._metrics.db_errors.inc()
            self._metrics.batches.labels("error").inc()
            raise UnavailableError(
                reason or "database unavailable", retry_after_s=self._settings.retry_after_s
            ) from None
        finally:
            self._refreshing.discard(token_hash)
        if found is None:
            self._reject("auth")
            raise AuthError("unknown or revoked token")
        return found

    def _unavailable(self, reason: str | None = None) -> UnavailableError:
        """Count a batch the database could not take and build its 503."""
        self._metrics.db_errors.inc()
        self._metrics.batches.labels("error").inc()
        return UnavailableError(
            reason or "database busy or unavailable", retry_after_s=self._settings.retry_after_s
        )

    def _schema_reason(self, exc: BaseException | None = None) -> str | None:
        """Why the schema cannot be used (after the failed statement `exc`), or None: it is fine,
        or the database is unreachable, which is not the schema's fault. On PostgreSQL a missing
        table is never an OperationalError (that is a lost or refused connection: asking again
        could wait out a connect timeout); on SQLite it is ("no such table")."""
        if self._schema is None:
            return None
        if isinstance(exc, OperationalError) and self._db.dialect != "sqlite":
            return None
        try:
            reason = self._schema.check(failed=True)
            if reason is None and _missing_object(exc):
                # The statement met a missing table while the check, a moment apart, did not see
                # the schema go (it was being dropped and recreated): ask once more, now.
                reason = self._schema.check(force=True)
        except DBAPIError:
            reason = None
        if reason is None and _missing_object(exc):
            return "a table of the Flightdeck schema is missing (the database changed under the server)"
        return reason

    def forget(self) -> None:
        """Drop the cached row ids and verified tokens (the database they came from is gone)."""
        self._cache = store.IngestCache()
        self._tokens.clear()

    def _refused(
        self, batch: Batch, refused: list[Refusal], applied: store.IngestResult | None
    ) -> InvalidBatchError:
        """Count and log the refused snapshots of a batch (once: not for a duplicate), its 422."""
        self._metrics.refused_snapshots.inc(len(refused))
        if applied is None:
            self._reject("schema")
        log.warning(
            "batch %s from %s: %d snapshots or NIXL samples refused (%s): %s",
            batch.batch_id,
            batch.collector_host,
            len(refused),
            "the rest applied" if applied is not None else "nothing applied",
            "; ".join(r.reason for r in refused[:3]) + (" ..." if len(refused) > 3 else ""),
        )
        return _refused_error(batch, refused, applied)

    def _reject(self, reason: str) -> None:
        self._metrics.rejects.labels(reason).inc()
        self._metrics.batches.labels("rejected").inc()

    async def acquire(self) -> None:
        """Take an in-flight slot, waiting in the queue; BusyError (429) when it is full or the
        wait times out."""
        try:
            await self.admission.acquire()
        except Refused as exc:
            self._metrics.batches.labels("throttled").inc()
            raise BusyError(
                f"too many ingest requests in flight ({exc})", retry_after_s=self._settings.retry_after_s
            ) from None

    def release(self) -> None:
        """Give the slot back."""
        self.admission.release()

    def check_length(self, content_length: str | None) -> None:
        """413 early when the declared body size is already over the limit."""
        if content_length is None:
            return
        try:
            n = int(content_length)
        except ValueError:
            raise InvalidBatchError("Content-Length: not an integer") from None
        if n > self._settings.max_request_bytes:
            self._reject("too_large")
            raise PayloadTooLargeError(f"body of {n} bytes exceeds {self._settings.max_request_bytes}")

    def too_large(self) -> PayloadTooLargeError:
        """The error for a body that turned out too large while reading it."""
        self._reject("too_large")
        return PayloadTooLargeError(f"body exceeds {self._settings.max_request_bytes} bytes")

    def ingest(
        self,
        *,
        body: bytes,
        encoding: str | None,
        collector: Sender,
        started: float,
        batch_age_ms: str | None = None,
    ) -> dict[str, Any]:
        """Decode and apply one batch; returns the JSON answer. Raises ServerError subclasses.

        `batch_age_ms`: the collector's `BATCH_AGE_HEADER`, how long the batch waited in its queue.
        """
        if self._schema is not None and self._schema.problem is not None:
            reason = self._schema_reason()  # at most one query a second while it lasts
            if reason is not None:
                raise self._unavailable(reason)
        limit = self._settings.max_request_bytes
        self._decode_gate.wait()  # the diagnosis worker goes first (decode_gate.py)
        enc = (encoding or "identity").strip().lower()
        sent = body
        try:
            if enc == "gzip":
                body = gunzip_limited(body, limit)
            elif enc != "identity":
                raise UnsupportedEncodingError(f"Content-Encoding {encoding!r} is not supported (use gzip)")
            with GC_PAUSE:
                doc = _loads(body)
                try:
                    # The bad snapshots (and NIXL samples) are left out, each with its reason.
                    batch, refused = decode_checked(doc)
                except WireError as exc:
                    raise InvalidBatchError(str(exc)) from None
                # Freed here, while paused: the parsed document is the bulk of the batch's objects.
                del doc
        except PayloadTooLargeError:
            self._reject("too_large")
            raise
        except (InvalidBatchError, UnsupportedEncodingError):
            self._reject("schema")
            raise
        refusal = collector.scope.batch_refusal(batch, collector=collector.name)
        if refusal is not None:
            self._reject("scope")
            raise ForbiddenError(refusal)
        before = len(refused)
        collector.scope.take_out(batch, refused, collector=collector.name)
        if len(refused) > before:
            self._reject("scope")
        out_of_scope = collector.scope.take_out_gone(batch)
        if refused and not batch.snapshots and not batch.nixl and not batch.gone:
            raise self._refused(batch, refused, None)
        request = _Request(
            batch=batch,
            collector=collector,
            feed_body=(sent if enc == "gzip" else gzip.compress(sent, compresslevel=1))
            if self._settings.cluster
            else b"",
            started=started,
            age_s=_batch_age_s(batch_age_ms),
        )
        try:
            done = self._group.run(
                request, weight=max(1, batch.entry_count), timeout_s=self._settings.db_busy_timeout_s
            )
        except TimeoutError:
            raise self._unavailable() from None
        if done.error is not None:
            raise done.error
        result: store.IngestResult = done.result
        self._metrics.latency.observe(time.perf_counter() - started)
        if result.duplicate:
            self._metrics.batches.labels("duplicate").inc()
            return {"duplicate": True, "batch_id": batch.batch_id}
        self._metrics.batches.labels("accepted").inc()
        self._metrics.entries.inc(result.entries)
        ignored = out_of_scope + result.gone_ignored
        if ignored:
            # Another host's rank, another job, or a pid the rank does not have: not ended by this.
            log.warning(
                "batch %s from %s: %d gone reports ignored (out of the token's scope or no such "
                "rank and pid): %s",
                batch.batch_id,
                batch.collector_host,
                len(ignored),
                ", ".join(f"{g.job}#{g.attempt} rank {g.rank} pid {g.pid}" for g in ignored[:3]),
            )
        if refused:
            # Applied, but not whole: a 422 that says what was kept and what was refused.
            raise self._refused(batch, refused, result)
        return {
            "duplicate": False,
            "batch_id": batch.batch_id,
            "snapshots": len(result.snapshots),
            "entries": result.entries,
            **({"gone": len(result.gone), "gone_ignored": len(ignored)} if batch.gone or ignored else {}),
        }


#: PostgreSQL's SQLSTATEs for a table, schema or column that does not exist.
_MISSING_OBJECT_STATES = frozenset({"42P01", "3F000", "42703"})


def _missing_object(exc: BaseException | None) -> bool:
    """Whether a failed statement met a missing table, schema or column (PostgreSQL; `exc` is
    SQLAlchemy's wrapper or psycopg's own error)."""
    orig = exc.orig if isinstance(exc, DBAPIError) else exc
    return getattr(orig, "sqlstate", None) in _MISSING_OBJECT_STATES


#: Refusals listed in one answer (the count is always whole).
MAX_LISTED_REFUSALS = 100


def _refused_error(
    batch: Batch, refused: list[Refusal], applied: store.IngestResult | None
) -> InvalidBatchError:
    """The 422 of a batch with refused snapshots: `applied` says whether the rest was applied
    (a collector that reads it acknowledges the batch; re-sending it changes nothing)."""
    kept = "the rest was applied" if applied is not None else "nothing was applied"
    total = len(refused) + len(batch.snapshots) + len(batch.nixl)
    # The first reason leads: it names the field, as every other 422 of ingest does.
    return InvalidBatchError(
        f"{refused[0].reason} ({len(refused)} of {total} snapshots and NIXL samples refused, {kept})",
        extra={
            "batch_id": batch.batch_id,
            "applied": applied is not None,
            "snapshots": 0 if applied is None else len(applied.snapshots),
            "entries": 0 if applied is None else applied.entries,
            "refused_count": len(refused),
            "refused": [r.to_json() for r in refused[:MAX_LISTED_REFUSALS]],
        },
    )
