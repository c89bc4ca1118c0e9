"""Reader of NIXL's telemetry ring files (`NIXL_TELEMETRY_DIR`), one per agent.

`$NIXL_TELEMETRY_DIR/<agent_name>` is a single-producer, single-consumer ring of per-operation
events: a 40-byte header, then `capacity` fixed-size slots (layouts in docs/nixl-telemetry.md).
Reading is destructive: the consumer reads the slots between `read_pos` and `write_pos`, then
stores `read_pos` so NIXL can reuse them; a ring nobody consumes fills up and NIXL silently drops
new events. So exactly one consumer per file (`flightdeck.collector.nixl_consumer.RingConsumer`,
owned by the collector daemon), and nothing else may write `read_pos`.

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

from flightdeck.readers.nixl import (
    NixlAccessError,
    NixlFormatError,
    event_type_id,
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
