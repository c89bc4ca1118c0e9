"""What one server process exports to Prometheus besides its own counters: the store's facts
about collectors and NIXL agents, and which of the cluster's series are this process's to export.

A collector's token can be revoked by any process (`flightdeck token revoke` writes the store), and
with several replicas each one hears from only some collectors and agents. So the scrape reads
these from the store, at most every `REFRESH_S` (a scrape every 2 s must not cost a query each):
a revoked collector's series is gone within that time, and the leader exports every collector and
agent once, whichever replica received their batches.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy.exc import OperationalError

from flightdeck.server import store
from flightdeck.server.cluster import Cluster
from flightdeck.server.db import Database

#: Seconds between two reads of the store's tokens and NIXL agents (at scrape time).
REFRESH_S = 3.0


@dataclass(frozen=True, slots=True)
class NixlFacts:
    """One NIXL agent as stored: the source of its counters, totals over its runs, latest sample."""

    source: str
    totals: dict[str, Any]
    sample: dict[str, Any]


class StoreFacts:
    """Unrevoked collector tokens and NIXL agents from the store, re-read every `REFRESH_S`."""

    def __init__(
        self,
        *,
        db: Database,
        on_db_error: Callable[[], None],
        read_nixl: bool,
        monotonic: Callable[[], float] = time.monotonic,
        refresh_s: float = REFRESH_S,
    ) -> None:
        """`read_nixl`: read the NIXL agents too (several replicas: the leader exports them all)."""
        self._db = db
        self._on_db_error = on_db_error
        self._read_nixl = read_nixl
        self._mono = monotonic
        self._refresh_s = refresh_s
        self._lock = threading.Lock()
        self._read_at = float("-inf")
        self._tokens: dict[str, int | None] = {}
        self._revoked: frozenset[str] = frozenset()
        self._nixl: dict[tuple[str, str], NixlFacts] = {}

    def refresh(self, *, force: bool = False) -> None:
        """Re-read the store when the last read is older than `refresh_s` (or `force`); a
        database error keeps the previous facts (and is counted)."""
        with self._lock:
            now = self._mono()
            if not force and now - self._read_at < self._refresh_s:
                return
            self._read_at = now
            try:
                with self._db.read() as session:
                    rows = store.list_tokens(session=session)
                    tokens = {t.name: t.last_push_ns for t in rows if t.revoked_at_ns is None}
                    revoked = frozenset(t.name for t in rows if t.revoked_at_ns is not None)
                    nixl = (
                        {
                            (a.host, a.agent): NixlFacts(a.source, store.nixl_totals(a), dict(a.sample))
                            for a in store.nixl_agents(session=session)
                        }
                        if self._read_nixl
                        else {}
                    )
            except OperationalError:
                self._on_db_error()
                return
            self._tokens, self._revoked, self._nixl = tokens, revoked, nixl

    def collectors(self) -> tuple[dict[str, int | None], frozenset[str]]:
        """(unrevoked token name -> epoch ns of its last push as stored, None: never pushed;
        the names of the revoked tokens)."""
        self.refresh()
        with self._lock:
            return dict(self._tokens), self._revoked

    def nixl(self) -> dict[tuple[str, str], NixlFacts]:
        """(host, agent) -> the agent as stored (empty unless `read_nixl`)."""
        self.refresh()
        with self._lock:
            return dict(self._nixl)


class ExportPolicy:
    """Which series this process exports: everything when it runs alone; with several replicas
    (cluster.py) a job's series only from its owner and the cluster-wide ones only from the
    leader, so that summing over the replicas counts each once."""

    def __init__(self, cluster: Cluster | None) -> None:
        self._cluster = cluster

    @property
    def clustered(self) -> bool:
        """Several replicas share the store."""
        return self._cluster is not None

    def job(self, job_id: int) -> bool:
        """Whether to export this job's series (a set lookup: safe while the worker updates it)."""
        return self._cluster is None or job_id in self._cluster.owned

    def leads(self) -> bool:
        """Whether to export the cluster-wide series (jobs by status, collectors, NIXL agents)."""
        return self._cluster is None or self._cluster.leader
