"""`read_all`: `flightdeck analyze`'s reader processes, the calling one among them. Every item is
read once and its result handed over whoever read it; a worker's exception is raised in the
caller; a worker that dies has its items read by the caller; the summaries are those of one
process reading every file."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest

from bench.analyze_scale import build
from flightdeck.analyze_cmd import load_summaries
from flightdeck.analyze_readers import CHUNK, read_all

_CALLER = os.getpid()
R = TypeVar("R")


def _square(x: int) -> tuple[int, int]:
    return x * x, os.getpid()


def _fails_in_a_worker(x: int) -> int:
    if os.getpid() != _CALLER:
        raise ValueError(f"item {x}")
    time.sleep(0.01)  # so that the caller does not read every item before the worker starts
    return x


def _dies_in_a_worker(x: int) -> tuple[int, int]:
    if os.getpid() != _CALLER:
        os._exit(3)  # as a worker killed (the OOM killer) would: no word to the caller
    time.sleep(0.01)
    return x * x, os.getpid()


def _collect(items: list[int], work: Callable[[int], R], processes: int) -> dict[int, R]:
    got: dict[int, R] = {}

    def keep(i: int, res: R) -> None:
        assert i not in got
        got[i] = res

    read_all(items, work, processes=processes, on_result=keep)
    return got


def test_every_item_is_read_once_by_one_of_the_processes() -> None:
    items = list(range(20 * CHUNK + 3))
    got = _collect(items, _square, 3)
    assert sorted(got) == items
    assert all(got[i][0] == i * i for i in items)


def test_one_process_reads_everything_here() -> None:
    got = _collect(list(range(5)), _square, 1)
    assert {pid for _sq, pid in got.values()} == {_CALLER}


def test_an_exception_in_a_worker_is_raised_in_the_caller() -> None:
    with pytest.raises(ValueError, match="item"):
        _collect(list(range(200)), _fails_in_a_worker, 2)


def test_the_items_of_a_worker_that_dies_are_read_by_the_caller() -> None:
    items = list(range(40))
    got = _collect(items, _dies_in_a_worker, 2)
    assert sorted(got) == items
    assert {pid for _sq, pid in got.values()} == {_CALLER}


def test_the_summaries_are_those_of_one_process(tmp_path: Path) -> None:
    build(tmp_path, ranks=40, entries=30, culprit=7)
    (tmp_path / "rank_12").write_bytes(b"not a pickle")
    alone, errors_alone = load_summaries([tmp_path], workers=1)
    shared, errors = load_summaries([tmp_path], workers=3)
    assert errors == errors_alone and len(errors) == 1
    assert shared == alone
    assert len(shared[(None, 0)]) == 39
