"""Every thread's Python stack, for the stall and final snapshots' `thread_stacks`."""

from __future__ import annotations

import sys
import threading
import traceback
from collections.abc import Mapping
from types import FrameType, TracebackType
from typing import Any


def thread_stacks(
    replace: Mapping[int, TracebackType] | None = None,
) -> list[dict[str, Any]]:
    """Every thread's Python stack, innermost first; `replace` maps a thread id to a traceback to
    show instead (the stack where an exception was raised, rather than the hook's)."""
    names = {t.ident: t.name for t in threading.enumerate()}
    out: list[dict[str, Any]] = []
    for tid, frame in sys._current_frames().items():
        tb = (replace or {}).get(tid)
        frames = _tb_frames(tb) if tb is not None else _frame_chain(frame)
        out.append({"thread_name": names.get(tid, f"thread-{tid}"), "thread_id": tid, "frames": frames})
    return sorted(out, key=lambda s: (s["thread_name"] != "MainThread", s["thread_id"]))


def _frame_chain(frame: FrameType | None) -> list[dict[str, Any]]:
    frames = []
    while frame is not None:
        code = frame.f_code
        frames.append({"name": code.co_name, "filename": code.co_filename, "line": frame.f_lineno or 0})
        frame = frame.f_back
    return frames


def _tb_frames(tb: TracebackType) -> list[dict[str, Any]]:
    summary = traceback.extract_tb(tb)
    return [{"name": f.name, "filename": f.filename, "line": f.lineno or 0} for f in reversed(summary)]
