"""The per-node collector: spool files and torch dumps in, delta batches out, through a durable queue.

Data flow (one way): watcher (dirty paths) -> `Collector.flush` (read complete files with
`fr.files.read_dump_file`, diff each rank against what was shipped, read NIXL telemetry) -> batches
(`flightdeck.wire`) -> `DurableQueue` -> `Pusher` -> server.

Threads: the caller's (runs `run`: flushes every `push_interval_s`), the watchdog observer, the
pusher, and the metrics HTTP server. Every loop catches and logs unexpected exceptions and goes on;
`close` joins every thread it started.

When a file is read:
- spool files (renamed into place by the agent: always complete) at the next flush;
- torch's own dumps (written in place) once size and mtime were the same at two flushes;
- a file that fails to parse is looked at again at the next flush; only when it has not changed
  since the failure (stable and still bad) is it quarantined. So a file caught half-written is read
  once it is complete, never quarantined for being caught early.

Queue full (`max_queue_bytes`): queued batches are never dropped and no new snapshot batch is made;
the changed files stay dirty. Why keep the oldest: the queued batches hold deltas whose entries may
no longer be in any ring (lost if dropped), while the changes held back are still in the spool
files, and the newest file of a rank supersedes the older ones: when room comes back, one read of
the newest file against the shipped state yields every change since, intermediate states merged.
NIXL samples are cumulative, so a flush's samples are simply dropped (the next carries the totals).

Re-delivery: each file's stat signature (device, inode, size, mtime) is stored with the batch that
shipped it (`DurableQueue.enqueue`, one transaction), so a restart reads no file already shipped
and sends no snapshot again: the server's `last_seen` and elapsed times do not move.

Gone ranks: for every rank whose spool snapshots name this host and a pid, each flush asks the
process lookup (`collector.processes`) whether that pid still runs. A rank whose latest snapshot is
not final and whose process is gone is reported once (`Batch.gone`, stored with the report), and
only once each of its files on disk has been shipped: its snapshots reach the server first.

Spool cleanup: a `<spool>/<job>/<attempt>/` directory whose every rank is final or gone, and whose
files are all older than `spool_retention_s`, is removed at a rescan with its delivery records.

Heartbeat: when nothing was queued for `heartbeat_s` and the queue is empty, an empty batch goes
out, so the server sees an idle collector alive.

Digest mode (`collector.digests`): the ranks of jobs of `digest_from_ranks` ranks or more are read
and diffed as above, but their snapshots are held to the end of the flush; one request then sends
their progress digests, and only the held snapshots of the jobs the server asks for (a detail
round), and stall and final ones, go into batches. What was read of the others is committed as
shipped, with no batch.

The parts: this module holds `Collector` itself (its threads, the flush loop, the commit to the
queue); the class is assembled from one part per concern, each in its module: `reading.FileReading`
(one dirty file: read, looked at again, or quarantined), `ranks.RankTracking` (gone ranks, spool
cleanup, heartbeats, forgetting old state), `nixl_telemetry.NixlTelemetry` (NIXL samples),
`batches.BatchEncoding` (batches within the size limits) and `digests.DigestMode` (the ranks of
large jobs: digests, detail rounds).
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from prometheus_client import CollectorRegistry
from watchdog.observers.api import BaseObserver

from flightdeck.collector.batches import BatchEncoding
from flightdeck.collector.digests import DigestMode, ProgressTracker
from flightdeck.collector.metrics import CollectorMetrics, MetricsServer
from flightdeck.collector.nixl_telemetry import NixlTelemetry, _strip_time
from flightdeck.collector.processes import ProcessLookup, ProcTable
from flightdeck.collector.pusher import Pusher
from flightdeck.collector.queue import DurableQueue, RankKey, RankRecord
from flightdeck.collector.ranks import RankTracking
from flightdeck.collector.reading import QUARANTINE_DIR, FileReading, Sig, _Bad
from flightdeck.collector.settings import CollectorSettings
from flightdeck.collector.watcher import Watcher, WatchRoot
from flightdeck.readers.delta import RankState
from flightdeck.readers.fr.decode import DumpBudget
from flightdeck.readers.fr.errors import InvalidDumpError
from flightdeck.readers.incremental import IncrementalReader
from flightdeck.snapshot_check import SnapshotError, check_snapshot
from flightdeck.wire import Snapshot, snapshot_from_dump

log = logging.getLogger(__name__)

#: A rank's process groups (names, descriptions, members) are shipped when they change and at
#: least this often: a 4,096-rank world group in every snapshot of every rank would be most of
#: the bytes the server parses (see docs/dev/performance-history.md, "Scale").
GROUPS_RESEND_S = 60.0


@dataclass(slots=True)
class _Pending:
    """What a flush has read but not yet committed to the queue."""

    read: dict[Path, tuple[Sig, Any]] = field(default_factory=dict)
    snapshots: list[Snapshot] = field(default_factory=list)
    states: dict[RankKey, RankState] = field(default_factory=dict)
    ranks: dict[RankKey, RankRecord] = field(default_factory=dict)
    entries: int = 0

    def clear(self) -> None:
        """Forget what was committed (or refused); later files of the flush start afresh."""
        self.read.clear()
        self.snapshots.clear()
        self.states.clear()
        self.ranks.clear()
        self.entries = 0


@dataclass(slots=True)
class FlushResult:
    """What one flush did (for tests and --once)."""

    files_read: int = 0
    snapshots: int = 0
    entries: int = 0
    nixl_samples: int = 0
    batches: int = 0
    quarantined: int = 0
    #: Ranks reported gone.
    gone: int = 0
    #: Ranks whose digests the server took (digest mode).
    digest_ranks: int = 0
    #: Snapshots of ranks on digests not shipped (no detail round for their job).
    held_back: int = 0
    #: An empty batch was queued (nothing else was for heartbeat_s).
    heartbeat: bool = False
    #: Spool directories of ended jobs removed.
    removed_dirs: int = 0
    refused: bool = False


class StateDirError(Exception):
    """The state directory cannot hold the collector's state (read-only, not a directory, not ours,
    or a queue database that is not one); the message says which and why, in one line."""

    def __init__(self, state_dir: Path, exc: BaseException) -> None:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        where = f" ({exc.filename})" if isinstance(exc, OSError) and exc.filename else ""
        super().__init__(
            f"state_dir {state_dir} is not usable: {why}{where}; it must be a writable directory "
            "on a local filesystem (set state_dir)"
        )


def open_queue(
    state_dir: Path, settings: CollectorSettings, *, clock: Callable[[], int] = time.time_ns
) -> DurableQueue:
    """The durable queue in `state_dir`; raises StateDirError when it cannot be opened there."""
    try:
        return DurableQueue(
            state_dir,
            max_bytes=settings.max_queue_bytes,
            clock=clock,
            reserve_bytes=settings.disk_reserve_bytes,
        )
    except (OSError, sqlite3.Error) as exc:
        raise StateDirError(state_dir, exc) from None


class Collector(FileReading, RankTracking, NixlTelemetry, BatchEncoding, DigestMode):
    """The daemon; everything that varies is injected (settings hold the paths)."""

    def __init__(
        self,
        settings: CollectorSettings,
        *,
        client: httpx.Client,
        registry: CollectorRegistry,
        clock: Callable[[], int] = time.time_ns,
        monotonic: Callable[[], float] = time.monotonic,
        observer_factory: Callable[[], BaseObserver] | None = None,
        nixl_owner_finder: Any = None,
        processes: ProcessLookup | None = None,
    ) -> None:
        self.settings = settings
        self.processes: ProcessLookup = processes if processes is not None else ProcTable()
        self.clock = clock
        self.monotonic = monotonic
        self.host = settings.host_name
        self.metrics = CollectorMetrics(registry)
        self.state_dir = Path(os.path.abspath(os.path.expanduser(settings.state_dir)))
        self.quarantine_dir = self.state_dir / QUARANTINE_DIR
        self.queue = open_queue(self.state_dir, settings, clock=clock)
        try:
            self.quarantine_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            self.queue.close()
            raise StateDirError(self.state_dir, exc) from None
        self.metrics.watch_queue(self.queue.stats, clock)
        self.stop_event = threading.Event()
        self.pusher = Pusher(
            self.queue,
            client=client,
            url=settings.ingest_url,
            token=settings.resolve_token(),
            metrics=self.metrics,
            deadline_s=settings.push_deadline_s,
            request_timeout_s=settings.request_timeout_s,
            max_attempts=settings.max_attempts,
            backoff_base_s=settings.retry_backoff_s,
            backoff_max_s=settings.retry_backoff_max_s,
            monotonic=monotonic,
            stop=self.stop_event,
            token_source=settings.resolve_token if settings.token_file is not None else None,
            auth_backoff_max_s=settings.auth_retry_max_s,
        )
        roots = [
            WatchRoot(Path(os.path.abspath(os.path.expanduser(d))), "spool") for d in settings.spool_dirs
        ]
        self._spool_roots = list(roots)
        roots += [WatchRoot.torch(p) for p in settings.torch_dump_prefixes]
        self.watcher = Watcher(
            roots,
            polling=settings.polling,
            poll_interval_s=settings.poll_interval_s,
            observer_factory=observer_factory,
        )
        self._nixl_rings: Any = None
        if settings.nixl_telemetry_dir is not None:
            from flightdeck.collector.nixl_consumer import RingDirectory

            self._nixl_rings = RingDirectory(
                Path(os.path.expanduser(settings.nixl_telemetry_dir)),
                host=self.host,
                clock=clock,
                **({"owner_finder": nixl_owner_finder} if nixl_owner_finder is not None else {}),
            )
        #: What was shipped per rank (mirrors the durable `shipped` table).
        self.shipped: dict[RankKey, RankState] = {}
        for key, blob in self.queue.load_shipped().items():
            try:
                self.shipped[key] = RankState.decode(blob)
            except ValueError as exc:
                log.warning(
                    "shipped state of %s is unreadable (%s): its entries will be sent again", key, exc
                )
        #: Stat signature of each file at its last successful read (or quarantine of a copy); those
        #: of shipped files are durable (the `delivered` table), so a restart ships none again.
        self._done: dict[Path, Sig] = {Path(p): sig for p, sig in self.queue.load_delivered().items()}
        #: What is known of each spool rank: its directory, pid, snapshot times, final, gone.
        self._ranks: dict[RankKey, RankRecord] = self.queue.load_ranks()
        self._last_enqueue = float("-inf")  # monotonic time a batch was last queued
        #: When each rank's process was first found gone (its report may wait for its files).
        self._gone_since: dict[RankKey, int] = {}
        self._cleanup_failed: set[str] = set()
        #: Torch dumps: the signature at the previous look, to tell that writing has finished.
        self._settling: dict[Path, Sig] = {}
        self._bad: dict[Path, _Bad] = {}
        #: Remembers each file's last content, so that an unchanged ring rewritten is not decoded.
        self._reader = IncrementalReader()
        self._budget = DumpBudget(
            max_entries=settings.max_dump_entries,
            max_frames=settings.max_dump_frames,
            max_dims=settings.max_dump_frames,
        )
        #: Per rank: (hash of its groups, monotonic time) when they were last put in a batch.
        self._groups_shipped: dict[RankKey, tuple[int, float]] = {}
        #: Ranks on digests: their progress, from the changed entries of each read (in memory).
        self._progress = ProgressTracker()
        self._digest_url = settings.digest_url
        #: The last digest request failed (its outage was logged).
        self._digest_failing = False
        #: (job, attempt) -> the id of the latest round this collector shipped for (a round stays
        #: open over two intervals, so that every collector hears it; each answers it once).
        self._rounds_answered: dict[tuple[str, int], int] = {}
        #: Last shipped NIXL sample per identity: (wire without read time, when shipped).
        self._nixl_shipped: dict[tuple[Any, ...], tuple[dict[str, Any], int]] = {}
        self._nixl_errors_logged: set[str] = set()
        self._queue_full = False
        self._last_rescan = float("-inf")
        self._last_prune = 0
        self._threads: list[threading.Thread] = []
        self._metrics_server: MetricsServer | None = None
        self._lock = threading.Lock()  # flush is not reentrant (run loop vs. --once/shutdown)

    # --- lifecycle ------------------------------------------------------------------------------

    def start(self, *, metrics: bool = True) -> None:
        """Start the watcher, the pusher thread and (when configured) the metrics listener."""
        addr = self.settings.metrics_address
        if metrics and addr is not None:
            self._metrics_server = MetricsServer(self.metrics.registry, *addr)
        self.watcher.start()
        t = threading.Thread(target=self.pusher.run, name="flightdeck-pusher", daemon=True)
        t.start()
        self._threads.append(t)

    @property
    def metrics_port(self) -> int | None:
        """The port /metrics listens on, when started."""
        return self._metrics_server.port if self._metrics_server else None

    def run(self) -> None:
        """Flush every push_interval_s until `stop_event` is set (call `start` first)."""
        while not self.stop_event.is_set():
            try:
                self.flush()
            except Exception:
                log.exception("flush failed; trying again at the next interval")
                self.metrics.loop_errors.labels(loop="flush").inc()
            self.stop_event.wait(self.settings.push_interval_s)

    def once(self) -> bool:
        """One pass for `--once`: read everything, ship it, return True when nothing is left queued.

        Torch dumps and bad files need a second look (stable across two looks), so when the first
        flush left any waiting, a second one follows after push_interval_s.
        """
        self.flush()
        if self._settling or self._bad:
            time.sleep(self.settings.push_interval_s)
            self.flush()
        return self.pusher.drain(timeout_s=self.settings.push_deadline_s, give_up_on_auth=True)

    def close(self, *, drain_s: float | None = None) -> bool:
        """Stop everything: final flush, push what can be pushed within `drain_s`, join threads.

        Returns True when the queue is empty at the end.
        """
        self.stop_event.set()
        self.watcher.stop()
        for t in self._threads:
            t.join(30.0)
        self._threads.clear()
        empty = False
        try:
            try:
                self.flush()
            except Exception:
                log.exception("final flush failed")
            grace = self.settings.shutdown_grace_s if drain_s is None else drain_s
            empty = self.pusher.drain(timeout_s=grace) if grace > 0 else self.queue.peek() is None
            if not empty:
                log.info("%d batches stay queued for the next start", self.queue.stats().depth)
        finally:
            if self._metrics_server is not None:
                self._metrics_server.close()
                self._metrics_server = None
            self.queue.close()
        return empty

    # --- one flush ------------------------------------------------------------------------------

    def flush(self) -> FlushResult:
        """Read what changed, enqueue it as batches (one transaction), return what was done."""
        with self._lock:
            return self._flush()

    def _flush(self) -> FlushResult:
        result = FlushResult()
        now_mono = self.monotonic()
        if now_mono - self._last_rescan >= self.settings.rescan_interval_s:
            self._last_rescan = now_mono
            self._clean_spool(result)
            for path, root in self.watcher.rescan():
                self.watcher.mark(path, root)
            self._prune()
        # Looked at before the files are: whatever a dead rank wrote is on disk by now, so it is
        # read in this flush (or found unshipped below, and the report waits).
        gone = self._gone_candidates()
        dirty = self.watcher.take()
        nixl = self._read_nixl()
        if not self.queue.has_room():
            self._refuse(dirty, nixl, result)
            return result
        # One file at a time, keeping only its changed entries; once a batch's worth has built up it
        # is committed (its batches and its ranks' shipped state, in one transaction), so memory
        # stays flat however many ranks changed at once (a collector start reads every ring).
        pending = _Pending()
        # The ranks on digests: read like the others, but committed at the end of the flush, once
        # the server has said whether it wants their entries (collector.digests).
        held = _Pending()
        #: The state of every rank read in this flush (a rank's files are diffed one after another).
        read_states: dict[RankKey, RankState] = {}
        items = self._order(dirty)
        for i, (path, root) in enumerate(items):
            got = self._read(path, root, read_states, result)
            if got is not None:
                sig, key, changed = got
                snap = snapshot_from_dump(changed.dump)
                snap.oldest_record_id = changed.oldest_record_id
                snap.host = snap.host or self.host
                try:
                    # Checked alone, before it joins a batch: the server would refuse the batch.
                    check_snapshot(snap)
                except SnapshotError as exc:
                    self._reader.forget(path)
                    self._failed(path, root, sig, InvalidDumpError(str(exc)), result)
                    continue
                self._bad.pop(path, None)
                read_states[key] = changed.state
                digest = self._on_digests(snap.world_size)
                into = held if digest else pending
                into.read[path] = (sig, root)
                into.states[key] = changed.state
                if root.kind == "spool":
                    into.ranks[key] = self._rank_record(key, path, snap, into.ranks.get(key))
                if digest:
                    self._track(key, snap, changed.oldest_record_id)
                else:
                    self._thin_groups(key, snap, now_mono)  # held ones: when they ship
                into.snapshots.append(snap)
                into.entries += len(changed.dump.entries)
            if pending.entries >= self.settings.max_batch_entries and not self._commit(pending, [], result):
                rest = {p: r for p, r in items[i + 1 :]}
                rest.update((p, r) for p, (_sig, r) in held.read.items())
                self._refuse(rest, nixl, result)
                return result
        samples = self._changed_nixl(nixl)
        if self.settings.digest_from_ranks > 0:
            ship = self._settle_digests(held.snapshots, now_mono, result)
            # One transaction: the snapshots shipped, and the shipped state of every read (those
            # held back included: the next flush diffs against what was read, shipped or not).
            pending.snapshots.extend(ship)
            pending.entries += sum(len(s.entries) for s in ship)
            pending.read.update(held.read)
            pending.states.update(held.states)
            pending.ranks.update(held.ranks)
        if (pending.snapshots or samples or pending.read) and not self._commit(pending, samples, result):
            self._refuse({}, nixl, result)
            return result
        if gone:
            self._report_gone(gone, result)
        self._heartbeat(result)
        return result

    def _thin_groups(self, key: RankKey, snap: Snapshot, now_mono: float) -> None:
        """Drop the snapshot's groups when this rank shipped the same ones under GROUPS_RESEND_S ago
        (the server keeps a group's members from its earlier snapshots). Marked shipped before the
        batch is queued: should the queue refuse it, the groups go again within GROUPS_RESEND_S."""
        digest = hash(tuple(sorted((n, g.desc, g.ranks) for n, g in snap.groups.items())))
        last = self._groups_shipped.get(key)
        if last is not None and last[0] == digest and now_mono - last[1] < GROUPS_RESEND_S:
            snap.groups = {}
        else:
            self._groups_shipped[key] = (digest, now_mono)

    def _commit(
        self, pending: _Pending, samples: list[tuple[dict[str, Any], tuple[Any, ...]]], result: FlushResult
    ) -> bool:
        """Enqueue what is pending (batches + shipped state, one transaction); False when refused.

        With no snapshot and no sample (ranks on digests held back) the state alone is committed."""
        batches = (
            self._batches(pending.snapshots, [w for w, _ in samples]) if pending.snapshots or samples else []
        )
        delivered = {str(path): sig for path, (sig, _root) in pending.read.items()}
        if not self.queue.enqueue(
            batches,
            {k: s.encode() for k, s in pending.states.items()},
            delivered=delivered,
            ranks=pending.ranks,
        ):
            self._refuse({path: root for path, (_s, root) in pending.read.items()}, [], result)
            pending.clear()
            return False
        if self._queue_full:
            log.info("queue has room again: batches are being made again")
            self._queue_full = False
        # Committed: now (and only now) remember what was shipped.
        if batches:  # state alone is no sign of life to the server: the heartbeat still goes
            self._last_enqueue = self.monotonic()
        self.shipped.update(pending.states)
        self._ranks.update(pending.ranks)
        for path, (sig, _root) in pending.read.items():
            self._done[path] = sig
        now = self.clock()
        for wire, ident in samples:
            self._nixl_shipped[ident] = (_strip_time(wire), now)
        result.snapshots += len(pending.snapshots)
        result.entries += pending.entries
        result.nixl_samples += len(samples)
        result.batches += len(batches)
        self.metrics.batches_enqueued.inc(len(batches))
        self.metrics.entries_enqueued.inc(pending.entries)
        self.metrics.nixl_samples.inc(len(samples))
        pending.clear()
        return True

    def _refuse(self, dirty: dict[Path, WatchRoot], nixl: list[dict[str, Any]], result: FlushResult) -> None:
        """Queue full: keep every dirty file for later, drop this flush's NIXL samples."""
        for path, root in dirty.items():
            self.watcher.mark(path, root)
        if dirty:
            self.metrics.enqueue_refused.labels(kind="snapshots").inc()
        if nixl:
            self.metrics.enqueue_refused.labels(kind="nixl").inc()
        result.refused = True
        if self.queue.disk_full:
            return  # the queue said so, once, in its own words (a full disk, not a full queue)
        if not self._queue_full:
            self._queue_full = True
            log.error(
                "queue is full (max_queue_bytes=%d): holding back new snapshots (the files stay and "
                "are read when the server has taken queued batches), dropping NIXL samples until then",
                self.settings.max_queue_bytes,
            )

    def _order(self, dirty: dict[Path, WatchRoot]) -> list[tuple[Path, WatchRoot]]:
        """Oldest first, so that a rank's snapshots are diffed in the order they were taken."""

        def mtime(item: tuple[Path, WatchRoot]) -> int:
            try:
                return item[0].stat().st_mtime_ns
            except OSError:
                return 0

        return sorted(dirty.items(), key=mtime)
