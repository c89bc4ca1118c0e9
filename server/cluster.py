"""Several server processes on one PostgreSQL: who diagnoses which job, and what it must read.

Any process ingests any batch (a load balancer spreads the collectors), but each job is diagnosed
by exactly one process at a time: the one holding the job's PostgreSQL advisory lock
(`store.try_own_job`, on a connection this module keeps open). Findings are therefore opened
and resolved once, whichever process received the batches.

The owner needs every batch of its jobs, including those the other processes ingested. Each
ingest transaction also writes its batch to the short-lived `ingest_feed` table (`store.add_feed`),
stamped with the transaction's id; the owner reads, per job, the feed rows that its previous read's
snapshot did not see (`store.feed_after`), in id order, and folds their snapshots in. Its own
batches it takes from memory (`remember`), in the same order. A process that takes a job over
rebuilds the job's summaries from the database and starts the job's feed reads after the
rebuild's snapshot, so each batch is folded in exactly once: a row is new when its transaction
committed after the last read, however long that transaction ran, and only new rows are read
(a read looking back over a time window re-read every row of the window, each step).

What each process exports to Prometheus follows the same split: a job's series come from its
owner only, and the cluster-wide series (jobs by status, collectors, NIXL agents) from the
leader, the one process holding the leader lock (`store.try_lead`, on the same connection): so
`sum()` over the replicas' series equals what one process alone would export. A leader that dies
releases the lock with its connection; another process takes it at its next housekeeping.

Per rank, feed order is delivery order: a collector sends a rank's next batch only after the
server acknowledged (committed) the previous one, so its feed id is larger.
"""

from __future__ import annotations

import gzip
import logging
from collections.abc import Callable, Iterable

import orjson
from sqlalchemy import Connection
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from flightdeck.server import store
from flightdeck.server.db import Database
from flightdeck.server.validation import decode_checked
from flightdeck.wire import Snapshot

log = logging.getLogger(__name__)

NS = 1_000_000_000
#: Feed rows older than this are deleted (by any process): far longer than a commit takes, so
#: the owner has read a row before it goes.
FEED_KEEP_S = 120.0
#: This process's own batches are kept in memory this long for the owner's read (it finds them
#: in the feed within a commit).
LOCAL_KEEP_S = 30.0
#: How often the feed is pruned and the job list re-read (to take over jobs of a process that died).
HOUSEKEEPING_S = 5.0


class Cluster:
    """One process's share of the cluster: the jobs it owns and the feed rows it has folded in."""

    def __init__(self, *, db: Database, clock: Callable[[], int], on_db_error: Callable[[], None]) -> None:
        self._db = db
        self._clock = clock
        self._on_db_error = on_db_error
        self._conn: Connection | None = None
        self.owned: set[int] = set()
        #: Whether this process holds the leader lock (exports the cluster-wide series).
        self.leader = False
        #: Per owned job, the snapshot of its last feed read (or of its rebuild): the next read
        #: takes what that one did not see (`store.feed_after`).
        self._after: dict[int, str] = {}
        #: feed id -> (stamp, job id, snapshots) of this process's own batches of owned jobs.
        self._local: dict[int, tuple[int, int, list[Snapshot]]] = {}
        self._last_housekeeping = 0

    # --- ownership ------------------------------------------------------------------------------

    def _session(self) -> Session:
        if self._conn is None:
            # Autocommit: lock calls must not leave a transaction open on the lock connection.
            self._conn = self._db.engine.connect().execution_options(isolation_level="AUTOCOMMIT")
        return Session(bind=self._conn)

    def claim(self, job_ids: Iterable[int]) -> list[int]:
        """Try to own each of these jobs; returns the ones newly owned (to be rebuilt)."""
        got = []
        try:
            with self._session() as session:
                for job_id in job_ids:
                    if job_id not in self.owned and store.try_own_job(session=session, job_id=job_id):
                        self.owned.add(job_id)
                        got.append(job_id)
        except OperationalError:
            self._lost()
        return got

    def lead(self) -> bool:
        """Try to become the leader (if not already); returns whether this process leads."""
        if self.leader:
            return True
        try:
            with self._session() as session:
                self.leader = store.try_lead(session=session)
        except OperationalError:
            self._lost()
        return self.leader

    def release(self, job_id: int) -> None:
        """Give a job's diagnosis up (the job went idle)."""
        if job_id not in self.owned:
            return
        self.owned.discard(job_id)
        self._after.pop(job_id, None)
        try:
            with self._session() as session:
                store.disown_job(session=session, job_id=job_id)
        except OperationalError:
            self._lost()

    def check(self) -> bool:
        """False when the lock connection broke: every lock is gone (the caller drops its jobs)."""
        if self._conn is None:
            return not self.owned
        try:
            with self._session() as session:
                store.ping(session=session)
            return True
        except OperationalError:
            self._lost()
            return False

    def _lost(self) -> None:
        self._on_db_error()
        log.warning("cluster: lost the lock connection; %d jobs released", len(self.owned))
        self.owned.clear()
        self._after.clear()
        self.leader = False
        if self._conn is not None:
            try:
                self._conn.invalidate()
                self._conn.close()
            except Exception:  # already broken: nothing more to release
                log.debug("cluster: closing the broken lock connection failed", exc_info=True)
            self._conn = None

    def close(self) -> None:
        """Close the lock connection (releases every job and the leader lock)."""
        self.owned.clear()
        self._after.clear()
        self.leader = False
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    # --- the feed -------------------------------------------------------------------------------

    def remember(self, feed_ids: dict[int, int], snapshots: list[store.AppliedSnapshot]) -> None:
        """Keep this process's own committed batch for the owned jobs (no need to read it back)."""
        stamp = self._clock()
        for job_id, feed_id in feed_ids.items():
            if job_id in self.owned:
                snaps = [a.snapshot for a in snapshots if a.job_id == job_id]
                self._local[feed_id] = (stamp, job_id, snaps)

    def mark_seen(self, session: Session, job_id: int) -> None:
        """Start the job's feed reads after what `session` sees (a REPEATABLE READ transaction:
        the rebuild's read, which includes those rows)."""
        self._after[job_id] = store.feed_snapshot(session=session)

    def read(self, jobs: dict[int, tuple[str, int]]) -> dict[int, list[Snapshot]]:
        """Snapshots of the feed rows of these jobs (id -> (name, attempt)) not folded in yet, per
        job, in feed order."""
        out: dict[int, list[Snapshot]] = {}
        if not jobs:
            return out
        # Jobs rebuilt at different times start after different snapshots; after one read they
        # share the read's, so this is one query per step.
        by_after: dict[str | None, list[int]] = {}
        for job_id in sorted(jobs):
            by_after.setdefault(self._after.get(job_id), []).append(job_id)
        try:
            with self._db.read() as session:
                session.connection(execution_options={"isolation_level": "REPEATABLE READ"})
                now_snapshot = store.feed_snapshot(session=session)
                new: list[tuple[int, int]] = []
                for after, job_ids in by_after.items():
                    new.extend(store.feed_after(session=session, job_ids=job_ids, after=after))
                new.sort()
                fetch = [i for i, _ in new if i not in self._local]
                bodies = store.feed_bodies(session=session, ids=fetch) if fetch else {}
        except OperationalError:
            self._on_db_error()
            return out
        for job_id in jobs:
            self._after[job_id] = now_snapshot
        for feed_id, job_id in new:
            local = self._local.pop(feed_id, None)
            if local is not None:
                out.setdefault(job_id, []).extend(local[2])
                continue
            key = jobs[job_id]
            snaps = _decode(bodies.get(feed_id, b""), job_id, feed_id)
            out.setdefault(job_id, []).extend(s for s in snaps if (s.job, s.attempt) == key)
        return out

    def housekeeping(self) -> bool:
        """Prune the feed and the memory of it, and try to lead, every HOUSEKEEPING_S; True when
        it ran."""
        now = self._clock()
        if now - self._last_housekeeping < HOUSEKEEPING_S * NS:
            return False
        self._last_housekeeping = now
        self.lead()
        horizon = now - int(LOCAL_KEEP_S * NS)
        self._local = {i: v for i, v in self._local.items() if v[0] >= horizon}
        try:
            with self._db.write() as session, session.begin():
                store.prune_feed(session=session, before_ns=now - int(FEED_KEEP_S * NS))
        except OperationalError:
            self._on_db_error()
        return True


def _decode(body: bytes, job_id: int, feed_id: int) -> list[Snapshot]:
    """Every snapshot of a feed body (a batch may hold other jobs' too: the caller filters)."""
    try:
        # Checked as ingest checked it: the snapshots it refused were not applied (the body is
        # the batch as sent).
        batch, _refused = decode_checked(orjson.loads(gzip.decompress(body)))
    except (OSError, ValueError) as exc:  # it was valid when ingested: log, skip
        log.error("cluster: feed row %d of job %d unreadable: %s", feed_id, job_id, exc)
        return []
    return batch.snapshots
