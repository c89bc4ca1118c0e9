"""What one snapshot may hold: the limits of the store and the analysis, and the scalar rules, in one place.

The one owner of these rules: the server's validation at its edge (`flightdeck.server.validation`,
column by column on a decoded batch) and the collector's check of each dump before it joins a batch
(`flightdeck.snapshot_check`) both take their limits and their rules for names and free text from
here, so the collector sets aside alone what the server would refuse. The values are what the
store's columns hold (`flightdeck.server.models`); `docs/input-limits.md` lists them for users. Only
constants and scalar checks live here (no imports from the project), so any module can use them
without an import cycle.
"""

from __future__ import annotations

import math
import re

#: Signed 64-bit (BIGINT, and SQLite's INTEGER): times in ns, record / sequence / op ids, pids.
INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
#: Signed 32-bit (INTEGER): the attempt number, a frame's line.
INT32_MAX = 2**31 - 1
#: Largest world size taken (ranks are 0 <= rank < world_size <= MAX_WORLD_SIZE): a documented
#: bound that keeps what the diagnosis may allocate per rank finite whatever a snapshot claims.
MAX_WORLD_SIZE = 1_048_576

#: Longest name per column, in characters (the model's String(n); SQLite does not enforce it,
#: PostgreSQL does).
MAX_JOB = 256
MAX_HOST = 255
MAX_GROUP = 128
MAX_OP = 256
MAX_BACKEND = 64
MAX_DTYPE = 64
MAX_VERSION = 64
MAX_KIND = 16
MAX_AGENT = 255
MAX_RUN = 128
MAX_BATCH_ID = 128
#: Thread names are stored cut to this many characters (names are long only by accident).
MAX_THREAD = 64
#: Frames are JSON in the stacks table (no column width): bounded so one stack cannot be megabytes.
#: 4096, not the 1024 the collector once cut to: the store holds 4096, and a C++ frame's demangled
#: name is often longer than 1024 characters.
MAX_FRAME_TEXT = 4096
MAX_FRAME_LINE = INT32_MAX
#: Free text, cut to these lengths (never refused for its length).
MAX_EXCEPTION = 65_536
MAX_SOURCE = 4096
MAX_GROUP_DESC = 256
#: Tensors per entry signature and dimensions per tensor.
MAX_TENSORS = 4096
MAX_DIMS = 64
#: Longest snapshot interval (seconds) taken: a year.
MAX_INTERVAL_S = 365 * 86400.0

#: Control characters: C0 (NUL, ESC, ...), DEL and C1. Never in a name that identifies something:
#: an altered name would be another job or group, and an ANSI escape sequence in one would be
#: replayed on whoever reads it in a terminal.
CONTROL_CHARS = r"\x00-\x1f\x7f-\x9f"
CONTROL = re.compile(f"[{CONTROL_CHARS}]")
#: The same but tab and newline, which free text may hold.
CONTROL_TEXT = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def int_ok(v: object, low: int = 0, high: int = INT64_MAX) -> bool:
    """Whether `v` is an int (not a bool) in [low, high]."""
    return type(v) is int and low <= v <= high


def opt_int_ok(v: object, low: int = 0, high: int = INT64_MAX) -> bool:
    """`int_ok`, or None."""
    return v is None or int_ok(v, low, high)


def duration_ok(v: object) -> bool:
    """Whether `v` is a finite non-negative number (not a bool), or None."""
    if v is None:
        return True
    if type(v) is not int and type(v) is not float:
        return False
    return math.isfinite(v) and v >= 0


def interval_ok(v: object) -> bool:
    """Whether `v` is a snapshot interval the server takes (a number in [0, MAX_INTERVAL_S]), or None."""
    return duration_ok(v) and (v is None or v <= MAX_INTERVAL_S)  # type: ignore[operator]


def name_problem(v: object, max_chars: int, *, empty: bool = False) -> str | None:
    """Why `v` is not a valid identifying name (a str of 1..max_chars without control characters),
    or None when it is; `empty` allows ""."""
    if type(v) is not str:
        return f"expected a string, got {type(v).__name__}"
    if not v and not empty:
        return "must not be empty"
    if len(v) > max_chars:
        return f"longer than {max_chars} characters ({len(v)})"
    m = CONTROL.search(v)
    if m is not None:
        return f"holds a control character ({m.group()!r} at {m.start()})"
    return None


def neutralize(text: str, limit: int) -> str:
    """Free text (an exception, a source path, a description) made safe to store and show: control
    characters but tab and newline become U+FFFD (so an ANSI escape sequence is shown, not run),
    cut to `limit` characters. Free text identifies nothing, so it is normalized, never refused."""
    if len(text) > limit:
        text = text[:limit]
    return CONTROL_TEXT.sub("\ufffd", text) if CONTROL_TEXT.search(text) else text
