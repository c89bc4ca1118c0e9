"""GroupCommit with real threads: concurrent items share writes, errors stay with their items,
an item no writer takes in time comes back as TimeoutError."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from flightdeck.server.group_commit import GroupCommit, Pending


def test_items_queued_during_a_write_share_the_next_one() -> None:
    groups: list[list[int]] = []
    release = threading.Event()

    def write(group: list[Pending[int]]) -> None:
        groups.append([p.item for p in group])
        if len(groups) == 1:
            release.wait(10)  # hold the first write while the others queue
        for p in group:
            p.result = p.item * 10

    gc: GroupCommit[int] = GroupCommit(write, writers=1)
    with ThreadPoolExecutor(8) as pool:
        first = pool.submit(gc.run, 0, timeout_s=10)
        while not groups:
            time.sleep(0.001)
        rest = [pool.submit(gc.run, i, timeout_s=10) for i in range(1, 8)]
        while sum(1 for p in gc._queue) < 7:
            time.sleep(0.001)
        release.set()
        results = [f.result().result for f in [first, *rest]]
    assert results == [i * 10 for i in range(8)]
    assert groups == [[0], [1, 2, 3, 4, 5, 6, 7]]


@pytest.mark.parametrize(("threads", "items", "pause_s"), [(16, 40, 0.01), (64, 1000, 0.002)])
def test_max_weight_splits_groups_and_writers_bound_concurrency(
    threads: int, items: int, pause_s: float
) -> None:
    # Each thread sleeps on its own item's event: the queue must still drain through both writer
    # slots (a freed slot wakes the next item in line, a new leader the one after it).
    active = 0
    most = 0
    sizes: list[int] = []
    lock = threading.Lock()

    def write(group: list[Pending[int]]) -> None:
        nonlocal active, most
        with lock:
            active += 1
            most = max(most, active)
            sizes.append(sum(p.weight for p in group))
        time.sleep(pause_s)
        for p in group:
            p.result = -p.item
        with lock:
            active -= 1

    gc: GroupCommit[int] = GroupCommit(write, writers=2, max_weight=5)
    with ThreadPoolExecutor(threads) as pool:
        got = list(pool.map(lambda i: gc.run(i, weight=1 + i % 3, timeout_s=30).result, range(items)))
    assert got == [-i for i in range(items)]
    assert most == 2
    assert max(sizes) <= 5
    assert sum(sizes) == sum(1 + i % 3 for i in range(items))
    assert not gc._queue


def test_an_error_reaches_only_the_items_of_its_write() -> None:
    def write(group: list[Pending[int]]) -> None:
        for p in group:
            if p.item == 3:
                p.error = ValueError("bad item")
            else:
                p.result = p.item
        if any(p.item == 5 for p in group):
            raise RuntimeError("write failed")

    gc: GroupCommit[int] = GroupCommit(write, writers=1)
    assert gc.run(1, timeout_s=1).result == 1
    bad = gc.run(3, timeout_s=1)
    assert isinstance(bad.error, ValueError)
    failed = gc.run(5, timeout_s=1)
    assert isinstance(failed.error, RuntimeError)
    assert gc.run(6, timeout_s=1).result == 6  # the writer slot was given back


def test_an_item_not_taken_in_time_is_withdrawn() -> None:
    started = threading.Event()
    release = threading.Event()
    written: list[int] = []

    def write(group: list[Pending[int]]) -> None:
        started.set()
        release.wait(10)
        written.extend(p.item for p in group)
        for p in group:
            p.result = p.item

    gc: GroupCommit[int] = GroupCommit(write, writers=1, max_weight=1)
    with ThreadPoolExecutor(2) as pool:
        slow = pool.submit(gc.run, 1, timeout_s=10)
        started.wait(10)
        with pytest.raises(TimeoutError):
            gc.run(2, timeout_s=0.05)
        release.set()
        assert slow.result().result == 1
    assert written == [1]  # the withdrawn item was never written
    assert not gc._queue
