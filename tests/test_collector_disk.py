"""The collector's state directory on a small real tmpfs that fills up, with the real collector
process and a real server: acknowledging delivered batches goes on (nothing is sent twice), new
snapshots are held back with one clear log line, and once there is room the collector goes on by
itself and everything arrives exactly once."""

from __future__ import annotations

import errno
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.collector_stack import (
    Collector,
    Server,
    expected_entries,
    rank_feeders,
    stored,
)
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

RESERVE = 1024 * 1024


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """An 8 MiB tmpfs (root only), unmounted afterwards."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mnt = tmp_path / "statefs"
    mnt.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=8m,mode=0700", "tmpfs", str(mnt)], capture_output=True, text=True
    )
    if done.returncode != 0:  # root without CAP_SYS_ADMIN (an unprivileged container)
        pytest.skip(f"cannot mount a tmpfs: {done.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    with Server(tmp_path / "server-data", tmp_path / "server.log") as s:
        yield s


def fill(directory: Path) -> Path:
    """Write a file until the filesystem is full; returns it."""
    filler = directory / "filler"
    chunk = b"\xa5" * 65536
    with open(filler, "wb", buffering=0) as f:
        while True:
            try:
                f.write(chunk)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
                break
        while True:  # and the last few bytes
            try:
                f.write(b"\xa5" * 512)
            except OSError:
                break
    return filler


def _settled(collector: Collector, before: float) -> bool:
    """Whether the collector queued entries since `before` was read, and no more over the next
    second (five of its 0.2 s flushes): what it had read is committed."""
    now = collector.metric("flightdeck_collector_entries_enqueued_total")
    if now <= before:
        return False
    time.sleep(1.0)
    return collector.metric("flightdeck_collector_entries_enqueued_total") == now


def test_full_disk_under_the_queue_loses_nothing_and_sends_nothing_twice(
    tmp_path: Path, server: Server, small_fs: Path
) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(server.token("create", "node-a") + "\n")
    server.start()
    spool = tmp_path / "spool"
    feeders = rank_feeders(spool)
    collector = Collector(tmp_path, server.url, token_file, spool, None)
    config = collector.config.read_text().replace(
        f'state_dir = "{tmp_path / "collector-state"}"', f'state_dir = "{small_fs / "state"}"'
    )
    collector.config.write_text(config + f"disk_reserve_bytes = {RESERVE}\n")
    collector.start()
    duplicates = "flightdeck_ingest_batches_total"
    try:
        for f in feeders.values():
            f.write_early(4, age_s=3.0)
        wait_until(lambda: len(server.timeline()) == 4 * len(feeders), 60, "the first snapshots")

        # Batches queued while the server is away; then the disk fills up under the queue.
        server.stop()
        entries = collector.metric("flightdeck_collector_entries_enqueued_total")
        for f in feeders.values():
            f.write_early(7, age_s=2.0)
        # Every rank's new snapshot read and committed to the queue before the disk fills: one
        # batch queued is not enough (on a loaded machine the others were still unread, then held
        # back by the full disk, and never reached the server before the test's room came back).
        wait_until(
            lambda: collector.metric("flightdeck_collector_files_seen_total") >= 2 * len(feeders),
            30,
            "the snapshots taken at the outage's start to be read",
        )
        wait_until(lambda: _settled(collector, entries), 30, "the read snapshots queued")
        assert collector.metric("flightdeck_collector_queue_depth_batches") >= 1
        filler = fill(small_fs)
        # Acknowledging the queued batches needs room in SQLite's WAL, which there is not.
        server.start()
        wait_until(lambda: len(server.timeline()) == 7 * len(feeders), 60, "the queued snapshots")
        wait_until(lambda: collector.metric("flightdeck_collector_disk_full") == 1, 30, "disk_full = 1")
        for f in feeders.values():
            f.write_early(9, age_s=1.5)  # cannot be queued now: held back in the spool
        time.sleep(5.0)  # the pusher would have re-sent the acknowledged batch about 5 times by now
        dup_full = server.metric(duplicates, outcome="duplicate")
        depth_full = collector.metric("flightdeck_collector_queue_depth_batches")
        assert dup_full == 0, f"{dup_full} batches sent twice while the disk was full"
        assert depth_full == 0
        assert len(server.timeline()) == 7 * len(feeders)  # the held-back snapshots wait

        # Room again (someone cleaned up): the collector goes on by itself.
        filler.unlink()
        wait_until(lambda: collector.metric("flightdeck_collector_disk_full") == 0, 30, "disk_full = 0")
        wait_until(lambda: len(server.timeline()) == 9 * len(feeders), 60, "the held-back snapshots")
        for f in feeders.values():
            f.copy_committed(("", ".stall", ".final"))
        want = expected_entries()
        wait_until(lambda: stored(server) == want, 90, "every entry with its final state")
        wait_until(
            lambda: collector.metric("flightdeck_collector_queue_depth_batches") == 0, 30, "an empty queue"
        )
        assert server.metric(duplicates, outcome="duplicate") == 0
        assert collector.metric("flightdeck_collector_dead_letter_batches") == 0
        assert collector.metric("flightdeck_collector_loop_errors_total", loop="flush") == 0
        log = collector.log.read_text()
        assert (
            log.count("is full: released the 1048576-byte reserve") + log.count("is full: new batches") == 1
        ), log
        assert "has room again: reserve restored" in log
        assert "Traceback" not in log, log[-4000:]
    finally:
        code = collector.stop()
    assert code == 0
