"""The database at start and while serving: schema version checked (/healthz, ingest), migrations
only when told to (or on the server's own SQLite), retries while the database is unreachable.

Real SQLite and PostgreSQL; the start-up rules run in real `flightdeck server` processes.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from sqlalchemy import text

from flightdeck.cli import main
from flightdeck.launch.demo.ranks import free_port
from flightdeck.server import store
from flightdeck.server.db import connect, migrate
from flightdeck.server.ingest import hash_token
from flightdeck.server.models import Base
from flightdeck.server.schema import current_revision, head_revisions
from tests.support.clock import FakeClock
from tests.support.server_app import TOKEN, Server, make_server
from tests.support.server_batches import scenario_dumps, snapshots

REPO = Path(__file__).resolve().parents[1]


def _wipe(url: str) -> None:
    """Drop every table: the database as an operator who dropped and recreated it left it."""
    db = connect(url)
    try:
        with db.write_engine.begin() as conn:
            if conn.dialect.name == "sqlite":
                conn.exec_driver_sql("PRAGMA foreign_keys=OFF")
            Base.metadata.drop_all(conn)
            conn.execute(text("DROP TABLE alembic_version"))
    finally:
        db.dispose()


def _migrated(url: str, revision: str = "head") -> None:
    db = connect(url)
    try:
        migrate(db, revision)
    finally:
        db.dispose()


def _add_token(srv: Server) -> None:
    with srv.svc.db.write() as session, session.begin():
        store.create_token(
            session=session, name="test-collector", token_hash=hash_token(TOKEN), now_ns=srv.clock()
        )


def test_a_vanished_schema_is_a_503_with_the_reason_until_migrated(
    database_url: str, clock: FakeClock
) -> None:
    _migrated(database_url)
    srv = make_server(database_url, clock, migrate=False)
    try:
        snaps = snapshots([d for ds in scenario_dumps("healthy_4").values() for d in ds])
        assert srv.push(snaps).status_code == 200
        r = srv.client.get("/healthz")
        assert r.status_code == 200 and r.json()["status"] == "ok"

        _wipe(database_url)
        r = srv.client.get("/healthz")
        assert r.status_code == 503
        assert r.json()["status"] == "unavailable"
        assert "no Flightdeck schema" in r.json()["reason"] and "flightdeck migrate" in r.json()["reason"]
        for _ in range(3):  # the token was verified a moment ago: the batch reaches the writer
            r = srv.push(snaps)
            assert r.status_code == 503, r.text
            assert "no Flightdeck schema" in r.json()["detail"]
            assert r.headers["Retry-After"] == "1"
        r = srv.client.get("/api/v1/jobs")
        assert r.status_code == 503 and "no Flightdeck schema" in r.json()["detail"]

        assert main(["migrate", "--database-url", database_url]) == 0
        srv.clock.advance(2)  # past the guard's one check a second
        assert srv.client.get("/healthz").status_code == 200
        _add_token(srv)
        # Nothing of the old database is used: the job gets the new database's rows and ids.
        assert srv.push(snaps).status_code == 200
        srv.diagnose()
        assert srv.job("healthy_4")["ranks"]
        with srv.svc.db.read() as session:
            job = store.get_job(session=session, name="healthy_4")
            assert job is not None
            entries = store.load_entries(session=session, job_id=job.id)
        assert sorted(entries) == [0, 1, 2, 3]
    finally:
        srv.svc.close()


def test_told_to_migrate_a_running_server_restores_a_vanished_schema(
    database_url: str, clock: FakeClock
) -> None:
    srv = make_server(database_url, clock, migrate=True)
    try:
        _wipe(database_url)
        r = srv.client.get("/healthz")
        assert r.status_code == 200, r.text
        assert current_revision(srv.svc.db) in head_revisions()
    finally:
        srv.svc.close()


@pytest.mark.slow
def test_a_server_process_on_a_dropped_and_recreated_database_answers_503_without_tracebacks(
    pg_url: str, tmp_path: Path
) -> None:
    """The reported incident: a real server whose PostgreSQL schema is dropped and recreated empty
    under it. /healthz and ingest answer 503 with the reason, the log says so once (no traceback
    per request or per worker step), and after `flightdeck migrate` it serves again."""
    import psycopg

    from tests.support.server_app import start_server_process
    from tests.support.server_batches import body, make_batch

    assert main(["migrate", "--database-url", pg_url]) == 0
    token = "fdk_process-test-token"
    db = connect(pg_url)
    try:
        with db.write() as session, session.begin():
            store.create_token(session=session, name="p", token_hash=hash_token(token), now_ns=1)
    finally:
        db.dispose()
    auth = {"Authorization": f"Bearer {token}"}
    snaps = snapshots([d for ds in scenario_dumps("healthy_4").values() for d in ds])
    log_path = tmp_path / "server.log"
    with open(log_path, "wb") as log:
        proc, base = start_server_process(
            {"FLIGHTDECK_SERVER_DATABASE_URL": pg_url, "FLIGHTDECK_SERVER_DIAGNOSIS_INTERVAL_S": "0.1"}, log
        )
    try:

        def push() -> httpx.Response:
            data, headers = body(make_batch(snaps, sent_at_ns=time.time_ns()))
            return httpx.post(f"{base}/api/v1/ingest", content=data, headers={**headers, **auth}, timeout=30)

        assert push().status_code == 200
        schema = pg_url.rsplit("%3D", 1)[1]
        with psycopg.connect(pg_url.split("?")[0].replace("+psycopg", ""), autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
            conn.execute(f'CREATE SCHEMA "{schema}"')
        answers = []
        for _ in range(20):
            r = push()
            answers.append((r.status_code, r.json()["detail"]))
            time.sleep(0.1)
        # The token was verified a moment ago (auth_cache_s): then the cache is dropped with the
        # rest of the old database, and the token lookup itself meets the missing schema.
        assert {code for code, _ in answers} == {503}, answers
        assert all("no Flightdeck schema" in d for _, d in answers), answers
        r = httpx.get(f"{base}/healthz", timeout=10)
        assert r.status_code == 503 and "flightdeck migrate" in r.json()["reason"]
        time.sleep(1.0)  # the diagnosis and webhook workers keep stepping meanwhile

        assert main(["migrate", "--database-url", pg_url]) == 0
        time.sleep(1.1)
        assert httpx.get(f"{base}/healthz", timeout=10).status_code == 200
    finally:
        proc.terminate()
        proc.wait(30)
    text_ = log_path.read_text(errors="replace")
    assert "Traceback" not in text_, text_[-3000:]
    assert text_.count("database schema lost") == 1, text_[-3000:]


# --- start-up, in real server processes ---------------------------------------------------------


def _server(env: dict[str, str], *args: str, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    """Run `flightdeck server` until it exits on its own (it must refuse to start)."""
    full = {**os.environ, "FLIGHTDECK_SERVER_PORT": str(free_port()), **env}
    return subprocess.run(
        [sys.executable, "-m", "flightdeck", "server", "--log-level", "warning", *args],
        env=full,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def _serves(env: dict[str, str], *args: str) -> None:
    """`flightdeck server` starts and answers /healthz 200; then it is stopped."""
    port = free_port()
    full = {**os.environ, **env, "FLIGHTDECK_SERVER_PORT": str(port)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "flightdeck", "server", "--log-level", "warning", *args],
        env=full,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.communicate()[1]
            try:
                r = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2)
                if r.status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "no /healthz 200"
            time.sleep(0.2)
    finally:
        proc.terminate()
        proc.wait(20)


def _one_line(stderr: str) -> str:
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr
    return lines[0]


@pytest.fixture
def pg_url(database_url: str) -> str:
    """PostgreSQL only: a fresh, empty schema."""
    if not database_url.startswith("postgresql"):
        pytest.skip("PostgreSQL rule")
    return database_url


@pytest.mark.slow
def test_postgresql_missing_or_older_schema_refused_until_migrated(pg_url: str) -> None:
    env = {"FLIGHTDECK_SERVER_DATABASE_URL": pg_url}
    done = _server(env)
    assert done.returncode == 4
    line = _one_line(done.stderr)
    assert line.startswith("flightdeck server: refusing to start: the database has no Flightdeck schema")
    assert "flightdeck migrate" in line and "--migrate" in line

    _migrated(pg_url, "0004")
    done = _server(env)
    assert done.returncode == 4
    assert "is at revision 0004, older than this server's" in _one_line(done.stderr)
    assert main(["migrate", "--database-url", pg_url, "--check"]) == 4

    assert main(["migrate", "--database-url", pg_url]) == 0
    assert main(["migrate", "--database-url", pg_url, "--check"]) == 0
    _serves(env)


def test_token_command_follows_the_same_rule(pg_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["token", "--database-url", pg_url, "create", "n", "--host", "n"]) == 4
    assert "no Flightdeck schema" in capsys.readouterr().err
    assert main(["migrate", "--database-url", pg_url]) == 0
    assert main(["token", "--database-url", pg_url, "create", "n", "--host", "n"]) == 0
    url = f"postgresql+psycopg://postgres@127.0.0.1:{_closed_port()}/x"
    capsys.readouterr()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FLIGHTDECK_SERVER_DB_STARTUP_TIMEOUT_S", "1")
        assert main(["token", "--database-url", url, "list"]) == 3
    err = capsys.readouterr().err
    assert "flightdeck token: giving up: database" in err and "Traceback" not in err


@pytest.mark.slow
def test_postgresql_migrated_at_start_when_told(pg_url: str) -> None:
    _serves({"FLIGHTDECK_SERVER_DATABASE_URL": pg_url}, "--migrate")
    _wipe(pg_url)
    _serves({"FLIGHTDECK_SERVER_DATABASE_URL": pg_url, "FLIGHTDECK_SERVER_MIGRATE": "true"})


@pytest.mark.slow
def test_sqlite_is_migrated_by_default_unless_told_not_to(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/fd.db"
    done = _server({"FLIGHTDECK_SERVER_DATABASE_URL": url, "FLIGHTDECK_SERVER_MIGRATE": "false"})
    assert done.returncode == 4 and "no Flightdeck schema" in _one_line(done.stderr)
    _serves({"FLIGHTDECK_SERVER_DATABASE_URL": url})


@pytest.mark.slow
def test_a_newer_schema_is_refused_even_when_told_to_migrate(database_url: str) -> None:
    _migrated(database_url)
    db = connect(database_url)
    try:
        with db.write_engine.begin() as conn:
            conn.execute(text("UPDATE alembic_version SET version_num = '9999_from_the_future'"))
    finally:
        db.dispose()
    done = _server({"FLIGHTDECK_SERVER_DATABASE_URL": database_url}, "--migrate")
    assert done.returncode == 4
    line = _one_line(done.stderr)
    assert "9999_from_the_future, unknown to this server" in line and "upgrade the server" in line


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed again on return: nothing listens there


@pytest.mark.slow
def test_unreachable_postgresql_is_retried_then_given_up_with_exit_code_3() -> None:
    url = f"postgresql+psycopg://postgres:secret-pw@127.0.0.1:{_closed_port()}/flightdeck"
    started = time.monotonic()
    done = _server({"FLIGHTDECK_SERVER_DATABASE_URL": url, "FLIGHTDECK_SERVER_DB_STARTUP_TIMEOUT_S": "3"})
    took = time.monotonic() - started
    assert done.returncode == 3, done.stderr
    assert "Traceback" not in done.stderr and "secret-pw" not in done.stderr
    lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
    retries = [ln for ln in lines if "not reachable (attempt" in ln]
    assert len(retries) >= 2 and all(ln.startswith("flightdeck server: database ") for ln in retries)
    assert "retrying in" in retries[0]
    assert lines[-1].startswith("flightdeck server: giving up: database ")
    assert "FLIGHTDECK_SERVER_DB_STARTUP_TIMEOUT_S" in lines[-1]
    assert len(lines) == len(retries) + 1
    assert took >= 3  # it waited out its deadline


@pytest.mark.slow
def test_a_database_that_comes_up_during_the_retries_is_served(pg_url: str) -> None:
    """PostgreSQL reachable only after a few seconds (a forwarder to it starts late): the server
    retries, then starts and serves."""
    import threading

    port = _closed_port()
    url = pg_url.replace("127.0.0.1:5432", f"127.0.0.1:{port}")
    assert url != pg_url
    stop = threading.Event()

    def pipe(a: socket.socket, b: socket.socket) -> None:
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        finally:
            b.close()

    def forward() -> None:
        time.sleep(2.5)
        with socket.socket() as srv:
            srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            srv.bind(("127.0.0.1", port))
            srv.listen()
            srv.settimeout(0.2)
            while not stop.is_set():
                try:
                    c, _ = srv.accept()
                except TimeoutError:
                    continue
                u = socket.create_connection(("127.0.0.1", 5432))
                threading.Thread(target=pipe, args=(c, u), daemon=True).start()
                threading.Thread(target=pipe, args=(u, c), daemon=True).start()

    t = threading.Thread(target=forward, daemon=True)
    t.start()
    try:
        _serves({"FLIGHTDECK_SERVER_DATABASE_URL": url, "FLIGHTDECK_SERVER_MIGRATE": "true"})
    finally:
        stop.set()
        t.join(5)


def test_compose_migrates_at_start() -> None:
    doc: dict[str, Any] = yaml.safe_load((REPO / "docker-compose.yml").read_text(encoding="utf-8"))
    assert doc["services"]["flightdeck"]["environment"]["FLIGHTDECK_SERVER_MIGRATE"] == "true"
