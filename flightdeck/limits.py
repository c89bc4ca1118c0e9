"""What one snapshot may hold: the limits of the store and the analysis, in one place.

Shared by the collector (which checks and normalizes each dump before it joins a batch, so that one
bad file is set aside alone) and meant for the server's validation at its edge, so that both refuse
the same things. Only constants and scalar checks live here (no imports from the project), so any
module can use them without an import cycle.
"""

from __future__ import annotations

import math
import re

#: Every integer the store keeps is a signed 64-bit column.
INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
#: Largest world size taken (ranks are 0 <= rank < world_size <= MAX_WORLD_SIZE): what the
#: diagnosis allocates per rank stays bounded whatever a snapshot claims.
MAX_WORLD_SIZE = 1_048_576

#: Longest strings, in characters, by what they name (the store's column widths).
MAX_JOB_CHARS = 256
MAX_HOST_CHARS = 255
MAX_GROUP_NAME_CHARS = 128
MAX_GROUP_DESC_CHARS = 256
MAX_OP_CHARS = 256
MAX_BACKEND_CHARS = 64
MAX_DTYPE_CHARS = 64
MAX_THREAD_NAME_CHARS = 64
MAX_VERSION_CHARS = 64
MAX_KIND_CHARS = 16
MAX_FRAME_TEXT_CHARS = 1024
MAX_SOURCE_CHARS = 4096
MAX_EXCEPTION_CHARS = 65_536

#: Control characters (C0, DEL, C1): never in a name that identifies something (an ANSI escape
#: sequence in a job name would be replayed on whoever reads it in a terminal).
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def int64_ok(v: object, *, low: int = 0) -> bool:
    """Whether `v` is an int (not a bool) in [low, INT64_MAX]."""
    return type(v) is int and low <= v <= INT64_MAX


def opt_int64_ok(v: object, *, low: int = 0) -> bool:
    """`int64_ok`, or None."""
    return v is None or int64_ok(v, low=low)


def finite_ok(v: object) -> bool:
    """Whether `v` is a finite non-negative number (not a bool), or None."""
    if v is None:
        return True
    if type(v) is not int and type(v) is not float:
        return False
    return math.isfinite(v) and v >= 0


def name_problem(v: object, max_chars: int, *, empty: bool = False) -> str | None:
    """Why `v` is not a valid identifying name (a str of 1..max_chars without control characters),
    or None when it is; `empty` allows ""."""
    if type(v) is not str:
        return f"expected a string, got {type(v).__name__}"
    if not v and not empty:
        return "is empty"
    if len(v) > max_chars:
        return f"is {len(v)} characters, over the {max_chars}-character limit"
    if _CONTROL.search(v):
        return "holds a control character (NUL, ESC, ...)"
    return None


def clean_text(v: str, max_chars: int) -> str:
    """Free text (an exception, a thread or file name) made storable: NUL removed, cut to max_chars.

    Free text is shown, never used to identify anything, so it is normalized, not refused.
    """
    if "\x00" in v:
        v = v.replace("\x00", "")
    return v if len(v) <= max_chars else v[:max_chars]
