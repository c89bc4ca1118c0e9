"""Live diagnosis (server/live/) through the in-process server's API on real SQLite and PostgreSQL:
hangs found and resolved, replayed and late batches judged by their lag, a restart without new data."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import replace

import pytest

from flightdeck.analysis import Report
from flightdeck.server.live import DiagnosisBudget
from flightdeck.wire import BATCH_AGE_HEADER, Snapshot, snapshot_from_dump
from tests.support.clock import FakeClock
from tests.support.server_app import NS, STALL_S, Server, healthy_prefix, make_server
from tests.support.server_batches import scenario_dumps, scenario_expected, skip_stuck_view


@pytest.fixture
def server(database_url: str, clock: FakeClock) -> Iterator[Server]:
    """A server on a fresh database (SQLite file or PostgreSQL schema)."""
    with make_server(database_url, clock) as srv:
        yield srv


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


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
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


def test_budget_is_a_share_for_all_jobs_together() -> None:
    budget = DiagnosisBudget(share=0.25, burst_s=1.0)
    assert not budget.spent(100.0)
    budget.charge(100.0, 0.5)  # after idle time, 1 s is credited: 0.5 / 0.25 = 2 s moves it 1 s on
    assert budget.spent(100.0) and budget.spent(100.99) and not budget.spent(101.0)
    budget.charge(101.1, 0.25)  # no idle credit left: the next start is 1 s after the last allowed one
    assert budget.spent(101.9) and not budget.spent(102.0)


def test_one_step_diagnoses_what_the_budget_allows_jobs_with_new_data_first(
    database_url: str, clock: FakeClock
) -> None:
    snaps = skip_stuck_view()
    clock.now_ns = max(s.snapshot_time_ns for s in snaps) + int((STALL_S + 3) * NS)
    with make_server(database_url, clock, diagnosis_max_share=1e-6, diagnosis_debounce_s=0.0) as srv:
        assert srv.push([replace(s, job="first") for s in snaps]).status_code == 200
        assert srv.push([replace(s, job="second") for s in snaps]).status_code == 200
        live = srv.svc.live
        assert live.step() == 1  # one diagnosis spends the tiny share for every job
        assert live.step() == 0
        diagnosed = {js.name for js in live.jobs.values() if js.report is not None}
        assert len(diagnosed) == 1
        assert srv.job(diagnosed.pop())["status"] == "hung"
        srv.diagnose()  # forced: the budget does not apply
        assert {srv.job(name)["status"] for name in ("first", "second")} == {"hung"}
