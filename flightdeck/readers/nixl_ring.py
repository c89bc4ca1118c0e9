"""Reader of NIXL's telemetry ring files (`NIXL_TELEMETRY_DIR`), one per agent.

`$NIXL_TELEMETRY_DIR/<agent_name>` is a single-producer, single-consumer ring of per-operation
events: a 40-byte header, then `capacity` fixed-size slots (layouts in docs/nixl-telemetry.md).
Reading is destructive: the consumer reads the slots between `read_pos` and `write_pos`, then
stores `read_pos` so NIXL can reuse them; a ring nobody consumes fills up and NIXL silently drops
new events. So exactly one `RingConsumer` per file, owned by the collector daemon, and nothing
else may write `read_pos`.

What we write: only the 8 bytes of `read_pos` (offset 8), only after the header and the file size
validated, and only when there were events. Files are never created, truncated or deleted.

Verified with NIXL 1.0.1, 1.1.0, 1.2.0, 1.3.2 and 1.5.1 (files under tests/data/nixl): both
positions are stored already masked (0 ≤ pos < capacity), so `write_pos` going backwards is the
normal wrap-around, not a restart; an agent restart shows as `read_pos` differing from the value
we stored (NIXL resets both to 0) or as a new inode.
"""

from __future__ import annotations

import errno
import os
import stat
import struct
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
    NixlFormatError,
    event_type_id,
    parse_local_rank,
)

RING_HEADER = struct.Struct("<QQiiQQ")  # write_pos, read_pos, version, expected_version, capacity, mask
RING_HEADER_SIZE = RING_HEADER.size  # 40
READ_POS = struct.Struct("<Q")
READ_POS_OFFSET = 8
KNOWN_VERSIONS = (1, 2, 3, 4)
#: Larger files are refused unread: a ring of 2**22 events of the largest layout (56 bytes) fits.
MAX_RING_BYTES = RING_HEADER_SIZE + 56 * 2**22

# Event layouts, named by version and slot size. A decoder yields (event id or -1, value).
_V1 = struct.Struct("<Qi32s4xQ")  # timestamp_us, category, name, pad, value
_V2_48 = struct.Struct("<i32s4xQ")  # category, name, pad, value
_V2_16 = struct.Struct("<iIQ")  # category, event type, value
_V3_16 = struct.Struct("<I4xQ")  # event type, 4 uninitialised bytes (ignored), value
#: (layout, slot size) candidates per version; the file size picks one.
_CANDIDATES: dict[int, tuple[tuple[str, int], ...]] = {
    1: (("v1", _V1.size),),
    2: (("v2-48", _V2_48.size), ("v2-16", _V2_16.size)),
    3: (("v3", _V3_16.size),),
    4: (("v3", _V3_16.size),),
}


@dataclass(frozen=True, slots=True)
class RingHeader:
    """A validated ring header plus what the file size says about its slots."""

    write_pos: int
    read_pos: int
    version: int
    capacity: int
    #: "v1" (56-byte slots), "v2-48" (1.1.x), "v2-16" (1.2.x) or "v3" (16-byte, versions 3 and 4).
    layout: str
    event_size: int

    @property
    def mask(self) -> int:
        """capacity − 1: positions are taken modulo capacity."""
        return self.capacity - 1

    @property
    def unread(self) -> int:
        """Events between read_pos and write_pos; the ring is full at capacity − 1."""
        return (self.write_pos - self.read_pos) & self.mask

    @property
    def full(self) -> bool:
        """True when NIXL can store no more events (it discards new ones silently)."""
        return self.unread == self.capacity - 1


@dataclass(frozen=True, slots=True)
class RingRead:
    """What one read of a ring file found."""

    path: Path
    header: RingHeader
    #: (event id in EVENT_TYPES order, value) in ring order; an unknown v1/v2 name gives -1, an
    #: unknown id of a later version stays as written (both are counted as unknown).
    events: list[tuple[int, int]]
    #: When the file was read (epoch ns): the only time stamp events of version ≥ 2 get.
    read_time_ns: int
    #: Whether read_pos was advanced in the file (consuming read with events).
    consumed: bool
    st_dev: int
    st_ino: int


def parse_ring_header(data: bytes, *, path: Path) -> RingHeader:
    """Validate a ring file's header against its size (`data` is the whole file).

    Raises NixlFormatError for a truncated header, an unknown version, a capacity that is not a
    power of two, an inconsistent mask, a size that does not match capacity × slot size, or a
    position outside the ring (NIXL stores both masked: 0 ≤ pos < capacity; anything else is a
    corrupt or foreign file, whose "unread" slots would be phantom events).
    """
    size = len(data)
    if size < RING_HEADER_SIZE:
        raise NixlFormatError(f"{path}: truncated NIXL ring header: {size} bytes, need {RING_HEADER_SIZE}")
    write_pos, read_pos, version, expected, capacity, mask = RING_HEADER.unpack_from(data, 0)
    if version not in KNOWN_VERSIONS:
        raise NixlFormatError(
            f"{path}: unsupported NIXL ring version {version} (this reader knows versions "
            f"{', '.join(map(str, KNOWN_VERSIONS))}); a newer NIXL needs a newer Flightdeck"
        )
    if expected != version:
        raise NixlFormatError(f"{path}: ring version {version} but expected_version {expected}")
    if capacity <= 0 or capacity & (capacity - 1):
        raise NixlFormatError(f"{path}: ring capacity {capacity} is not a power of two")
    if mask != capacity - 1:
        raise NixlFormatError(f"{path}: ring mask {mask} is not capacity − 1 = {capacity - 1}")
    for name, pos in (("write_pos", write_pos), ("read_pos", read_pos)):
        if pos >= capacity:
            raise NixlFormatError(
                f"{path}: ring {name} {pos} is outside the ring (capacity {capacity}); refused, "
                "nothing read or written"
            )
    body = size - RING_HEADER_SIZE
    # Version 2 has two layouts: 1.1.x kept the 48-byte named events, 1.2.x has 16-byte ids.
    fitting = [c for c in _CANDIDATES[version] if body == capacity * c[1]]
    if not fitting:
        want = " or ".join(str(RING_HEADER_SIZE + capacity * es) for _, es in _CANDIDATES[version])
        raise NixlFormatError(
            f"{path}: ring file is {size} bytes but version {version} with capacity {capacity} "
            f"needs {want} bytes"
        )
    layout, event_size = fitting[0]
    return RingHeader(
        write_pos=write_pos,
        read_pos=read_pos,
        version=version,
        capacity=capacity,
        layout=layout,
        event_size=event_size,
    )


def decode_events(data: bytes, header: RingHeader) -> list[tuple[int, int]]:
    """Decode the unread slots (read_pos up to write_pos, wrapping) of a whole-file buffer."""
    n = header.unread
    if n == 0:
        return []
    start = header.read_pos & header.mask
    es = header.event_size
    view = memoryview(data)
    first = min(n, header.capacity - start)
    chunks = [view[RING_HEADER_SIZE + start * es : RING_HEADER_SIZE + (start + first) * es]]
    if first < n:  # wrapped: the rest starts at slot 0
        chunks.append(view[RING_HEADER_SIZE : RING_HEADER_SIZE + (n - first) * es])
    out: list[tuple[int, int]] = []
    for chunk in chunks:
        out.extend(_decode(header.layout, chunk))
    return out


def _decode(layout: str, chunk: memoryview) -> list[tuple[int, int]]:
    # struct.iter_unpack walks the buffer in C; only the per-event tuple is built in Python.
    if layout == "v3":
        return list(_V3_16.iter_unpack(chunk))
    if layout == "v2-16":
        return [(t, v) for _cat, t, v in _V2_16.iter_unpack(chunk)]
    if layout == "v2-48":
        return [(_name_id(n), v) for _cat, n, v in _V2_48.iter_unpack(chunk)]
    return [(_name_id(n), v) for _ts, _cat, n, v in _V1.iter_unpack(chunk)]


_NAME_CACHE: dict[bytes, int] = {}


def _name_id(raw: bytes) -> int:
    # Names repeat endlessly (a handful per release), so decode each distinct raw field once.
    i = _NAME_CACHE.get(raw)
    if i is None:
        found = event_type_id(raw.split(b"\0", 1)[0].decode("ascii", "replace"))
        i = -1 if found is None else found
        if len(_NAME_CACHE) < 1024:
            _NAME_CACHE[raw] = i
    return i


def read_ring(
    path: Path,
    *,
    consume: bool,
    clock: Callable[[], int] = time.time_ns,
) -> RingRead:
    """Read a ring file's unread events with one read; with `consume`, then advance read_pos.

    Raises NixlFormatError (nothing written) for a file that is not a ring, NixlAccessError when
    it cannot be opened, FileNotFoundError when it is gone.

    Without `consume` the file is opened read-only and nothing changes (a peek: NIXL keeps the
    events and the ring fills up). With it, read_pos becomes the write_pos we saw, which equals
    read_pos + unread whether NIXL stores positions masked (as verified) or not.
    """
    if not stat.S_ISREG(os.lstat(path).st_mode):  # a FIFO would block the open; a device, worse
        raise NixlFormatError(f"{path}: not a regular file; not opened")
    flags = os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, (os.O_RDWR if consume else os.O_RDONLY) | flags)
    except PermissionError as e:
        how = "read-write (a consumer stores read_pos)" if consume else "for reading"
        raise NixlAccessError(f"{path}: cannot open {how}: {e.strerror}") from e
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise NixlFormatError(f"{path}: is a symlink; not followed") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NixlFormatError(f"{path}: not a regular file")
        if st.st_size > MAX_RING_BYTES:  # a stray big file in the directory: do not slurp it
            raise NixlFormatError(f"{path}: {st.st_size} bytes is too large for a NIXL ring file")
        data = os.pread(fd, st.st_size, 0)
        read_time_ns = clock()
        header = parse_ring_header(data, path=path)
        events = decode_events(data, header)
        consumed = False
        if consume and events:
            os.pwrite(fd, READ_POS.pack(header.write_pos), READ_POS_OFFSET)
            consumed = True
        return RingRead(
            path=path,
            header=header,
            events=events,
            read_time_ns=read_time_ns,
            consumed=consumed,
            st_dev=st.st_dev,
            st_ino=st.st_ino,
        )
    finally:
        os.close(fd)


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
