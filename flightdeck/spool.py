"""The spool contract: the files the in-job agent writes and the collector reads, in one place.

The agent (`flightdeck.agent`) writes, and the collector (`flightdeck.collector.watcher`,
`.daemon`, and the reader `flightdeck.readers.fr`) reads, the same names, sidecar keys and ring
split; both import them from here so that the two sides cannot drift. In
`<spool_dir>/<job>/<attempt>/` (`attempt_dir`):

- `rank_<R>.pkl`         a periodic snapshot of the whole ring;
- `rank_<R>.recent.pkl`  a periodic snapshot of only the ring's recent changes (`RingSplitter`);
- `rank_<R>.stall.pkl`   the stall snapshot (frames and every thread's stack);
- `rank_<R>.final.pkl`   the final snapshot (exit, uncaught exception, SIGTERM / SIGINT);
- `X.meta.json`          the sidecar of dump file `X` (`Sidecar`), written before `X`;
- `.X.<pid>.tmp`         a file being written (`temp_path`); renamed into place when complete, so
                         a reader never sees a partial file.

Readers also take files named like PyTorch's own dumps (`comm_lib_trace_rank_3`,
`host-a_rank_3.json`): `rank_from_name` and `is_dump_name` are the one rule for all of them.

The standard library only: the agent imports this inside training jobs. Pure: no files are read
or written here, no clock is read.
"""

from __future__ import annotations

import pickle
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypedDict

# --- names -----------------------------------------------------------------------------------------

#: Where in a spool root the dump files are, as said to people (`flightdeck collector --check`).
LAYOUT = "<job>/<attempt>/rank_<R>[.recent|.stall|.final].pkl"
#: The spool root the agent writes to and the collector watches by default (the systemd unit's).
DEFAULT_SPOOL_DIR = "/var/spool/flightdeck"
#: What the agent writes: a periodic snapshot, the stall snapshot or the final one.
SnapshotKind = Literal["periodic", "stall", "final"]
#: The name suffix (before `DUMP_EXT`) of each kind's file; a recent-changes file is `RECENT_SUFFIX`.
KIND_SUFFIXES: Mapping[SnapshotKind, str] = {"periodic": "", "stall": ".stall", "final": ".final"}
#: File name suffix (before `.pkl`) of the recent-changes snapshot.
RECENT_SUFFIX = ".recent"
#: The extension of every dump file the agent writes.
DUMP_EXT = ".pkl"
#: What a dump file's sidecar appends to its name.
META_SUFFIX = ".meta.json"
#: A file being written, or an editor's leftover: hidden names, `.tmp` (the agent's), `.partial`,
#: `~`, `.swp`. Never a dump, whatever its name says.
TEMP_RE = re.compile(r"(\.tmp|\.partial|~|\.swp)$|^\.")
#: The rank in a dump file's name: `rank_3`, `rank-3`, `rank3`, then any `.ext` suffixes.
RANK_RE = re.compile(r"rank[_-]?(\d+)((?:\.[A-Za-z][A-Za-z0-9]*)*)$")
_JOB_SAFE = re.compile(r"[^A-Za-z0-9._-]+")


def sanitize_job(job: str, default: str = "job") -> str:
    """The job id as used in paths and sidecars: unsafe characters become `_`; `default` when
    nothing is left (no letter or digit)."""
    return _JOB_SAFE.sub("_", job).strip("._") or default


def attempt_dir(spool_dir: Path, job: str, attempt: int) -> Path:
    """The directory one attempt of a job writes to: `<spool_dir>/<job>/<attempt>`.

    `job` must already be sanitized (`sanitize_job`).
    """
    return spool_dir / job / str(attempt)


def snapshot_name(rank: int, kind: SnapshotKind, *, recent: bool = False) -> str:
    """The file name of a rank's snapshot of `kind`; `recent`: a recent-changes periodic one."""
    return f"rank_{rank}{RECENT_SUFFIX if recent else KIND_SUFFIXES[kind]}{DUMP_EXT}"


def sidecar_path(dump: Path) -> Path:
    """The sidecar of dump file `dump`: `X.meta.json` beside `X`."""
    return dump.with_name(dump.name + META_SUFFIX)


def temp_path(path: Path, pid: int) -> Path:
    """The hidden name `path` is written under by process `pid` before it is renamed into place."""
    return path.with_name(f".{path.name}.{pid}.tmp")


def rank_from_name(name: str) -> int | None:
    """The rank in a dump file name (`comm_lib_trace_rank_3`, `host-a_rank_3.json`, ...), or None."""
    if name.endswith(META_SUFFIX):
        return None
    m = RANK_RE.search(name)
    return int(m.group(1)) if m else None


def is_dump_name(name: str) -> bool:
    """Whether a file name is a dump's (not a sidecar, not a temporary, and it names a rank)."""
    return not name.endswith(META_SUFFIX) and not TEMP_RE.search(name) and rank_from_name(name) is not None


# --- the sidecar -----------------------------------------------------------------------------------

#: The sidecar format version, under `VERSION_KEY`; a JSON object without it is not a sidecar.
SIDECAR_VERSION = 1
VERSION_KEY = "flightdeck_snapshot"
#: The sidecar key of a recent-changes snapshot (`RingExtent`).
RING_META_KEY = "ring"


class RingExtent(TypedDict):
    """Where the ring a recent-changes file belongs to begins (sidecar key `ring`)."""

    #: The oldest record id of the ring.
    first: int
    #: Entries in the ring.
    entries: int
    #: Snapshot time of the whole ring this file completes (epoch ns).
    base_time_ns: int


class Identity(TypedDict):
    """Who wrote a snapshot: learned once per process, the same in every sidecar it writes."""

    job: str
    attempt: int
    rank: int
    world_size: int
    local_rank: int | None
    host: str
    pid: int
    torch_version: str
    backend: str


class Sidecar(Identity):
    """A dump file's sidecar (`X.meta.json`, one JSON object with sorted keys), as the agent writes
    it: every key, always. Readers must take every key as optional and check its type: files from
    older agents, and files that are not ours, are read too. docs/agent.md describes each key.
    """

    flightdeck_snapshot: int
    kind: SnapshotKind
    snapshot_time_ns: int
    interval_s: float
    stacks_after_s: float
    #: Process groups by name: `{"desc": ..., "ranks": [...]}`.
    groups: dict[str, dict[str, Any]]
    #: The final snapshot's exception text; None in the others.
    exception: str | None
    #: Every thread's stack (stall and final snapshots); None in periodic ones.
    thread_stacks: list[dict[str, Any]] | None
    last_progress_ns: int | None
    #: The rank's configuration report (`flightdeck.records.config_to_dict`).
    config: dict[str, Any] | None
    #: The main thread's progress evidence (`flightdeck.records.progress_to_dict`).
    progress: dict[str, Any] | None
    ring: RingExtent | None


def is_sidecar(meta: object) -> bool:
    """Whether decoded JSON is a Flightdeck sidecar (an object carrying the version key)."""
    return isinstance(meta, dict) and bool(meta.get(VERSION_KEY))


# --- the ring split --------------------------------------------------------------------------------
#
# Rewriting the whole 2,000-entry ring every 2 s makes every reader decode 2,000 entries to learn
# about the few dozen that moved; on a node with 8 ranks that decoding is most of the collector's
# CPU. So the agent writes the whole ring (`rank_<R>.pkl`) only every `full_every_s`, and in
# between a small file (`rank_<R>.recent.pkl`) with just the entries that are new or were still
# unfinished in that whole ring (the only ones whose fields can have changed), plus where the ring
# now begins. Both files stay on disk, so a reader that missed snapshots (collector down,
# restarted) still gets the whole picture from the newest of each: nothing is lost that the ring
# itself keeps. Works on decoded dumps and times given by the caller; no torch.

#: A recent-changes file holding more than this share of the ring is written whole instead: the
#: saving is gone, and a whole ring resets what the next ones must carry.
MAX_RECENT_SHARE = 0.25
#: ... but small rings are always allowed this many entries.
MIN_RECENT_ENTRIES = 64


@dataclass(slots=True)
class Part:
    """What to write for one periodic snapshot."""

    kind: Literal["full", "recent"]
    #: The dump bytes to write (the dump function's own bytes for a whole ring).
    data: bytes
    #: Sidecar `ring` value for a recent-changes file; None for a whole ring.
    ring: RingExtent | None = None
    #: For a whole ring the recent files after it can complete: its highest record id and the
    #: record ids it held unfinished (their state, retired flag or times may still change).
    base: tuple[int, set[int]] | None = None


@dataclass(slots=True)
class RingSplitter:
    """Decides, snapshot by snapshot, whether to write the whole ring or the recent changes.

    `full_every_s` <= 0 writes the whole ring every time (the format before recent files).
    """

    full_every_s: float
    #: Snapshot time of the last whole ring written (epoch ns); None before the first.
    base_time_ns: int | None = None
    #: Highest record id in that ring.
    base_max: int = -1
    #: Record ids that ring held unfinished (`Part.base`).
    base_open: set[int] = field(default_factory=set)

    def split(self, dump: Mapping[str, Any], raw: bytes, now_ns: int) -> Part:
        """The part to write for `dump` (decoded from `raw`), taken at `now_ns`.

        Call `written` once the part is on disk: only a whole ring that was written may serve as
        the base of later recent files.
        """
        entries = dump.get("entries")
        ids = _record_ids(entries)
        if ids is None or not isinstance(entries, list):
            return Part("full", raw)  # no usable base either: the next snapshot is whole again
        if (
            self.full_every_s <= 0
            or self.base_time_ns is None
            or now_ns - self.base_time_ns >= self.full_every_s * 1e9
            or not ids
        ):
            return _whole(raw, entries, ids)
        base_max, base_open = self.base_max, self.base_open
        recent = [e for e, rid in zip(entries, ids, strict=True) if rid > base_max or rid in base_open]
        if len(recent) > max(MIN_RECENT_ENTRIES, int(len(entries) * MAX_RECENT_SHARE)):
            return _whole(raw, entries, ids)
        head = {k: v for k, v in dump.items() if k != "entries"}
        head["entries"] = recent
        ring: RingExtent = {"first": min(ids), "entries": len(ids), "base_time_ns": self.base_time_ns}
        return Part("recent", pickle.dumps(head, protocol=pickle.HIGHEST_PROTOCOL), ring)

    def written(self, part: Part, now_ns: int) -> None:
        """Record that `part` was written at `now_ns`."""
        if part.kind != "full":
            return
        if part.base is None:
            self.base_time_ns = None
            return
        self.base_time_ns = now_ns
        self.base_max, self.base_open = part.base


def _whole(raw: bytes, entries: list[Any], ids: list[int]) -> Part:
    """The whole ring, with what recent files after it need to know of it."""
    unfinished = {rid for e, rid in zip(entries, ids, strict=True) if not _finished(e)}
    return Part("full", raw, base=(max(ids, default=-1), unfinished))


def _finished(e: Mapping[str, Any]) -> bool:
    """Whether an entry's fields can no longer change: retired, i.e. the backend is done with it
    (completed or failed; on gloo, whose state stays `scheduled`, the only such signal)."""
    return bool(e.get("retired"))


def _record_ids(entries: object) -> list[int] | None:
    """Every entry's record id, or None when the entries are not what the agent can split safely."""
    if not isinstance(entries, list):
        return None
    ids: list[int] = []
    for e in entries:
        rid = e.get("record_id") if isinstance(e, dict) else None
        if type(rid) is not int:
            return None
        ids.append(rid)
    return ids
