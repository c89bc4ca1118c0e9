"""Untrusted bytes -> the raw dump dict: restricted unpickling and the per-file budget.

Pickles are untrusted input (anyone who can write the dump directory can write one): they are read
with `SafeUnpickler`, which builds only plain data and refuses every global, so a hostile pickle
cannot run code. `load_raw` decodes a pickle or a JSON dump and checks its version and entry
count; `check_budget` refuses a dump whose entries would cost more to normalize than `DumpBudget`
allows (a small pickle can share one object many times over).
"""

from __future__ import annotations

import gc
import io
import json
import pickle
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import chain
from operator import methodcaller
from typing import Any

from flightdeck.readers.fr.errors import (
    DumpBudgetError,
    DumpError,
    NotADumpError,
    TruncatedDumpError,
    UnsafePickleError,
    UnsupportedVersionError,
)


class SafeUnpickler(pickle.Unpickler):
    """Unpickler that builds only dict, list, tuple, str, bytes, int, float, bool and None."""

    def find_class(self, module: str, name: str) -> Any:
        """Refuse every global: FR dumps contain none, so any is hostile or not a dump."""
        raise UnsafePickleError(
            f"pickle references the global {module}.{name}; refused (dumps hold plain data)"
        )

    def persistent_load(self, pid: Any) -> Any:
        """Refuse persistent ids for the same reason."""
        raise UnsafePickleError("pickle uses a persistent id; refused (dumps hold plain data)")


@contextmanager
def gc_paused() -> Iterator[None]:
    """The cyclic garbage collector paused for the block (and on again after it, if it was on).

    Reading a dump allocates tens of thousands of small containers (the decoded pickle, then the
    columns and records made from it), and each allocation burst starts a collection that walks
    the whole young decoded dump again; none of it is cyclic garbage. With collection paused
    while one file is read and summarized, `flightdeck analyze`'s reader spent ~17% less CPU on
    bench/analyze_scale.py's 2,000-entry files (perf: gc_collect_main, visit_decref,
    visit_reachable and dict_traverse were 17% of its samples). Whatever cycles a hostile pickle
    builds are collected once the collector runs again.
    """
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()


def safe_loads(data: bytes) -> Any:
    """Unpickle untrusted bytes into plain data, or raise a `DumpError`."""
    # BufferedReader gives the C unpickler peek(), which makes it ~4x faster than a bare BytesIO.
    reader = io.BufferedReader(io.BytesIO(data), buffer_size=1 << 20)
    try:
        with gc_paused():  # the loader makes millions of small containers; no cycles to collect
            return SafeUnpickler(reader).load()
    except DumpError:
        raise
    except (
        EOFError,
        pickle.UnpicklingError,
        ValueError,
        IndexError,
        KeyError,
        TypeError,
        OverflowError,
        MemoryError,
        RecursionError,
        UnicodeDecodeError,
        AttributeError,
    ) as exc:
        msg = str(exc) or type(exc).__name__
        if isinstance(exc, EOFError) or "truncated" in msg or "ran out of input" in msg.lower():
            raise TruncatedDumpError(f"pickle is truncated ({msg})") from None
        raise NotADumpError(f"not a readable pickle ({type(exc).__name__}: {msg})") from None


@dataclass(frozen=True, slots=True)
class DumpBudget:
    """What one file may cost: the reader refuses a dump over any of these before normalizing it.

    The unpickler builds a shared object once however often it is referenced, so a small pickle can
    decode to a structure whose traversal is huge (400,000 references to one entry with a 200-frame
    stack: 0.8 MB that took 16.5 s and 311 MB to normalize). So what normalization will walk is
    counted per reference, in C where it can be: entries (an entry referenced twice counts twice),
    frames of every entry (a stack shared by entries counts at each use) and tensor sizes.
    """

    #: Entries in one file (PyTorch's ring holds TORCH_FR_BUFFER_SIZE, default 2,000).
    max_entries: int = 100_000
    #: Stack frames summed over the file's entries.
    max_frames: int = 4_000_000
    #: Tensors and dimensions in the entries' input and output sizes, summed over entries.
    max_dims: int = 4_000_000


DEFAULT_BUDGET = DumpBudget()
_INPUT_SIZES = methodcaller("get", "input_sizes")
_OUTPUT_SIZES = methodcaller("get", "output_sizes")
_FRAMES_OF = methodcaller("get", "frames")


def check_budget(raw: dict[str, Any], budget: DumpBudget = DEFAULT_BUDGET) -> None:
    """Raise DumpBudgetError when normalizing `raw` (all its entries) would cost more than `budget`
    allows."""
    entries = raw.get("entries") or []
    n = len(entries)
    if n > budget.max_entries:
        raise DumpBudgetError(f"{n} entries, over the budget of {budget.max_entries} per file")
    if not set(map(type, entries)) <= {dict}:
        return  # not a dump's entries: normalizing refuses them at the first one, at no cost
    try:
        frames = sum(map(len, filter(None, map(_FRAMES_OF, entries))))
    except TypeError:  # frames that are not sized: the forgiving path ignores them
        frames = 0
    if frames > budget.max_frames:
        raise DumpBudgetError(
            f"{frames} stack frames over {n} entries, over the budget of {budget.max_frames} per file"
        )
    _check_dims(n, (list(map(getter, entries)) for getter in (_INPUT_SIZES, _OUTPUT_SIZES)), budget)


def _check_dims(n: int, columns: Iterable[list[Any]], budget: DumpBudget) -> None:
    """The tensor-size part of `check_budget`, on the entries' input and output sizes columns."""
    dims = 0
    for sizes in columns:
        try:
            # Tensors first (one C pass), so a huge shared list of tensors is caught before its dims.
            dims += sum(map(len, sizes))
            if dims > budget.max_dims:
                break
            dims += sum(map(len, chain.from_iterable(sizes)))
        except TypeError:  # sizes that are not lists of lists: the forgiving path reads them as ()
            continue
    if dims > budget.max_dims:
        raise DumpBudgetError(f"{dims}+ tensor sizes over {n} entries, over the budget of {budget.max_dims}")


def load_raw(data: bytes, *, budget: DumpBudget = DEFAULT_BUDGET) -> dict[str, Any]:
    """Decode dump bytes (pickle or JSON, detected from the content) into the raw dump dict, within
    `budget` (DumpBudgetError when over)."""
    if not data:
        raise TruncatedDumpError("file is empty")
    head = data[:1]
    if head == b"\x80":
        raw = safe_loads(data)
    elif data.lstrip()[:1] == b"{":
        try:
            raw = json.loads(data)
        except json.JSONDecodeError as exc:
            if exc.pos >= len(data.rstrip()) - 1:
                raise TruncatedDumpError(f"JSON is truncated at byte {exc.pos}") from None
            raise NotADumpError(f"invalid JSON at byte {exc.pos}: {exc.msg}") from None
        except UnicodeDecodeError as exc:
            raise NotADumpError(f"JSON is not UTF-8 ({exc.reason})") from None
    else:
        raise NotADumpError("neither a pickle (protocol 2+) nor a JSON object")
    if not isinstance(raw, dict):
        raise NotADumpError(f"top level is a {type(raw).__name__}, not a dump dict")
    version = raw.get("version")
    if not isinstance(version, str):
        raise NotADumpError("no 'version' string: not a flight-recorder dump")
    major = version.split(".", 1)[0]
    if major != "2":
        raise UnsupportedVersionError(f"schema version {version!r} is not supported (2.x is)")
    if "entries" in raw and not isinstance(raw["entries"], list):
        raise NotADumpError("'entries' is not a list")
    # Only the count here (one len): frames and sizes are counted on the entries a parse is about
    # to normalize (`LoadedDump.parse`), which for an incremental read are the few that changed.
    n = len(raw.get("entries") or [])
    if n > budget.max_entries:
        raise DumpBudgetError(f"{n} entries, over the budget of {budget.max_entries} per file")
    return raw
