"""Small formatting helpers the pages share: ranks as ranges (and a rank filter read back),
times, durations, tensor shapes, byte counts."""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence


def fmt_ranks(ranks: Iterable[int], limit: int = 12) -> str:
    """Ranks as compact ranges: `0–3, 5, 8–1023`; at most `limit` ranges, then `(+N more)`."""
    rs = sorted(set(ranks))
    parts: list[str] = []
    i = 0
    while i < len(rs):
        j = i
        while j + 1 < len(rs) and rs[j + 1] == rs[j] + 1:
            j += 1
        parts.append(str(rs[i]) if i == j else f"{rs[i]}–{rs[j]}")
        i = j + 1
    if len(parts) > limit:
        more = sum(1 for _ in parts[limit:])
        return ", ".join(parts[:limit]) + f" (+{more} more ranges)"
    return ", ".join(parts)


#: Ranks a filter may name: the server's largest world size (`flightdeck.server.validation`).
MAX_RANKS = 1_048_576


def parse_ranks(text: str | None) -> frozenset[int] | None:
    """A rank filter like `0-7, 12` as a set; None for an empty filter. Raises ValueError."""
    if text is None or not text.strip():
        return None
    out: set[int] = set()
    named = 0
    for part in text.replace(" ", "").split(","):
        if not part:
            continue
        lo, sep, hi = part.replace("–", "-").partition("-")
        a = int(lo)
        b = int(hi) if sep else a
        if a < 0 or b < a or b >= MAX_RANKS:
            raise ValueError(f"bad rank range {part!r}")
        named += b - a + 1
        if named > MAX_RANKS:  # repeated ranges count each time: the work is bounded
            raise ValueError("rank filter names too many ranks")
        out.update(range(a, b + 1))
    return frozenset(out) if out else None


def fmt_time_ns(ns: int | None) -> str:
    """Epoch ns as `HH:MM:SS.mmm` UTC (the date is on the page header); empty when unknown."""
    if ns is None:
        return ""
    t = time.gmtime(ns // 1_000_000_000)
    return time.strftime("%H:%M:%S", t) + f".{(ns // 1_000_000) % 1000:03d}"


def fmt_datetime_s(s: float | None) -> str:
    """Epoch seconds as `YYYY-MM-DD HH:MM:SS UTC`; empty when unknown."""
    if s is None:
        return ""
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(s))


def fmt_duration(s: float | None) -> str:
    """Seconds as `850 ms`, `8.7 s`, `3 min 20 s`; empty when unknown."""
    if s is None:
        return ""
    if s < 1:
        return f"{s * 1000:.0f} ms"
    if s < 120:
        return f"{s:.1f} s"
    return f"{int(s // 60)} min {int(s % 60)} s"


def fmt_sizes(sizes: Sequence[Sequence[int]]) -> str:
    """Tensor shapes as `[256] [4, 8]`; `–` for none."""
    return " ".join("[" + ", ".join(str(x) for x in s) + "]" for s in sizes) or "–"


def fmt_bytes(n: float) -> str:
    """Bytes with a binary unit: `512 B`, `1.5 KiB`, `3.0 GiB`."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # unreachable; keeps mypy's return analysis simple
