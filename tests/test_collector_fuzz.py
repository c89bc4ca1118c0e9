"""Property: whatever values a dump and its sidecar hold, the collector's read path either refuses the
file (a DumpError or SnapshotError: it is set aside alone) or makes a snapshot the wire decoder takes.

So a file can never make the collector send something the server refuses for the whole batch, and
never raises anything else out of the reader (which would stop the flush for every job). The files
are real pickles and JSON sidecars, built from a committed real dump with fields replaced by hostile
values, read by the collector's own incremental reader.
"""

from __future__ import annotations

import json
import pickle
import tempfile
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flightdeck.readers.fr.decode import load_raw
from flightdeck.readers.fr.errors import DumpError
from flightdeck.readers.incremental import IncrementalReader
from flightdeck.snapshot_check import SnapshotError, check_snapshot
from flightdeck.wire import Batch, decode_batch, encode_batch, snapshot_from_dump
from tests.support.collector_fixtures import FR_DATA

SRC = FR_DATA / "healthy_2" / "rank_0.final.pkl"
RAW = load_raw(SRC.read_bytes())
META = json.loads(SRC.with_name(SRC.name + ".meta.json").read_text())

_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([2**31, 2**63 - 1, 2**63, 2**64, -1, 0, 1_048_576, 2_000_000_000]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.sampled_from(["", "\x00", "a\x00b", "\x1b[31mred", "x" * 300, "600000", "nan", "scheduled"]),
)
hostile = st.one_of(
    _scalars, st.lists(_scalars, max_size=3), st.dictionaries(st.text(max_size=5), _scalars, max_size=3)
)

ENTRY_FIELDS = sorted({k for e in RAW["entries"] for k in e})
META_FIELDS = ["job", "attempt", "rank", "world_size", "local_rank", "host", "pid", "torch_version", "backend",
               "snapshot_time_ns", "kind", "interval_s", "exception", "groups", "thread_stacks"]  # fmt: skip


@pytest.mark.slow
@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    entry_changes=st.lists(
        st.tuples(
            st.integers(min_value=0, max_value=len(RAW["entries"]) - 1),
            st.sampled_from(ENTRY_FIELDS),
            hostile,
        ),
        max_size=4,
    ),
    meta_changes=st.dictionaries(st.sampled_from(META_FIELDS), hostile, max_size=3),
    raw_changes=st.dictionaries(
        st.sampled_from(["pg_config", "comm_lib_version", "version"]), hostile, max_size=2
    ),
    frame_changes=st.lists(
        st.tuples(
            st.integers(min_value=0, max_value=len(RAW["entries"]) - 1),
            st.sampled_from(["name", "filename", "line"]),
            hostile,
        ),
        max_size=2,
    ),
)
def test_any_dump_is_refused_alone_or_decodes_on_the_server(
    entry_changes: list[tuple[int, str, Any]],
    meta_changes: dict[str, Any],
    raw_changes: dict[str, Any],
    frame_changes: list[tuple[int, str, Any]],
) -> None:
    raw = dict(RAW, entries=[dict(e) for e in RAW["entries"]], **raw_changes)
    for i, key, value in frame_changes:
        frames = [
            dict(f) for f in raw["entries"][i].get("frames") or [{"name": "f", "filename": "x.py", "line": 1}]
        ]
        frames[0][key] = value
        raw["entries"][i]["frames"] = frames
    for i, key, value in entry_changes:
        raw["entries"][i][key] = value
    meta = dict(META, **meta_changes)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "rank_0.pkl"
        path.with_name(path.name + ".meta.json").write_bytes(
            orjson.dumps(meta, option=orjson.OPT_NON_STR_KEYS) if _jsonable(meta) else b"{}"
        )
        path.write_bytes(pickle.dumps(raw, protocol=4))
        try:
            changed = IncrementalReader().read(path, identify=lambda _h: None, max_bytes=1 << 24)
            snap = snapshot_from_dump(changed.dump)
            snap.oldest_record_id = changed.oldest_record_id
            snap.host = snap.host or "node-a"
            check_snapshot(snap)
        except (DumpError, SnapshotError):
            return  # set aside alone, with its reason
    doc = encode_batch(Batch("b", "node-a", "test", 1, snapshots=[snap]))
    decode_batch(json.loads(orjson.dumps(doc)))  # what the server decodes; raises WireError if not


def _jsonable(meta: dict[str, Any]) -> bool:
    try:
        orjson.dumps(meta, option=orjson.OPT_NON_STR_KEYS)
    except TypeError:
        return False
    return True
