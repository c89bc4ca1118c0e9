"""How the server and the collector tune the interpreter: the cyclic garbage collector (GC) and
the GIL switch interval. These are process-wide, so they are chosen here, in one place, and
applied where a process starts its work: the server app's lifespan (`tuned`), the collector
daemon's start (`tune`), and around each batch the server decodes (`GC_PAUSE`). "GC" here is
Python's cyclic garbage collector, never Flightdeck's collector daemon.

Why the GC is tuned at all: both processes create millions of short-lived, acyclic containers
(decoded batches, entries, rows; unpickled dumps), which reference counting frees at once. With
CPython's default young-generation threshold (700 allocations) the GC runs thousands of times
per batch and re-scans the long-lived summaries each time, finding nothing: that halved the
server's ingest throughput, and was a third of the collector's CPU.
"""

from __future__ import annotations

import gc
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Tuning:
    """One process's interpreter settings."""

    #: `gc.set_threshold` (allocations between young collections, then the older generations').
    gc_threshold: tuple[int, int, int]
    #: `sys.setswitchinterval` in seconds; None leaves the interpreter's (5 ms).
    switch_interval_s: float | None = None


#: The server. The diagnosis thread runs long pure-Python loops; an ingest thread or the event
#: loop waiting for the GIL after every socket read or database round trip would wait out a
#: whole switch interval (5 ms by default) each time: a 100 ms request for 2 ms of work.
SERVER = Tuning(gc_threshold=(50_000, 20, 100), switch_interval_s=0.0005)
#: The collector daemon: each snapshot read unpickles ~10,000 short-lived containers.
COLLECTOR_DAEMON = Tuning(gc_threshold=(100_000, 20, 100))


def tune(tuning: Tuning) -> None:
    """Apply `tuning` for the rest of the process. What start-up allocated (modules, settings,
    templates) lives as long as the process: it is frozen out of every later collection."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*tuning.gc_threshold)
    if tuning.switch_interval_s is not None:
        sys.setswitchinterval(tuning.switch_interval_s)


_lock = threading.Lock()
_users = 0
_before: tuple[tuple[int, int, int], float] | None = None


@contextmanager
def tuned(tuning: Tuning) -> Iterator[None]:
    """`tune` while the block runs (an app's lifespan), then the interpreter's settings as they
    were, frozen objects unfrozen: a process that runs several apps one after the other (tests)
    does not keep what one of them froze. Nested or overlapping blocks share one tuning: the
    first applies it, the last restores."""
    global _users, _before
    with _lock:
        _users += 1
        if _users == 1:
            t0, t1, t2 = gc.get_threshold()
            _before = ((t0, t1, t2), sys.getswitchinterval())
            tune(tuning)
    try:
        yield
    finally:
        with _lock:
            _users -= 1
            if _users == 0 and _before is not None:
                threshold, interval = _before
                gc.set_threshold(*threshold)
                sys.setswitchinterval(interval)
                gc.unfreeze()
                _before = None


class GcPause:
    """Keeps the cyclic garbage collector off while ingest threads decode batches.

    Parsing a batch creates ~10 containers per entry that all live until the batch is decoded,
    so every young-generation collection during a decode scans tens of thousands of objects and
    frees none (a quarter of ingest time at 50,000 allocations per collection). Nothing a decode
    creates is cyclic, and reference counting frees it, so the GC is paused while any thread
    decodes and resumes when the last one is done. Under a sustained, overlapping load the pause
    could last; the thread leaving a pause that has lasted over `max_pause_s` runs a young
    collection, and a full one every `full_every` of those, so garbage never piles up.
    """

    def __init__(self, *, max_pause_s: float = 1.0, full_every: int = 10) -> None:
        self._lock = threading.Lock()
        self._depth = 0
        #: Whether this pause turned the GC off (it stays off if something else had).
        self._owned = False
        self._since = 0.0
        self._forced = 0
        self._max_pause_s = max_pause_s
        self._full_every = full_every

    def __enter__(self) -> None:
        with self._lock:
            if self._depth == 0:
                self._owned = gc.isenabled()
                if self._owned:
                    gc.disable()
                self._since = time.monotonic()
            self._depth += 1

    def __exit__(self, *_exc: object) -> None:
        generation: int | None = None
        with self._lock:
            self._depth -= 1
            if self._depth == 0:
                if self._owned:
                    gc.enable()
            elif self._owned and time.monotonic() - self._since > self._max_pause_s:
                self._since = time.monotonic()
                self._forced += 1
                generation = 2 if self._forced % self._full_every == 0 else 1
        if generation is not None:
            gc.collect(generation)


#: One per process: the garbage collector is process-wide.
GC_PAUSE = GcPause()


def _mapped_libraries() -> str:
    """The paths of what is mapped into this process (/proc/self/maps; empty where unreadable)."""
    try:
        with open("/proc/self/maps", encoding="ascii", errors="replace") as maps:
            return maps.read()
    except OSError:
        return ""


def allocator_in_use() -> str:
    """The allocator of this process's objects: `pymalloc` when CPython's small-object allocator
    serves them (it counts their blocks); otherwise the C library's malloc, named for what
    provides it: `jemalloc` or `mimalloc` when that library is mapped into the process
    (preloaded), else `malloc`."""
    if sys.getallocatedblocks() > 0:
        return "pymalloc"
    maps = _mapped_libraries()
    return next((name for name in ("jemalloc", "mimalloc") if f"lib{name}" in maps), "malloc")
