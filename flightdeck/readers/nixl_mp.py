"""Reader of NIXL's `prometheus_mp` store files (`NIXL_TELEMETRY_EXPORTER=prometheus_mp`).

Each NIXL agent of each process keeps its cumulative counters and histograms in
`$NIXL_TELEMETRY_MULTIPROC_DIR/nixl.<pid>.<run_ns>.<instance>.mmap`, exactly 6800 bytes, little
endian (layout in docs/nixl-telemetry.md). Reading is non-destructive: any number of readers may
look, and the writer never notices. The same directory also holds NIXL's HTTP-owner election lock
(`nixl-owner.<addr>:<port>.lock`), which is not a store and is skipped by `read_mp_dir`.
"""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import itertools
import os
import re
import stat
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from flightdeck.nixl_records import Histogram, NixlSample
from flightdeck.readers.nixl import (
    EVENT_TYPES,
    NixlAccessError,
    NixlError,
    NixlFormatError,
    parse_local_rank,
    sample_counters,
)

MP_MAGIC = 0x3153504D4C58494E  # b"NIXLMPS1" read as a little-endian u64
MP_SCHEMA_VERSION = 1
MP_FILE_SIZE = 6800
MP_MAX_BUCKETS = 32
MP_FILE_RE = re.compile(r"^nixl\.(\d+)\.(\d+)\.(\d+)\.mmap$")

_SLOTS = len(EVENT_TYPES)
# magic, schema, slot count, pid, last update (monotonic ns), instance, bucket count
_HEAD = struct.Struct("<QIIqQQQ")
_AGENT = slice(48, 304)
_HOST = slice(304, 432)
_LOCAL_RANK = slice(432, 496)
_BOUNDS = struct.Struct(f"<{MP_MAX_BUCKETS}d")
_BOUNDS_AT = 496
_U64S = struct.Struct(f"<{_SLOTS}Q")
_COUNTERS_AT = 752
_GAUGES_AT = 920
_HIST = struct.Struct(f"<{_SLOTS * (MP_MAX_BUCKETS + 1)}Q")
_HIST_AT = 1088
_SUMS_AT = 6632


@dataclass(frozen=True, slots=True)
class MpStore:
    """One decoded store file: everything its header and tables say."""

    path: Path
    schema_version: int
    pid: int
    #: CLOCK_MONOTONIC ns of the writer's last update (comparable only on the same boot).
    last_update_monotonic_ns: int
    instance: int
    #: `<run_ns>.<instance>` from the file name, or the file name when it does not follow NIXL's.
    run: str
    agent: str
    hostname: str
    #: The writer's `$LOCAL_RANK` as written (may be empty).
    local_rank_raw: str
    bounds_us: tuple[float, ...]
    #: Per event type (EVENT_TYPES order): cumulative sum, last value.
    counters: tuple[int, ...]
    gauges: tuple[int, ...]
    #: Per event type: bucket counts (len(bounds_us) + 1, non-cumulative, last is +Inf) and sum.
    bucket_counts: tuple[tuple[int, ...], ...]
    hist_sums: tuple[int, ...]
    #: Whether the writer still holds its exclusive flock; None when not checked.
    writer_alive: bool | None

    def histogram(self, type_id: int) -> Histogram:
        """The histogram NIXL keeps for one event type."""
        counts = self.bucket_counts[type_id]
        return Histogram(
            bounds_us=self.bounds_us, counts=counts, sum_us=self.hist_sums[type_id], count=sum(counts)
        )

    def to_sample(self, *, host: str, read_time_ns: int) -> NixlSample:
        """The store as a `NixlSample`; `host` is the collector's host name."""
        return NixlSample(
            host=host,
            agent=self.agent,
            pid=self.pid,
            local_rank=parse_local_rank(self.local_rank_raw),
            source="mp",
            read_time_ns=read_time_ns,
            run=self.run,
            format_version=self.schema_version,
            **sample_counters(self.counters, self.histogram),
            writer_alive=self.writer_alive,
        )


def parse_mp_store(data: bytes, *, path: Path, writer_alive: bool | None = None) -> MpStore:
    """Decode the bytes of one store file; raises NixlFormatError when they are not one."""
    if len(data) != MP_FILE_SIZE:
        raise NixlFormatError(
            f"{path}: not a NIXL prometheus_mp store: size {len(data)} bytes, expected {MP_FILE_SIZE}"
        )
    magic, schema, slots, pid, updated, instance, nbuckets = _HEAD.unpack_from(data, 0)
    if magic != MP_MAGIC:
        raise NixlFormatError(
            f"{path}: not a NIXL prometheus_mp store: magic {magic:#018x}, expected {MP_MAGIC:#018x}"
        )
    if schema != MP_SCHEMA_VERSION:
        raise NixlFormatError(
            f"{path}: unsupported prometheus_mp schema version {schema} (this reader knows "
            f"{MP_SCHEMA_VERSION})"
        )
    if slots != _SLOTS:
        raise NixlFormatError(f"{path}: slot count {slots}, expected {_SLOTS} for schema {schema}")
    if not 0 < nbuckets <= MP_MAX_BUCKETS:
        raise NixlFormatError(f"{path}: bucket count {nbuckets} outside 1..{MP_MAX_BUCKETS}")
    bounds = _BOUNDS.unpack_from(data, _BOUNDS_AT)[:nbuckets]
    if any(a >= b for a, b in itertools.pairwise(bounds)) or not all(0 <= b < float("inf") for b in bounds):
        raise NixlFormatError(f"{path}: bucket bounds are not finite and increasing: {list(bounds)}")
    hist = _HIST.unpack_from(data, _HIST_AT)
    row = MP_MAX_BUCKETS + 1
    m = MP_FILE_RE.match(path.name)
    return MpStore(
        path=path,
        schema_version=schema,
        pid=pid,
        last_update_monotonic_ns=updated,
        instance=instance,
        run=f"{m.group(2)}.{m.group(3)}" if m else path.name,
        agent=_cstr(data[_AGENT]),
        hostname=_cstr(data[_HOST]),
        local_rank_raw=_cstr(data[_LOCAL_RANK]),
        bounds_us=bounds,
        counters=_U64S.unpack_from(data, _COUNTERS_AT),
        gauges=_U64S.unpack_from(data, _GAUGES_AT),
        # Index `nbuckets` of a row is the +Inf bucket; the rest of the row is unused.
        bucket_counts=tuple(tuple(hist[t * row : t * row + nbuckets + 1]) for t in range(_SLOTS)),
        hist_sums=_U64S.unpack_from(data, _SUMS_AT),
        writer_alive=writer_alive,
    )


def read_mp_store(path: Path, *, check_writer: bool = True) -> MpStore:
    """Read one store file (one read), then tell whether its writer is alive.

    Raises NixlFormatError for a file that is not a store, NixlAccessError when it cannot be
    opened, FileNotFoundError when it is gone.

    The writer holds an exclusive flock for its whole life, so a non-blocking shared flock that
    succeeds means it is gone; one that fails changes nothing for the writer. The lock is tried
    only after the bytes parsed, because a writer that is still creating the file has not yet
    written its magic and takes its lock around then: a valid file already belongs to a locked
    writer, or to a dead one.
    """
    if not stat.S_ISREG(os.lstat(path).st_mode):  # a FIFO would block the open; a device, worse
        raise NixlFormatError(f"{path}: not a regular file; not opened")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except PermissionError as e:  # stores are 0600: only the writer's user (or root) may read
        raise NixlAccessError(f"{path}: cannot open for reading: {e.strerror}") from e
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise NixlFormatError(f"{path}: is a symlink; not followed") from None
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NixlFormatError(f"{path}: not a regular file")
        # One byte more than expected, so that a longer file is caught as well as a shorter one.
        data = os.pread(fd, MP_FILE_SIZE + 1, 0)
        store = parse_mp_store(data, path=path)
        if not check_writer:
            return store
        return dataclasses.replace(store, writer_alive=_writer_alive(fd))
    finally:
        os.close(fd)  # also drops our shared lock, if we got it


def read_mp_dir(
    directory: Path,
    *,
    host: str,
    clock: Callable[[], int] = time.time_ns,
) -> tuple[list[NixlSample], list[NixlError]]:
    """Samples of every store file in `directory`, and the errors of the files that failed.

    Files not named like a store (the owner lock, strays) are skipped; a bad or unreadable store
    does not hide the others. Files that vanish between listing and reading are left out.
    """
    samples: list[NixlSample] = []
    failures: list[NixlError] = []
    try:
        names = sorted(os.listdir(directory))
    except FileNotFoundError:
        return samples, failures
    for name in names:
        if not MP_FILE_RE.match(name):
            continue
        try:
            store = read_mp_store(directory / name)
        except NixlError as e:
            failures.append(e)
            continue
        except FileNotFoundError:  # removed since the listing
            continue
        except OSError as e:  # an I/O error on one file must not stop the others
            failures.append(NixlAccessError(f"{directory / name}: {e}"))
            continue
        samples.append(store.to_sample(host=host, read_time_ns=clock()))
    return samples, failures


def _writer_alive(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as e:
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return True
        raise
    fcntl.flock(fd, fcntl.LOCK_UN)
    return False


def _cstr(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode("utf-8", "replace")
