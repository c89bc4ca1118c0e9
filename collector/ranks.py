"""The ranks a collector has seen in its spools: gone processes, ended spool directories, heartbeats,
and forgetting the state of ranks long finished.

A part of `Collector` (`flightdeck.collector.daemon`, whose docstring says when a rank is reported
gone and when a spool directory is removed).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gzip
import logging
import os
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import orjson

from flightdeck import __version__
from flightdeck.collector.digests import ProgressTracker
from flightdeck.collector.metrics import CollectorMetrics
from flightdeck.collector.processes import ProcessLookup
from flightdeck.collector.queue import DurableQueue, NewBatch, RankKey, RankRecord
from flightdeck.collector.reading import Sig, _sig
from flightdeck.collector.settings import CollectorSettings
from flightdeck.collector.watcher import Watcher, WatchRoot
from flightdeck.readers.delta import RankState
from flightdeck.spool import is_dump_name, rank_from_name
from flightdeck.wire import MAX_GONE, Batch, GoneRank, Snapshot, encode_batch

if TYPE_CHECKING:
    from flightdeck.collector.daemon import FlushResult

#: The daemon's parts log under the one name they had as one module (log lines name it).
log = logging.getLogger("flightdeck.collector.daemon")

#: How often the shipped state of long-finished ranks is pruned.
PRUNE_INTERVAL_NS = 3600_000_000_000


class RankTracking:
    """The `Collector`'s part that follows each spool rank to its end (final, or its process gone).

    Its state is the `Collector`'s, set in `Collector.__init__` (what each field holds is said
    there); the annotations below name the fields this part uses.
    """

    settings: CollectorSettings
    clock: Callable[[], int]
    monotonic: Callable[[], float]
    host: str
    metrics: CollectorMetrics
    processes: ProcessLookup
    queue: DurableQueue
    watcher: Watcher
    shipped: dict[RankKey, RankState]
    _spool_roots: list[WatchRoot]
    _done: dict[Path, Sig]
    _ranks: dict[RankKey, RankRecord]
    _gone_since: dict[RankKey, int]
    _groups_shipped: dict[RankKey, tuple[int, float]]
    _progress: ProgressTracker
    _cleanup_failed: set[str]
    _last_enqueue: float
    _last_prune: int

    if TYPE_CHECKING:

        def _forget(self, path: Path) -> None: ...  # `FileReading`'s

    def _prune(self) -> None:
        """Forget the shipped state of ranks that sent nothing for state_retention_s."""
        now = self.clock()
        if now - self._last_prune < PRUNE_INTERVAL_NS:
            return
        self._last_prune = now
        forgotten = self.queue.forget_shipped(now - int(self.settings.state_retention_s * 1e9))
        for key in forgotten:
            self.shipped.pop(key, None)
            self._groups_shipped.pop(key, None)
            self._ranks.pop(key, None)
        # A rank on digests forgotten here is read in full when it comes back (collector.digests).
        self._progress.forget(forgotten)
        if forgotten:
            self.queue.forget_ranks(forgotten)
        missing = [p for p in self._done if not p.exists()]
        for path in missing:
            self._forget(path)
        if missing:
            self.queue.forget_files(str(p) for p in missing)

    # --- ranks: gone processes, ended spool directories, heartbeats -----------------------------

    def _rank_record(self, key: RankKey, path: Path, snap: Snapshot, prev: RankRecord | None) -> RankRecord:
        """The rank's record once this snapshot is shipped."""
        prev = prev or self._ranks.get(key)
        t = snap.snapshot_time_ns
        # Only a pid of this host means anything to this host's process table.
        pid = snap.pid if snap.pid is not None and snap.host == self.host else None
        directory = str(path.parent)
        if prev is None or (t > prev.last_ns and pid != prev.pid):
            # New, or a new process for the same rank (a job re-run under the same name).
            return RankRecord(directory, pid, t, t, snap.kind == "final")
        if t >= prev.last_ns:
            return dataclasses.replace(prev, directory=directory, last_ns=t, final=snap.kind == "final")
        return dataclasses.replace(prev, first_ns=min(prev.first_ns, t))

    def _gone_candidates(self) -> list[RankKey]:
        """Ranks of this host whose latest snapshot is not final and whose process is gone."""
        out = []
        for key, rec in self._ranks.items():
            if rec.pid is None or rec.ended:
                continue
            try:
                running = self.processes.running(rec.pid, started_by_ns=rec.first_ns)
            except Exception:
                log.exception("process lookup of pid %d failed", rec.pid)
                continue
            if running:
                self._gone_since.pop(key, None)
            else:
                self._gone_since.setdefault(key, self.clock())
                out.append(key)
        return out

    def _unshipped_files(self, key: RankKey, rec: RankRecord) -> bool:
        """Whether the rank has a file on disk not yet shipped (marked for the next flush)."""
        directory = Path(rec.directory)
        try:
            names = os.listdir(directory)
        except OSError:
            return False  # its directory is gone: nothing left to ship
        root = self._spool_root(directory)
        found = False
        for name in names:
            if not is_dump_name(name) or rank_from_name(name) != key[2]:
                continue
            path = directory / name
            try:
                sig = _sig(os.lstat(path))
            except OSError:
                continue
            if self._done.get(path) != sig:
                found = True
                if root is not None:
                    self.watcher.mark(path, root)
        return found

    def _report_gone(self, candidates: list[RankKey], result: FlushResult) -> None:
        """Queue one report of the ranks whose process is gone (with their records: once)."""
        now = self.clock()
        gone: list[GoneRank] = []
        records: dict[RankKey, RankRecord] = {}
        for key in candidates:
            rec = self._ranks.get(key)
            if rec is None or rec.ended or rec.pid is None:
                self._gone_since.pop(key, None)
                continue  # its final snapshot came in this flush
            if self._unshipped_files(key, rec):
                continue  # its snapshots go first; looked at again at the next flush
            since = self._gone_since.get(key, now)
            gone.append(GoneRank(key[0], key[1], key[2], rec.pid, since))
            records[key] = dataclasses.replace(rec, gone_ns=since)
        if not gone:
            return
        batches = [
            self._control_batch(gone=gone[i : i + MAX_GONE], kind="gone")
            for i in range(0, len(gone), MAX_GONE)
        ]
        if not self.queue.enqueue(batches, ranks=records):
            return  # the queue is full: they are found gone again at a later flush
        self._last_enqueue = self.monotonic()
        self._ranks.update(records)
        for key in records:
            self._gone_since.pop(key, None)
        result.gone += len(gone)
        result.batches += len(batches)
        self.metrics.batches_enqueued.inc(len(batches))
        self.metrics.gone_ranks.inc(len(gone))
        for g in gone:
            log.info("rank %d of %s (attempt %d): process %d is gone", g.rank, g.job, g.attempt, g.pid)

    def _heartbeat(self, result: FlushResult) -> None:
        """An empty batch when nothing was queued for heartbeat_s and nothing waits to be sent."""
        every = self.settings.heartbeat_s
        if every <= 0 or self.monotonic() - self._last_enqueue < every:
            return
        if self.queue.stats().depth:
            return  # the pusher has something to send (or keeps trying): that says enough
        if self.queue.enqueue([self._control_batch(kind="heartbeat")]):
            self._last_enqueue = self.monotonic()
            result.heartbeat = True
            result.batches += 1
            self.metrics.batches_enqueued.inc()
            self.metrics.heartbeats.inc()

    def _control_batch(self, *, kind: str, gone: list[GoneRank] | None = None) -> NewBatch:
        """A batch without snapshots or samples: gone ranks, or nothing (a heartbeat)."""
        batch_id = str(uuid.uuid4())
        doc = encode_batch(
            Batch(batch_id, self.host, __version__, self.clock(), snapshots=[], gone=gone or [])
        )
        return NewBatch(batch_id, kind, 0, gzip.compress(orjson.dumps(doc), compresslevel=3))

    def _spool_root(self, directory: Path) -> WatchRoot | None:
        for root in self._spool_roots:
            if directory == root.directory or root.directory in directory.parents:
                return root
        return None

    def _clean_spool(self, result: FlushResult) -> None:
        """Remove `<spool>/<job>/<attempt>/` directories whose ranks all ended (final or gone) and
        whose files are all older than spool_retention_s, with their delivery records."""
        keep_s = self.settings.spool_retention_s
        if keep_s <= 0:
            return
        cutoff = self.clock() - int(keep_s * 1e9)
        by_dir: dict[str, list[RankKey]] = {}
        ended: dict[str, bool] = {}
        for key, rec in self._ranks.items():
            by_dir.setdefault(rec.directory, []).append(key)
            ended[rec.directory] = ended.get(rec.directory, True) and rec.ended
        for directory, keys in by_dir.items():
            if not ended[directory] or directory in self._cleanup_failed:
                continue
            path = Path(directory)
            root = self._spool_root(path)
            if root is None or len(path.relative_to(root.directory).parts) != 2:
                continue  # only a job's attempt directory in a spool root
            if path.exists() and not self._removable(path, {k[2] for k in keys}, cutoff):
                continue
            try:
                shutil.rmtree(path)
            except FileNotFoundError:
                pass
            except OSError as exc:
                self._cleanup_failed.add(directory)
                log.warning("cannot remove the spool directory %s of an ended job: %s", directory, exc)
                continue
            with contextlib.suppress(OSError):
                path.parent.rmdir()  # the job's directory, once its last attempt is gone
            self.queue.forget_directory(directory)
            for key in keys:
                self._ranks.pop(key, None)
            for p in [p for p in self._done if p.parent == path]:
                self._forget(p)
            result.removed_dirs += 1
            self.metrics.spool_dirs_removed.inc()
            log.info("removed the spool directory %s: its ranks ended", directory)

    def _removable(self, path: Path, ranks: set[int], cutoff_ns: int) -> bool:
        """Every file older than the cutoff, and every dump one of the ended ranks'."""
        try:
            with os.scandir(path) as it:
                for entry in it:
                    st = entry.stat(follow_symlinks=False)
                    if st.st_mtime_ns > cutoff_ns or entry.is_dir(follow_symlinks=False):
                        return False
                    if is_dump_name(entry.name) and rank_from_name(entry.name) not in ranks:
                        return False  # a rank this collector knows nothing of (yet)
        except OSError:
            return False
        return True
