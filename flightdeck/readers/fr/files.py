"""Dump files on disk -> `LoadedDump` (decoded, not normalized yet) or `RankDump`.

Regular files read without ever blocking (`read_regular`), the agent's sidecar beside a dump
(`read_meta`), a file's rank (its sidecar's, else its name's), `load_dump_file` and `LoadedDump`,
`read_dump_file`, and `discover` (the candidate dump files under some paths).
"""

from __future__ import annotations

import errno
import json
import os
import stat as stat_mod
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from flightdeck.readers.fr.columns import EntryColumns
from flightdeck.readers.fr.decode import DEFAULT_BUDGET, DumpBudget, check_budget, load_raw
from flightdeck.readers.fr.errors import DumpError, DumpTooLargeError, NotADumpError, NotRegularFileError
from flightdeck.readers.fr.groups import _outside_pg_config
from flightdeck.readers.fr.parse import parse_columns, parse_dump, parse_signatures
from flightdeck.readers.fr.scan import EntryRow, EntryScan, entry_rows, scan_entries
from flightdeck.readers.fr.signatures import SignatureColumns
from flightdeck.records import RankDump
from flightdeck.spool import is_dump_name, is_sidecar, rank_from_name, sidecar_path


def _warn(msg: str, *args: object) -> None:
    """Log a warning; `logging` is imported here, on the first one, not when the reader is (it
    was ~15-25 ms of `flightdeck analyze`'s start-up, which logs nothing on good input)."""
    import logging

    logging.getLogger(__name__).warning(msg, *args)


#: Default cap on a dump file's size: a 2,000-entry dump with frames is ~0.3-1 MB.
DEFAULT_MAX_BYTES = 256 * 1024 * 1024
#: A sidecar is a few KB (its largest part: the world group's member list); larger is not ours.
MAX_META_BYTES = 16 * 1024 * 1024

#: What a path that is not a regular file is, by `stat.S_IFMT` (the `reason` of a skipped file).
_FILE_KINDS: dict[int, str] = {
    stat_mod.S_IFIFO: "fifo",
    stat_mod.S_IFSOCK: "socket",
    stat_mod.S_IFCHR: "device",
    stat_mod.S_IFBLK: "device",
    stat_mod.S_IFDIR: "directory",
    stat_mod.S_IFLNK: "symlink",
}
#: Every `NotRegularFileError.kind`.
FILE_KINDS = ("fifo", "socket", "device", "directory", "symlink", "other")


def _not_regular(st: os.stat_result) -> NotRegularFileError | None:
    if stat_mod.S_ISREG(st.st_mode):
        return None
    kind = _FILE_KINDS.get(stat_mod.S_IFMT(st.st_mode), "other")
    return NotRegularFileError(f"not a regular file (a {kind}): not opened", kind)


def read_regular(path: Path, *, max_bytes: int, head: bool = False) -> tuple[bytes, os.stat_result]:
    """The bytes of a regular file of at most `max_bytes`, and its stat (after opening), never blocking.

    The path is looked at with lstat first, so a FIFO, socket or device is never opened (opening a
    FIFO blocks until a writer comes; opening some devices has side effects), nor a symlink
    followed; then it is opened non-blocking without following a symlink, and fstat confirms a
    regular file (it could have been swapped in between). Raises NotRegularFileError for anything
    else, DumpTooLargeError over `max_bytes` (with `head`: the first max_bytes + 1 bytes instead),
    OSError when it cannot be read.
    """
    bad = _not_regular(os.lstat(path))
    if bad is not None:
        raise bad
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # became a symlink after the lstat
            raise NotRegularFileError("not a regular file (a symlink): not followed", "symlink") from None
        raise
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fd)
        bad = _not_regular(st)
        if bad is not None:
            raise bad
        if head:
            return fh.read(max_bytes + 1), st
        if st.st_size > max_bytes:
            raise DumpTooLargeError(f"{st.st_size} bytes is over the {max_bytes}-byte limit")
        # The size is known: ask for a little more than it (a file growing while we read is cut at
        # the limit), not for max_bytes, which makes the reader allocate that much up front.
        data = fh.read(min(max_bytes, st.st_size + 65536) + 1)
    if len(data) > max_bytes:
        raise DumpTooLargeError(f"more than the {max_bytes}-byte limit (the file grew while read)")
    return data, st


def read_meta(path: Path) -> dict[str, Any] | None:
    """The agent's sidecar for a dump file, or None when there is none or it is unreadable."""
    mp = sidecar_path(path)
    try:
        data, _st = read_regular(mp, max_bytes=MAX_META_BYTES)
    except (NotRegularFileError, DumpTooLargeError) as exc:
        _warn("%s: metadata sidecar ignored: %s", mp, exc)
        return None
    except OSError:
        return None
    try:
        meta = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError):
        _warn("%s: metadata sidecar is not valid JSON; ignored", mp)
        return None
    return meta if is_sidecar(meta) else None


class _Unread:
    """`load_dump_file`'s default `meta`: the sidecar is read there."""


UNREAD = _Unread()


@dataclass(slots=True)
class LoadedDump:
    """A dump file decoded (safely) but not normalized yet, with what identifies its rank.

    `read_dump_file` is `load_dump_file(...).parse()`; the collector scans the entries
    (`scan`) and normalizes only those it ships (`parse(only=...)`).
    """

    raw: dict[str, Any]
    rank: int
    source: str
    meta: dict[str, Any] | None
    mtime_ns: int
    #: Size of the dump file in bytes.
    size: int
    #: What normalizing it may cost (checked by `parse` on the entries it normalizes).
    budget: DumpBudget = DEFAULT_BUDGET

    @property
    def entry_count(self) -> int:
        """Entries in the file."""
        return len(self.raw.get("entries") or [])

    def scan(self) -> list[EntryScan] | None:
        """`scan_entries` of this dump."""
        return scan_entries(self.raw)

    def rows(self) -> tuple[list[EntryRow], bool] | None:
        """`entry_rows` of this dump."""
        return entry_rows(self.raw)

    def without_entries(self) -> LoadedDump:
        """This dump without its entries: what stays true of the file while its bytes do not change."""
        return replace(self, raw={k: v for k, v in self.raw.items() if k != "entries"})

    def with_sidecar_of(self, path: Path, *, mtime_ns: int, size: int) -> LoadedDump | None:
        """This dump with `path`'s sidecar read again (the same bytes rewritten with a new sidecar);
        None when the sidecar now names another rank."""
        meta = read_meta(path)
        if _rank_of(path, meta) != self.rank:
            return None
        return replace(self, source=str(path), meta=meta, mtime_ns=mtime_ns, size=size)

    def parse(
        self,
        *,
        only: Collection[int] | None = None,
        scan: list[EntryScan] | None = None,
        at: Iterable[int] | None = None,
    ) -> RankDump:
        """Normalize the dump; with `only`, just the entries whose record id is in it.

        `scan` (this dump's `scan()`) saves looking the record ids up again when `only` is given;
        `at` narrows the look to those entry positions (file order). Metadata (groups of
        pg_config, sidecar, times) is the whole file's either way.
        """
        raw = self.raw
        if only is not None:
            entries = raw.get("entries") or []
            if not only:
                picked = []
            elif at is not None:
                picked = [e for e in map(entries.__getitem__, at) if e.get("record_id") in only]
            elif scan is not None:
                picked = [e for e, k in zip(entries, scan, strict=True) if k[0] in only]
            else:
                picked = [e for e in entries if isinstance(e, dict) and e.get("record_id") in only]
            raw = dict(raw, entries=picked)
        check_budget(raw, self.budget)
        return parse_dump(raw, rank=self.rank, source=self.source, meta=self.meta, mtime_ns=self.mtime_ns)

    def parse_signatures(self) -> tuple[RankDump, SignatureColumns] | None:
        """`parse_signatures` of the whole dump, within its budget; None where `parse_columns`
        or `parse` must do it."""
        return parse_signatures(
            self.raw,
            rank=self.rank,
            source=self.source,
            meta=self.meta,
            mtime_ns=self.mtime_ns,
            budget=self.budget,
        )

    def parse_columns(self) -> tuple[RankDump, EntryColumns] | None:
        """`parse_columns` of the whole dump, within its budget; None where `parse` must do it."""
        check_budget(self.raw, self.budget)
        return parse_columns(
            self.raw, rank=self.rank, source=self.source, meta=self.meta, mtime_ns=self.mtime_ns
        )


def read_dump_bytes(path: Path, *, max_bytes: int = DEFAULT_MAX_BYTES) -> tuple[bytes, os.stat_result]:
    """A dump file's bytes and its stat, within `max_bytes`, or a DumpError saying why not."""
    try:
        return read_regular(path, max_bytes=max_bytes)
    except OSError as exc:
        raise DumpError(f"cannot read: {exc.strerror}") from None


def load_dump_file(
    path: Path,
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
    data: bytes | None = None,
    st: os.stat_result | None = None,
    budget: DumpBudget = DEFAULT_BUDGET,
    meta: dict[str, Any] | _Unread | None = UNREAD,
) -> LoadedDump:
    """Decode one dump file and its sidecar without normalizing, or raise a DumpError saying why.

    `data` and `st` are the file's bytes and stat when the caller has read them already
    (`read_dump_bytes`); `meta` its sidecar (`read_meta`), when the caller has read it.
    """
    if data is None or st is None:
        data, st = read_dump_bytes(path, max_bytes=max_bytes)
    raw = load_raw(data, budget=budget)
    if isinstance(meta, _Unread):
        meta = read_meta(path)
    rank = _rank_of(path, meta)
    if rank is None:
        raise NotADumpError("no rank: the name has no rank_<N> suffix and there is no metadata sidecar")
    if not (meta and isinstance(meta.get("rank"), int)):
        why = _outside_pg_config(raw, rank)
        if why is not None:
            raise NotADumpError(why)
    return LoadedDump(raw, rank, str(path), meta, st.st_mtime_ns, st.st_size, budget)


def _rank_of(path: Path, meta: dict[str, Any] | None) -> int | None:
    """The rank of a dump file: its sidecar's, else the one in its name."""
    rank = meta.get("rank") if meta else None
    return rank if isinstance(rank, int) else rank_from_name(path.name)


def read_dump_file(
    path: Path, *, max_bytes: int = DEFAULT_MAX_BYTES, budget: DumpBudget = DEFAULT_BUDGET
) -> RankDump:
    """Read one dump file (and its sidecar) into a RankDump, or raise a DumpError saying why."""
    return load_dump_file(path, max_bytes=max_bytes, budget=budget).parse()


def discover(paths: Iterable[Path]) -> Iterator[Path]:
    """Candidate dump files under the given files/directories (recursively), in a stable order."""
    for p in paths:
        if p.is_dir():
            for root, dirs, files in os.walk(p):
                dirs.sort()
                for name in sorted(files):
                    if is_dump_name(name):
                        yield Path(root) / name
        elif p.exists():
            yield p
        else:
            raise FileNotFoundError(str(p))
