"""The control plane end to end, in-process, on real SQLite and real PostgreSQL.

Batches are built from the committed dumps of real gloo jobs (tests/data/fr/). Workers are off
(`start_workers=False`) and the diagnosis is stepped by hand with a fake clock, so every test is
deterministic; the webhook test runs the real delivery thread against a real local HTTP server.
"""

from __future__ import annotations

import gzip
import json
import platform
import re
import shutil
import subprocess
import threading
import time
import warnings
from collections.abc import Iterator
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

import httpx
import pytest
from sqlalchemy import text

from flightdeck.analysis import Report
from flightdeck.collector.frdump import merge
from flightdeck.server import store
from flightdeck.server.live import LiveDiagnosis
from flightdeck.wire import BATCH_AGE_HEADER, Snapshot, snapshot_from_dump
from tests.support.clock import FakeClock
from tests.support.metrics_doc import METRICS_DOC
from tests.support.server_app import (
    AUTH,
    NS,
    STALL_S,
    Server,
    healthy_prefix,
    make_server,
    nixl_wire_sample,
    skip_stuck_view,
    start_server_process,
)
from tests.support.server_batches import body, make_batch, scenario_dumps, scenario_expected, snapshots

with warnings.catch_warnings():
    # starlette warns at import that it prefers httpx2; the TestClient itself works unchanged.
    warnings.simplefilter("ignore")


@pytest.fixture
def server(database_url: str, clock: FakeClock) -> Iterator[Server]:
    """A server on a fresh database (SQLite file or PostgreSQL schema)."""
    srv = make_server(database_url, clock)
    yield srv
    srv.svc.close()


# --- scenarios built from real dumps -------------------------------------------------------------


# --- ingest: auth, validation, limits, idempotency -----------------------------------------------


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
    doc = {"wire_version": 1, "batch_id": "b1", "collector": {"host": "h"}, "sent_at_ns": 1, "stacks": []}
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


def test_entry_state_is_upserted(server: Server) -> None:
    stuck, finals, _ = healthy_prefix(10)
    assert server.push(stuck).status_code == 200
    n = server.counts()["entries"]

    def state_of_seq10(rank: int) -> tuple[str, bool]:
        r = server.client.get(
            "/api/v1/jobs/healthy_4/timeline", params={"group": "0", "seq_from": 10, "seq_to": 10}
        )
        row = next(e for e in r.json()["entries"] if e["rank"] == rank)
        return row["state"], row["retired"]

    assert state_of_seq10(0) == ("scheduled", False)
    assert server.push(finals).status_code == 200
    assert state_of_seq10(0) == ("scheduled", True)  # gloo: retired is the finished signal
    after = server.counts()["entries"]
    assert after == sum(len(s.entries) for s in finals)
    assert after > n


def test_timeline_window(server: Server) -> None:
    server.push(snapshots([d for ds in scenario_dumps("healthy_4").values() for d in ds]))
    r = server.client.get(
        "/api/v1/jobs/healthy_4/timeline",
        params={"group": "0", "rank_from": 1, "rank_to": 2, "seq_from": 3, "seq_to": 5, "limit": 100},
    )
    rows = r.json()["entries"]
    assert {(e["rank"], e["collective_seq_id"]) for e in rows} == {(r, s) for r in (1, 2) for s in (3, 4, 5)}
    assert [e["collective_seq_id"] for e in rows] == sorted(e["collective_seq_id"] for e in rows)
    r = server.client.get("/api/v1/jobs/healthy_4/timeline", params={"limit": 2})
    assert len(r.json()["entries"]) == 2
    assert server.client.get("/api/v1/jobs/nope/timeline").status_code == 404


# --- live diagnosis ------------------------------------------------------------------------------


def test_hang_found_through_the_api_names_the_rank(server: Server) -> None:
    snaps = skip_stuck_view()
    server.clock.now_ns = max(s.snapshot_time_ns for s in snaps) + int((STALL_S + 3) * NS)
    assert server.push(snaps).status_code == 200
    server.diagnose()
    doc = server.job("skip")
    exp = scenario_expected("skip")
    assert doc["status"] == "hung"
    assert set(Report(0, [], [], []).to_json()) <= set(doc)  # the `flightdeck analyze` shape
    root = doc["findings"][0]
    assert root["kind"] == exp["kind"] == "hang"
    assert root["culprit_ranks"] == exp["culprit_ranks"] == [2]
    assert root["process_group"] == exp["process_group"]
    assert root["collective_seq_id"] == exp["collective_seq_id"]
    assert root["waiting_ranks"] == [0, 1, 3]
    jobs = server.client.get("/api/v1/jobs").json()
    assert [(j["job"], j["status"], j["open_findings"]) for j in jobs] == [
        ("skip", "hung", len(doc["findings"]))
    ]


def test_finding_resolves_when_the_job_moves_on(server: Server) -> None:
    stuck, finals, t_k = healthy_prefix(10)
    server.clock.now_ns = t_k + int((STALL_S + 1) * NS)
    server.push(stuck)
    server.diagnose()
    doc = server.job("healthy_4")
    assert doc["status"] == "hung"
    assert [(f["kind"], f["culprit_ranks"], f["collective_seq_id"]) for f in doc["findings"]] == [
        ("hang", [3], 10)
    ]
    server.clock.advance(1)
    server.diagnose()  # still stuck: the same finding, updated, not a new one
    hist = server.client.get("/api/v1/jobs/healthy_4/findings").json()["findings"]
    assert len(hist) == 1 and hist[0]["open"]
    assert hist[0]["updated_at_s"] > hist[0]["opened_at_s"]
    server.clock.advance(1)
    server.push(finals)
    server.diagnose()
    doc = server.job("healthy_4")
    assert doc["status"] == "finished"
    assert doc["findings"] == [] and doc["healthy"]
    hist = server.client.get("/api/v1/jobs/healthy_4/findings").json()["findings"]
    assert len(hist) == 1
    assert not hist[0]["open"]
    assert hist[0]["resolved_at_s"] == pytest.approx(server.clock() / NS, abs=1e-3)
    assert hist[0]["finding"]["culprit_ranks"] == [3]


def test_replayed_old_batches_open_no_finding_before_the_newer_ones_arrive(
    database_url: str, clock: FakeClock
) -> None:
    """A collector back from an outage sends its queue oldest first: the job's diagnosis waits for
    the newer batches instead of calling every collective pending in the old ones hung."""
    srv = make_server(database_url, clock, diagnosis_debounce_s=0.0)
    try:
        stuck, finals, t_k = healthy_prefix(10)
        clock.now_ns = t_k + int(60 * NS)  # the stuck snapshots arrive a minute after they were taken
        assert srv.push(stuck, sent_at_ns=t_k).status_code == 200
        assert srv.svc.live.step() == 0  # held back: no verdict on a replay
        clock.now_ns = max(s.snapshot_time_ns or 0 for s in finals) + NS  # then the newest batch
        assert srv.push(finals).status_code == 200
        assert srv.svc.live.step() == 1
        assert srv.job("healthy_4")["status"] == "finished"
        assert srv.client.get("/api/v1/jobs/healthy_4/findings").json()["findings"] == []
    finally:
        srv.svc.close()


def test_a_replay_that_never_catches_up_is_diagnosed_after_stall_after(
    database_url: str, clock: FakeClock
) -> None:
    """Held back for at most stall_after: a collector stuck mid-replay must not hide a hang."""
    srv = make_server(database_url, clock, diagnosis_debounce_s=0.0)
    try:
        stuck, _finals, t_k = healthy_prefix(10)
        clock.now_ns = t_k + int(60 * NS)
        assert srv.push(stuck, sent_at_ns=t_k).status_code == 200
        assert srv.svc.live.step() == 0
        time.sleep(STALL_S + 0.2)  # the hold is measured on the server's monotonic clock
        assert srv.svc.live.step() == 1
        doc = srv.job("healthy_4")
        assert [(f["kind"], f["culprit_ranks"]) for f in doc["findings"]] == [("hang", [3])]
    finally:
        srv.svc.close()


@pytest.mark.parametrize("told_by", ["sent_at", "age_header"])
def test_late_batches_are_judged_as_of_their_lag_not_the_clock(
    database_url: str, clock: FakeClock, told_by: str
) -> None:
    """A server falling behind: batches arrive seconds late. A collective in flight at a snapshot
    is not called hung for the time its batch waited; fresh data still shows the real hang.

    How late a batch is comes from `Flightdeck-Batch-Age-Ms` (the collector's own clock: with it,
    a collector whose clock is a minute behind is neither late nor replaying) or, without it, from
    comparing the batch's `sent_at_ns` with the server's clock.
    """
    srv = make_server(database_url, clock, diagnosis_debounce_s=0.0)

    def push(snaps: list[Snapshot], late_s: float) -> None:
        if told_by == "age_header":
            skewed = clock.now_ns - 60 * NS  # the collector's clock; the header does not need it
            r = srv.push(snaps, sent_at_ns=skewed, headers={BATCH_AGE_HEADER: str(int(late_s * 1000))})
        else:
            r = srv.push(snaps, sent_at_ns=clock.now_ns - int(late_s * NS))
        assert r.status_code == 200

    try:
        stuck, _finals, _t_k = healthy_prefix(10)
        snap_ns = max(s.snapshot_time_ns or 0 for s in stuck)
        clock.now_ns = snap_ns + int(3 * NS)  # 3 s late: by the clock, pending for 3.5 s > STALL_S
        push(stuck, 3.0)
        assert srv.svc.live.step() == 1  # not a replay (that is over max(STALL_S / 2, 5 s) late)
        doc = srv.job("healthy_4")
        assert doc["findings"] == [] and doc["status"] != "hung"  # as of the data: 0.5 s pending
        # The ranks' next snapshots arrive on time and still show the collective pending: a hang.
        for s in stuck:
            s.snapshot_time_ns = clock.now_ns
        clock.now_ns += NS // 10
        push(stuck, 0.02)
        assert srv.svc.live.step() == 1
        doc = srv.job("healthy_4")
        assert [(f["kind"], f["culprit_ranks"]) for f in doc["findings"]] == [("hang", [3])]
    finally:
        srv.svc.close()


def test_ranks_behind_a_late_collector_are_not_lost_next_to_an_on_time_one(
    database_url: str, clock: FakeClock
) -> None:
    """Overload hits collectors unevenly: one host's batches still arrive on time while another's
    wait in its queue. Its ranks are judged as of what it has delivered, not called lost."""
    srv = make_server(database_url, clock, diagnosis_debounce_s=0.0)
    try:
        periodic = {
            r: next(d for d in ds if d.kind == "periodic") for r, ds in scenario_dumps("healthy_4").items()
        }
        t0 = max(e.time_created_ns for d in periodic.values() for e in d.entries) + NS // 10
        late = [replace(snapshot_from_dump(periodic[r]), snapshot_time_ns=t0) for r in (2, 3)]
        clock.now_ns = t0 + 3 * NS
        late_age = {BATCH_AGE_HEADER: "3000"}  # waited 3 s in node-b's queue
        assert srv.push(late, collector_host="node-b", headers=late_age).status_code == 200
        time.sleep(1.5)  # nothing more from node-b: its next batch is still queued there
        clock.now_ns += int(1.5 * NS)
        fresh = [replace(snapshot_from_dump(periodic[r]), snapshot_time_ns=clock.now_ns) for r in (0, 1)]
        on_time = {BATCH_AGE_HEADER: "10"}
        assert srv.push(fresh, collector_host="node-a", headers=on_time).status_code == 200
        assert srv.svc.live.step() == 1
        # By the clock, or by the latest batch's lag alone, ranks 2 and 3 are 1.5 s (> 3 x 0.4 s)
        # behind what the job has delivered: lost. As of node-b's data, they are not.
        doc = srv.job("healthy_4")
        assert doc["findings"] == [] and doc["status"] == "running", doc["findings"]
    finally:
        srv.svc.close()


def test_hang_found_after_restart_without_new_data(database_url: str, clock: FakeClock) -> None:
    """Summaries are rebuilt from the database: a restarted server still sees the hang grow."""
    snaps = skip_stuck_view()
    entered = max(e.time_created_ns for s in snaps for e in s.entries)
    clock.now_ns = entered + NS // 2  # not stuck for long yet
    first = make_server(database_url, clock)
    first.push(snaps)
    first.diagnose()
    assert first.job("skip")["status"] == "running"
    first.svc.close()
    clock.advance(STALL_S + 2)
    second = make_server(database_url, clock)
    try:
        second.diagnose()
        doc = second.job("skip")
        assert doc["status"] == "hung"
        assert doc["findings"][0]["culprit_ranks"] == [2]
    finally:
        second.svc.close()


def test_two_servers_on_one_postgresql_agree(pg_database: str, clock: FakeClock) -> None:
    import psycopg

    schema = "two_servers"
    with psycopg.connect(pg_database.replace("+psycopg", ""), autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        conn.execute(f'CREATE SCHEMA "{schema}"')
    url = f"{pg_database}?options=-csearch_path%3D{schema}"
    a = make_server(url, clock)
    b = make_server(url, clock)
    try:
        snaps = skip_stuck_view()
        clock.now_ns = max(s.snapshot_time_ns for s in snaps) + int((STALL_S + 3) * NS)
        assert a.push(snaps, batch_id="shared-batch").json()["duplicate"] is False
        assert b.push(snaps, batch_id="shared-batch").json()["duplicate"] is True
        a.diagnose()
        for path in ("/api/v1/jobs", "/api/v1/jobs/skip", "/api/v1/jobs/skip/findings"):
            assert a.client.get(path).json() == b.client.get(path).json(), path
        assert b.job("skip")["findings"][0]["culprit_ranks"] == [2]
    finally:
        a.svc.close()
        b.svc.close()


#: Keys that change with every diagnosis of a job that is still being watched.
_VOLATILE = {"diagnosed_at_s", "updated_at_s", "now_s", "elapsed_s", "detail"}


def _stable(doc: Any) -> Any:
    """`doc` without the keys that move with each re-diagnosis (the owner keeps diagnosing)."""
    if isinstance(doc, dict):
        return {k: _stable(v) for k, v in doc.items() if k not in _VOLATILE}
    if isinstance(doc, list):
        return [_stable(v) for v in doc]
    return doc


def test_two_server_processes_share_jobs_without_duplicates(pg_database: str, tmp_path: Any) -> None:
    """Two real server processes in cluster mode on one PostgreSQL, each ingesting half the ranks of
    the same jobs: one of them diagnoses each job (advisory lock), from both halves (the feed), and
    both answer the same; no finding is opened twice."""
    import psycopg

    schema = "two_processes"
    with psycopg.connect(pg_database.replace("+psycopg", ""), autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        conn.execute(f'CREATE SCHEMA "{schema}"')
    url = f"{pg_database}?options=-csearch_path%3D{schema}"
    # The token first (this also migrates the schema, so the processes do not race to).
    make_server(url, FakeClock(time.time_ns())).svc.close()
    logs = [open(tmp_path / f"server{i}.log", "wb") for i in range(2)]  # noqa: SIM115 (closed below)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        bases = []
        for log in logs:
            proc, base = start_server_process(
                {"FLIGHTDECK_DATABASE_URL": url, "FLIGHTDECK_CLUSTER": "true", "FLIGHTDECK_MIGRATE": "true"},
                log,
            )
            procs.append(proc)
            bases.append(base)
        a, b = (httpx.Client(base_url=base, timeout=30) for base in bases)

        def push(client: httpx.Client, snaps: list[Snapshot]) -> None:
            data, headers = body(make_batch(snaps))
            r = client.post("/api/v1/ingest", content=data, headers={**headers, **AUTH})
            assert r.status_code == 200, r.text

        def wait_for(job: str, status: str) -> None:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                if all(c.get(f"/api/v1/jobs/{job}").json().get("status") == status for c in (a, b)):
                    return
                time.sleep(0.2)
            raise AssertionError(f"{job} not {status} on both: {a.get(f'/api/v1/jobs/{job}').json()}")

        # A hang: ranks 0-1 arrive through one process, ranks 2-3 (2 is the culprit) through the other.
        stuck = sorted(skip_stuck_view(), key=lambda x: x.rank)
        push(a, stuck[:2])
        push(b, stuck[2:])
        wait_for("skip", "hung")
        # A healthy job split the same way is finished only if its owner folded in both halves.
        finals = sorted(
            snapshots([merge(ds) for ds in scenario_dumps("healthy_4").values()]), key=lambda x: x.rank
        )
        push(b, finals[:2])
        deadline = time.monotonic() + 60
        while b.get("/api/v1/jobs/healthy_4").json().get("diagnosed_at_s") is None:
            assert time.monotonic() < deadline, "healthy_4 never diagnosed"
            time.sleep(0.1)
        # Diagnosed already, so owned: the other half reaches the owner through the feed (or, if
        # `a` owns it, from memory), not through a rebuild.
        push(a, finals[2:])
        wait_for("healthy_4", "finished")
        time.sleep(1.5)  # several more diagnosis rounds on both processes
        for path in (
            "/api/v1/jobs",
            "/api/v1/jobs/skip",
            "/api/v1/jobs/skip/findings",
            "/api/v1/jobs/healthy_4",
        ):
            ra, rb = a.get(path), b.get(path)
            assert ra.status_code == rb.status_code == 200, path
            assert _stable(ra.json()) == _stable(rb.json()), path
        history = a.get("/api/v1/jobs/skip/findings").json()["findings"]
        hang = [f for f in history if f["kind"] == "hang"]
        assert len(hang) == 1 and hang[0]["open"], history
        assert hang[0]["finding"]["culprit_ranks"] == [2]
        identities = [
            (f["kind"], f["finding"].get("process_group"), f["finding"].get("collective_seq_id"))
            for f in history
            if f["open"]
        ]
        assert len(identities) == len(set(identities)), history
        assert a.get("/api/v1/jobs/healthy_4").json()["findings"] == []
        # Each finding episode was opened by exactly one process (the job's owner): the processes'
        # counters add up to the stored episodes, where two diagnosing processes would count twice.
        opened = []
        for c in (a, b):
            text = c.get("/metrics").text
            opened.append(
                sum(
                    float(line.rsplit(" ", 1)[1])
                    for line in text.splitlines()
                    if line.startswith("flightdeck_job_findings_total{")
                )
            )
        stored = sum(
            len(a.get(f"/api/v1/jobs/{j}/findings").json()["findings"]) for j in ("skip", "healthy_4")
        )
        print(f"findings opened per process: {opened}, stored episodes: {stored}")
        assert sum(opened) == stored
        a.close()
        b.close()
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
        for log in logs:
            log.close()
    errors = [(tmp_path / f"server{i}.log").read_text() for i in range(2)]
    assert not any("Traceback" in e for e in errors), errors


# --- backpressure --------------------------------------------------------------------------------


def test_saturated_ingest_is_throttled(database_url: str, clock: FakeClock) -> None:
    srv = make_server(
        database_url, clock, max_inflight_ingests=1, retry_after_s=3, ingest_queue_timeout_s=0.2
    )
    try:
        assert srv.svc.ingest.admission.try_acquire()  # another request holds the only slot
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


def test_ingest_waits_in_the_queue_for_a_slot(database_url: str, clock: FakeClock) -> None:
    # A request that finds every slot taken waits (no 429) and is applied once one frees up.
    srv = make_server(database_url, clock, max_inflight_ingests=1, ingest_queue_timeout_s=30)
    try:
        admission = srv.svc.ingest.admission
        assert admission.try_acquire()
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
        gate = srv.svc.live.decode_gate
        gate.clear()  # as during a step
        pushed: list[int] = []
        t = threading.Thread(
            target=lambda: pushed.append(srv.push(snapshots(scenario_dumps("healthy_4")[0][:1])).status_code)
        )
        t.start()
        t.join(0.3)  # it waits up to DECODE_GATE_MAX_WAIT_S (1 s) for the step
        assert not pushed and srv.counts()["entries"] == 0
        gate.set()
        t.join(10)
        assert pushed == [200] and srv.counts()["entries"] > 0
    finally:
        srv.svc.close()


def test_the_worker_step_closes_the_decode_gate_while_it_diagnoses(server: Server) -> None:
    snaps = skip_stuck_view()
    server.clock.now_ns = max(s.snapshot_time_ns for s in snaps) + int((STALL_S + 3) * NS)
    assert server.push(snaps).status_code == 200
    gate_open: list[bool] = []
    # A second worker on the same database (as after a restart), whose finding callback runs
    # inside its step; a monotonic clock far ahead makes the job due without forcing.
    live = LiveDiagnosis(
        db=server.svc.db,
        settings=server.svc.settings,
        clock=server.clock,
        on_events=lambda _js, _events: gate_open.append(live.decode_gate.is_set()),
        on_db_error=lambda: None,
        monotonic=lambda: 1e9,
    )
    live.load()
    assert live.decode_gate.is_set()
    assert live.run_step() == 1
    assert gate_open == [False]  # the hang was opened with decoding held back
    assert live.decode_gate.is_set()  # and the gate is open again after the step


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


# --- webhooks ------------------------------------------------------------------------------------


class _Receiver(BaseHTTPRequestHandler):
    """Answers 503 to the first POST, 200 to the rest; records the bodies."""

    calls: ClassVar[list[dict[str, Any]]] = []
    statuses: ClassVar[list[int]] = []

    def do_POST(self) -> None:
        n = int(self.headers["Content-Length"])
        type(self).calls.append(json.loads(self.rfile.read(n)))
        status = 503 if len(type(self).calls) == 1 else 200
        type(self).statuses.append(status)
        self.send_response(status)
        if status == 503:
            self.send_header("Retry-After", "0")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


def test_webhook_delivered_after_a_failed_attempt(tmp_path: Any, clock: FakeClock) -> None:
    _Receiver.calls, _Receiver.statuses = [], []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    hook = f"http://127.0.0.1:{httpd.server_address[1]}/hook"
    srv = make_server(
        f"sqlite:///{tmp_path}/hooks.db", clock, webhook_urls=[hook], webhook_backoff_initial_s=0.05
    )
    try:
        srv.svc.webhooks.start()
        stuck, finals, t_k = healthy_prefix(10)
        clock.now_ns = t_k + int((STALL_S + 1) * NS)
        srv.push(stuck)
        srv.diagnose()
        deadline = time.monotonic() + 10
        while len(_Receiver.calls) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert _Receiver.statuses[:2] == [503, 200]
        first, retried = _Receiver.calls[:2]
        assert first == retried
        assert retried["event"] == "finding.opened"
        assert (retried["job"], retried["attempt"]) == ("healthy_4", 0)
        assert retried["finding"]["kind"] == "hang" and retried["finding"]["culprit_ranks"] == [3]
        srv.push(finals)
        srv.diagnose()
        while len(_Receiver.calls) < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert _Receiver.calls[2]["event"] == "finding.resolved"
    finally:
        srv.svc.close()
        httpd.shutdown()
        httpd.server_close()


# --- metrics -------------------------------------------------------------------------------------


def server_metric_names() -> set[str]:
    """The metric names of the `## Server` table of docs/metrics.md (other tables: other processes)."""
    doc = METRICS_DOC.read_text(encoding="utf-8")
    section = doc.split("## Server", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\|\s*`(flightdeck_[a-z0-9_]+)`\s*\|", section, flags=re.M))


def _families(text_: str) -> set[str]:
    return {line.split()[2] for line in text_.splitlines() if line.startswith("# TYPE ")}


def test_metrics_expose_the_documented_names_and_the_state(server: Server) -> None:
    snaps = skip_stuck_view()
    server.clock.now_ns = max(s.snapshot_time_ns for s in snaps) + int((STALL_S + 3) * NS)
    server.push(snaps, nixl=[nixl_wire_sample("run-1", 1000)])
    server.push([], nixl=[nixl_wire_sample("run-2", 300)])  # the agent restarted: counters start over
    server.diagnose()
    r = server.client.get("/metrics")
    assert r.status_code == 200
    exposed = _families(r.text)
    assert {f for f in exposed if f.startswith("flightdeck_")} == server_metric_names()
    assert {"process_cpu_seconds_total", "process_resident_memory_bytes"} <= exposed
    get = server.svc.registry.get_sample_value
    from flightdeck import __version__

    assert get("flightdeck_build_info", {"version": __version__, "python": platform.python_version()}) == 1
    assert (get("process_resident_memory_bytes") or 0) > 0
    assert get("flightdeck_jobs", {"status": "hung"}) == 1
    assert get("flightdeck_job_hang_active", {"job": "skip", "group": "0"}) == 1
    assert get("flightdeck_job_culprit_ranks", {"job": "skip", "group": "0"}) == 1
    assert get("flightdeck_job_waiting_ranks", {"job": "skip", "group": "0"}) == 3
    assert get("flightdeck_job_findings_open", {"job": "skip", "kind": "hang"}) == 1
    assert get("flightdeck_job_findings_total", {"kind": "hang"}) == 1
    assert (
        get("flightdeck_job_oldest_unfinished_elapsed_seconds", {"job": "skip", "group": "0"}) or 0
    ) > STALL_S
    assert (
        get("flightdeck_job_collectives_total", {"job": "skip", "group": "0", "op": "all_reduce"}) or 0
    ) > 0
    assert get("flightdeck_ingest_entries_total") == sum(len(s.entries) for s in snaps)
    assert get("flightdeck_rank_last_seen_age_seconds", {"job": "skip", "rank": "2"}) == pytest.approx(
        STALL_S + 3
    )
    assert get("flightdeck_collector_last_push_age_seconds", {"collector": "test-collector"}) == 0
    labels = {"host": "node-1", "agent": "agent-a"}
    assert get("flightdeck_nixl_tx_bytes_total", labels) == 1300  # both runs
    assert get("flightdeck_nixl_errors_total", {**labels, "kind": "backend"}) == 2
    assert get("flightdeck_nixl_memory_registered_bytes", labels) == 3072
    assert get("flightdeck_nixl_xfer_time_seconds_bucket", {**labels, "le": "1e-05"}) == 2
    assert get("flightdeck_nixl_xfer_time_seconds_count", labels) == 4
    agents = server.client.get("/api/v1/nixl/agents").json()
    assert [(a["host"], a["agent"], a["totals"]["tx_bytes"]) for a in agents] == [("node-1", "agent-a", 1300)]
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (Debian package `prometheus`)")
    out = subprocess.run([promtool, "check", "metrics"], input=r.content, capture_output=True, timeout=30)
    assert out.returncode == 0, out.stdout.decode() + out.stderr.decode()
    assert not out.stdout.strip() and not out.stderr.strip(), out.stdout.decode() + out.stderr.decode()


# --- retention, health, docs ---------------------------------------------------------------------


def test_retention_deletes_old_entries_and_keeps_findings(server: Server) -> None:
    stuck, _finals, t_k = healthy_prefix(10)
    server.clock.now_ns = t_k + int((STALL_S + 1) * NS)
    server.push(stuck)
    server.diagnose()
    assert server.counts()["entries"] > 0
    server.clock.advance(server.svc.settings.retention_days * 86400 + 60)
    deleted = server.svc.run_retention()
    counts = server.counts()
    assert deleted > 0 and counts["entries"] == 0
    assert counts["findings"] == 1
    assert counts["ingested_batches"] == 0


def test_entry_window_keeps_each_ranks_newest_entries_and_the_findings(
    database_url: str, clock: FakeClock
) -> None:
    srv = make_server(database_url, clock, entries_per_rank=4)
    try:
        stuck, _finals, t_k = healthy_prefix(10)
        clock.now_ns = t_k + int((STALL_S + 1) * NS)
        srv.push(stuck)
        srv.diagnose()
        with srv.svc.db.read() as session:
            before = store.load_entries(session=session, job_id=1)
        assert all(len(es) > 4 for es in before.values())
        deleted = srv.svc.trim_entries()
        with srv.svc.db.read() as session:
            after = store.load_entries(session=session, job_id=1)
        assert deleted == sum(len(es) - 4 for es in before.values())
        for rank, es in before.items():
            top = max(e.record_id for e in es)
            assert [e.record_id for e in after[rank]] == list(range(top - 3, top + 1))
        assert srv.counts()["findings"] == 1
        srv.diagnose()  # the in-memory summaries keep the history: the verdict stands
        assert srv.job("healthy_4")["findings"][0]["culprit_ranks"] == [3]
    finally:
        srv.svc.close()


def test_health_and_openapi(server: Server) -> None:
    r = server.client.get("/healthz")
    assert r.status_code == 200 and r.json()["status"] == "ok"
    paths = set(server.client.get("/openapi.json").json()["paths"])
    assert {
        "/api/v1/ingest",
        "/api/v1/jobs",
        "/api/v1/jobs/{job}",
        "/api/v1/jobs/{job}/findings",
        "/api/v1/jobs/{job}/timeline",
        "/api/v1/nixl/agents",
        "/healthz",
        "/metrics",
    } <= paths
    assert server.client.get("/api/v1/jobs/none").status_code == 404


def test_reads_can_require_a_token(database_url: str, clock: FakeClock) -> None:
    srv = make_server(database_url, clock, require_read_token=True)
    try:
        assert srv.client.get("/api/v1/jobs").status_code == 401
        assert srv.client.get("/api/v1/jobs", headers=AUTH).status_code == 200
        assert srv.client.get("/metrics").status_code == 401
        assert srv.client.get("/metrics", headers=AUTH).status_code == 200
        assert srv.client.get("/healthz").status_code == 200
        assert srv.client.get("/openapi.json").status_code == 404
    finally:
        srv.svc.close()
