"""The collector's consumer of NIXL's telemetry ring files: one `RingConsumer` per file.

Reading a ring is destructive (`flightdeck.readers.nixl_ring`, which knows the file format): the
consumer stores `read_pos` so NIXL can reuse the slots, so exactly one consumer per file, owned by the
collector daemon, and nothing else may write `read_pos`. This module keeps what one read cannot:
the cumulative counters across polls, agent restarts, and the process that owns each ring (found
through `/proc`, re-checked for pid reuse).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from flightdeck.nixl_records import NixlSample
from flightdeck.readers.nixl import (
    DEFAULT_BUCKET_BOUNDS_US,
    Accumulator,
    NixlAccessError,
    NixlError,
    parse_local_rank,
)
from flightdeck.readers.nixl_ring import RingRead, read_ring

# --- owning process ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Owner:
    """The process that has a ring file mmapped (the NIXL agent's process)."""

    pid: int
    #: Start time in clock ticks since boot (/proc/<pid>/stat field 22), to detect pid reuse.
    start_ticks: int
    local_rank: int | None


class OwnerFinder:
    """Finds the process that mmaps a file, through `<proc_root>/*/maps`.

    A full scan reads every process's maps, so callers cache the result and re-check it with
    `still_alive` (one small read) instead. A line matches when its device and inode are the
    file's, or its path is the file's real path (device numbers differ on overlay filesystems).
    """

    def __init__(self, proc_root: Path = Path("/proc"), *, exclude_pid: int | None = None) -> None:
        self.proc_root = proc_root
        #: Our own process never counts as an owner (we read with pread, but be explicit).
        self.exclude_pid = os.getpid() if exclude_pid is None else exclude_pid

    def find(self, path: Path, *, st_dev: int, st_ino: int) -> Owner | None:
        """The owner of `path`; the lowest pid when several map it (forked children inherit the
        mapping, and they come after the parent that created the agent)."""
        real = os.fsencode(os.path.realpath(path))
        ino_token = b" %d " % st_ino
        dev_token = b"%02x:%02x" % (os.major(st_dev), os.minor(st_dev))
        try:
            entries = os.listdir(self.proc_root)
        except OSError:
            return None
        pids = sorted(int(e) for e in entries if e.isdigit())
        for pid in pids:
            if pid == self.exclude_pid:
                continue
            try:
                with open(self.proc_root / str(pid) / "maps", "rb") as f:
                    maps = f.read()
            except OSError:  # gone, or not ours to read
                continue
            if (ino_token in maps or real in maps) and _maps_match(maps, real, dev_token, st_ino):
                start = self._start_ticks(pid)
                if start is None:
                    continue
                return Owner(pid=pid, start_ticks=start, local_rank=self.local_rank(pid))
        return None

    def still_alive(self, owner: Owner) -> bool:
        """Whether the same process (not a reused pid) still exists."""
        return self._start_ticks(owner.pid) == owner.start_ticks

    def local_rank(self, pid: int) -> int | None:
        """`LOCAL_RANK` from the process's initial environment; None when unset or unreadable.

        /proc/<pid>/environ shows the environment at exec, which is where launchers (torchrun,
        vLLM's workers) put LOCAL_RANK.
        """
        try:
            with open(self.proc_root / str(pid) / "environ", "rb") as f:
                env = f.read()
        except OSError:
            return None
        for item in env.split(b"\0"):
            if item.startswith(b"LOCAL_RANK="):
                return parse_local_rank(item[len(b"LOCAL_RANK=") :])
        return None

    def _start_ticks(self, pid: int) -> int | None:
        try:
            with open(self.proc_root / str(pid) / "stat", "rb") as f:
                stat = f.read()
        except OSError:
            return None
        # comm (field 2) may hold spaces and parentheses: split after the last ')'.
        fields = stat[stat.rfind(b")") + 2 :].split()
        try:
            return int(fields[19])  # field 22, counting from field 3 at index 0
        except (IndexError, ValueError):
            return None


def _maps_match(maps: bytes, real: bytes, dev_token: bytes, st_ino: int) -> bool:
    for line in maps.splitlines():
        # address perms offset dev inode [path]; the path may contain spaces.
        parts = line.split(None, 5)
        if len(parts) < 5:
            continue
        if parts[3] == dev_token and parts[4] == b"%d" % st_ino:
            return True
        if len(parts) == 6 and parts[5] == real:
            return True
    return False


# --- the stateful consumer -----------------------------------------------------------------------


class RingConsumer:
    """The one consumer of one ring file: reads new events, keeps cumulative counters.

    `poll()` consumes what NIXL wrote since the last poll and returns the sample of everything
    consumed by this instance so far. Counters keep growing across agent restarts (NIXL resets
    both positions; we notice and go on from the reset positions); `run` names this instance, so
    a collector restart starts a new counter lifetime.
    """

    def __init__(
        self,
        path: Path,
        *,
        host: str,
        clock: Callable[[], int] = time.time_ns,
        owner_finder: OwnerFinder | None = None,
        bounds_us: tuple[float, ...] = DEFAULT_BUCKET_BOUNDS_US,
        owner_rescan_ns: int = 30_000_000_000,
    ) -> None:
        self.path = path
        self.host = host
        self.clock = clock
        self.owner_finder = owner_finder or OwnerFinder()
        #: How often to look for the owner again while it is unknown (a full /proc scan).
        self.owner_rescan_ns = owner_rescan_ns
        self.acc = Accumulator(bounds_us)
        self.run = f"{os.getpid()}.{clock()}"
        self.restarts = 0
        self.ring_full_reads = 0
        self.events_read = 0
        #: The last read, for inspection (events and header).
        self.last_read: RingRead | None = None
        self._identity: tuple[int, int, int, int] | None = None  # dev, ino, version, capacity
        self._expected_read_pos: int | None = None
        self._owner: Owner | None = None
        self._owner_scanned_ns: int | None = None

    @property
    def agent(self) -> str:
        """The agent name: NIXL names the ring file after the agent."""
        return self.path.name

    def poll(self) -> NixlSample:
        """Consume new events and return the cumulative sample.

        Raises NixlFormatError (nothing written) when the file is not a ring NIXL wrote,
        NixlAccessError when it cannot be opened read-write, FileNotFoundError when it is gone.
        """
        r = read_ring(self.path, consume=True, clock=self.clock)
        h = r.header
        identity = (r.st_dev, r.st_ino, h.version, h.capacity)
        restarted = self._identity is not None and (
            identity != self._identity or h.read_pos != self._expected_read_pos
        )
        if restarted:
            self.restarts += 1
        self._identity = identity
        self._expected_read_pos = h.write_pos if r.consumed else h.read_pos
        if h.full:
            self.ring_full_reads += 1
        self.acc.add_many(r.events)
        self.events_read += len(r.events)
        self.last_read = r
        owner = self._find_owner(r, force=restarted)
        return self.acc.sample(
            host=self.host,
            agent=self.agent,
            pid=owner.pid if owner else None,
            local_rank=owner.local_rank if owner else None,
            source="ring",
            read_time_ns=r.read_time_ns,
            run=self.run,
            format_version=h.version,
            writer_alive=True if owner else None,
            restarts=self.restarts,
            ring_full_reads=self.ring_full_reads,
        )

    def _find_owner(self, r: RingRead, *, force: bool) -> Owner | None:
        if self._owner is not None and not force and self.owner_finder.still_alive(self._owner):
            return self._owner
        now = r.read_time_ns
        if (
            not force
            and self._owner is None
            and self._owner_scanned_ns is not None
            and now - self._owner_scanned_ns < self.owner_rescan_ns
        ):
            return None
        self._owner_scanned_ns = now
        self._owner = self.owner_finder.find(r.path, st_dev=r.st_dev, st_ino=r.st_ino)
        return self._owner


class RingDirectory:
    """One `RingConsumer` per ring file in a NIXL_TELEMETRY_DIR; what the collector daemon polls."""

    def __init__(
        self,
        directory: Path,
        *,
        host: str,
        clock: Callable[[], int] = time.time_ns,
        owner_finder: OwnerFinder | None = None,
        bounds_us: tuple[float, ...] = DEFAULT_BUCKET_BOUNDS_US,
    ) -> None:
        self.directory = directory
        self.host = host
        self.clock = clock
        self.owner_finder = owner_finder or OwnerFinder()
        self.bounds_us = bounds_us
        self.consumers: dict[str, RingConsumer] = {}
        #: Totals over every consumer this directory had (dropped ones included), for counters:
        #: reads that found a ring full (NIXL was discarding events) and events of unknown type.
        self.ring_full_reads = 0
        self.unknown_events = 0

    def poll(self) -> tuple[list[NixlSample], list[NixlError]]:
        """Poll every ring file; a bad or unreadable file yields an error, not hiding the others.

        Consumers of files that disappeared are dropped (NIXL never deletes rings, so a person
        did).
        """
        samples: list[NixlSample] = []
        failures: list[NixlError] = []
        try:
            names = sorted(e.name for e in os.scandir(self.directory) if e.is_file(follow_symlinks=False))
        except FileNotFoundError:
            names = []
        for gone in self.consumers.keys() - set(names):
            del self.consumers[gone]
        for name in names:
            consumer = self.consumers.get(name)
            if consumer is None:
                consumer = RingConsumer(
                    self.directory / name,
                    host=self.host,
                    clock=self.clock,
                    owner_finder=self.owner_finder,
                    bounds_us=self.bounds_us,
                )
                self.consumers[name] = consumer
            full, unknown = consumer.ring_full_reads, consumer.acc.unknown
            try:
                samples.append(consumer.poll())
            except NixlError as e:
                failures.append(e)
            except FileNotFoundError:  # removed since the listing
                continue
            except OSError as e:  # an I/O error on one file must not stop the others
                failures.append(NixlAccessError(f"{consumer.path}: {e}"))
            finally:
                self.ring_full_reads += consumer.ring_full_reads - full
                self.unknown_events += consumer.acc.unknown - unknown
        return samples, failures
