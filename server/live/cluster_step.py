"""Several servers on one PostgreSQL: the worker's step for the jobs this process owns.

Each step, the process owning a job (`flightdeck.server.cluster`) folds the feed of that job's
snapshots, whichever server ingested them; the others track the job's status only. A mixin of
`LiveDiagnosis`: these steps work on the worker's jobs, under its lock.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from sqlalchemy.exc import OperationalError

from flightdeck.server import store
from flightdeck.server.cluster import Cluster
from flightdeck.server.db import Database
from flightdeck.server.live.state import JobState
from flightdeck.server.settings import ServerSettings

NS = 1_000_000_000


class ClusterSteps:
    """The cluster side of `LiveDiagnosis` (which sets these attributes)."""

    jobs: dict[int, JobState]
    cluster: Cluster | None
    _claim_tried: dict[int, float]
    _db: Database
    _lock: threading.Lock
    _mono: Callable[[], float]
    _on_db_error: Callable[[], None]
    _settings: ServerSettings

    def _cluster_step(self, jobs: list[JobState], now: float, now_ns: int) -> list[JobState]:
        """Own what can be owned, release idle jobs, queue the feed's new snapshots of the owned
        jobs; returns the owned jobs (the others are diagnosed by another process)."""
        c = self.cluster
        assert c is not None
        idle_s = self._settings.job_idle_s
        housekept = c.housekeeping()
        if housekept:
            if not c.check():
                for js in jobs:
                    js.summaries = None
            jobs = self._discover(jobs, now_ns)
        want = []
        for js in jobs:
            active = (now_ns - js.heard_ns) / NS <= idle_s
            if js.job_id in c.owned:
                if not active:
                    c.release(js.job_id)
                    js.summaries = None
            elif active and now - self._claim_tried.get(js.job_id, -1e9) >= 1.0:
                self._claim_tried[js.job_id] = now
                want.append(js.job_id)
        for job_id in c.claim(want):
            js = self.jobs[job_id]
            with self._lock:
                js.pending.clear()
                js.summaries = None  # rebuilt from the database, then the feed from there on
                js.dirty = True
                js.dirty_since = now
        owned = [js for js in jobs if js.job_id in c.owned]
        for js in jobs:
            if js.job_id not in c.owned:
                js.summaries = None
        if housekept and owned:
            self._learn_gone([js for js in owned if js.ended_at_ns is None])
        feed = c.read({js.job_id: (js.name, js.attempt) for js in owned if js.summaries is not None})
        for job_id, snaps in feed.items():
            js = self.jobs[job_id]
            with self._lock:
                js.pending.extend(snaps)
                js.world_size = next((x.world_size for x in reversed(snaps) if x.world_size), js.world_size)
                newest = max((min(x.snapshot_time_ns, now_ns) for x in snaps), default=0)
                js.last_seen_ns = max(js.last_seen_ns, newest)
                js.heard_ns = now_ns
                js.last_ingest = now
                if not js.dirty:
                    js.dirty = True
                    js.dirty_since = now
        return owned

    def _learn_gone(self, jobs: list[JobState]) -> None:
        """The gone reports other processes ingested for these owned jobs (the feed carries the
        snapshots only): read from the store every `cluster.HOUSEKEEPING_S`."""
        try:
            with self._db.read() as session:
                gone = store.gone_ranks(session=session, job_ids=[js.job_id for js in jobs])
        except OperationalError:
            self._on_db_error()
            return
        now = self._mono()
        with self._lock:
            for js in jobs:
                new = gone.get(js.job_id, {})
                if new.keys() - js.gone.keys():
                    js.gone.update(new)
                    if not js.dirty:
                        js.dirty = True
                        js.dirty_since = now

    def _discover(self, jobs: list[JobState], now_ns: int) -> list[JobState]:
        """Learn the active jobs other processes ingested (to take them over should their owner
        die) and the status of the jobs this process does not own."""
        since = now_ns - int(self._settings.job_idle_s * NS)
        try:
            with self._db.read() as session:
                rows = store.active_jobs(session=session, since_ns=since)
        except OperationalError:
            self._on_db_error()
            return jobs
        owned = self.cluster.owned if self.cluster is not None else set()
        with self._lock:
            for r in rows:
                js = self.jobs.get(r.id)
                if js is None:
                    js = self.jobs[r.id] = JobState(
                        job_id=r.id,
                        name=r.name,
                        attempt=r.attempt,
                        world_size=r.world_size,
                        status=r.status,
                        first_seen_ns=r.first_seen_ns,
                    )
                js.last_seen_ns = max(js.last_seen_ns, r.last_seen_ns)
                js.heard_ns = max(js.heard_ns, r.heard_ns)
                if r.id not in owned:
                    js.status = r.status
                    js.ended_at_ns = r.ended_at_ns
            return list(self.jobs.values())
