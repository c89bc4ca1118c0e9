"""The spool contract (`flightdeck.spool`): names both sides agree on, and a sidecar schema that
covers every key the collector reads."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from flightdeck import spool

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(
    ("rank", "kind", "recent", "name"),
    [
        (3, "periodic", False, "rank_3.pkl"),
        (3, "periodic", True, "rank_3.recent.pkl"),
        (0, "stall", False, "rank_0.stall.pkl"),
        (12, "final", False, "rank_12.final.pkl"),
    ],
)
def test_snapshot_names_are_dumps_of_their_rank(
    rank: int, kind: spool.SnapshotKind, recent: bool, name: str
) -> None:
    """Every name the agent writes is one the collector takes, with the rank it was written for;
    its sidecar and its temporary name are not dumps."""
    assert spool.snapshot_name(rank, kind, recent=recent) == name
    assert spool.is_dump_name(name) and spool.rank_from_name(name) == rank
    dump = Path("/spool/job/0") / name
    assert spool.sidecar_path(dump).name == name + ".meta.json"
    assert not spool.is_dump_name(spool.sidecar_path(dump).name)
    assert not spool.is_dump_name(spool.temp_path(dump, 4242).name)
    assert not spool.is_dump_name(spool.temp_path(spool.sidecar_path(dump), 4242).name)


def test_attempt_dir_and_job_names() -> None:
    """`<spool>/<job>/<attempt>`, with the job id made safe for a path."""
    assert spool.attempt_dir(Path("/s"), spool.sanitize_job("a b/c"), 2) == Path("/s/a_b_c/2")
    assert spool.sanitize_job("..//..") == "job"
    assert spool.sanitize_job("..", default="") == ""


def test_sidecar_constants_are_schema_keys() -> None:
    """The key constants readers use on untyped JSON name keys of the typed schema."""
    keys = spool.Sidecar.__required_keys__
    assert {spool.VERSION_KEY, spool.RING_META_KEY} <= keys
    assert spool.RingExtent.__required_keys__ == {"first", "entries", "base_time_ns"}
    assert spool.is_sidecar({spool.VERSION_KEY: spool.SIDECAR_VERSION})
    assert not spool.is_sidecar({"rank": 0}) and not spool.is_sidecar([spool.VERSION_KEY])


def _meta_keys_read(path: Path) -> set[str]:
    """The literal keys read from a variable named `meta` (`meta.get("k")`, `meta["k"]`)."""
    keys: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "get"
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "meta"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            keys.add(node.args[0].value)
        elif (
            isinstance(node, ast.Subscript)
            and isinstance(node.value, ast.Name)
            and node.value.id == "meta"
            and isinstance(node.slice, ast.Constant)
            and isinstance(node.slice.value, str)
        ):
            keys.add(node.slice.value)
    return keys


def test_collector_reads_only_schema_keys() -> None:
    """Every sidecar key the reader looks up is one the agent writes (a typo there would read as
    "absent" forever, silently)."""
    read = set().union(*map(_meta_keys_read, (ROOT / "flightdeck" / "readers" / "fr").glob("*.py")))
    assert read, "the reader no longer reads `meta` by literal keys: update this test"
    assert read <= spool.Sidecar.__required_keys__, sorted(read - spool.Sidecar.__required_keys__)
