"""Which part of a rank's ring a periodic snapshot writes: the whole ring, or what changed since.

Rewriting the whole 2,000-entry ring every 2 s makes every reader decode 2,000 entries to learn
about the few dozen that moved; on a node with 8 ranks that decoding is most of the collector's
CPU. So the agent writes the whole ring (`rank_<R>.pkl`) only every `full_every_s`, and in
between a small file (`rank_<R>.recent.pkl`) with just the entries that are new or were still
unfinished in that whole ring (the only ones whose fields can have changed), plus where the ring
now begins. Both files stay on disk, so a reader that missed snapshots (collector down, restarted)
still gets the whole picture from the newest of each: nothing is lost that the ring itself keeps.

Pure: works on decoded dumps and times given by the caller; no files, no clock, no torch.
"""

from __future__ import annotations

import pickle
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

#: The sidecar key of a recent-changes snapshot: `{"first": oldest record id of the ring,
#: "entries": entries in the ring, "base_time_ns": snapshot time of the whole ring it completes}`.
RING_META_KEY = "ring"
#: File name suffix (before `.pkl`) of the recent-changes snapshot.
RECENT_SUFFIX = ".recent"
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
    ring: dict[str, int] | None = None
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
        ring = {"first": min(ids), "entries": len(ids), "base_time_ns": self.base_time_ns}
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
