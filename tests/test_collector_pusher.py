"""The durable queue (real SQLite) and the pusher against a real recording HTTP endpoint."""

from __future__ import annotations

import gzip
import json
import random
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry

from flightdeck.collector.metrics import CollectorMetrics
from flightdeck.collector.pusher import Outcome, Pusher
from flightdeck.collector.queue import DurableQueue, NewBatch
from flightdeck.readers.fr.files import read_dump_file
from flightdeck.wire import Batch, decode_batch, encode_batch, snapshot_from_dump
from tests.support.collector_fixtures import FR_DATA, thread_guard
from tests.support.collector_recorder import Recorder, Scripted


@pytest.fixture(autouse=True)
def _no_leaked_threads() -> Iterator[None]:
    yield from thread_guard()


def batch(batch_id: str, entries: int = 1) -> NewBatch:
    doc = {"wire_version": 2, "batch_id": batch_id, "snapshots": [], "nixl": []}
    return NewBatch(batch_id, "fr", entries, gzip.compress(json.dumps(doc).encode()))


class Rig:
    """A queue, a pusher and its metrics around one recorder."""

    def __init__(self, tmp_path: Path, recorder: Recorder, **kwargs: float) -> None:
        self.queue = DurableQueue(tmp_path / "state", max_bytes=1 << 20)
        self.registry = CollectorRegistry()
        self.metrics = CollectorMetrics(self.registry)
        self.metrics.watch_queue(self.queue.stats, time.time_ns)
        self.client = httpx.Client()
        self.pusher = Pusher(
            self.queue,
            client=self.client,
            url=recorder.url + "/api/v1/ingest",
            token="tok",
            metrics=self.metrics,
            rng=random.Random(7),
            deadline_s=kwargs.pop("deadline_s", 10.0),
            backoff_base_s=kwargs.pop("backoff_base_s", 0.05),
            backoff_max_s=0.2,
            max_attempts=3,
        )

    def metric(self, name: str, **labels: str) -> float:
        return self.registry.get_sample_value(name, labels) or 0.0

    def close(self) -> None:
        self.client.close()
        self.queue.close()


@pytest.fixture
def rig(tmp_path: Path, recorder: Recorder) -> Iterator[Rig]:
    r = Rig(tmp_path, recorder)
    yield r
    r.close()


# --- queue ------------------------------------------------------------------------------------


def test_queue_keeps_batches_and_shipped_state_across_reopen(tmp_path: Path) -> None:
    q = DurableQueue(tmp_path, max_bytes=1 << 20)
    assert q.enqueue([batch("a"), batch("b")], {("job", 0, 3): b"state-1"})
    q.close()
    q = DurableQueue(tmp_path, max_bytes=1 << 20)
    try:
        head = q.peek()
        assert head is not None and head.batch_id == "a"
        assert q.load_shipped() == {("job", 0, 3): b"state-1"}
        q.ack(head.seq)
        stats = q.stats()
        assert (stats.depth, stats.nbytes) == (1, len(batch("b").body))
    finally:
        q.close()


def test_full_queue_refuses_batches_and_their_shipped_state_together(tmp_path: Path) -> None:
    q = DurableQueue(tmp_path, max_bytes=100)
    try:
        big = NewBatch("big", "fr", 1, b"x" * 101)
        assert not q.enqueue([big], {("job", 0, 0): b"s"})
        assert q.peek() is None and q.load_shipped() == {}
        assert q.enqueue([], {("job", 0, 0): b"s"})  # state alone always fits
    finally:
        q.close()


# --- pusher -----------------------------------------------------------------------------------


@pytest.mark.slow
def test_503_and_429_are_retried_honouring_retry_after(rig: Rig, recorder: Recorder) -> None:
    recorder.script = [Scripted(503, {"Retry-After": "1"}), Scripted(429, {"Retry-After": "0"})]
    rig.queue.enqueue([batch("b1")])
    start = time.monotonic()
    assert rig.pusher.drain(timeout_s=10)
    assert time.monotonic() - start >= 0.95  # waited the server's second, not the 0.05 s backoff
    assert [(bid, st) for bid, st, _ in recorder.requests] == [("b1", 503), ("b1", 429), ("b1", 200)]
    assert rig.metric("flightdeck_collector_batches_failed_total", reason="unavailable") == 1
    assert rig.metric("flightdeck_collector_batches_failed_total", reason="throttled") == 1
    assert rig.metric("flightdeck_collector_batches_sent_total") == 1


def test_lost_answer_resends_the_same_batch_counted_once(rig: Rig, recorder: Recorder) -> None:
    recorder.script = [Scripted(drop=True)]
    rig.queue.enqueue([batch("b1"), batch("b2")])
    assert rig.pusher.drain(timeout_s=10)
    assert [(bid, st) for bid, st, _ in recorder.requests] == [("b1", -1), ("b1", 200), ("b2", 200)]
    assert list(recorder.batches) == ["b1", "b2"]  # the recorder's idempotency: b1 once
    assert rig.metric("flightdeck_collector_batches_duplicate_total") == 1
    assert rig.metric("flightdeck_collector_batches_failed_total", reason="connection") == 1


def test_4xx_goes_to_dead_letters_once_and_the_queue_goes_on(rig: Rig, recorder: Recorder) -> None:
    recorder.script = [Scripted(422, body={"detail": "batch.snapshots[0].job: missing field 'job'"})]
    rig.queue.enqueue([batch("bad"), batch("good")])
    assert rig.pusher.drain(timeout_s=10)
    assert [bid for bid, _, _ in recorder.requests] == ["bad", "good"]  # never retried
    assert rig.queue.dead_letters() == [("bad", 422, "batch.snapshots[0].job: missing field 'job'")]
    assert rig.metric("flightdeck_collector_dead_letter_batches") == 1
    # An operator fixes the server and puts it back.
    assert rig.queue.requeue_dead_letters() == 1
    assert rig.pusher.drain(timeout_s=10)
    assert list(recorder.batches) == ["good", "bad"]


def test_rejected_token_keeps_batches_queued_and_backs_off(
    rig: Rig, recorder: Recorder, caplog: pytest.LogCaptureFixture
) -> None:
    recorder.script = [Scripted(401, body={"detail": "unknown or revoked token"})] * 3
    rig.pusher.auth_backoff_max_s = 0.2
    rig.queue.enqueue([batch("b1"), batch("b2")])
    with caplog.at_level("DEBUG", logger="flightdeck.collector.pusher"):
        assert not rig.pusher.drain(timeout_s=0.25)  # rejected, backing off: nothing sent, nothing lost
        assert rig.queue.dead_letters() == [] and rig.queue.stats().depth == 2
        assert rig.metric("flightdeck_collector_token_rejected") == 1
        assert rig.pusher.drain(timeout_s=10)
    assert [(bid, st) for bid, st, _ in recorder.requests] == [
        ("b1", 401),
        ("b1", 401),
        ("b1", 401),
        ("b1", 200),
        ("b2", 200),
    ]
    assert rig.metric("flightdeck_collector_auth_failures_total") == 3
    assert rig.metric("flightdeck_collector_batches_failed_total", reason="auth") == 3
    assert rig.metric("flightdeck_collector_token_rejected") == 0
    assert rig.queue.dead_letters() == []
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and errors[0].startswith(
        "server rejected the collector token: HTTP 401 unknown or revoked token"
    )


def test_a_new_token_file_is_tried_at_once(tmp_path: Path, rig: Rig, recorder: Recorder) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("tok\n")
    recorder.script = [Scripted(401, body={"detail": "unknown or revoked token"})]
    rig.pusher.token_source = lambda: token_file.read_text().strip()
    rig.pusher.auth_backoff_max_s = 600.0  # without the new token, the retry would be minutes away
    # The operator writes the new token while the server is rejecting the old one.

    def rotate() -> None:
        token_file.write_text("new-token\n")

    recorder.on_request = rotate
    rig.queue.enqueue([batch("b1")])
    assert rig.pusher.drain(timeout_s=10)
    assert [(st, h["authorization"]) for _, st, h in recorder.requests] == [
        (401, "Bearer tok"),
        (200, "Bearer new-token"),
    ]


def test_500_is_retried_a_bounded_number_of_times(rig: Rig, recorder: Recorder) -> None:
    recorder.script = [Scripted(500)] * 3
    rig.queue.enqueue([batch("b1")])
    assert rig.pusher.drain(timeout_s=10)
    assert [st for _, st, _ in recorder.requests] == [500, 500, 500]
    assert rig.queue.dead_letters()[0][:2] == ("b1", 500)


def test_down_server_leaves_the_batch_queued_after_the_deadline(tmp_path: Path, recorder: Recorder) -> None:
    recorder.stop()
    r = Rig(tmp_path, recorder, deadline_s=0.5)
    try:
        r.queue.enqueue([batch("b1")])
        head = r.queue.peek()
        assert head is not None
        start = time.monotonic()
        assert r.pusher.deliver(head, deadline=time.monotonic() + 0.5) is Outcome.PENDING
        assert time.monotonic() - start < 2.0
        assert r.queue.stats().depth == 1
        assert r.metric("flightdeck_collector_batches_failed_total", reason="deadline") == 1
        recorder.start()
        assert r.pusher.drain(timeout_s=10)
        assert list(recorder.batches) == ["b1"]
    finally:
        r.close()


def _real_batch(batch_id: str) -> tuple[NewBatch, list[int]]:
    """A batch of three real rank snapshots (a committed gloo job's dumps), and their entry counts."""
    snaps = [snapshot_from_dump(read_dump_file(FR_DATA / "healthy_4" / f"rank_{r}.pkl")) for r in range(3)]
    doc = encode_batch(Batch(batch_id, "node-a", "test", time.time_ns(), snapshots=snaps))
    body = gzip.compress(json.dumps(doc).encode())
    return NewBatch(batch_id, "fr", sum(len(s.entries) for s in snaps), body), [len(s.entries) for s in snaps]


def test_422_for_some_snapshots_dead_letters_those_alone(rig: Rig, recorder: Recorder) -> None:
    # The server applied the batch but for snapshot 1 (the answer lists each refusal by index).
    refused = {
        "snapshot": 1,
        "job": "healthy_4",
        "attempt": 0,
        "rank": 1,
        "reason": "rank: 5 is not in [0, 4)",
    }
    recorder.script = [
        Scripted(
            422,
            body={
                "detail": "1 of 3 snapshots and NIXL samples refused (the rest was applied): rank ...",
                "applied": True,
                "snapshots": 2,
                "refused_count": 1,
                "refused": [refused],
            },
        )
    ]
    big, counts = _real_batch("b-partial")
    rig.queue.enqueue([big, batch("next")])
    assert rig.pusher.drain(timeout_s=10)
    assert [bid for bid, _, _ in recorder.requests] == ["b-partial", "next"]  # never resent
    assert rig.queue.stats().depth == 0
    [(bid, status, message)] = rig.queue.dead_letters()
    assert (bid, status) == ("b-partial-refused", 422)
    assert "snapshot 1 (healthy_4/0/1): rank: 5 is not in [0, 4)" in message
    assert rig.metric("flightdeck_collector_dead_lettered_total") == 1
    assert rig.metric("flightdeck_collector_batches_failed_total", reason="rejected") == 0
    # The dead letter holds only the refused snapshot, decodable as a batch of its own.
    assert rig.queue.requeue_dead_letters() == 1
    assert rig.pusher.drain(timeout_s=10)
    part = decode_batch(recorder.batches["b-partial-refused"])
    assert [(s.rank, len(s.entries)) for s in part.snapshots] == [(1, counts[1])]


def test_422_that_lists_fewer_refusals_than_it_counts_dead_letters_the_whole_batch(
    rig: Rig, recorder: Recorder
) -> None:
    listed = [{"snapshot": 0, "reason": "x"}]
    recorder.script = [
        Scripted(422, body={"detail": "2 refused", "applied": True, "refused_count": 2, "refused": listed})
    ]
    big, _ = _real_batch("b-many")
    rig.queue.enqueue([big])
    assert rig.pusher.drain(timeout_s=10)
    assert [bid for bid, _, _ in rig.queue.dead_letters()] == ["b-many"]
