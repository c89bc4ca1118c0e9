"""Servers side by side on one PostgreSQL (server/cluster.py): two in-process servers agree, and two
real server processes in cluster mode share jobs without duplicates."""

from __future__ import annotations

import subprocess
import time
from typing import Any

import httpx
import pytest

from flightdeck.readers.fr.merge import merge
from flightdeck.wire import Snapshot
from tests.support.clock import FakeClock
from tests.support.server_app import AUTH, NS, STALL_S, make_server, start_server_process
from tests.support.server_batches import body, make_batch, scenario_dumps, skip_stuck_view, snapshots
from tests.support.server_process import stop_processes


@pytest.mark.slow
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


@pytest.mark.slow
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
                {
                    "FLIGHTDECK_SERVER_DATABASE_URL": url,
                    "FLIGHTDECK_SERVER_CLUSTER": "true",
                    "FLIGHTDECK_SERVER_MIGRATE": "true",
                },
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
        stop_processes(procs)
        for log in logs:
            log.close()
    errors = [(tmp_path / f"server{i}.log").read_text() for i in range(2)]
    assert not any("Traceback" in e for e in errors), errors
