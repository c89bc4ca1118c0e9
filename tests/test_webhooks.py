"""Durable webhook delivery: the outbox table, the claim and lease, the retry rules, and real server
processes that are killed (SIGKILL) or run side by side on one PostgreSQL.

Receivers are real HTTP servers on 127.0.0.1 started by the tests; databases are real SQLite files
and PostgreSQL schemas. Delivery is at least once, so what is asserted is event ids: every event
arrives, under the same id in the body and both headers.

One file past 500 lines on purpose: the outbox, lease and retry tests and the real-process ones
share the test receivers and the outbox and server helpers, which a split would only scatter.
"""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import httpx
import pytest

from flightdeck.launch.demo.ranks import free_port
from flightdeck.server import store
from flightdeck.server.db import Database, connect, migrate
from flightdeck.server.metrics import WebhookMetrics
from flightdeck.server.settings import ServerSettings
from flightdeck.server.webhooks import WebhookSender
from flightdeck.wire import Snapshot
from tests.support.clock import FakeClock
from tests.support.server_app import STALL_S, Server, healthy_prefix, make_server, start_server_process
from tests.support.server_batches import (
    body,
    make_batch,
    renamed,
    skip_stuck_view,
)

NS = 1_000_000_000

#: answer(path, event id, POSTs of this event id to this path before this one) -> (status, headers)
Answer = Callable[[str, str, int], tuple[int, dict[str, str]]]


@dataclass(frozen=True)
class Post:
    """One POST a receiver got."""

    path: str
    event_id: str
    idempotency_key: str
    body: dict[str, Any]
    status: int


class Receiver:
    """A webhook endpoint on 127.0.0.1 that records every POST and answers what `answer` says."""

    def __init__(self, answer: Answer | None = None, port: int = 0) -> None:
        self.posts: list[Post] = []
        self._answer: Answer = answer or (lambda _path, _id, _n: (200, {}))
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                data = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
                event_id = self.headers.get("X-Flightdeck-Event-Id", "")
                with receiver._lock:
                    n = sum(1 for p in receiver.posts if p.event_id == event_id and p.path == self.path)
                    status, headers = receiver._answer(self.path, event_id, n)
                    receiver.posts.append(
                        Post(self.path, event_id, self.headers.get("Idempotency-Key", ""), data, status)
                    )
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                """Silence the per-request log line."""

        self._server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="receiver", daemon=True)
        self._thread.start()

    def url(self, path: str = "/hook") -> str:
        """The URL of `path` on this receiver."""
        return f"http://127.0.0.1:{self._server.server_address[1]}{path}"

    def snapshot(self) -> list[Post]:
        """The POSTs so far."""
        with self._lock:
            return list(self.posts)

    def close(self) -> None:
        """Stop serving."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    """A receiver answering 200 to everything."""
    r = Receiver()
    yield r
    r.close()


def _outbox(db: Database) -> list[Any]:
    with db.read() as session:
        return store.webhook_deliveries(session=session)


def _open_hang(srv: Server, clock: FakeClock) -> None:
    """healthy_4 stuck at its 10th collective, judged past the stall threshold: a hang opens."""
    stuck, _finals, t_k = healthy_prefix(10)
    clock.now_ns = t_k + int((STALL_S + 1) * NS)
    assert srv.push(stuck).status_code == 200
    srv.diagnose()


# --- the outbox in-process -----------------------------------------------------------------------


def test_events_are_written_with_the_findings_then_delivered_and_pruned(
    database_url: str, clock: FakeClock, receiver: Receiver
) -> None:
    urls = [receiver.url("/a"), receiver.url("/b")]
    srv = make_server(database_url, clock, webhook_urls=urls, retention_days=1e-6)
    try:
        _open_hang(srv, clock)
        rows = _outbox(srv.svc.db)
        with srv.svc.db.read() as session:
            job = store.get_job(session=session, name="healthy_4")
            assert job is not None
            findings = store.findings_history(session=session, job_id=job.id)
        assert findings and rows
        # One row per (event, URL), one event per opened finding; the id is the same for both URLs.
        assert sorted(r.url for r in rows) == sorted(urls * len(findings))
        by_event: dict[str, list[Any]] = {}
        for r in rows:
            by_event.setdefault(r.event_id, []).append(r)
        assert len(by_event) == len(findings)
        assert {rs[0].payload["finding"]["id"] for rs in by_event.values()} == {f.id for f in findings}
        for event_id, rs in by_event.items():
            assert {r.url for r in rs} == set(urls)
            assert all(r.payload["id"] == event_id and r.state == "pending" for r in rs)
            assert rs[0].payload["event"] == "finding.opened"
            assert (rs[0].payload["job"], rs[0].payload["attempt"]) == ("healthy_4", 0)
        # The sender, stepped by hand (workers are off): every row delivered, headers carry the id.
        srv.svc.webhooks.step()
        posts = receiver.snapshot()
        assert sorted((p.path, p.event_id) for p in posts) == sorted(
            ("/" + r.url.rsplit("/", 1)[1], r.event_id) for r in rows
        )
        assert all(p.idempotency_key == p.event_id == p.body["id"] for p in posts)
        assert {r.state for r in _outbox(srv.svc.db)} == {"delivered"}
        get = srv.svc.registry.get_sample_value
        assert get("flightdeck_webhook_deliveries_total", {"outcome": "delivered"}) == len(rows)
        assert get("flightdeck_webhook_outbox_depth_deliveries") == 0
        # A diagnosis that changes nothing writes nothing; the retention task prunes delivered rows.
        srv.diagnose()
        assert len(_outbox(srv.svc.db)) == len(rows)
        time.sleep(0.2)  # retention_days=1e-6 is 86 ms
        srv.svc.run_retention()
        assert _outbox(srv.svc.db) == []
    finally:
        srv.svc.close()


def test_no_urls_no_outbox_rows(database_url: str, clock: FakeClock) -> None:
    srv = make_server(database_url, clock)
    try:
        _open_hang(srv, clock)
        assert srv.job("healthy_4")["status"] == "hung"
        assert _outbox(srv.svc.db) == []
    finally:
        srv.svc.close()


def _add(db: Database, n: int, now_ns: int, url: str = "http://127.0.0.1:1/x") -> None:
    with db.write() as session, session.begin():
        store.add_webhook_deliveries(
            session=session,
            deliveries=[
                {
                    "event_id": f"ev-{i}",
                    "url": url,
                    "payload": {"id": f"ev-{i}"},
                    "created_ns": now_ns,
                    "due_ns": now_ns,
                    "deadline_ns": now_ns + 600 * NS,
                }
                for i in range(n)
            ],
        )


def test_claims_are_leased_and_exclusive(database_url: str) -> None:
    db = connect(database_url)
    try:
        migrate(db)
        url, t, lease = "http://127.0.0.1:1/x", 1_000 * NS, 10 * NS
        _add(db, 3, t, url)

        def claim(now: int, limit: int, token: str) -> list[store.ClaimedDelivery]:
            with db.write() as session, session.begin():
                return store.claim_webhook_deliveries(
                    session=session, urls=[url], now_ns=now, limit=limit, lease_ns=lease, claim=token
                )

        first = claim(t, 2, "a")
        assert [d.event_id for d in first] == ["ev-0", "ev-1"] and [d.attempts for d in first] == [1, 1]
        assert [d.event_id for d in claim(t, 5, "b")] == ["ev-2"]
        assert claim(t + lease - 1, 5, "c") == []  # all leased
        with db.write() as session, session.begin():
            assert store.settle_webhook_delivery(
                session=session, row_id=first[0].row_id, claim="a", state="delivered", now_ns=t
            )
            # Only the holder of the lease records an outcome.
            assert not store.settle_webhook_delivery(
                session=session, row_id=first[1].row_id, claim="zzz", state="delivered", now_ns=t
            )
        # ev-1's lease ran out (a sender died holding it): another sender takes it, second attempt.
        again = claim(t + 2 * lease, 5, "d")
        assert sorted((d.event_id, d.attempts) for d in again) == [("ev-1", 2), ("ev-2", 2)]
        with db.write() as session, session.begin():
            ev2 = next(d for d in again if d.event_id == "ev-2")
            store.release_webhook_deliveries(session=session, row_ids=[ev2.row_id], claim="d", now_ns=t)
            assert store.webhook_outbox_status(session=session, urls=[url]) == (2, t)
        assert [(d.event_id, d.attempts) for d in claim(t, 5, "e")] == [("ev-2", 2)]
        if db.dialect != "postgresql":
            return
        # PostgreSQL: a claim in flight (rows locked, not committed) is skipped, not waited for.
        _add(db, 4, t, "http://127.0.0.1:2/y")
        y = ["http://127.0.0.1:2/y"]
        with db.write() as s1, s1.begin():
            held = store.claim_webhook_deliveries(
                session=s1, urls=y, now_ns=t, limit=2, lease_ns=lease, claim="p"
            )
            with db.write() as s2, s2.begin():
                other = store.claim_webhook_deliveries(
                    session=s2, urls=y, now_ns=t, limit=10, lease_ns=lease, claim="q"
                )
        assert len(held) == 2 and len(other) == 2
        assert not {d.row_id for d in held} & {d.row_id for d in other}
    finally:
        db.dispose()


def test_retry_rules(tmp_path: Path) -> None:
    """Non-retryable answers are final, Retry-After is honoured, attempts and the deadline bound
    the retries; the outbox clock is a fake one, the HTTP is real."""

    def answer(path: str, _event_id: str, n: int) -> tuple[int, dict[str, str]]:
        if path == "/bad":
            return 400, {}
        if path == "/flaky":
            return (503, {"Retry-After": "7"}) if n == 0 else (200, {})
        return 503, {}  # /down

    rcv = Receiver(answer)
    settings = ServerSettings(
        database_url=f"sqlite:///{tmp_path}/hooks.db",
        webhook_urls=[rcv.url("/bad"), rcv.url("/flaky"), rcv.url("/down")],
        webhook_max_attempts=2,
        webhook_backoff_initial_s=0.5,
        webhook_deadline_s=60,
    )
    db = connect(settings.effective_database_url)
    clock = FakeClock(2_000 * NS)
    metrics = WebhookMetrics()
    client = httpx.Client()
    sender = WebhookSender(
        settings=settings, db=db, client=client, metrics=metrics, clock=clock, jitter=lambda: 1.0
    )
    ev = store.FindingEvent("finding.opened", 7, "hang", {"kind": "hang"})
    try:
        migrate(db)
        with db.write() as session, session.begin():
            (first,) = sender.enqueue(session=session, job="j", attempt=0, events=[ev])
        assert sender.step() == 0.5  # /down is due again after the first backoff (jitter 1: 0.5 s)
        assert Counter(p.path for p in rcv.snapshot()) == {"/bad": 1, "/flaky": 1, "/down": 1}
        assert sender.step() == 0.5 and len(rcv.snapshot()) == 3  # nothing due yet
        clock.advance(1)
        sender.step()  # /down: second attempt fails, no attempts left
        clock.advance(6)
        sender.step()  # /flaky: Retry-After 7 s has passed
        posts = rcv.snapshot()
        assert Counter(p.path for p in posts) == {"/bad": 1, "/flaky": 2, "/down": 2}
        assert {(p.event_id, p.idempotency_key, p.body["id"]) for p in posts} == {(first, first, first)}
        assert all(p.body["finding"] == {"kind": "hang", "id": 7} for p in posts)
        states = {r.url.rsplit("/", 1)[1]: (r.state, r.attempts) for r in _outbox(db)}
        assert states == {"bad": ("dropped", 1), "flaky": ("delivered", 2), "down": ("dropped", 2)}
        assert metrics.deliveries.values() == {"delivered": 1, "failed": 2, "dropped": 2}
        # An event not sent by its deadline (say, every server was down) is dropped unsent.
        with db.write() as session, session.begin():
            sender.enqueue(session=session, job="j", attempt=0, events=[ev])
        clock.advance(61)
        sender.step()
        assert len(rcv.snapshot()) == len(posts)
        assert metrics.deliveries.values()["dropped"] == 5 and metrics.depth == 0
    finally:
        client.close()
        db.dispose()
        rcv.close()


# --- real server processes -----------------------------------------------------------------------


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(20)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(10)


def _push(base: str, snaps: list[Snapshot]) -> None:
    data, headers = body(make_batch(snaps))
    r = httpx.post(f"{base}/api/v1/ingest", content=data, headers=headers, timeout=30)
    assert r.status_code == 200, r.text


def _wait(what: str, cond: Callable[[], bool], timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def _status(base: str, job: str) -> str | None:
    doc = httpx.get(f"{base}/api/v1/jobs/{job}", timeout=10).json()
    return doc.get("status") if isinstance(doc, dict) else None


def _webhook_env(url: str, *hooks: str) -> dict[str, str]:
    return {
        "FLIGHTDECK_SERVER_DATABASE_URL": url,
        "FLIGHTDECK_SERVER_WEBHOOK_URLS": json.dumps(list(hooks)),
        "FLIGHTDECK_SERVER_WEBHOOK_BACKOFF_INITIAL_S": "0.05",
        "FLIGHTDECK_SERVER_WEBHOOK_BACKOFF_MAX_S": "0.3",
        "FLIGHTDECK_SERVER_WEBHOOK_MAX_ATTEMPTS": "100000",
        "FLIGHTDECK_SERVER_WEBHOOK_POLL_INTERVAL_S": "0.05",
        "FLIGHTDECK_SERVER_WEBHOOK_TIMEOUT_S": "2",
    }


@pytest.mark.slow
def test_event_survives_sigkill_of_the_server(tmp_path: Path) -> None:
    """The receiver is down while a hang opens; the server is SIGKILLed with the event undelivered
    and restarted with the receiver up: the event arrives, under the id it was stored with."""
    url = f"sqlite:///{tmp_path}/fd.db"
    port = free_port()  # the receiver's, not listening yet: connections are refused
    hook = f"http://127.0.0.1:{port}/hook"
    env = {**_webhook_env(url, hook), "FLIGHTDECK_SERVER_DATA_DIR": str(tmp_path)}
    logs = [open(tmp_path / f"server{i}.log", "wb") for i in range(2)]  # noqa: SIM115 (closed below)
    db = connect(url)
    rcv: Receiver | None = None
    procs: list[subprocess.Popen[bytes]] = []
    try:
        proc, base = start_server_process(
            {"FLIGHTDECK_SERVER_ALLOW_UNAUTHENTICATED_INGEST": "true", **env}, logs[0]
        )
        procs.append(proc)
        _push(base, skip_stuck_view())
        _wait("the hang", lambda: _status(base, "skip") == "hung")
        # Written with the finding, attempted (refused) at least once, still pending.
        _wait("a failed attempt", lambda: any(r.attempts >= 1 for r in _outbox(db)))
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        before = _outbox(db)
        assert before and all(r.state == "pending" for r in before), before
        stored = {r.event_id for r in before}
        print(f"\nundelivered at SIGKILL: {len(before)} rows, attempts {[r.attempts for r in before]}")
        rcv = Receiver(port=port)
        proc, base = start_server_process(
            {"FLIGHTDECK_SERVER_ALLOW_UNAUTHENTICATED_INGEST": "true", **env}, logs[1]
        )
        procs.append(proc)
        _wait("the delivery", lambda: all(r.state == "delivered" for r in _outbox(db)))
        posts = rcv.snapshot()
        # At least once in general; here exactly once: nothing reached the receiver before the kill.
        assert Counter(p.event_id for p in posts) == dict.fromkeys(stored, 1)
        assert all(p.idempotency_key == p.event_id == p.body["id"] and p.status == 200 for p in posts)
        assert any(p.body["event"] == "finding.opened" and p.body["finding"]["kind"] == "hang" for p in posts)
        # The restarted server re-diagnosed the job and found the same open hang: no new event.
        assert _status(base, "skip") == "hung"
        assert {r.event_id for r in _outbox(db)} == stored
    finally:
        _stop(procs)
        for log in logs:
            log.close()
        db.dispose()
        if rcv is not None:
            rcv.close()
    errors = [(tmp_path / f"server{i}.log").read_text() for i in range(2)]
    assert not any("Traceback" in e for e in errors), errors


@pytest.mark.slow
def test_two_server_processes_deliver_each_event_once(pg_database: str, tmp_path: Path) -> None:
    """Two server processes on one PostgreSQL, polling the outbox every 50 ms: every event's first
    attempt is refused (503, Retry-After 0), so both race for each retry. Each event is POSTed
    exactly twice: once refused, once delivered, never by both processes."""
    import psycopg

    schema = "webhook_two_processes"
    with psycopg.connect(pg_database.replace("+psycopg", ""), autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        conn.execute(f'CREATE SCHEMA "{schema}"')
    url = f"{pg_database}?options=-csearch_path%3D{schema}"
    db = connect(url)
    migrate(db)  # here, so the processes do not race to
    rcv = Receiver(lambda _path, _id, n: (503, {"Retry-After": "0"}) if n == 0 else (200, {}))
    env = {**_webhook_env(url, rcv.url()), "FLIGHTDECK_SERVER_CLUSTER": "true"}
    logs = [open(tmp_path / f"server{i}.log", "wb") for i in range(2)]  # noqa: SIM115 (closed below)
    procs: list[subprocess.Popen[bytes]] = []
    jobs = [f"skip-{k}" for k in range(6)]
    try:
        bases = []
        for log in logs:
            proc, base = start_server_process(
                {"FLIGHTDECK_SERVER_ALLOW_UNAUTHENTICATED_INGEST": "true", **env}, log
            )
            procs.append(proc)
            bases.append(base)
        for k, job in enumerate(jobs):
            _push(bases[k % 2], [renamed(s, job) for s in skip_stuck_view()])
        _wait("every job hung", lambda: all(_status(bases[0], job) == "hung" for job in jobs))
        _wait("every delivery", lambda: all(r.state == "delivered" for r in _outbox(db)))
        time.sleep(1.0)  # a duplicate, if there were one, would land now
        rows = _outbox(db)
        events = {r.event_id for r in rows}
        assert len(events) >= len(jobs)
        posts = rcv.snapshot()
        per_event = Counter(p.event_id for p in posts)
        assert per_event == dict.fromkeys(events, 2), per_event
        assert Counter(p.status for p in posts) == {503: len(events), 200: len(events)}
        assert all(r.attempts == 2 for r in rows)
        sent: list[dict[str, float]] = []
        for base in bases:
            reg_text = httpx.get(f"{base}/metrics", timeout=10).text
            outcomes: dict[str, float] = {}
            for line in reg_text.splitlines():
                if line.startswith("flightdeck_webhook_deliveries_total{"):
                    outcomes[line.split('"')[1]] = float(line.rsplit(" ", 1)[1])
            sent.append(outcomes)
        print(f"\n{len(events)} events; outcomes per process: {sent}")
        assert sum(s["delivered"] for s in sent) == len(events)
        assert sum(s["failed"] for s in sent) == len(events)
    finally:
        _stop(procs)
        for log in logs:
            log.close()
        db.dispose()
        rcv.close()
    errors = [(tmp_path / f"server{i}.log").read_text() for i in range(2)]
    assert not any("Traceback" in e for e in errors), errors


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
