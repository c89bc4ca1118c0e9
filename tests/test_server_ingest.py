"""Ingest through the in-process server (server/ingest_http.py, server/ingest.py) on real SQLite and
PostgreSQL: auth, validation, size limits, idempotency, backpressure and the decode gate."""

from __future__ import annotations

import asyncio
import gzip
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import text

from flightdeck.server import store
from flightdeck.server.decode_gate import DecodeGate
from flightdeck.server.live import LiveDiagnosis
from tests.support.clock import FakeClock
from tests.support.server_app import AUTH, NS, STALL_S, Server, make_server
from tests.support.server_batches import body, make_batch, scenario_dumps, skip_stuck_view, snapshots


@pytest.fixture
def server(database_url: str, clock: FakeClock) -> Iterator[Server]:
    """A server on a fresh database (SQLite file or PostgreSQL schema)."""
    with make_server(database_url, clock) as srv:
        yield srv


def test_auth_missing_bad_and_revoked_tokens(server: Server) -> None:
    data, headers = body(make_batch(snapshots(scenario_dumps("healthy_4")[0][:1])))
    url = "/api/v1/ingest"
    assert server.client.post(url, content=data, headers=headers).status_code == 401
    r = server.client.post(url, content=data, headers={**headers, "Authorization": "Bearer nope"})
    assert r.status_code == 401
    assert server.client.post(url, content=data, headers={**headers, **AUTH}).status_code == 200
    with server.svc.db.write() as session, session.begin():
        assert store.revoke_token(session=session, name="test-collector", now_ns=server.clock())
    # A verified token is trusted for auth_cache_s (default 1 s) without asking the database.
    assert server.client.post(url, content=data, headers={**headers, **AUTH}).status_code == 200
    server.clock.advance(1.0)
    r = server.client.post(url, content=data, headers={**headers, **AUTH})
    assert r.status_code == 401
    assert "revoked" in r.json()["detail"]
    reg = server.svc.registry
    assert reg.get_sample_value("flightdeck_ingest_rejects_total", {"reason": "auth"}) == 3


def test_schema_errors_are_422_with_the_field(server: Server) -> None:
    doc = {"wire_version": 2, "batch_id": "b1", "collector": {"host": "h"}, "sent_at_ns": 1, "stacks": []}
    doc["sigs"] = []
    r = server.client.post("/api/v1/ingest", content=json.dumps(doc), headers=AUTH)
    assert r.status_code == 422
    assert r.json()["detail"] == "batch: missing field 'snapshots'"
    r = server.client.post("/api/v1/ingest", content=b"{not json", headers=AUTH)
    assert r.status_code == 422
    assert "not JSON" in r.json()["detail"]
    bad_nixl = {**doc, "snapshots": [], "nixl": [{"v": 99}]}
    r = server.client.post("/api/v1/ingest", content=json.dumps(bad_nixl), headers=AUTH)
    assert r.status_code == 422
    assert r.json()["detail"].startswith("batch.nixl[0]:")
    assert server.counts()["entries"] == 0


def test_size_limits_on_the_wire_and_after_gzip(database_url: str, clock: FakeClock) -> None:
    srv = make_server(database_url, clock, max_request_bytes=64 * 1024)
    try:
        big = b"x" * (65 * 1024)
        r = srv.client.post("/api/v1/ingest", content=big, headers=AUTH)
        assert r.status_code == 413
        bomb = gzip.compress(b"{" + b" " * (10 * 1024 * 1024) + b"}")  # 10 MiB of JSON in ~10 KiB
        assert len(bomb) < 64 * 1024
        r = srv.client.post("/api/v1/ingest", content=bomb, headers={**AUTH, "Content-Encoding": "gzip"})
        assert r.status_code == 413
        assert (
            srv.svc.registry.get_sample_value("flightdeck_ingest_rejects_total", {"reason": "too_large"}) == 2
        )
    finally:
        srv.svc.close()


def test_same_batch_twice_changes_nothing(server: Server) -> None:
    snaps = snapshots([d for ds in scenario_dumps("healthy_4").values() for d in ds])
    r1 = server.push(snaps, batch_id="batch-1")
    assert r1.status_code == 200 and r1.json()["duplicate"] is False
    before = server.counts()
    assert before["entries"] > 0
    r2 = server.push(snaps, batch_id="batch-1")
    assert r2.status_code == 200
    assert r2.json()["duplicate"] is True
    assert server.counts() == before
    assert (
        server.svc.registry.get_sample_value("flightdeck_ingest_batches_total", {"outcome": "duplicate"}) == 1
    )


def test_saturated_ingest_is_throttled(database_url: str, clock: FakeClock) -> None:
    srv = make_server(
        database_url, clock, max_inflight_ingests=1, retry_after_s=3, ingest_queue_timeout_s=0.2
    )
    try:
        asyncio.run(srv.svc.ingest.admission.acquire())  # another request holds the only slot (free: at once)
        r = srv.push(snapshots(scenario_dumps("healthy_4")[0][:1]))  # waits 0.2 s in the queue
        assert r.status_code == 429
        assert r.headers["Retry-After"] == "3"
        assert "timed out waiting for a slot" in r.json()["detail"]
        srv.svc.ingest.release()
        assert srv.push(snapshots(scenario_dumps("healthy_4")[0][:1])).status_code == 200
        reg = srv.svc.registry
        assert reg.get_sample_value("flightdeck_ingest_batches_total", {"outcome": "throttled"}) == 1
        assert reg.get_sample_value("flightdeck_ingest_queued_requests") == 0
    finally:
        srv.svc.close()


@pytest.mark.slow
def test_ingest_waits_in_the_queue_for_a_slot(database_url: str, clock: FakeClock) -> None:
    # A request that finds every slot taken waits (no 429) and is applied once one frees up.
    srv = make_server(database_url, clock, max_inflight_ingests=1, ingest_queue_timeout_s=30)
    try:
        admission = srv.svc.ingest.admission
        asyncio.run(admission.acquire())  # the only slot, free: taken at once
        pushed: list[int] = []
        t = threading.Thread(
            target=lambda: pushed.append(srv.push(snapshots(scenario_dumps("healthy_4")[0][:1])).status_code)
        )
        t.start()
        deadline = time.monotonic() + 10
        while admission.queued == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert admission.queued == 1 and not pushed
        assert srv.svc.registry.get_sample_value("flightdeck_ingest_queued_requests") == 1
        srv.svc.ingest.release()  # hands the slot to the waiting request
        t.join(10)
        assert pushed == [200] and admission.queued == 0
        assert srv.counts()["entries"] > 0
    finally:
        srv.svc.close()


def test_a_batch_is_decoded_after_the_diagnosis_step_in_progress(database_url: str, clock: FakeClock) -> None:
    # The worker's step holds new batches back (LiveDiagnosis.run_step): under load it would
    # otherwise share the GIL with every decoding thread and find a hang late.
    srv = make_server(database_url, clock)
    try:
        pushed: list[int] = []
        t = threading.Thread(
            target=lambda: pushed.append(srv.push(snapshots(scenario_dumps("healthy_4")[0][:1])).status_code)
        )
        with srv.svc.decode_gate.hold():  # as during a step
            t.start()
            t.join(0.3)  # it waits up to DECODE_GATE_MAX_WAIT_S (1 s) for the step
            assert not pushed and srv.counts()["entries"] == 0
        t.join(10)
        assert pushed == [200] and srv.counts()["entries"] > 0
    finally:
        srv.svc.close()


def test_the_worker_step_closes_the_decode_gate_while_it_diagnoses(server: Server) -> None:
    snaps = skip_stuck_view()
    server.clock.now_ns = max(s.snapshot_time_ns for s in snaps) + int((STALL_S + 3) * NS)
    assert server.push(snaps).status_code == 200
    gate_held: list[bool] = []
    gate = DecodeGate()
    # A second worker on the same database (as after a restart), whose finding callback runs
    # inside its step; a monotonic clock far ahead makes the job due without forcing.
    live = LiveDiagnosis(
        db=server.svc.db,
        settings=server.svc.settings,
        clock=server.clock,
        on_events=lambda _js, _events: gate_held.append(gate.held),
        decode_gate=gate,
        on_db_error=lambda: None,
        monotonic=lambda: 1e9,
    )
    live.load()
    assert not gate.held
    assert live.run_step() == 1
    assert gate_held == [True]  # the hang was opened with decoding held back
    assert not gate.held  # and the gate is open again after the step


def test_locked_sqlite_answers_503(tmp_path: Any, clock: FakeClock) -> None:
    url = f"sqlite:///{tmp_path}/locked.db"
    srv = make_server(url, clock, db_busy_timeout_s=0.2)
    try:
        with srv.svc.db.write_engine.connect() as conn:
            conn.execute(text("SELECT 1"))  # BEGIN IMMEDIATE: holds the write lock
            r = srv.push(snapshots(scenario_dumps("healthy_4")[0][:1]))
            assert r.status_code == 503
            assert r.headers["Retry-After"] == "1"
        assert srv.svc.registry.get_sample_value("flightdeck_db_errors_total") == 1
    finally:
        srv.svc.close()
