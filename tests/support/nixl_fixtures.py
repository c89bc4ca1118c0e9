"""Test helper: the committed NIXL telemetry fixtures (tests/data/nixl, written by
`tests/nixl_jobs/make_fixtures.py`) and what the NIXL tests share to read them."""

from __future__ import annotations

import json
import shutil
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "nixl"
EXPECTED: dict[str, Any] = json.loads((DATA / "expected.json").read_text())
RING_RELEASES = {"1.0.1": (1, "v1"), "1.1.0": (2, "v2-48"), "1.2.0": (2, "v2-16"), "1.3.2": (3, "v3")}
RING_RELEASES["1.5.1"] = (4, "v3")


def ticking_clock(start: int = 1_000_000_000) -> Callable[[], int]:
    """A clock that advances one second per call (an injected clock, not a mock of a reader)."""
    now = [start]

    def clock() -> int:
        now[0] += 1_000_000_000
        return now[0]

    return clock


def copy_fixture(name: str, tmp_path: Path) -> Path:
    """A writable copy of a fixture directory (consuming a ring writes to it)."""
    dest = tmp_path / name
    shutil.copytree(DATA / name, dest)
    return dest


def snapshot(path: Path) -> tuple[bytes, int]:
    """A file's bytes and mtime, to prove a reader wrote nothing."""
    return path.read_bytes(), path.stat().st_mtime_ns


def delta(rep2: dict[str, Any], rep1: dict[str, Any], key: str) -> int:
    """What the producer did between its two reports."""
    return int(rep2[key]) - int(rep1[key])


def build_ring(
    version: int, capacity: int, slots: list[bytes], *, write_pos: int, read_pos: int = 0
) -> bytes:
    """A ring file from the doc's header layout; `slots` are already-encoded events."""
    size = len(slots[0])
    body = b"".join(slots) + bytes(size * (capacity - len(slots)))
    return struct.pack("<QQiiQQ", write_pos, read_pos, version, version, capacity, capacity - 1) + body


def patch_struct(data: bytes, fmt: str, offset: int, *values: float) -> bytes:
    """`data` with `values` packed as `fmt` at `offset` (a fixture file made bad in one place)."""
    out = bytearray(data)
    struct.pack_into(fmt, out, offset, *values)
    return bytes(out)
