"""The reader's column paths give what the entry-by-entry path gives: the same records, the same
summaries, the same refusals (`fr.columns._columnar_entries`, `fr.parse.parse_columns`,
`summary.add_columns`)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from flightdeck import spool
from flightdeck.analysis.summary import summarize
from flightdeck.readers.fr.columns import _columnar_entries
from flightdeck.readers.fr.errors import DumpError
from flightdeck.readers.fr.files import LoadedDump, load_dump_file
from flightdeck.readers.fr.normalize import _Ctx

DATA = Path(__file__).parent / "data"
HEALTHY = DATA / "fr" / "healthy_4" / "rank_0.final.pkl"


def _dumps() -> list[Path]:
    return sorted(p for p in DATA.rglob("*") if p.is_file() and spool.is_dump_name(p.name))


def _outcome(fn: Callable[[], Any]) -> tuple[str, str]:
    """What a read gives: the summary, every field written out (`repr`), or the refusal's message."""
    try:
        return "ok", repr(fn())
    except DumpError as exc:
        return type(exc).__name__, str(exc)


def _by_parse(loaded: LoadedDump) -> tuple[str, str]:
    return _outcome(lambda: summarize(loaded.parse()))


def _by_entries(loaded: LoadedDump, monkeypatch: pytest.MonkeyPatch) -> tuple[str, str]:
    with monkeypatch.context() as m:
        m.setattr("flightdeck.readers.fr.parse._columnar_entries", lambda raw, ctx: None)
        return _outcome(lambda: summarize(loaded.parse()))


def _by_columns(loaded: LoadedDump) -> tuple[str, str]:
    def run() -> Any:
        got = loaded.parse_columns()
        return summarize(*got) if got is not None else summarize(loaded.parse())

    return _outcome(run)


def _by_signatures(loaded: LoadedDump) -> tuple[str, str]:
    """What `flightdeck analyze`'s reader makes of a one-file rank (`analyze_cmd._summary_of_file`)."""

    def run() -> Any:
        lean = loaded.parse_signatures()
        if lean is not None:
            return summarize(lean[0], signatures=lean[1])
        got = loaded.parse_columns()
        return summarize(*got) if got is not None else summarize(loaded.parse())

    return _outcome(run)


def _takes_signatures(loaded: LoadedDump) -> bool:
    try:
        return loaded.parse_signatures() is not None
    except DumpError:
        return False


@pytest.mark.slow
def test_every_fixture_reads_the_same_by_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    compared = columns = lean = 0
    for path in _dumps():
        try:
            loaded = load_dump_file(path)
        except DumpError:
            continue
        want = _by_entries(loaded, monkeypatch)
        assert _by_parse(loaded) == want, path
        assert _by_columns(loaded) == want, path
        assert _by_signatures(loaded) == want, path
        compared += 1
        columns += loaded.parse_columns() is not None
        lean += _takes_signatures(loaded)
    assert compared > 100
    assert columns > compared // 2  # the fast paths are the ones the fixtures take
    assert lean > compared // 2


def test_a_real_dump_takes_the_column_paths() -> None:
    loaded = load_dump_file(HEALTHY)
    raw_entries = loaded.raw["entries"]
    assert _columnar_entries(raw_entries, _Ctx()) is not None
    got = loaded.parse_columns()
    assert got is not None
    dump, cols = got
    assert dump.entries == []
    assert [cols.entry(i) for i in range(len(cols.record_id))] == loaded.parse().entries


def _huge_duration(e: dict[str, Any]) -> None:
    e["duration_ms"] = 10**400  # float() of it overflows: the file is refused


def _deep_frame_name(e: dict[str, Any]) -> None:
    nested: Any = ()
    for _ in range(100_000):
        nested = (nested,)
    e["frames"] = [{"name": nested, "filename": "f.py", "line": 1}]


#: One odd value each, in the entry at position 3: each makes a column path decline (the column
#: check, or the summary's fold for `FOLD_DECLINES`), and the entry-by-entry path decides
#: (converts, warns or refuses) exactly as before.
MUTATIONS: dict[str, Callable[[dict[str, Any]], None]] = {
    "bool record id": lambda e: e.__setitem__("record_id", True),
    "float seq": lambda e: e.__setitem__("collective_seq_id", 7.0),
    "str op id": lambda e: e.__setitem__("op_id", "12"),
    "huge seq": lambda e: e.__setitem__("collective_seq_id", 1 << 70),
    "list profiling name": lambda e: e.__setitem__("profiling_name", ["gloo:all_reduce"]),
    "unknown state": lambda e: e.__setitem__("state", "sleeping"),
    "int retired": lambda e: e.__setitem__("retired", 1),
    "one-part process group": lambda e: e.__setitem__("process_group", ("0",)),
    "int group name": lambda e: e.__setitem__("process_group", (0, "default_pg")),
    "str process group": lambda e: e.__setitem__("process_group", "0"),
    "tuple sizes": lambda e: e.__setitem__("input_sizes", ((4, 4),)),
    "float dim": lambda e: e.__setitem__("input_sizes", [[4.0]]),
    "bool dim": lambda e: e.__setitem__("output_sizes", [[True]]),
    "int dtype": lambda e: e.__setitem__("input_dtypes", [3]),
    "str timeout": lambda e: e.__setitem__("timeout_ms", "600000"),
    "float started": lambda e: e.__setitem__("time_discovered_started_ns", 5.0),
    "huge int duration": _huge_duration,
    "int duration": lambda e: e.__setitem__("duration_ms", 3),
    "list thread name": lambda e: e.__setitem__("thread_name", ["t"]),
    "frames a dict": lambda e: e.__setitem__("frames", {"name": "x"}),
    "frame a list": lambda e: e.__setitem__("frames", [["x", "f.py", 1]]),
    "frame without line": lambda e: e.__setitem__("frames", [{"name": "x", "filename": "f.py"}]),
    "str line": lambda e: e.__setitem__("frames", [{"name": "x", "filename": "f.py", "line": "1"}]),
    "deeply nested frame name": _deep_frame_name,
    "missing op id": lambda e: e.pop("op_id"),
    "record ids out of order": lambda e: e.__setitem__("record_id", 0),
}
#: Values every normalization takes as they are, which the summary's column fold leaves to
#: `add_entries`.
FOLD_DECLINES = {"huge seq", "record ids out of order"}


@pytest.mark.parametrize("name", sorted(MUTATIONS))
def test_an_odd_value_reads_as_entry_by_entry(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    base = load_dump_file(HEALTHY)
    raw = copy.deepcopy(base.raw)
    MUTATIONS[name](raw["entries"][3])
    loaded = LoadedDump(raw, base.rank, base.source, base.meta, base.mtime_ns, base.size)
    declined = _columnar_entries(raw["entries"], _Ctx()) is None
    assert declined != (name in FOLD_DECLINES)
    want = _by_entries(loaded, monkeypatch)
    assert _by_columns(loaded) == want
    assert _by_signatures(loaded) == want


#: Values the entry-by-entry path takes in its fast path or converts without a warning, placed
#: in entries the summary keeps only as columns (not the last ones): the signature path either
#: reads them the same or declines, and the summary is the same either way.
SIGNATURE_CASES: dict[str, Callable[[dict[str, Any]], None]] = {
    **MUTATIONS,
    "bool seq": lambda e: e.__setitem__("collective_seq_id", True),
    "str p2p seq": lambda e: e.__setitem__("p2p_seq_id", "x"),
    "no retired": lambda e: e.pop("retired"),
    "no is_p2p": lambda e: e.pop("is_p2p"),
    "truthy is_p2p": lambda e: e.__setitem__("is_p2p", 1),
    "list process group": lambda e: e.__setitem__("process_group", ["0", "default_pg"]),
    "three-part process group": lambda e: e.__setitem__("process_group", ("0", "default_pg", "x")),
    "str sizes": lambda e: e.__setitem__("input_sizes", "ab"),
    "bytes dims": lambda e: e.__setitem__("input_sizes", [b"\x04"]),
    "dict sizes": lambda e: e.__setitem__("input_sizes", {(4, 4): 0}),
    "str dtypes": lambda e: e.__setitem__("input_dtypes", "Float"),
    "list dtype": lambda e: e.__setitem__("input_dtypes", [["Float"]]),
    "negative seq": lambda e: e.__setitem__("collective_seq_id", -1),
    "frames not a list": lambda e: e.__setitem__("frames", 5),
    "empty frames": lambda e: e.__setitem__("frames", []),
    "float duration": lambda e: e.__setitem__("duration_ms", 1.5),
}


@pytest.mark.parametrize("name", sorted(SIGNATURE_CASES))
@pytest.mark.parametrize("where", [0, 3, -1])
def test_an_odd_value_reads_the_same_by_signatures(
    name: str, where: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = load_dump_file(HEALTHY)
    raw = copy.deepcopy(base.raw)
    SIGNATURE_CASES[name](raw["entries"][where])
    loaded = LoadedDump(raw, base.rank, base.source, base.meta, base.mtime_ns, base.size)
    assert _by_signatures(loaded) == _by_entries(loaded, monkeypatch)


def test_shared_objects_read_the_same_by_signatures(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pickle that memoizes lists shared by entries (bench/analyze_scale.py writes such files)
    decodes to shared objects: read per distinct object, the summary is the same."""
    base = load_dump_file(HEALTHY)
    raw = copy.deepcopy(base.raw)
    entries = raw["entries"]
    for e in entries[1:]:
        for k in ("input_sizes", "output_sizes", "input_dtypes", "output_dtypes", "frames"):
            if e[k] == entries[0][k]:
                e[k] = entries[0][k]
    loaded = LoadedDump(raw, base.rank, base.source, base.meta, base.mtime_ns, base.size)
    assert loaded.parse_signatures() is not None
    assert _by_signatures(loaded) == _by_entries(loaded, monkeypatch)


def test_the_huge_duration_is_still_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    base = load_dump_file(HEALTHY)
    raw = copy.deepcopy(base.raw)
    _huge_duration(raw["entries"][3])
    loaded = LoadedDump(raw, base.rank, base.source, base.meta, base.mtime_ns, base.size)
    for read in (_by_columns, _by_signatures):
        kind, message = read(loaded)
        assert kind == "NotADumpError"
        assert "OverflowError" in message


def test_every_fixture_normalizes_to_the_same_records(monkeypatch: pytest.MonkeyPatch) -> None:
    for path in _dumps():
        try:
            loaded = load_dump_file(path)
            fast = loaded.parse()
        except DumpError:
            continue
        with monkeypatch.context() as m:
            m.setattr("flightdeck.readers.fr.parse._columnar_entries", lambda raw, ctx: None)
            assert loaded.parse() == fast, path
