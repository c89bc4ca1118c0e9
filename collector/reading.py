"""Reading one dirty file for the collector: complete yet? changed? parsed, or looked at again, or quarantined.

A part of `Collector` (`flightdeck.collector.daemon`, whose docstring says when a file is read and
when a bad one is quarantined).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from flightdeck.collector.metrics import CollectorMetrics
from flightdeck.collector.queue import FileSig, RankKey
from flightdeck.collector.settings import CollectorSettings
from flightdeck.collector.watcher import Watcher, WatchRoot
from flightdeck.readers.delta import RankState
from flightdeck.readers.fr.decode import DumpBudget
from flightdeck.readers.fr.errors import (
    DumpBudgetError,
    DumpError,
    DumpTooLargeError,
    InvalidDumpError,
    NotADumpError,
    NotRegularFileError,
    TruncatedDumpError,
    UnsafePickleError,
    UnsupportedVersionError,
)
from flightdeck.readers.fr.files import FILE_KINDS, read_regular
from flightdeck.readers.incremental import ChangedRead, IncrementalReader
from flightdeck.records import RankDump
from flightdeck.spool import sidecar_path

if TYPE_CHECKING:
    from flightdeck.collector.daemon import FlushResult

#: The daemon's parts log under the one name they had as one module (log lines name it).
log = logging.getLogger("flightdeck.collector.daemon")

QUARANTINE_DIR = "quarantine"
#: How much of a too-large torch dump is copied to quarantine (enough to see what it is).
QUARANTINE_COPY_MAX = 1024 * 1024

_REASONS: tuple[tuple[type[DumpError], str], ...] = (
    (UnsafePickleError, "unsafe_pickle"),
    (TruncatedDumpError, "truncated"),
    (UnsupportedVersionError, "unsupported_version"),
    (DumpTooLargeError, "too_large"),
    (DumpBudgetError, "over_budget"),
    (InvalidDumpError, "invalid"),
    (NotADumpError, "not_a_dump"),
)

Sig = FileSig  # device, inode, size, mtime_ns


def error_reason(exc: DumpError) -> str:
    """The `reason` label of a reader error."""
    return next((r for cls, r in _REASONS if isinstance(exc, cls)), "unreadable")


def _sig(st: os.stat_result) -> Sig:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


@dataclass(slots=True)
class _Bad:
    """A file that failed to parse, waiting to be seen unchanged before it is quarantined."""

    sig: Sig
    error: DumpError


class FileReading:
    """The `Collector`'s part that reads one dirty file, and sets aside the files it cannot read.

    Its state is the `Collector`'s, set in `Collector.__init__` (what each field holds is said
    there); the annotations below name the fields this part uses.
    """

    settings: CollectorSettings
    clock: Callable[[], int]
    metrics: CollectorMetrics
    watcher: Watcher
    quarantine_dir: Path
    shipped: dict[RankKey, RankState]
    _done: dict[Path, Sig]
    _settling: dict[Path, Sig]
    _bad: dict[Path, _Bad]
    _reader: IncrementalReader
    _budget: DumpBudget

    if TYPE_CHECKING:

        def _reads_in_full(self, head: RankDump, key: RankKey) -> bool: ...  # `DigestMode`'s

    def _read(
        self, path: Path, root: WatchRoot, pending: dict[RankKey, RankState], result: FlushResult
    ) -> tuple[Sig, RankKey, ChangedRead] | None:
        """Read a dirty file when it is complete and changed: its signature, rank key and changes.

        None when there is nothing to ship yet. `pending` holds the states of ranks already read in
        this flush (a rank's stall and periodic files can both change in one flush).
        """
        try:
            st = os.lstat(path)  # never follows a symlink; stat of a FIFO does not block
        except OSError:
            self._forget(path)
            return None
        sig = _sig(st)
        if self._done.get(path) == sig:
            return None
        if root.kind == "torch" and self._settling.get(path) != sig:
            # Written in place by PyTorch: wait until two looks agree before reading.
            self._settling[path] = sig
            self.watcher.mark(path, root)
            return None
        keys: list[RankKey] = []

        def identify(head: RankDump) -> RankState | None:
            if root.kind == "torch":
                head.job = head.job or self.settings.torch_job
            elif head.job is None:
                self._identity_from_path(head, path, root)
            key = (head.job or "unknown", head.attempt, head.rank)
            keys.append(key)
            if self._reads_in_full(head, key):
                return None  # every entry, not the changes since the shipped state (collector.digests)
            return pending.get(key) or self.shipped.get(key)

        try:
            changed = self._reader.read(
                path, identify=identify, max_bytes=self.settings.max_dump_bytes, budget=self._budget
            )
        except NotRegularFileError as exc:
            self._skipped(path, sig, exc)
            return None
        except DumpError as exc:
            self._failed(path, root, sig, exc, result)
            return None
        try:
            after = _sig(path.stat())
        except OSError:
            after = None
        if after != sig and root.kind == "torch":  # rewritten while we read it: torn read possible
            self.watcher.mark(path, root)
            return None
        self._settling.pop(path, None)
        self.metrics.files_seen.inc()
        result.files_read += 1
        return sig, keys[-1], changed

    def _identity_from_path(self, dump: RankDump, path: Path, root: WatchRoot) -> None:
        """A spool file without its sidecar: job and attempt from `<spool>/<job>/<attempt>/`."""
        rel = path.relative_to(root.directory).parts
        if len(rel) >= 3:
            dump.job = rel[-3]
            if rel[-2].isdigit():
                dump.attempt = int(rel[-2])

    def _skipped(self, path: Path, sig: Sig, exc: NotRegularFileError) -> None:
        """A FIFO, socket, device, directory or symlink where a dump belongs: never opened, never
        moved; counted and logged once per version of the path (a regular file put there later is
        read as usual)."""
        self._done[path] = sig
        self._reader.forget(path)
        self._settling.pop(path, None)
        self._bad.pop(path, None)
        kind = exc.kind if exc.kind in FILE_KINDS else "other"
        self.metrics.files_skipped.labels(reason=kind).inc()
        log.warning("skipped %s: %s", path, exc)

    def _failed(self, path: Path, root: WatchRoot, sig: Sig, exc: DumpError, result: FlushResult) -> None:
        """A parse failure: quarantine when the file is stable and still bad, else look again later."""
        bad = self._bad.get(path)
        if bad is None or bad.sig != sig:
            # First failure of this version of the file: it may still be being written.
            self._bad[path] = _Bad(sig, exc)
            self.watcher.mark(path, root)
            log.debug("%s: %s; looking again at the next flush", path, exc)
            return
        del self._bad[path]
        reason = error_reason(exc)
        self.metrics.parse_errors.labels(reason=reason).inc()
        try:
            dest = self._quarantine(path, root, sig, exc, reason)
        except OSError as qexc:
            log.error("%s: %s; cannot quarantine it (%s)", path, exc, qexc)
            self._done[path] = sig  # do not retry the same bad version every flush
            return
        self.metrics.quarantined.inc()
        result.quarantined += 1
        log.warning(
            "bad dump %s: %s [%s]; %s to %s",
            path,
            exc,
            reason,
            "copied" if root.kind == "torch" else "moved",
            dest,
        )

    def _quarantine(self, path: Path, root: WatchRoot, sig: Sig, exc: DumpError, reason: str) -> Path:
        """Move (spool) or copy (torch's own paths) a bad file into quarantine, with a .reason file."""
        try:
            rel = "_".join(path.relative_to(root.directory).parts)
        except ValueError:
            rel = path.name
        dest = self.quarantine_dir / f"{self.clock()}-{rel}"
        truncated = False
        if root.kind == "torch":
            # Never move PyTorch's file: the job may write it again. Copy (the head of a huge one).
            try:
                data, _st = read_regular(path, max_bytes=QUARANTINE_COPY_MAX, head=True)
            except NotRegularFileError as nexc:
                raise OSError(str(nexc)) from None
            truncated = len(data) > QUARANTINE_COPY_MAX
            with open(dest, "wb") as out:
                out.write(data[:QUARANTINE_COPY_MAX])
            self._done[path] = sig
        else:
            shutil.move(path, dest)
            meta = sidecar_path(path)
            if meta.exists():
                shutil.move(meta, sidecar_path(dest))
            self._forget(path)
        doc = {
            "path": str(path),
            "reason": reason,
            "error": f"{type(exc).__name__}: {exc}",
            "size": sig[2],
            "mtime_ns": sig[3],
            "quarantined_ns": self.clock(),
            "action": "copied" if root.kind == "torch" else "moved",
            "copy_truncated_to": QUARANTINE_COPY_MAX if truncated else None,
        }
        dest.with_name(dest.name + ".reason").write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
        return dest

    def _forget(self, path: Path) -> None:
        self._reader.forget(path)
        self._done.pop(path, None)
        self._settling.pop(path, None)
        self._bad.pop(path, None)
