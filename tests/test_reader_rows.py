"""The C pass of the signature columns (`flightdeck.readers.fr._rows`) gives what the Python pass
gives (`signatures._signature_rows_py`), or declines: on every fixture, on odd values, on hostile
entries and on random ones; and it holds its references (no growth over many calls)."""

from __future__ import annotations

import copy
import gc
import os
import subprocess
import sys
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flightdeck.env_names import READER_PURE_PYTHON
from flightdeck.readers.fr import signatures
from flightdeck.readers.fr.decode import DEFAULT_BUDGET, DumpBudget, load_raw
from flightdeck.readers.fr.errors import DumpError
from flightdeck.readers.fr.files import load_dump_file
from flightdeck.readers.fr.normalize import _STATES

try:
    from flightdeck.readers.fr import _rows
except ImportError:  # built without a compiler: only the Python pass is there to test
    _rows = None  # type: ignore[assignment]

needs_c = pytest.mark.skipif(
    _rows is None,
    reason="the C extension flightdeck.readers.fr._rows is not built (python setup.py build_ext --inplace)",
)
DATA = Path(__file__).parent / "data"
HEALTHY = DATA / "fr" / "healthy_4" / "rank_0.final.pkl"


def _raw_entries(path: Path) -> list[Any]:
    entries = load_raw(path.read_bytes()).get("entries") or []
    assert isinstance(entries, list)
    return entries


def _pickled_fixtures() -> list[Path]:
    return sorted(p for p in DATA.rglob("*.pkl") if p.is_file())


def _outcome(fn: Callable[[], Any]) -> tuple[str, Any]:
    try:
        return "ok", fn()
    except DumpError as exc:
        return type(exc).__name__, str(exc)


def _c_pass(entries: list[Any], budget: DumpBudget = DEFAULT_BUDGET) -> Any:
    assert _rows is not None
    return _rows.signature_rows(entries, _STATES, budget.max_frames)


def _assert_same(entries: list[Any], budget: DumpBudget = DEFAULT_BUDGET) -> Any:
    """The C pass declines or gives the Python pass's columns; `_signature_rows` (C, then Python
    where C declines) gives the Python pass's outcome. Returns the C pass's answer."""
    want = _outcome(lambda: signatures._signature_rows_py(entries, budget))
    got = _c_pass(entries, budget)
    if got is not None:
        assert ("ok", got) == want
    assert _outcome(lambda: signatures._signature_rows(entries, budget)) == want
    return got


@needs_c
def test_the_c_pass_reads_every_fixture_as_the_python_pass() -> None:
    taken = 0
    for path in _pickled_fixtures():
        entries = _raw_entries(path)
        got = _assert_same(entries)
        python = signatures._signature_rows_py(entries, DEFAULT_BUDGET)
        # The fixtures are real dumps (exact types throughout): where the Python pass takes one,
        # so does the C pass, or the speed-up would not reach real files.
        assert (got is None) == (python is None), path
        taken += got is not None
    assert taken >= 20


@needs_c
def test_the_c_pass_is_the_one_that_runs() -> None:
    want = "Python" if os.environ.get(READER_PURE_PYTHON) else "C"
    assert want == signatures.ROWS_PASS


def test_the_setting_forces_the_python_pass() -> None:
    code = "from flightdeck.readers.fr import signatures as s; print(s.ROWS_PASS)"
    env = {**os.environ, READER_PURE_PYTHON: "1", "PYTHONPATH": str(Path(__file__).parents[1])}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "Python"


class _Dict(dict[str, Any]):
    pass


class _Int(int):
    pass


class _Str(str):
    __slots__ = ()


def _self_list() -> list[Any]:
    frames: list[Any] = []
    frames.append(frames)
    return frames


#: Odd values of one field each (key, value; value None: the key removed), beyond those of
#: tests/test_reader_columns.py: the C pass declines them or reads them as the Python pass.
ODD: dict[str, tuple[str, Any]] = {
    "bool record id": ("record_id", True),
    "bool seq": ("collective_seq_id", False),
    "int subclass seq": ("collective_seq_id", _Int(5)),
    "int64 max seq": ("collective_seq_id", (1 << 63) - 1),
    "int64 min created": ("time_created_ns", -(1 << 63)),
    "just over int64": ("time_created_ns", 1 << 63),
    "huge op id": ("op_id", 10**30),
    "float seq": ("collective_seq_id", 3.0),
    "str state subclass": ("state", _Str("scheduled")),
    "unknown state": ("state", "sleeping"),
    "list state": ("state", ["scheduled"]),
    "int duration": ("duration_ms", 3),
    "float duration": ("duration_ms", 2.5),
    "none duration": ("duration_ms", None),
    "str frames": ("frames", "abc"),
    "tuple frames": ("frames", ({"name": "x", "filename": "f.py", "line": 1},)),
    "self-containing frames": ("frames", _self_list()),
    "empty frames": ("frames", []),
    "int is_p2p": ("is_p2p", 1),
    "true is_p2p": ("is_p2p", True),
    "none is_p2p": ("is_p2p", None),
    "list process group": ("process_group", ["0", "default_pg"]),
    "one-part process group": ("process_group", ("0",)),
    "other group": ("process_group", ("1", "other")),
    "same name other desc": ("process_group", ("0", "another desc")),
    "str subclass group": ("process_group", (_Str("0"), "default_pg")),
    "unhashable group part": ("process_group", ("0", ["x"])),
    "bytes profiling name": ("profiling_name", b"gloo:all_reduce"),
    "list profiling name": ("profiling_name", ["gloo:all_reduce"]),
    "missing record id": ("record_id", None),
    "missing frames": ("frames", None),
    "missing profiling name": ("profiling_name", None),
    "missing output dtypes": ("output_dtypes", None),
    "odd sizes": ("input_sizes", {"a": 1}),
}


def _with(entries: list[Any], where: int, key: str, value: Any) -> list[Any]:
    out = copy.deepcopy(entries)
    if value is None and key != "duration_ms":
        out[where].pop(key, None)
    else:
        out[where][key] = value
    return out


@needs_c
@pytest.mark.parametrize("name", sorted(ODD))
@pytest.mark.parametrize("where", [0, 3, -1])
def test_an_odd_value_reads_the_same_by_either_pass(name: str, where: int) -> None:
    key, value = ODD[name]
    _assert_same(_with(_raw_entries(HEALTHY), where, key, value))


@needs_c
def test_hostile_shapes_read_the_same_by_either_pass() -> None:
    base = _raw_entries(HEALTHY)
    many_keys = copy.deepcopy(base)
    for e in many_keys:
        e.update({f"extra_{i}": i for i in range(80)})  # more keys than the C pass's layout holds
    reordered = copy.deepcopy(base)
    reordered[5] = dict(reversed(list(reordered[5].items())))  # another key order: looked up
    fresh_keys = [{str(k)[:1] + str(k)[1:]: v for k, v in e.items()} for e in copy.deepcopy(base)]
    odd_keys = copy.deepcopy(base)
    odd_keys[2][hash("state")] = "a key of another type with the hash of one of the names"
    sub = copy.deepcopy(base)
    sub[4] = _Dict(sub[4])
    not_dict = copy.deepcopy(base)
    not_dict[1] = [("record_id", 1)]
    shared = [base[0]] * 50  # one entry 50 times: record ids do not increase
    cases = [many_keys, reordered, fresh_keys, odd_keys, sub, not_dict, shared, [], [None], [{}]]
    for entries in cases:
        _assert_same(entries)
    assert _c_pass(many_keys) is not None
    assert _c_pass(reordered) is not None
    assert _c_pass(fresh_keys) is not None


@needs_c
def test_the_key_table_read_is_on_where_cpython_lays_dicts_out_as_it_expects() -> None:
    assert _rows is not None
    on_versions = sys.implementation.name == "cpython" and sys.version_info[:2] in ((3, 11), (3, 12))
    read = _rows.KEY_TABLE_READ
    assert read == int(on_versions)


@needs_c
def test_entries_whose_items_moved_read_the_same_by_either_pass() -> None:
    """The key-table read (`fields_by_peek`) takes a field where the first entry has it only when
    the very key object is there; every other entry is read by the walk or by lookups."""
    base = _raw_entries(HEALTHY)
    re_added = copy.deepcopy(base)
    e = re_added[3]
    e["state"] = e.pop("state")  # a deleted item where it was, the field now last
    other_key = copy.deepcopy(base)
    e = other_key[4]
    value = e.pop("op_id")
    e["".join(["op", "_id"])] = value  # an equal str, another object
    extra = copy.deepcopy(base)
    extra[2] = {"first": 0, **extra[2], "last": 1}  # every field one item later
    first_lacks = copy.deepcopy(base)
    first_lacks[0].pop("duration_ms", None)  # no key-table read for any entry
    swapped = copy.deepcopy(base)
    items = list(swapped[1].items())
    items[0], items[-1] = items[-1], items[0]
    swapped[1] = dict(items)
    for entries in (re_added, other_key, extra, first_lacks, swapped):
        assert _assert_same(entries) is not None  # read by the C pass, as the Python pass reads it


@needs_c
def test_the_frame_budget_is_refused_alike() -> None:
    entries = _raw_entries(HEALTHY)
    frames = sum(len(e.get("frames") or ()) for e in entries)
    for max_frames in (frames - 1, frames, frames + 1, 0):
        budget = DumpBudget(max_frames=max_frames)
        got = _assert_same(entries, budget)
        assert (got is None) == (frames > max_frames)
    kind, message = _outcome(lambda: signatures._signature_rows(entries, DumpBudget(max_frames=frames - 1)))
    assert kind == "DumpBudgetError"
    assert "stack frames" in message


@needs_c
def test_the_c_pass_refuses_wrong_arguments() -> None:
    assert _rows is not None
    with pytest.raises(TypeError):
        _rows.signature_rows((), _STATES, 10)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        _rows.signature_rows([], _STATES)  # type: ignore[call-arg]


@needs_c
def test_the_fingerprints_are_gathered_as_struct_packs_them(monkeypatch: pytest.MonkeyPatch) -> None:
    lean = load_dump_file(HEALTHY).parse_signatures()
    assert lean is not None
    cols = lean[1]
    values = {at: (at * 0x9E3779B97F4A7C15) % (1 << 63) for at in cols.keys}
    gathered = cols.by_key(values)
    monkeypatch.setattr(signatures, "_C_PASS", None)
    assert cols.by_key(values) == gathered
    assert list(gathered) == [values[k] for k in cols.key_of]
    assert _rows is not None
    assert _rows.take_int64([1, 2, 1], {1: -(1 << 63), 2: (1 << 63) - 1}) is not None
    assert _rows.take_int64([1, 3], {1: 5}) is None  # a key missing
    assert _rows.take_int64([1], {1: 1 << 63}) is None  # over 64 bits
    assert _rows.take_int64([1], {1: True}) is None  # not an exact int
    assert _rows.take_int64(["1"], {"1": 1}) is None  # type: ignore[list-item,dict-item]
    assert _rows.take_int64([], {}) == b""


_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(1 << 64), max_value=1 << 64),
    st.floats(allow_nan=False),
    st.sampled_from(["scheduled", "started", "completed", "0", "default_pg", "gloo:all_reduce", ""]),
    st.tuples(st.sampled_from(["0", "1", 0]), st.sampled_from(["default_pg", "x"])),
    st.lists(st.integers(min_value=0, max_value=3), max_size=3),
)
_FIELDS = [
    "record_id",
    "collective_seq_id",
    "time_created_ns",
    "op_id",
    "state",
    "duration_ms",
    "frames",
    "is_p2p",
    "process_group",
    "profiling_name",
    "input_sizes",
]


@needs_c
@settings(max_examples=300, deadline=None)
@given(
    n=st.integers(min_value=1, max_value=12),
    changes=st.lists(
        st.tuples(st.integers(min_value=0, max_value=11), st.sampled_from(_FIELDS), _VALUES), max_size=4
    ),
    drop=st.lists(st.tuples(st.integers(min_value=0, max_value=11), st.sampled_from(_FIELDS)), max_size=1),
)
def test_random_odd_entries_read_the_same_by_either_pass(
    n: int, changes: list[tuple[int, str, Any]], drop: list[tuple[int, str]]
) -> None:
    entries = copy.deepcopy(_raw_entries(HEALTHY)[:n])
    for where, key, value in changes:
        entries[where % n][key] = value
    for where, key in drop:
        entries[where % n].pop(key, None)
    _assert_same(entries)


@needs_c
def test_the_c_pass_holds_its_references() -> None:
    """Many calls that take the dump, and many that decline it midway, leave nothing behind."""
    base = _raw_entries(HEALTHY)
    declined = _with(base, len(base) // 2, "state", "sleeping")
    assert _c_pass(base) is not None and _c_pass(declined) is None
    before = [sys.getrefcount(x) for x in (base[0]["state"], base[0]["process_group"], base[0])]
    for _ in range(50):  # warm up whatever caches
        _c_pass(base)
        _c_pass(declined)
    gc.collect()
    tracemalloc.start()
    try:
        start, _peak = tracemalloc.get_traced_memory()
        for _ in range(500):
            _c_pass(base)
            _c_pass(declined)
        gc.collect()
        end, _peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert end - start < 10_000, f"{end - start} bytes more after 1,000 calls"
    assert [sys.getrefcount(x) for x in (base[0]["state"], base[0]["process_group"], base[0])] == before


def test_a_real_dump_summarizes_the_same_by_either_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """The whole read of `flightdeck analyze` (`parse_signatures` and the fold), with the C pass
    where it is built and with the Python pass forced: the same summary."""
    from flightdeck.analysis.summary import summarize

    def summary() -> str:
        lean = load_dump_file(HEALTHY).parse_signatures()
        assert lean is not None
        return repr(summarize(lean[0], signatures=lean[1]))

    with_default = summary()
    monkeypatch.setattr(signatures, "_C_PASS", None)
    assert summary() == with_default
