"""A job's lifecycle on the server (issue 20): it ends when its ranks are all final or gone, its
findings close as `ended` with their elapsed frozen, its gauges go to 0 and its series leave
/metrics after `ended_series_s`; replays move nothing; a picture still filling in opens nothing
that the arriving data could refute; the job list filters, searches and pages.

Real servers over HTTP (the in-process app through its test client, with a fake clock and the
worker stepped by hand; one real `flightdeck server` process for the replay), real SQLite and
PostgreSQL, batches built from the committed dumps of real gloo jobs.

One file past 500 lines on purpose: most of its tests share the stepped-worker `server` fixture and
the batch, /metrics and history helpers, which a split by rule would only scatter.
"""

from __future__ import annotations

import re
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import httpx
import pytest
from sqlalchemy import insert, text

from bench.server_synth import rank_entries, snapshot, stuck_entry, template
from flightdeck.analysis import Finding, Report
from flightdeck.analysis.lifecycle import end_state, job_end, job_status
from flightdeck.server import store
from flightdeck.server.ingest import hash_token
from flightdeck.server.models import Job
from flightdeck.wire import Batch, GoneRank, Snapshot
from tests.support.clock import FakeClock
from tests.support.server_app import AUTH, STALL_S, Server, healthy_prefix, make_server, start_server_process
from tests.support.server_batches import body, make_batch, scenario_dumps, snapshots

NS = 1_000_000_000
JOB = "healthy_4"


@pytest.fixture
def server(database_url: str, clock: FakeClock) -> Iterator[Server]:
    """A server with short retention of ended jobs' series (60 s)."""
    with make_server(database_url, clock, ended_series_s=60.0) as srv:
        yield srv


def push_batch(srv: Server, batch: Batch, auth: dict[str, str] | None = None) -> httpx.Response:
    data, headers = body(batch)
    resp: httpx.Response = srv.client.post(
        "/api/v1/ingest", content=data, headers={**headers, **(auth or AUTH)}
    )
    return resp


def gone_batch(gone: list[GoneRank], *, host: str = "test-host", sent_at_ns: int = 0) -> Batch:
    return Batch(uuid.uuid4().hex, host, "test", sent_at_ns, [], gone=gone)


def metric(srv: Server, name: str, **labels: str) -> float | None:
    """A sample of /metrics, None when absent."""
    text_ = srv.client.get("/metrics").text
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text_.splitlines():
        m = re.match(r"^(\w+)\{([^}]*)\} (\S+)$", line)
        if m and m.group(1) == name and ",".join(sorted(m.group(2).split(","))) == want:
            return float(m.group(3))
    return None


def history(srv: Server, job: str = JOB) -> list[dict[str, Any]]:
    doc: list[dict[str, Any]] = srv.client.get(f"/api/v1/jobs/{job}/findings").json()["findings"]
    return doc


# --- states (pure rules) -------------------------------------------------------------------------


def _report(*kinds: str) -> Report:
    findings = [Finding(kind=k, detail="", culprit_ranks=[1]) for k in kinds]  # type: ignore[arg-type]
    return Report(expected_ranks=2, with_dump=[0, 1], without_dump=[], findings=findings, job="j", now_s=0)


def test_states_of_a_running_job() -> None:
    assert job_status(_report("slow_rank"), [], 2) == "slow"
    assert job_status(_report("straggler"), [], 2) == "slow"
    assert job_status(_report("straggler", "hang"), [], 2) == "hung"
    assert job_status(_report("rank_lost", "slow_rank"), [], 2) == "lost"
    assert job_status(_report(), [], 2) == "running"


def test_end_rules() -> None:
    from flightdeck.analysis import RankSummary

    def rank(r: int, kind: str, t: int, exc: str | None = None) -> RankSummary:
        return RankSummary(rank=r, source="t", kind=kind, snapshot_time_ns=t, exception=exc)

    final = {0: rank(0, "final", 5), 1: rank(1, "final", 7)}
    assert job_end(final, {}, 2) == 7
    assert job_end(final, {}, 3) is None  # a rank never seen: not ended
    running = {0: rank(0, "final", 5), 1: rank(1, "periodic", 7)}
    assert job_end(running, {}, 2) is None
    assert job_end(running, {1: 9}, 2) == 9  # gone without a final snapshot
    assert end_state(set(), final, {}) == "finished"
    assert end_state({"hang"}, final, {}) == "failed"
    assert end_state({"version_skew", "straggler"}, final, {}) == "finished"
    assert end_state(set(), running, {1: 9}) == "failed"
    killed = {0: rank(0, "final", 5, "terminated by SIGTERM"), 1: rank(1, "final", 7)}
    assert end_state(set(), killed, {}) == "failed"


# --- ending ---------------------------------------------------------------------------------------


def test_a_hung_job_whose_ranks_are_gone_ends_failed_with_its_findings_frozen(server: Server) -> None:
    stuck, _finals, t_k = healthy_prefix(10)
    server.clock.now_ns = t_k + int((STALL_S + 1) * NS)
    assert server.push(stuck).status_code == 200
    server.diagnose()
    assert server.job(JOB)["status"] == "hung"
    assert metric(server, "flightdeck_job_hang_active", job=JOB, group="0") == 1.0
    server.clock.advance(2)
    gone_at = server.clock() - NS // 2
    gone = [GoneRank(JOB, 0, s.rank, s.pid or 0, gone_at) for s in stuck]
    r = push_batch(server, gone_batch(gone, sent_at_ns=server.clock()))
    assert r.status_code == 200 and r.json()["gone"] == 4, r.text
    server.diagnose()  # the next diagnosis step ends it
    doc = server.job(JOB)
    assert doc["status"] == "failed" and doc["ended_at_s"] == pytest.approx(gone_at / NS, abs=1e-3)
    # The verdict at the end stays on the page; nothing is open any more.
    assert [f["kind"] for f in doc["findings"]] == ["hang"] and doc["open_findings"] == 0
    (hang,) = history(server)
    assert hang["kind"] == "hang" and not hang["open"] and hang["resolution"] == "ended"
    assert hang["resolved_at_s"] == pytest.approx(gone_at / NS, abs=1e-3)
    elapsed = hang["finding"]["elapsed_s"]
    assert elapsed == pytest.approx((gone_at - t_k) / NS, abs=0.5)
    # Gauges at 0 at once; the rank ages are not exported for an ended job.
    assert metric(server, "flightdeck_job_hang_active", job=JOB, group="0") == 0.0
    assert metric(server, "flightdeck_job_culprit_ranks", job=JOB, group="0") == 0.0
    assert metric(server, "flightdeck_job_oldest_unfinished_elapsed_seconds", job=JOB, group="0") == 0.0
    assert metric(server, "flightdeck_rank_last_seen_age_seconds", job=JOB, rank="0") is None
    assert metric(server, "flightdeck_jobs", status="failed") == 1.0

    # Time passes: the elapsed time stays frozen at the end, the job stays ended.
    server.clock.advance(30)
    server.diagnose()
    (hang,) = history(server)
    assert hang["finding"]["elapsed_s"] == elapsed
    # A late snapshot from before the end (a replay) reopens nothing.
    assert server.push(stuck).status_code == 200
    server.diagnose()
    assert server.job(JOB)["status"] == "failed" and len(history(server)) == 1

    # After ended_series_s the series leave /metrics and memory; the history stays.
    server.clock.advance(60)
    server.diagnose()
    assert metric(server, "flightdeck_job_hang_active", job=JOB, group="0") is None
    assert metric(server, "flightdeck_jobs", status="failed") == 0.0
    assert server.svc.live.jobs == {}
    assert server.job(JOB)["status"] == "failed" and len(history(server)) == 1
    # A late one after that still reopens nothing (rebuilt from the store, still ended).
    assert server.push(stuck).status_code == 200
    server.diagnose()
    assert server.job(JOB)["status"] == "failed" and len(history(server)) == 1

    # A snapshot newer than the end: the job runs again.
    newer = [replace(s, snapshot_time_ns=server.clock()) for s in stuck]
    assert server.push(newer).status_code == 200
    server.diagnose()
    doc = server.job(JOB)
    assert doc["ended_at_s"] is None and doc["status"] != "failed"


def test_final_snapshots_of_a_sigterm_end_the_job_failed(server: Server) -> None:
    _stuck, finals, _t = healthy_prefix(10)
    server.clock.now_ns = max(s.snapshot_time_ns for s in finals) + NS
    killed = [replace(s, exception="terminated by SIGTERM") for s in finals]
    assert server.push(killed).status_code == 200
    server.diagnose()
    doc = server.job(JOB)
    assert doc["status"] == "failed"
    assert doc["ended_at_s"] == pytest.approx(max(s.snapshot_time_ns for s in finals) / NS, abs=1e-3)


def test_a_hung_job_stopped_by_sigterm_closes_its_hang_as_ended(server: Server) -> None:
    """The final snapshots of a SIGTERMed job arrive apart: the diagnosis of the moment half of
    them are in neither resolves the open hang nor opens anything; the end closes it as ended."""
    stuck, _finals, t_k = healthy_prefix(10)
    server.clock.now_ns = t_k + int((STALL_S + 1) * NS)
    assert server.push(stuck).status_code == 200
    server.diagnose()
    assert server.job(JOB)["status"] == "hung"
    server.clock.advance(1)
    killed = [
        replace(s, kind="final", exception="terminated by SIGTERM", snapshot_time_ns=server.clock())
        for s in stuck
    ]
    assert server.push(killed[:2]).status_code == 200
    server.diagnose()
    (hang,) = history(server)
    assert hang["open"] and server.job(JOB)["status"] == "hung"
    server.clock.advance(0.5)
    assert server.push(killed[2:]).status_code == 200
    server.diagnose()
    doc = server.job(JOB)
    assert doc["status"] == "failed" and doc["ended_at_s"] == pytest.approx(killed[0].snapshot_time_ns / NS)
    (hang,) = history(server)
    assert hang["resolution"] == "ended" and hang["resolved_at_s"] == doc["ended_at_s"]


def test_final_snapshots_after_the_gone_reports_keep_the_job_ended(server: Server) -> None:
    """A rank's final snapshot may arrive after its collector reported it gone (the agent writes
    it on SIGTERM while the collector looks): the job stays ended, its end moves to the finals,
    nothing reopens (measured with bench/job_end.py: one hang, two episodes, before this)."""
    stuck, _finals, t_k = healthy_prefix(10)
    server.clock.now_ns = t_k + int((STALL_S + 1) * NS)
    assert server.push(stuck).status_code == 200
    server.diagnose()
    server.clock.advance(1)
    gone_at = server.clock()
    gone = [GoneRank(JOB, 0, s.rank, s.pid or 0, gone_at) for s in stuck]
    assert push_batch(server, gone_batch(gone, sent_at_ns=gone_at)).status_code == 200
    server.diagnose()
    assert server.job(JOB)["status"] == "failed"
    server.clock.advance(2)
    killed = [
        replace(s, kind="final", exception="terminated by SIGTERM", snapshot_time_ns=server.clock() - NS)
        for s in stuck
    ]
    assert server.push(killed).status_code == 200
    server.diagnose()
    doc = server.job(JOB)
    assert doc["status"] == "failed"
    assert doc["ended_at_s"] == pytest.approx((server.clock() - NS) / NS, abs=1e-3)
    (hang,) = history(server)
    assert hang["resolution"] == "ended"


def test_a_scoped_token_ends_only_its_own_hosts_ranks(server: Server) -> None:
    stuck, _finals, t_k = healthy_prefix(10)
    server.clock.now_ns = t_k + int((STALL_S + 1) * NS)
    placed = [replace(s, host="node-a" if s.rank < 2 else "node-b") for s in stuck]
    assert server.push(placed).status_code == 200
    token = "fdk_node-a-token"
    with server.svc.db.write() as session, session.begin():
        store.create_token(
            session=session, name="node-a", token_hash=hash_token(token), now_ns=server.clock(), host="node-a"
        )
    auth = {"Authorization": f"Bearer {token}"}
    t = server.clock()
    pid = {s.rank: s.pid or 0 for s in stuck}
    gone = [
        GoneRank(JOB, 0, 0, pid[0], t),  # its own host's rank: applied
        GoneRank(JOB, 0, 2, pid[2], t),  # another host's rank: ignored
        GoneRank(JOB, 0, 1, pid[1] + 1, t),  # a pid the rank does not have: ignored
        GoneRank("other-job", 0, 0, 1, t),  # no such rank: ignored
    ]
    r = push_batch(server, gone_batch(gone, host="node-a", sent_at_ns=t), auth)
    assert r.status_code == 200, r.text
    assert r.json()["gone"] == 1 and r.json()["gone_ignored"] == 3
    with server.svc.db.read() as session:
        job = store.get_job(session=session, name=JOB)
        assert job is not None
        marked = {rk.rank: rk.gone_at_ns for rk, _ in store.job_ranks(session=session, job_id=job.id)}
    assert marked == {0: t, 1: None, 2: None, 3: None}
    server.diagnose()
    assert server.job(JOB)["ended_at_s"] is None  # three ranks still run


def test_no_data_while_the_collector_heartbeats(server: Server) -> None:
    _stuck, finals, _t = healthy_prefix(10)
    periodic = [replace(s, kind="periodic") for s in finals]
    server.clock.now_ns = max(s.snapshot_time_ns for s in finals) + NS
    assert server.push(periodic).status_code == 200
    server.diagnose()
    assert server.job(JOB)["status"] == "running"
    server.clock.advance(server.svc.settings.no_data_after_s + 1)
    server.diagnose()
    assert server.job(JOB)["status"] == "running"  # the collector is silent too: nothing known
    heartbeat = make_batch([], sent_at_ns=server.clock())
    assert push_batch(server, heartbeat).status_code == 200
    server.diagnose()
    assert server.job(JOB)["status"] == "no_data"
    assert metric(server, "flightdeck_jobs", status="no_data") == 1.0


# --- replays ---------------------------------------------------------------------------------------


@pytest.mark.slow
def test_replayed_batches_move_nothing_on_a_real_server(tmp_path: Any) -> None:
    """A restarted collector re-sends every batch (new batch ids): the job's first and last seen,
    status, findings (their elapsed times too) stay as they were."""
    db = tmp_path / "fd.db"
    log = open(tmp_path / "server.log", "wb")  # noqa: SIM115 (closed below)
    proc, base = start_server_process(
        {
            "FLIGHTDECK_SERVER_DATABASE_URL": f"sqlite:///{db}",
            "FLIGHTDECK_SERVER_ALLOW_UNAUTHENTICATED_INGEST": "1",
        },
        log,
    )
    try:
        dumps = scenario_dumps("skip")
        files = sorted((d for ds in dumps.values() for d in ds), key=lambda d: d.snapshot_time_ns or 0)
        stuck = [d for d in files if d.kind != "final"]
        # The job hangs (its ranks' stall and periodic snapshots), then its processes are gone.
        batches = [make_batch(snapshots([d]), sent_at_ns=time.time_ns()) for d in stuck]

        def post(b: Batch) -> None:
            data, headers = body(b)
            r = httpx.post(f"{base}/api/v1/ingest", content=data, headers=headers, timeout=30)
            assert r.status_code == 200, r.text

        for b in batches:
            post(b)
        deadline = time.monotonic() + 60
        while httpx.get(f"{base}/api/v1/jobs/skip", timeout=10).json()["status"] != "hung":
            assert time.monotonic() < deadline, "no hang found"
            time.sleep(0.2)
        pids = {d.rank: d.pid or 0 for d in stuck}
        post(gone_batch([GoneRank("skip", 0, r, p, time.time_ns()) for r, p in pids.items()], host="vm"))
        deadline = time.monotonic() + 60
        while (job := httpx.get(f"{base}/api/v1/jobs/skip", timeout=10).json())["ended_at_s"] is None:
            assert time.monotonic() < deadline, "not ended"
            time.sleep(0.2)
        before = (job, httpx.get(f"{base}/api/v1/jobs/skip/findings", timeout=10).json())
        assert job["status"] == "failed"
        # The replay: the same snapshots again, as a restarted collector sends them.
        for b in batches:
            post(replace(b, batch_id=uuid.uuid4().hex, sent_at_ns=time.time_ns()))
        time.sleep(2.0)  # several diagnosis intervals (0.3 s) and debounces (0.1 s)
        after = (
            httpx.get(f"{base}/api/v1/jobs/skip", timeout=10).json(),
            httpx.get(f"{base}/api/v1/jobs/skip/findings", timeout=10).json(),
        )
        for doc in (before[0], after[0]):
            doc.pop("diagnosed_at_s", None)
        assert after == before
        assert before[0]["last_seen_s"] == pytest.approx(
            max(d.snapshot_time_ns or 0 for d in stuck) / NS, abs=1e-3
        )
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()


def test_a_replay_does_not_move_last_seen_or_findings(server: Server) -> None:
    """The same on both databases in-process: last_seen comes from the snapshots, not arrival."""
    stuck, _finals, t_k = healthy_prefix(10)
    server.clock.now_ns = t_k + int((STALL_S + 1) * NS)
    assert server.push(stuck).status_code == 200
    server.diagnose()
    job, hist = server.job(JOB), history(server)
    server.clock.advance(0.5)
    assert server.push(stuck).status_code == 200  # new batch id, same snapshots
    server.diagnose()
    again, hist2 = server.job(JOB), history(server)
    assert (again["first_seen_s"], again["last_seen_s"]) == (job["first_seen_s"], job["last_seen_s"])
    assert job["last_seen_s"] == pytest.approx(max(s.snapshot_time_ns for s in stuck) / NS, abs=1e-3)
    assert [(h["id"], h["opened_at_s"], h["open"]) for h in hist2] == [
        (h["id"], h["opened_at_s"], h["open"]) for h in hist
    ]


# --- a picture still filling in ---------------------------------------------------------------


RANKS = 64
PER_BATCH = 8
SEQS = 40


def _old(job: str, t0: int, world: int) -> list[Snapshot]:
    """Old snapshots of every rank: their ring's newest collective in flight, ~100 s before `t0`."""
    tpl = template()
    base = t0 - 100 * NS
    out = []
    for r in range(world):
        es = [*rank_entries(tpl, r, 0, SEQS - 1, base), stuck_entry(tpl, r, SEQS - 1, base)]
        out.append(snapshot(job, r, world, es, base + SEQS * 1_000_000 + 5_000_000))
    return out


def _fresh(job: str, t: int, world: int, stuck_rank: int | None) -> list[Snapshot]:
    """Every rank's newest snapshot, taken at `t`: collective SEQS + 10 in flight since 0.1 s, or,
    with `stuck_rank`, since 10 s on every rank but that one, which never entered it."""
    tpl = template()
    n = SEQS + 10
    out = []
    for r in range(world):
        es = rank_entries(tpl, r, 0, n - 1, t - 100 * NS)
        if r != stuck_rank:
            since = t - (10 * NS if stuck_rank is not None else NS // 10)
            es.append(replace(stuck_entry(tpl, r, n - 1, t), time_created_ns=since))
        out.append(snapshot(job, r, world, es, t))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_large_job_backfilling_opens_nothing_until_its_ranks_are_in(
    database_url: str, clock: FakeClock
) -> None:
    """The issue's measurement in small: a 64-rank job whose rings arrive 8 ranks at a time,
    their entries ~100 s old. Judged as they arrive, the ranks not yet in look like the culprits
    of a hang at the ring's newest collective and like missing dumps; none of that opens. Once all
    ranks are in with their fresh snapshots, a real hang in such a job is still found."""
    srv = make_server(database_url, clock, job_settle_s=3600.0)
    try:
        for job, stuck_rank in (("backfill-healthy", None), ("backfill-hung", 37)):
            old = _old(job, clock(), RANKS)
            for i in range(0, RANKS, PER_BATCH):
                assert srv.push(old[i : i + PER_BATCH]).status_code == 200
                srv.diagnose()
                assert history(srv, job) == [], (
                    f"{job}: opened while {i + PER_BATCH} of {RANKS} ranks were in"
                )
                clock.advance(3)
            # The collector has caught up: each rank's newest snapshot, taken now.
            assert srv.push(_fresh(job, clock(), RANKS, stuck_rank)).status_code == 200
            srv.diagnose()
            kinds = [(h["kind"], h["finding"]["culprit_ranks"]) for h in history(srv, job)]
            if stuck_rank is None:
                assert kinds == []
            else:
                assert ("hang", [stuck_rank]) in kinds, kinds
        # Without the settle time, the same delivery opens findings that the later ranks refute.
        srv2 = make_server(f"sqlite:///{tempfile.mkdtemp()}/b.db", clock, job_settle_s=0.0)
        try:
            old = _old("backfill-nosettle", clock(), RANKS)
            for i in range(0, RANKS // 2, PER_BATCH):
                srv2.push(old[i : i + PER_BATCH])
                srv2.diagnose()
                clock.advance(3)
            assert {h["kind"] for h in history(srv2, "backfill-nosettle")} & {"hang", "missing_dump"}
        finally:
            srv2.svc.close()
    finally:
        srv.svc.close()


# --- the job list --------------------------------------------------------------------------------


@pytest.mark.slow
def test_the_job_list_filters_searches_and_pages_with_thousands_of_jobs(server: Server) -> None:
    n = 5000
    t0 = server.clock()
    statuses = ("running", "hung", "failed", "finished", "no_data", "slow", "lost")
    with server.svc.db.write() as session, session.begin():
        session.execute(
            insert(Job),
            [
                {
                    "name": f"train-{i:05d}" if i % 10 else f"eval-{i:05d}",
                    "attempt": 0,
                    "world_size": 8,
                    "first_seen_ns": t0 - (n - i) * NS,
                    "last_seen_ns": t0 - (n - i) * NS // 2,
                    "status": statuses[i % len(statuses)],
                    "ended_at_ns": t0 if statuses[i % len(statuses)] in ("failed", "finished") else None,
                }
                for i in range(n)
            ],
        )
        if session.get_bind().dialect.name == "postgresql":
            session.execute(text("ANALYZE jobs"))
    with server.svc.db.read() as session:
        for status in (None, "hung"):
            plan = store.list_jobs_plan(session=session, status=status, limit=100)
            assert "ix_jobs_" in plan, plan
            assert not re.search(r"Seq Scan|SCAN jobs\b(?! USING)", plan), plan
    # Pages: the whole list once, in order, 1,000 at a time.
    seen: list[str] = []
    url: str | None = "/api/v1/jobs?limit=1000"
    while url:
        r = server.client.get(url)
        assert r.status_code == 200, r.text
        seen += [j["job"] for j in r.json()]
        link = r.headers.get("link")
        url = re.match(r"<([^>]+)>", link).group(1) if link else None  # type: ignore[union-attr]
    assert len(seen) == n == len(set(seen))
    hung = server.client.get("/api/v1/jobs", params={"status": "hung", "limit": 1000}).json()
    assert len(hung) == sum(1 for i in range(n) if statuses[i % len(statuses)] == "hung")
    assert {j["status"] for j in hung} == {"hung"}
    found = server.client.get("/api/v1/jobs", params={"q": "EVAL-0", "limit": 1000}).json()
    assert len(found) == n // 10 and all(j["job"].startswith("eval-") for j in found)
    both = server.client.get("/api/v1/jobs", params={"q": "eval", "status": "failed"}).json()
    assert both and all(j["status"] == "failed" and j["ended_at_s"] for j in both)
    assert server.client.get("/api/v1/jobs", params={"q": "%"}).json() == []  # matched as typed
    assert server.client.get("/api/v1/jobs", params={"status": "bogus"}).status_code == 422
    # The page: the same filters in its form, the end time shown, a link to the older jobs.
    page = server.client.get("/", params={"status": "failed", "q": "eval"})
    assert page.status_code == 200
    assert 'name="q" value="eval"' in page.text and '<option value="failed" selected>' in page.text
    assert "Ended" in page.text and ("Older jobs" in page.text) == (len(both) >= 100)
    view = server.client.get("/", params={"status": "hung", "format": "json"}).json()
    assert view["status"] == "hung" and {j["status"] for j in view["jobs"]} == {"hung"}
    assert view["next_before"]  # 1,000 hung jobs: more than one page


def test_migration_0009_upgrades_and_downgrades(database_url: str) -> None:
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    from flightdeck.server.db import connect, migrate
    from flightdeck.server.models import Base

    db = connect(database_url)
    try:
        migrate(db, "0008")
        with db.write() as session, session.begin():
            session.execute(
                text(
                    "INSERT INTO jobs (name, attempt, first_seen_ns, last_seen_ns, status) "
                    "VALUES ('old', 0, 1, 2, 'finished')"
                )
            )
        migrate(db)
        with db.engine.connect() as conn:
            assert compare_metadata(MigrationContext.configure(conn), Base.metadata) == []
        with db.read() as session:
            (job,) = store.list_jobs(session=session)
            assert job.name == "old" and job.ended_at_ns is None
        # And back: 0009's downgrade leaves 0008's schema with the data.
        from alembic import command

        from flightdeck.server.db import alembic_config

        cfg = alembic_config()
        with db.write_engine.begin() as conn:
            cfg.attributes["connection"] = conn
            command.downgrade(cfg, "0008")
        with db.read() as session:
            assert session.execute(text("SELECT name FROM jobs")).scalar_one() == "old"
        migrate(db)
    finally:
        db.dispose()


@pytest.mark.slow
def test_in_a_cluster_the_owner_ends_a_job_whose_gone_reports_another_replica_took(
    pg_database: str, clock: FakeClock
) -> None:
    """Two replicas on one PostgreSQL: the gone reports reach one, the job's owner ends it."""
    import psycopg

    from flightdeck.server.cluster import HOUSEKEEPING_S

    schema = f"c_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(pg_database.replace("+psycopg", ""), autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    url = f"{pg_database}?options=-csearch_path%3D{schema}"
    a = make_server(url, clock, cluster=True)
    b = make_server(url, clock, cluster=True)
    try:
        stuck, _finals, t_k = healthy_prefix(10)
        clock.now_ns = t_k + int((STALL_S + 1) * NS)
        assert a.push(stuck).status_code == 200
        for _ in range(3):
            a.diagnose()
            b.diagnose()
        owner, other = (a, b) if a.svc.live.cluster and a.svc.live.cluster.owned else (b, a)
        assert owner.svc.live.cluster is not None and owner.svc.live.cluster.owned
        assert owner.job(JOB)["status"] == "hung"
        gone = [GoneRank(JOB, 0, s.rank, s.pid or 0, clock()) for s in stuck]
        assert push_batch(other, gone_batch(gone, sent_at_ns=clock())).json()["gone"] == 4
        clock.advance(HOUSEKEEPING_S + 0.1)
        owner.diagnose()
        owner.diagnose()
        doc = owner.job(JOB)
        assert doc["status"] == "failed" and doc["ended_at_s"] is not None
        assert other.job(JOB)["status"] == "failed"
    finally:
        a.svc.close()
        b.svc.close()


def test_the_pages_offer_the_servers_statuses() -> None:
    from flightdeck.server.models import JOB_STATUSES
    from flightdeck.web.views import FILTER_STATUSES, JOB_STATUS_ORDER

    assert FILTER_STATUSES == JOB_STATUSES
    assert set(JOB_STATUSES) <= set(JOB_STATUS_ORDER)


def test_a_job_that_arrives_over_keeps_its_findings_closed_and_pages_nobody(
    database_url: str, clock: FakeClock
) -> None:
    """The whole history of a hung job that is over (its final snapshots too) arrives at once: the
    hang is on its page and in its history, closed as ended, and no webhook event is queued."""
    srv = make_server(database_url, clock, webhook_urls=["http://127.0.0.1:9/hook"])
    try:
        snaps = [s for ds in scenario_dumps("skip").values() for s in snapshots(ds)]
        clock.now_ns = max(s.snapshot_time_ns for s in snaps) + 60 * NS
        assert srv.push(snaps).status_code == 200
        srv.diagnose()
        doc = srv.job("skip")
        assert doc["ended_at_s"] is not None and doc["open_findings"] == 0
        hist = history(srv, "skip")
        assert "hang" in {h["kind"] for h in hist}
        assert all(not h["open"] and h["resolution"] == "ended" for h in hist)
        with srv.svc.db.read() as session:
            assert store.webhook_deliveries(session=session) == []
    finally:
        srv.svc.close()


def test_an_ended_job_gives_its_summaries_back_and_rebuilds_them_only_for_newer_data(server: Server) -> None:
    """Memory (issue 22): once an ended job has had no batch for stall_after_s its summaries are
    dropped; a late snapshot from before the end leaves them dropped, and a newer one rebuilds
    them from the store: the job runs again, as when they were held."""
    _stuck, finals, _t = healthy_prefix(10)
    server.clock.now_ns = max(s.snapshot_time_ns for s in finals) + NS
    assert server.push(finals).status_code == 200
    server.diagnose()
    assert server.job(JOB)["status"] == "finished"
    (js,) = server.svc.live.jobs.values()
    assert js.summaries and not js.released
    time.sleep(STALL_S + 0.2)  # since the last batch, on the server's monotonic clock
    server.svc.live.step()
    assert js.summaries is None and js.released
    assert server.push(finals).status_code == 200  # a replay: nothing newer than the end
    server.diagnose()
    assert js.summaries is None and server.job(JOB)["status"] == "finished"
    server.clock.advance(1)
    newer = [replace(s, kind="periodic", snapshot_time_ns=server.clock()) for s in finals]
    assert server.push(newer).status_code == 200
    server.diagnose()
    assert js.summaries and not js.released and len(js.summaries) == len(finals)
    doc = server.job(JOB)
    assert doc["ended_at_s"] is None and doc["status"] == "running"
