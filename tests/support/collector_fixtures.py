"""Shared helpers of the collector tests: real dumps in a spool, an agent stand-in, a thread guard.

The dumps are the committed real ones (tests/data/fr/<scenario>/, written by the agent in real gloo
jobs). `AgentStandIn` rewrites a rank's file the way the agent does (sidecar first, then the dump,
each to a hidden temporary name and renamed) with entries advanced, as a live rank's ring would be.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from flightdeck.readers.fr.decode import load_raw
from flightdeck.spool import RECENT_SUFFIX, RING_META_KEY, RingSplitter

REPO = Path(__file__).resolve().parents[2]
FR_DATA = REPO / "tests" / "data" / "fr"
NIXL_DATA = REPO / "tests" / "data" / "nixl"


def thread_guard() -> Iterator[None]:
    """Fail the test when it leaves threads running (give them a moment to finish first)."""
    before = set(threading.enumerate())
    yield
    end = time.monotonic() + 5.0
    while True:
        # watchdog >= 5 reads inotify in ONE process-wide thread (InotifyFD.get_instance()), started
        # at the first watch and kept for the life of the process by design: not ours to join.
        leaked = [
            t
            for t in threading.enumerate()
            if t not in before and t.is_alive() and type(t).__name__ != "InotifyFD"
        ]
        if not leaked:
            return
        if time.monotonic() > end:
            raise AssertionError(
                f"threads leaked by the test: {[(t.name, type(t).__name__) for t in leaked]}"
            )
        time.sleep(0.02)


def spool_scenario(spool: Path, scenario: str, *, periodic_only: bool = False) -> Path:
    """Copy a committed scenario's spool files to `<spool>/<scenario>/0/`; returns that directory."""
    dest = spool / scenario / "0"
    dest.mkdir(parents=True, exist_ok=True)
    for p in sorted((FR_DATA / scenario).glob("rank_*")):
        if periodic_only and (".stall." in p.name or ".final." in p.name):
            continue
        shutil.copy2(p, dest / p.name)
    return dest


def write_atomic(path: Path, data: bytes) -> None:
    """Write like the agent: a hidden temporary name in the same directory, then rename."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


class AgentStandIn:
    """Rewrites one rank's periodic snapshot from a real dump, advancing entries each time."""

    def __init__(self, source: Path, target: Path, *, retired_upto: int | None = None) -> None:
        self.raw: dict[str, Any] = load_raw(source.read_bytes())
        meta_path = source.with_name(source.name + ".meta.json")
        self.meta: dict[str, Any] = json.loads(meta_path.read_text()) if meta_path.exists() else {}
        self.target = target
        entries = self.raw.get("entries") or []
        # Start with nothing finished: each write then finishes a few more, like a live ring.
        for e in entries[retired_upto or 0 :]:
            e["retired"] = False
        self.time_ns = int(self.meta.get("snapshot_time_ns") or time.time_ns())

    @property
    def entries(self) -> list[dict[str, Any]]:
        """The raw entries as they will be written."""
        out: list[dict[str, Any]] = self.raw.get("entries") or []
        return out

    def finish(self, n: int) -> list[int]:
        """Retire (gloo's progress signal) the next `n` unfinished entries; returns their record ids."""
        done: list[int] = []
        for e in self.entries:
            if len(done) == n:
                break
            if not e["retired"]:
                e["retired"] = True
                done.append(int(e["record_id"]))
        return done

    def write(self) -> None:
        """Sidecar first, then the dump, both renamed into place (the agent's contract)."""
        self.time_ns += 1_000_000_000
        if self.meta:
            self.meta["snapshot_time_ns"] = self.time_ns
            write_atomic(
                self.target.with_name(self.target.name + ".meta.json"), json.dumps(self.meta).encode()
            )
        write_atomic(self.target, pickle.dumps(self.raw, protocol=4))

    def write_split(self, splitter: RingSplitter) -> Path:
        """Like `write`, as the agent does it: the whole ring, or only its recent changes beside it
        (`rank_<R>.recent.pkl`) when `splitter` says so; returns the path written."""
        self.time_ns += 1_000_000_000
        part = splitter.split(self.raw, pickle.dumps(self.raw, protocol=4), self.time_ns)
        target = self.target
        if part.ring is not None:
            target = target.with_name(target.name.removesuffix(".pkl") + RECENT_SUFFIX + ".pkl")
        meta = dict(self.meta, snapshot_time_ns=self.time_ns, **{RING_META_KEY: part.ring})
        write_atomic(target.with_name(target.name + ".meta.json"), json.dumps(meta).encode())
        write_atomic(target, part.data)
        splitter.written(part, self.time_ns)
        return target
