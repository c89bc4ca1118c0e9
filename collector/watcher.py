"""Which dump files may have changed: watchdog events, plus full rescans as a safety net.

The watcher only collects candidate paths ("dirty"); it never reads a dump. Deciding whether a
file is complete and what changed in it is the daemon's job, at its next flush.

Two kinds of roots:
- spool roots (the agent's `<spool>/<job>/<attempt>/rank_<R>[.recent|.stall|.final].pkl`), watched
  recursively. The agent renames complete files into place, so a `moved` event names a finished
  file; `closed`, `created` and `modified` are taken too because a polling observer (network
  filesystems) reports a rename as a create or modify of the destination.
- torch dump prefixes (`~/.cache/torch/comm_lib_trace_rank_<R>`): the prefix's directory, not
  recursively, files named `<prefix basename><digits>`. PyTorch writes these in place, so they
  are read only once size and mtime held still across two looks (see the daemon).

Events can be lost (inotify queue overflow, a directory created and filled before its watch is
added, a root that appears later), so `rescan` lists every root and returns every candidate; the
daemon compares their stat signatures with what it already read.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from watchdog.events import (
    FileClosedEvent,
    FileCreatedEvent,
    FileModifiedEvent,
    FileMovedEvent,
    FileSystemEvent,
    FileSystemEventHandler,
)
from watchdog.observers import Observer
from watchdog.observers.api import BaseObserver
from watchdog.observers.polling import PollingObserver

from flightdeck.spool import is_dump_name

log = logging.getLogger(__name__)

RootKind = Literal["spool", "torch"]
_EVENT_TYPES = frozenset({"closed", "moved", "created", "modified"})
#: What inotify is asked for. Not IN_MODIFY (one per write() of every file being written), IN_OPEN
#: or IN_CLOSE_NOWRITE (one each per read, our own reads included): a finished file shows as a
#: rename (spool) or a close after writing (torch's dumps, written in place).
_INOTIFY_EVENTS: list[type[FileSystemEvent]] = [FileCreatedEvent, FileMovedEvent, FileClosedEvent]
#: A polling observer reports a rename or a rewrite as a creation or modification.
_POLLING_EVENTS: list[type[FileSystemEvent]] = [*_INOTIFY_EVENTS, FileModifiedEvent]


@dataclass(frozen=True, slots=True)
class WatchRoot:
    """A directory to watch and which of its files are dumps."""

    directory: Path
    kind: RootKind
    #: For torch roots: the file-name prefix the rank is appended to.
    name_prefix: str = ""

    @property
    def recursive(self) -> bool:
        """Spool roots hold `<job>/<attempt>/` subdirectories; torch prefixes name files directly."""
        return self.kind == "spool"

    def matches(self, path: Path) -> bool:
        """Whether `path` is a dump file of this root."""
        name = path.name
        if self.kind == "torch":
            return (
                path.parent == self.directory
                and name.startswith(self.name_prefix)
                and name[len(self.name_prefix) :].isdigit()
            )
        return is_dump_name(name) and self.directory in path.parents

    @classmethod
    def torch(cls, prefix: str) -> WatchRoot:
        """The root for a torch dump prefix such as `~/.cache/torch/comm_lib_trace_rank_`."""
        p = Path(os.path.expanduser(prefix))
        return cls(p.parent, "torch", p.name)


class _Handler(FileSystemEventHandler):
    def __init__(self, on_path: Callable[[Path], None]) -> None:
        self._on_path = on_path

    def on_any_event(self, event: FileSystemEvent) -> None:
        if event.is_directory or event.event_type not in _EVENT_TYPES:
            return
        raw = event.dest_path if event.event_type == "moved" else event.src_path
        self._on_path(Path(os.fsdecode(raw)))


class Watcher:
    """Collects paths that may have changed, from events and from `rescan`."""

    def __init__(
        self,
        roots: list[WatchRoot],
        *,
        polling: bool = False,
        poll_interval_s: float = 2.0,
        observer_factory: Callable[[], BaseObserver] | None = None,
    ) -> None:
        self.roots = roots
        # Only inotify (Linux's default observer) gets the short list; a polling or other observer, or
        # an injected one, gets every event type the handler takes.
        inotify = not polling and observer_factory is None and sys.platform.startswith("linux")
        self._event_filter = _INOTIFY_EVENTS if inotify else _POLLING_EVENTS
        if observer_factory is None:
            if polling:

                def observer_factory() -> BaseObserver:
                    return PollingObserver(timeout=poll_interval_s)
            else:
                observer_factory = Observer
        self._observer = observer_factory()
        self._handler = _Handler(self._event_path)
        self._lock = threading.Lock()
        self._dirty: dict[Path, WatchRoot] = {}
        self._scheduled: set[Path] = set()
        self._started = False

    def start(self) -> None:
        """Schedule the roots that exist and start the observer thread."""
        self.ensure_watches()
        self._observer.start()
        self._started = True

    def stop(self) -> None:
        """Stop and join the observer thread (and its emitters)."""
        if self._started:
            self._observer.stop()
            self._observer.join(10.0)
            self._started = False

    def ensure_watches(self) -> None:
        """Schedule watches for roots that exist now (a spool root may appear after we start)."""
        for root in self.roots:
            key = root.directory
            if key in self._scheduled or not key.is_dir():
                continue
            try:
                self._observer.schedule(
                    self._handler, str(key), recursive=root.recursive, event_filter=self._event_filter
                )
            except OSError as exc:  # e.g. inotify watch limit: the rescans still see the files
                log.warning("cannot watch %s (%s); relying on rescans every few seconds", key, exc)
                continue
            self._scheduled.add(key)

    def root_of(self, path: Path) -> WatchRoot | None:
        """The root a path belongs to, or None when it is no dump of any root."""
        for root in self.roots:
            if root.matches(path):
                return root
        return None

    def _event_path(self, path: Path) -> None:
        root = self.root_of(path)
        if root is not None:
            with self._lock:
                self._dirty[path] = root

    def mark(self, path: Path, root: WatchRoot) -> None:
        """Mark a path dirty (used by rescans, and to look at a file again at the next flush)."""
        with self._lock:
            self._dirty[path] = root

    def take(self) -> dict[Path, WatchRoot]:
        """The dirty paths since the last call (then forgotten: the caller marks them again to retry)."""
        with self._lock:
            out, self._dirty = self._dirty, {}
        return out

    def rescan(self) -> Iterator[tuple[Path, WatchRoot]]:
        """Every dump file under every root, whatever the events said."""
        if self._started:
            self.ensure_watches()
        for root in self.roots:
            if not root.directory.is_dir():
                continue
            if root.recursive:
                for dirpath, dirs, files in os.walk(root.directory):
                    dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                    for name in files:
                        path = Path(dirpath) / name
                        if is_dump_name(name):
                            yield path, root
            else:
                try:
                    names = os.listdir(root.directory)
                except OSError:
                    continue
                for name in names:
                    path = root.directory / name
                    if root.matches(path):
                        yield path, root
