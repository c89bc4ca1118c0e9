"""Group member lists on the wire: sent as [start, stop, step] runs when that is shorter (the world
group of a large job is one run), decoded to the same list, every run checked."""

from __future__ import annotations

import copy
import gzip
import json
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flightdeck.limits import MAX_WORLD_SIZE
from flightdeck.records import GroupInfo
from flightdeck.server.live.state import JobState
from flightdeck.server.validation import decode_checked
from flightdeck.wire import (
    MAX_RUNS,
    MEMBER_LISTS,
    MemberLists,
    Refusal,
    Snapshot,
    WireError,
    decode_batch,
    encode_batch,
    member_runs,
    snapshot_from_dump,
)
from tests.support.server_batches import make_batch, scenario_dumps


def _snapshot(members: tuple[int, ...] | None) -> Snapshot:
    dump = scenario_dumps("healthy_4")[0][-1]
    snap = snapshot_from_dump(dump)
    return replace(snap, groups={"0": GroupInfo("0", "default_pg", members)})


def _round_trip(snaps: list[Snapshot]) -> tuple[dict[str, object], list[Snapshot]]:
    doc = json.loads(json.dumps(encode_batch(make_batch(snaps))))
    return doc, decode_batch(doc).snapshots


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=70_000), max_size=300))
def test_any_member_list_comes_back_the_same(members: list[int]) -> None:
    _, (back,) = _round_trip([_snapshot(tuple(members))])
    assert back.groups["0"].ranks == tuple(members)


@pytest.mark.parametrize(
    ("members", "runs"),
    [
        (tuple(range(16_384)), [[0, 16_384, 1]]),  # the world group
        (tuple(range(3, 16_384, 8)), [[3, 16_380, 8]]),  # a data-parallel group (stop: the last + 1)
        (tuple(range(8)) + tuple(range(64, 72)), [[0, 8, 1], [64, 72, 1]]),
    ],
)
def test_regular_lists_go_as_runs(members: tuple[int, ...], runs: list[list[int]]) -> None:
    doc, (back,) = _round_trip([_snapshot(members)])
    group = doc["snapshots"][0]["groups"]["0"]  # type: ignore[index]
    assert group == {"desc": "default_pg", "runs": runs}
    assert back.groups["0"].ranks == members


def test_short_or_irregular_lists_go_as_lists() -> None:
    for members in [(0, 1, 2, 3), (5, 1, 9, 2, 8, 3, 7, 4), ()]:
        doc, (back,) = _round_trip([_snapshot(members)])
        assert doc["snapshots"][0]["groups"]["0"] == {"desc": "default_pg", "ranks": list(members)}  # type: ignore[index]
        assert back.groups["0"].ranks == members
    assert member_runs(tuple(range(0, 2 * MAX_RUNS + 2, 2))[::-1]) is None  # every rank a run of its own


def test_the_world_group_costs_bytes_not_kilobytes() -> None:
    world = tuple(range(16_384))
    snaps = [replace(_snapshot(world), rank=r) for r in range(8)]
    sent = gzip.compress(json.dumps(encode_batch(make_batch(snaps))).encode(), compresslevel=1)
    as_lists = encode_batch(make_batch(snaps))
    for s in as_lists["snapshots"]:
        s["groups"]["0"] = {"desc": "default_pg", "ranks": list(world)}
    before = gzip.compress(json.dumps(as_lists).encode(), compresslevel=1)
    assert len(before) - len(sent) > 8 * 16_384  # over a byte per member per snapshot saved
    back = decode_batch(json.loads(json.dumps(encode_batch(make_batch(snaps))))).snapshots
    assert all(s.groups["0"].ranks is back[0].groups["0"].ranks for s in back)  # one tuple per batch


@pytest.mark.parametrize(
    ("group", "says"),
    [
        ({"runs": "0-7"}, "expected a list of 1 to"),
        ({"runs": []}, "expected a list of 1 to"),
        ({"runs": [[0, 8, 1]] * (MAX_RUNS + 1)}, "expected a list of 1 to"),
        ({"runs": [[0, 8]]}, "runs of ints"),
        ({"runs": [[0, 8, True]]}, "runs of ints"),
        ({"runs": [[0, 8.0, 1]]}, "runs of ints"),
        ({"runs": [7]}, "[start, stop, step] runs"),
        ({"runs": [[-1, 8, 1]]}, "is not 0 <= start < stop"),
        ({"runs": [[8, 8, 1]]}, "is not 0 <= start < stop"),
        ({"runs": [[0, MAX_WORLD_SIZE + 1, 1]]}, "is not 0 <= start < stop"),
        ({"runs": [[0, 8, 0]]}, "step >= 1"),
        ({"runs": [[0, MAX_WORLD_SIZE, 1], [0, 2, 1]]}, f"more than {MAX_WORLD_SIZE} members"),
        ({"runs": [[0, 8, 1]], "ranks": [0]}, "both ranks and runs"),
    ],
)
def test_a_bad_run_refuses_its_snapshot_alone(group: dict[str, object], says: str) -> None:
    good = _snapshot(tuple(range(64)))
    doc = encode_batch(make_batch([good, replace(good, rank=1)]))
    bad = copy.deepcopy(doc)
    bad["snapshots"][1]["groups"]["0"] = {"desc": "default_pg", **group}
    with pytest.raises(WireError, match=r"batch\.snapshots\[1\]\.groups\['0'\]"):
        decode_batch(bad)
    refused: list[Refusal] = []
    batch = decode_batch(bad, refused=refused)
    assert [s.rank for s in batch.snapshots] == [good.rank]
    assert len(refused) == 1 and says in refused[0].reason


def test_runs_are_expanded_once_per_process_and_the_job_keeps_that_object() -> None:
    world = tuple(range(16_384))
    docs = [encode_batch(make_batch([replace(_snapshot(world), rank=r)])) for r in range(3)]
    lists = [decode_batch(json.loads(json.dumps(d))).snapshots[0].groups["0"].ranks for d in docs]
    first = lists[0]
    assert first == world and all(m is first for m in lists)  # one tuple, whatever the batch
    assert MEMBER_LISTS.bounds(first) == (0, 16_383)
    assert MEMBER_LISTS.bounds(world) is None  # an equal list it does not hold
    js = JobState(job_id=1, name="j", attempt=0)
    assert js.intern_members(first) is first and js.intern_members(first) is first
    assert js.intern_members(world) is first  # an equal list sent as ranks: the kept one
    assert js.lowest_member == {id(first): 0}


def test_member_lists_stay_within_their_bound() -> None:
    lists = MemberLists(max_members=100)
    a = lists.expand(((0, 60, 1),))
    assert lists.expand(((0, 60, 1),)) is a and lists.bounds(a) == (0, 59)
    b = lists.expand(((1, 100, 2),))  # 50 more: over 100, so the held ones go first
    assert b == tuple(range(1, 100, 2)) and lists.bounds(b) == (1, 99)
    assert lists.bounds(a) is None
    assert lists.expand(((0, 60, 1),)) == a  # expanded again, the same members


def test_a_cached_list_is_still_checked_against_each_snapshots_world() -> None:
    world = _snapshot(tuple(range(64)))
    big = replace(world, world_size=64)
    small = replace(world, rank=1, world_size=8)  # the same runs, but members beyond its world
    _, refused = decode_checked(json.loads(json.dumps(encode_batch(make_batch([big])))))
    assert refused == []
    batch, refused = decode_checked(json.loads(json.dumps(encode_batch(make_batch([big, small])))))
    assert [s.rank for s in batch.snapshots] == [0] and [r.rank for r in refused] == [1]


def test_a_list_larger_than_the_bound_is_not_held() -> None:
    lists = MemberLists(max_members=100)
    a = lists.expand(((0, 50, 1),))
    big = lists.expand(((0, 200, 1),))
    assert big == tuple(range(200)) and lists.bounds(big) is None
    assert lists.bounds(a) == (0, 49)  # what it held stays
