"""The collector's durable state: one SQLite database (WAL) in `state_dir`.

Three tables:

- `batches`: gzipped encoded batches waiting for the server, oldest first. A batch is written here,
  with its `batch_id` (the server's idempotency key), before any attempt to send it, and deleted
  only after the server answered 2xx (a `{"duplicate": true}` answer included).
- `dead_letter`: batches the server refused with a 4xx other than 429, 401 and 403 (those refuse
  the rate or the token, not the batch: it stays queued), or that failed with other statuses too
  often, with the status and the server's message; kept, never retried by itself.
- `shipped`: per (job, attempt, rank), what was already put in a batch (see `readers.delta`).
- `delivered`: per dump file, the stat signature (device, inode, size, mtime) of the version last
  put in a batch, so that a restart does not read and ship again a file already shipped.
- `ranks`: per (job, attempt, rank) seen in a spool, its directory, the pid its snapshots name on
  this host, its first and latest snapshot time, whether the latest is final, and when its
  process was reported gone (once: a restart does not report it again).

Why the shipped state lives here and not in a file of its own: a batch and the shipped-state
update that describes it (the shipped entries, the files delivered, the ranks' records) are
committed in ONE transaction (`enqueue`). After a kill -9 at any
point, either both exist (the batch is resent, the server deduplicates by batch_id) or neither (the
changes are found again in the spool files and shipped then). Nothing is lost and nothing is queued
twice. WAL with synchronous=NORMAL survives any process crash; only a power loss can drop the last
transactions, and then it drops both halves together.

Bounded disk: `enqueue` refuses (returns False) when the new batches would take the queue over
`max_bytes`; see `collector.daemon` for what is kept and why.

A full disk: every write to SQLite needs room in its WAL, acknowledging a batch (a DELETE) and
dead-lettering one included, and an acknowledgement that fails makes the pusher send the batch again.
So the queue keeps a reserve file (`queue.reserve`, `reserve_bytes`) beside the database. When a
write fails with SQLITE_FULL the reserve is released (deleted) and the write tried again, which makes
acknowledging work on a full disk; from then on `enqueue` refuses until the reserve is back in place
with as much free beside it (`has_room` looks each time it is asked), so
the space released serves the acknowledgements only. Should an acknowledgement fail even so, the
batch is remembered as delivered in memory, never sent again by this process, and deleted as soon
as a write succeeds (after a crash it is sent once more: the server answers "duplicate").

Why one module of over 500 lines: its tables are one database behind one connection and one lock,
and what binds them is the transaction above (a batch with the shipped state it describes) and the
reserve every write goes through; split by table, each part would need the others' connection,
lock and reserve, and the one transaction would span modules.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

DB_NAME = "queue.sqlite3"
RESERVE_NAME = "queue.reserve"
#: Default size of the reserve file: the WAL frames of many acknowledgements and a dead letter.
DEFAULT_RESERVE_BYTES = 8 * 1024 * 1024

log = logging.getLogger(__name__)


def is_disk_full(exc: BaseException) -> bool:
    """Whether a SQLite error says the disk (or its quota) is full."""
    return isinstance(exc, sqlite3.OperationalError) and (
        getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL or "disk is full" in str(exc)
    )


_SCHEMA = """
CREATE TABLE IF NOT EXISTS batches (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    batch_id TEXT NOT NULL UNIQUE,
    created_ns INTEGER NOT NULL,
    kind TEXT NOT NULL,
    entries INTEGER NOT NULL,
    nbytes INTEGER NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    body BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS dead_letter (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    batch_id TEXT NOT NULL,
    created_ns INTEGER NOT NULL,
    failed_ns INTEGER NOT NULL,
    kind TEXT NOT NULL,
    entries INTEGER NOT NULL,
    status INTEGER,
    message TEXT NOT NULL,
    body BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS shipped (
    job TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    rank INTEGER NOT NULL,
    updated_ns INTEGER NOT NULL,
    state BLOB NOT NULL,
    PRIMARY KEY (job, attempt, rank)
);
CREATE TABLE IF NOT EXISTS delivered (
    path TEXT PRIMARY KEY,
    dev INTEGER NOT NULL,
    ino INTEGER NOT NULL,
    size INTEGER NOT NULL,
    mtime_ns INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS ranks (
    job TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    rank INTEGER NOT NULL,
    directory TEXT NOT NULL,
    pid INTEGER,
    first_ns INTEGER NOT NULL,
    last_ns INTEGER NOT NULL,
    final INTEGER NOT NULL,
    gone_ns INTEGER,
    PRIMARY KEY (job, attempt, rank)
);
CREATE INDEX IF NOT EXISTS ranks_directory ON ranks (directory);
"""

RankKey = tuple[str, int, int]
#: A file's stat signature: device, inode, size, mtime_ns.
FileSig = tuple[int, int, int, int]


@dataclass(frozen=True, slots=True)
class RankRecord:
    """What the collector knows of one rank from its spool snapshots (the `ranks` table)."""

    #: The spool directory its files are in (`<spool>/<job>/<attempt>`).
    directory: str
    #: The pid its snapshots name, when they name this host; None otherwise (not ours to watch).
    pid: int | None
    #: Snapshot time of the first and of the latest snapshot read (epoch ns).
    first_ns: int
    last_ns: int
    #: The latest snapshot is the rank's final one.
    final: bool
    #: When its process was reported gone (collector clock); None while it was not.
    gone_ns: int | None = None

    @property
    def ended(self) -> bool:
        """Final, or its process reported gone."""
        return self.final or self.gone_ns is not None


@dataclass(frozen=True, slots=True)
class QueuedBatch:
    """A batch to send, as stored."""

    seq: int
    batch_id: str
    created_ns: int
    kind: str
    entries: int
    attempts: int
    body: bytes


@dataclass(frozen=True, slots=True)
class NewBatch:
    """A batch to enqueue: `body` is the gzipped JSON document whose batch_id is `batch_id`."""

    batch_id: str
    kind: str
    entries: int
    body: bytes


@dataclass(frozen=True, slots=True)
class QueueStats:
    """What the metrics report about the queue."""

    depth: int
    nbytes: int
    oldest_created_ns: int | None
    dead_letters: int
    #: The reserve file is released (the disk under state_dir was full) and not yet put back.
    disk_full: bool = False


class DurableQueue:
    """The batches, dead letters and shipped state of one collector; safe to share between threads."""

    def __init__(
        self,
        state_dir: Path,
        *,
        max_bytes: int,
        clock: Callable[[], int] = time.time_ns,
        reserve_bytes: int = DEFAULT_RESERVE_BYTES,
    ) -> None:
        state_dir.mkdir(parents=True, exist_ok=True)
        self.path = state_dir / DB_NAME
        self.reserve_path = state_dir / RESERVE_NAME
        self.reserve_bytes = reserve_bytes
        self.max_bytes = max_bytes
        self.clock = clock
        self._lock = threading.Lock()
        #: Batches delivered (seq -> the dead letter to write, or None) whose removal could not be
        #: written yet (disk full): never handed out by `peek` again, removed at the next write.
        self._held: dict[int, tuple[int | None, str, tuple[str, int, bytes] | None] | None] = {}
        self.disk_full = False
        # One connection shared under a lock: the daemon thread enqueues, the pusher thread acks,
        # the metrics thread reads stats; all statements are short.
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("PRAGMA busy_timeout=5000")
        self._db.executescript(_SCHEMA)
        row = self._db.execute("SELECT COALESCE(SUM(nbytes), 0), COUNT(*) FROM batches").fetchone()
        self._bytes, self._depth = int(row[0]), int(row[1])
        #: Set whenever a batch is enqueued, so that the pusher wakes at once.
        self.ready = threading.Event()
        if self._depth:
            self.ready.set()
        if not self._put_reserve():
            self.disk_full = True
            log.error(
                "no room for the %d-byte reserve file in %s: new batches are held back until there is "
                "(queued batches are still sent)",
                reserve_bytes,
                state_dir,
            )

    def _rollback(self) -> None:
        # A COMMIT that failed for a full disk has rolled the transaction back already.
        if self._db.in_transaction:
            self._db.execute("ROLLBACK")

    def close(self) -> None:
        """Close the database (a checkpoint folds the WAL back into the main file)."""
        with self._lock:
            try:
                self._db.close()
            except sqlite3.Error as exc:  # a full disk: the WAL stays, and is folded in at the next open
                log.warning("closing the queue: %s", exc)

    # --- the reserve file (see the module docstring) --------------------------------------------

    def _put_reserve(self) -> bool:
        """Make sure the reserve file holds reserve_bytes; False when there is no room for it."""
        try:
            if os.stat(self.reserve_path).st_size >= self.reserve_bytes:
                return True
        except FileNotFoundError:
            pass
        try:
            fs = os.statvfs(self.reserve_path.parent)
            if fs.f_bavail * fs.f_frsize < 2 * self.reserve_bytes:  # room for it and as much again
                return False
            fd = os.open(self.reserve_path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                os.posix_fallocate(fd, 0, self.reserve_bytes)  # really allocated, not a sparse file
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError:
            self.reserve_path.unlink(missing_ok=True)
            return False
        return True

    def _room_again(self) -> bool:
        """After a full disk: whether the reserve is back in place with as much free beside it."""
        if not self._put_reserve():
            return False
        try:
            fs = os.statvfs(self.reserve_path.parent)
        except OSError:
            return False
        return fs.f_bavail * fs.f_frsize >= self.reserve_bytes

    def _release_reserve(self) -> bool:
        """The disk is full: free the reserve for the write that needs it; False when already gone."""
        if not self.reserve_path.exists():
            return False
        self.reserve_path.unlink(missing_ok=True)
        if not self.disk_full:
            log.error(
                "disk under %s is full: released the %d-byte reserve so that delivered batches can be "
                "acknowledged; new batches are held back (the dump files stay and are read later) "
                "until there is room again",
                self.reserve_path.parent,
                self.reserve_bytes,
            )
        self.disk_full = True
        return True

    def _write(self, do: Callable[[], object]) -> bool:
        """Run one write under the lock, releasing the reserve once when the disk is full; False when
        the disk is full even so (nothing written)."""
        try:
            do()
            return True
        except sqlite3.OperationalError as exc:
            if not is_disk_full(exc):
                raise
        if self._release_reserve():
            try:
                do()
                return True
            except sqlite3.OperationalError as exc:
                if not is_disk_full(exc):
                    raise
        return False

    def _flush_held(self) -> None:
        """Write the removals of delivered batches that a full disk held back (under the lock)."""
        for seq, action in list(self._held.items()):
            if action is None:
                done = self._write(lambda seq=seq: self._delete(seq))  # type: ignore[misc]
            else:
                status, message, part = action
                done = self._write(
                    lambda seq=seq, status=status, message=message, part=part: self._move_to_dead_letter(  # type: ignore[misc]
                        seq, status, message, part
                    )
                )
            if not done:
                return
            del self._held[seq]

    # --- enqueue ----------------------------------------------------------------------------------

    def has_room(self, nbytes: int = 0) -> bool:
        """Whether `nbytes` more would fit under max_bytes (and on the disk: see the reserve)."""
        with self._lock:
            if self.disk_full:
                if not self._room_again():
                    return False
                self.disk_full = False
                log.info(
                    "disk under %s has room again: reserve restored, batches are made again", self.path.parent
                )
                self._flush_held()
            return self._bytes + nbytes <= self.max_bytes

    def enqueue(
        self,
        batches: Iterable[NewBatch],
        shipped: dict[RankKey, bytes] | None = None,
        *,
        delivered: dict[str, FileSig] | None = None,
        ranks: dict[RankKey, RankRecord] | None = None,
    ) -> bool:
        """Store batches and the shipped-state updates they imply in one transaction: the ranks'
        shipped entries, the files they were read from, the ranks' records.

        Returns False, storing nothing, when the batches would take the queue over max_bytes.
        """
        items = list(batches)
        total = sum(len(b.body) for b in items)
        now = self.clock()
        with self._lock:
            if items and self._bytes + total > self.max_bytes:
                return False
            if self.disk_full:  # what is left of the disk is for acknowledgements
                return False
            cur = self._db.cursor()
            cur.execute("BEGIN IMMEDIATE")
            try:
                cur.executemany(
                    "INSERT INTO batches (batch_id, created_ns, kind, entries, nbytes, body)"
                    " VALUES (?, ?, ?, ?, ?, ?)",
                    [(b.batch_id, now, b.kind, b.entries, len(b.body), b.body) for b in items],
                )
                cur.executemany(
                    "INSERT INTO shipped (job, attempt, rank, updated_ns, state) VALUES (?, ?, ?, ?, ?)"
                    " ON CONFLICT (job, attempt, rank)"
                    " DO UPDATE SET updated_ns = excluded.updated_ns, state = excluded.state",
                    [(k[0], k[1], k[2], now, v) for k, v in (shipped or {}).items()],
                )
                cur.executemany(
                    "INSERT OR REPLACE INTO delivered (path, dev, ino, size, mtime_ns) VALUES (?, ?, ?, ?, ?)",
                    [(p, *sig) for p, sig in (delivered or {}).items()],
                )
                cur.executemany(
                    "INSERT OR REPLACE INTO ranks (job, attempt, rank, directory, pid, first_ns, last_ns,"
                    " final, gone_ns) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    [
                        (k[0], k[1], k[2], r.directory, r.pid, r.first_ns, r.last_ns, int(r.final), r.gone_ns)
                        for k, r in (ranks or {}).items()
                    ],
                )
                cur.execute("COMMIT")
            except BaseException as exc:
                self._rollback()
                if is_disk_full(exc):
                    # Refused like a full queue; the reserve stays for the acknowledgements.
                    if not self.disk_full:
                        log.error(
                            "disk under %s is full: new batches are held back (the dump files stay and "
                            "are read later) until there is room again",
                            self.path.parent,
                        )
                    self.disk_full = True
                    return False
                raise
            self._bytes += total
            self._depth += len(items)
        if items:
            self.ready.set()
        return True

    # --- send side --------------------------------------------------------------------------------

    def peek(self) -> QueuedBatch | None:
        """The oldest queued batch, or None (and `ready` cleared) when the queue is empty."""
        with self._lock:
            if self._held:
                self._flush_held()
            # Delivered batches whose removal a full disk holds back are never handed out again.
            after = max(self._held, default=0)
            row = self._db.execute(
                "SELECT seq, batch_id, created_ns, kind, entries, attempts, body"
                " FROM batches WHERE seq > ? ORDER BY seq LIMIT 1",
                (after,),
            ).fetchone()
            if row is None:
                self.ready.clear()
                return None
        return QueuedBatch(*row)

    def ack(self, seq: int) -> None:
        """The server accepted the batch: forget it (on a full disk: see the module docstring)."""
        with self._lock:
            if not self._write(lambda: self._delete(seq)):
                self._hold(seq, None)

    def _delete(self, seq: int) -> None:
        row = self._db.execute("DELETE FROM batches WHERE seq = ? RETURNING nbytes", (seq,)).fetchone()
        if row is not None:
            self._bytes -= int(row[0])
            self._depth -= 1

    def _hold(self, seq: int, action: tuple[int | None, str, tuple[str, int, bytes] | None] | None) -> None:
        """A delivered batch whose removal cannot be written now: remembered, never sent again."""
        self._held[seq] = action
        log.error(
            "disk under %s is full even without the reserve: batch #%d is delivered but its removal "
            "cannot be written; it is not sent again and is removed once there is room",
            self.path.parent,
            seq,
        )

    def count_attempt(self, seq: int) -> int:
        """Count one failed attempt that counts towards max_attempts; returns the new count."""
        out: list[int] = []

        def count() -> None:
            row = self._db.execute(
                "UPDATE batches SET attempts = attempts + 1 WHERE seq = ? RETURNING attempts", (seq,)
            ).fetchone()
            out.append(int(row[0]) if row else 0)

        with self._lock:
            if not self._write(count):
                return 0  # not counted on a full disk: the batch is tried again, as after a restart
        return out[0]

    def dead_letter(
        self, seq: int, *, status: int | None, message: str, part: tuple[str, int, bytes] | None = None
    ) -> None:
        """Move a batch the server refused to the dead-letter table, with the server's message.

        `part` (batch_id, entries, body): the server applied the rest of the batch; only this part of
        it (the refused snapshots) is kept as the dead letter.
        """
        with self._lock:
            if not self._write(lambda: self._move_to_dead_letter(seq, status, message, part)):
                self._hold(seq, (status, message, part))

    def _move_to_dead_letter(
        self, seq: int, status: int | None, message: str, part: tuple[str, int, bytes] | None
    ) -> None:
        now = self.clock()
        cur = self._db.cursor()
        cur.execute("BEGIN IMMEDIATE")
        try:
            row = cur.execute(
                "DELETE FROM batches WHERE seq = ? RETURNING batch_id, created_ns, kind, entries, nbytes, body",
                (seq,),
            ).fetchone()
            if row is not None:
                batch_id, entries, body = (row[0], row[3], row[5]) if part is None else part
                cur.execute(
                    "INSERT INTO dead_letter (batch_id, created_ns, failed_ns, kind, entries, status,"
                    " message, body) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    (batch_id, row[1], now, row[2], entries, status, message[:4000], body),
                )
            cur.execute("COMMIT")
        except BaseException:
            self._rollback()
            raise
        if row is not None:
            self._bytes -= int(row[4])
            self._depth -= 1

    def requeue_dead_letters(self) -> int:
        """Put every dead letter back at the end of the queue (after fixing what the server refused)."""
        with self._lock:
            cur = self._db.cursor()
            cur.execute("BEGIN IMMEDIATE")
            try:
                rows = cur.execute(
                    "DELETE FROM dead_letter RETURNING batch_id, created_ns, kind, entries, body"
                ).fetchall()
                cur.executemany(
                    "INSERT OR IGNORE INTO batches (batch_id, created_ns, kind, entries, nbytes, body)"
                    " VALUES (?, ?, ?, ?, ?, ?)",
                    [(r[0], r[1], r[2], r[3], len(r[4]), r[4]) for r in rows],
                )
                cur.execute("COMMIT")
            except BaseException:
                self._rollback()
                raise
            row = self._db.execute("SELECT COALESCE(SUM(nbytes), 0), COUNT(*) FROM batches").fetchone()
            self._bytes, self._depth = int(row[0]), int(row[1])
        if rows:
            self.ready.set()
        return len(rows)

    def dead_letters(self) -> list[tuple[str, int | None, str]]:
        """(batch_id, status, message) of every dead letter, oldest first."""
        with self._lock:
            rows = self._db.execute(
                "SELECT batch_id, status, message FROM dead_letter ORDER BY seq"
            ).fetchall()
        return [(str(r[0]), r[1], str(r[2])) for r in rows]

    def stats(self) -> QueueStats:
        """Depth, bytes, age of the oldest batch and dead letters, for the metrics."""
        with self._lock:
            oldest = self._db.execute("SELECT created_ns FROM batches ORDER BY seq LIMIT 1").fetchone()
            dead = self._db.execute("SELECT COUNT(*) FROM dead_letter").fetchone()
            return QueueStats(
                self._depth - len(self._held),
                self._bytes,
                None if oldest is None else int(oldest[0]),
                int(dead[0]),
                self.disk_full,
            )

    # --- shipped state ----------------------------------------------------------------------------

    def load_shipped(self) -> dict[RankKey, bytes]:
        """Every rank's stored shipped state."""
        with self._lock:
            rows = self._db.execute("SELECT job, attempt, rank, state FROM shipped").fetchall()
        return {(str(r[0]), int(r[1]), int(r[2])): bytes(r[3]) for r in rows}

    def forget_shipped(self, older_than_ns: int) -> list[RankKey]:
        """Drop the shipped state of ranks not updated since `older_than_ns`; returns their keys."""
        with self._lock:
            try:
                rows = self._db.execute(
                    "DELETE FROM shipped WHERE updated_ns < ? RETURNING job, attempt, rank", (older_than_ns,)
                ).fetchall()
            except sqlite3.OperationalError as exc:
                if not is_disk_full(exc):
                    raise
                return []  # pruned at the next interval
        return [(str(r[0]), int(r[1]), int(r[2])) for r in rows]

    # --- delivered files and ranks --------------------------------------------------------------

    def load_delivered(self) -> dict[str, FileSig]:
        """Every delivered file's signature, by path."""
        with self._lock:
            rows = self._db.execute("SELECT path, dev, ino, size, mtime_ns FROM delivered").fetchall()
        return {str(r[0]): (int(r[1]), int(r[2]), int(r[3]), int(r[4])) for r in rows}

    def load_ranks(self) -> dict[RankKey, RankRecord]:
        """Every rank's record."""
        with self._lock:
            rows = self._db.execute(
                "SELECT job, attempt, rank, directory, pid, first_ns, last_ns, final, gone_ns FROM ranks"
            ).fetchall()
        return {
            (str(r[0]), int(r[1]), int(r[2])): RankRecord(
                str(r[3]), r[4], int(r[5]), int(r[6]), bool(r[7]), r[8]
            )
            for r in rows
        }

    def forget_files(self, paths: Iterable[str]) -> None:
        """Drop the delivery records of files that no longer exist."""
        with self._lock:
            self._write(
                lambda: self._db.executemany("DELETE FROM delivered WHERE path = ?", [(p,) for p in paths])
            )

    def forget_ranks(self, keys: Iterable[RankKey]) -> None:
        """Drop the records of ranks whose shipped state was forgotten (long silent)."""
        with self._lock:
            self._write(
                lambda: self._db.executemany(
                    "DELETE FROM ranks WHERE job = ? AND attempt = ? AND rank = ?", list(keys)
                )
            )

    def forget_directory(self, directory: str) -> None:
        """Drop the delivery records of every file under `directory` and its ranks' records (the
        directory was removed)."""
        prefix = directory.rstrip("/") + "/"

        def forget() -> None:
            cur = self._db.cursor()
            cur.execute("BEGIN IMMEDIATE")
            try:
                # substr, not LIKE: a path may hold `%` or `_`.
                cur.execute("DELETE FROM delivered WHERE substr(path, 1, ?) = ?", (len(prefix), prefix))
                cur.execute("DELETE FROM ranks WHERE directory = ?", (directory,))
                cur.execute("COMMIT")
            except BaseException:
                self._rollback()
                raise

        with self._lock:
            self._write(forget)
