"""The server's input validation (issue 21): values checked against the store, a bad snapshot
refused alone with its reason, reads answering 422 (never 500), unexpected errors answered 500
with an id on a kept connection, and nothing allocated per rank of a claimed world size.

In-process real app on real SQLite and PostgreSQL (the `database_url` fixture); the keep-alive
test runs a real `flightdeck server` process. Batches are built from the committed real gloo dumps
and then edited as JSON, the way a broken or hostile collector would send them.

One file past 500 lines on purpose: most tests post edited copies of one healthy batch through
the shared `server` fixture and helpers, which a split would only scatter.
"""

from __future__ import annotations

import copy
import gzip
import json
import os
import socket
import time
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import text

from flightdeck.limits import INT64_MAX, MAX_WORLD_SIZE
from flightdeck.server import store
from flightdeck.wire import encode_batch
from tests.support.clock import FakeClock
from tests.support.server_app import AUTH, Server, make_server
from tests.support.server_batches import make_batch, scenario_dumps, snapshots
from tests.support.server_process import ServerProcess

NS = 1_000_000_000


@pytest.fixture
def server(database_url: str, clock: FakeClock) -> Iterator[Server]:
    """A server on a fresh database (SQLite file or PostgreSQL schema)."""
    srv = make_server(database_url, clock)
    yield srv
    srv.svc.close()


def healthy_doc(clock: FakeClock, job: str = "good", ranks: int = 4) -> dict[str, Any]:
    """A wire document of a real healthy 4-rank job's latest snapshots, renamed `job`, sent now."""
    dumps = scenario_dumps("healthy_4")
    snaps = snapshots([dumps[r][-1] for r in sorted(dumps)[:ranks]], job=job)
    doc: dict[str, Any] = encode_batch(make_batch(snaps, sent_at_ns=clock.now_ns))
    return doc


def post(server: Server, doc: Any) -> httpx.Response:
    """POST a wire document (gzip JSON) with the test token."""
    data = gzip.compress(json.dumps(doc).encode())
    headers = {**AUTH, "Content-Encoding": "gzip", "Content-Type": "application/json"}
    resp: httpx.Response = server.client.post("/api/v1/ingest", content=data, headers=headers)
    return resp


def entry_count(server: Server, job: str) -> int:
    """Entries stored for a job (any attempt), 0 when there is no such job."""
    with server.svc.db.read() as session:
        j = store.get_job(session=session, name=job)
        return 0 if j is None else store.count_entries(session=session, job_id=j.id)


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    """An edit of one snapshot: `a.b` sets s[a][b], `entries.x.0` an entry column's first value."""

    def edit(s: dict[str, Any]) -> None:
        keys = path.split(".")
        obj: Any = s
        for k in keys[:-1]:
            obj = obj[int(k)] if isinstance(obj, list) else obj[k]
        last = keys[-1]
        if isinstance(obj, list):
            obj[int(last)] = value
        else:
            obj[last] = value

    return edit


def _first_group(edit: Callable[[dict[str, Any], str], None]) -> Callable[[dict[str, Any]], None]:
    def apply(s: dict[str, Any]) -> None:
        edit(s, sorted(s["groups"])[0])

    return apply


def _long_group(s: dict[str, Any]) -> None:
    name = "g" * 129
    s["groups"][name] = {"desc": "", "ranks": None}
    s["entries"]["g"][0] = name


def _repeat_rid(s: dict[str, Any]) -> None:
    s["entries"]["rid"][1] = s["entries"]["rid"][0]


#: A snapshot edit a broken or hostile collector might send, and what the refusal names.
HOSTILE: dict[str, tuple[Callable[[dict[str, Any]], None], str]] = {
    "nul_in_job": (_set("job", "bad\x00job"), ".job"),
    "ansi_in_host": (_set("host", "node\x1b[31m-1"), ".host"),
    "world_size_0": (_set("world_size", 0), ".world_size"),
    "world_size_2e9": (_set("world_size", 2_000_000_000), ".world_size"),
    "rank_2e9_no_world": (lambda s: s.update(rank=2_000_000_000, world_size=None), ".rank"),
    "rank_not_below_world": (_set("rank", 7), ".rank"),
    "negative_attempt": (_set("attempt", -1), ".attempt"),
    "negative_time": (_set("snapshot_time_ns", -5), ".snapshot_time_ns"),
    "attempt_2_63": (_set("attempt", 2**63), ".attempt"),
    "pid_2_63": (_set("pid", 2**63), ".pid"),
    "rid_2_63": (_set("entries.rid.0", 2**63), ".rid"),
    "negative_rid": (_set("entries.rid.0", -1), ".rid"),
    "repeated_rid": (_repeat_rid, "repeated"),
    "seq_2_64_minus_1": (_set("entries.seq.0", 2**64 - 1), ".seq"),
    "time_2_63": (_set("entries.tc.0", 2**63), ".tc"),
    "long_group_name": (_long_group, ".g"),
    "nul_in_group": (_first_group(lambda s, g: s["groups"].update({"x\x00": s["groups"][g]})), "groups"),
    "thread_id_text": (
        lambda s: s.update(thread_stacks=[{"thread_name": "t", "thread_id": "abc"}]),
        "thread_id",
    ),
    "thread_id_2_63": (
        lambda s: s.update(thread_stacks=[{"thread_name": "t", "thread_id": 2**63}]),
        "thread_id",
    ),
    "group_rank_out_of_world": (
        _first_group(lambda s, g: s["groups"][g].update(ranks=[0, 1, 2, 99])),
        "ranks",
    ),
    "timeout_string": (lambda s: s["entries"].update(to=["30000"] * s["entries"]["n"]), ".to"),
    "negative_duration": (lambda s: s["entries"].update(dur=[-1.0] * s["entries"]["n"]), ".dur"),
    "nul_in_thread_name": (lambda s: s["entries"].update(thr=["a\x00"] * s["entries"]["n"]), ".thr"),
    "peer_out_of_range": (lambda s: s["entries"].update(peer=[MAX_WORLD_SIZE] * s["entries"]["n"]), ".peer"),
}


def test_realistic_large_values_are_stored(server: Server, clock: FakeClock) -> None:
    """A 30-day timeout, 64-bit pids, sequence and op ids past 2^31: stored and read back as sent."""
    doc = healthy_doc(clock)
    s = doc["snapshots"][0]
    n = s["entries"]["n"]
    s["pid"] = 2**40 + 7
    s["entries"]["to"] = [2_592_000_000] * n
    s["entries"]["seq"] = [2**31 + 10 + i for i in range(n)]
    s["entries"]["opid"] = [2**33 + i for i in range(n)]
    s["entries"]["p2p"] = [2**32] * n
    r = post(server, doc)
    assert r.status_code == 200, r.text
    with server.svc.db.read() as session:
        j = store.get_job(session=session, name="good")
        assert j is not None
        ranks = dict(store.job_ranks(session=session, job_id=j.id))
        loaded = store.load_entries(session=session, job_id=j.id)
    assert {r.rank: r.pid for r in ranks}[s["rank"]] == 2**40 + 7
    mine = loaded[s["rank"]]
    assert {e.timeout_ms for e in mine} == {2_592_000_000}
    assert sorted(e.collective_seq_id for e in mine) == s["entries"]["seq"]
    assert {e.p2p_seq_id for e in mine} == {2**32}
    server.diagnose()
    assert server.job("good")["ranks"]["with_dump"] == [0, 1, 2, 3]


def test_each_bad_snapshot_is_refused_alone(server: Server, clock: FakeClock) -> None:
    """One batch: a healthy job's 4 snapshots and one bad snapshot per hostile edit. 422 lists
    every bad one with a reason naming its field; the healthy job is stored and diagnosed."""
    doc = healthy_doc(clock)
    template = doc["snapshots"][0]
    names = list(HOSTILE)
    for name in names:
        s = copy.deepcopy(template)
        s["job"] = f"bad-{name}"
        HOSTILE[name][0](s)
        doc["snapshots"].append(s)
    r = post(server, doc)
    assert r.status_code == 422, r.text
    answer = r.json()
    assert answer["applied"] is True and answer["snapshots"] == 4
    assert answer["entries"] == sum(s["entries"]["n"] for s in doc["snapshots"][:4])
    assert answer["refused_count"] == len(names)
    refused = {x["snapshot"]: x for x in answer["refused"]}
    assert sorted(refused) == list(range(4, 4 + len(names)))
    for i, name in enumerate(names):
        reason = refused[4 + i]["reason"]
        assert reason.startswith(f"batch.snapshots[{4 + i}]"), (name, reason)
        assert HOSTILE[name][1] in reason, (name, reason)
    assert "refused" in answer["detail"] and "applied" in answer["detail"]
    assert entry_count(server, "good") == answer["entries"]
    # No bad job got in under a cleaned name: only the healthy one (and the ones whose bad value
    # is elsewhere than the name, refused all the same) exist... i.e. exactly one job.
    with server.svc.db.read() as session:
        assert [j.name for j in store.list_jobs(session=session)] == ["good"]
    server.diagnose()
    assert server.job("good")["healthy"] is True
    # Sending the same batch again is a duplicate (already applied): acknowledged, nothing changes.
    again = post(server, doc)
    assert again.status_code == 200 and again.json()["duplicate"] is True
    metrics = server.client.get("/metrics").text
    assert f"flightdeck_ingest_refused_snapshots_total {float(len(names))}" in metrics


def test_a_batch_of_only_bad_snapshots_applies_nothing(server: Server, clock: FakeClock) -> None:
    """Nothing valid: 422 with `applied: false`, nothing stored, and the batch id stays free (the
    corrected batch under the same id is taken)."""
    doc = healthy_doc(clock)
    bad = copy.deepcopy(doc)
    for s in bad["snapshots"]:
        s["world_size"] = 0
    r = post(server, bad)
    assert r.status_code == 422
    assert r.json()["applied"] is False and r.json()["refused_count"] == 4
    assert entry_count(server, "good") == 0
    ok = post(server, doc)
    assert ok.status_code == 200 and ok.json()["duplicate"] is False


def test_bad_table_items_refuse_only_the_snapshots_that_use_them(server: Server, clock: FakeClock) -> None:
    """A signature with a NUL in its op and a stack with an ANSI escape in a file name: the
    snapshots referring to them are refused, another job's snapshots in the batch are not."""
    doc = healthy_doc(clock)
    other = healthy_doc(clock, job="other")
    # The other job's snapshots get their own signature and stack tables, appended to the batch's.
    base_sig, base_stk = len(doc["sigs"]), len(doc["stacks"])
    doc["sigs"] += other["sigs"]
    doc["stacks"] += other["stacks"]
    for s in other["snapshots"]:
        s["entries"]["sig"] = [i + base_sig for i in s["entries"]["sig"]]
        if "stk" in s["entries"]:
            s["entries"]["stk"] = [None if i is None else i + base_stk for i in s["entries"]["stk"]]
        for t in s.get("thread_stacks") or []:
            if t.get("stk") is not None:
                t["stk"] += base_stk
    doc["snapshots"] += other["snapshots"]
    for sig in doc["sigs"][base_sig:]:
        sig["op"] = "nccl:all_reduce\x00"
    r = post(server, doc)
    assert r.status_code == 422, r.text
    answer = r.json()
    assert {x["job"] for x in answer["refused"]} == {"other"}
    assert all("batch.sigs[" in x["reason"] for x in answer["refused"])
    assert entry_count(server, "good") > 0 and entry_count(server, "other") == 0


def test_free_text_is_neutralized_not_refused(server: Server, clock: FakeClock) -> None:
    """An exception message with NUL and an ANSI escape is stored with U+FFFD in their place;
    newlines and tabs stay."""
    doc = healthy_doc(clock)
    doc["snapshots"][0]["exception"] = "RuntimeError: \x1b[31mboom\x00\n\tat step 3"
    for snap in doc["snapshots"]:
        snap["groups"][sorted(snap["groups"])[0]]["desc"] = "pg\x07"
    r = post(server, doc)
    assert r.status_code == 200, r.text
    with server.svc.db.read() as session:
        j = store.get_job(session=session, name="good")
        assert j is not None
        ranks = {rk.rank: rk for rk, _ in store.job_ranks(session=session, job_id=j.id)}
        descs = {g.desc for g in store.job_groups(session=session, job_id=j.id)}
    assert ranks[doc["snapshots"][0]["rank"]].exception == "RuntimeError: \ufffd[31mboom\ufffd\n\tat step 3"
    assert "pg\ufffd" in descs


def test_batch_level_errors_refuse_the_batch(server: Server, clock: FakeClock) -> None:
    """The batch's own fields are everyone's: a bad one refuses the whole batch (422, nothing applied)."""
    for field, value in (("sent_at_ns", 2**63), ("batch_id", "id\x00"), ("sent_at_ns", -1)):
        doc = healthy_doc(clock)
        doc[field] = value
        r = post(server, doc)
        assert r.status_code == 422, (field, r.text)
        assert field in r.json()["detail"]
    doc = healthy_doc(clock)
    doc["collector"]["host"] = "h\x1b[2J"
    assert post(server, doc).status_code == 422
    assert entry_count(server, "good") == 0


@pytest.mark.slow
@pytest.mark.parametrize(
    "path",
    [
        "/api/v1/jobs/good/timeline?rank_from=3000000000",
        "/api/v1/jobs/good/timeline?rank_to=-1",
        f"/api/v1/jobs/good/timeline?seq_from={2**63}",
        f"/api/v1/jobs/good?attempt={2**63}",
        "/api/v1/jobs/good?attempt=-1",
        f"/api/v1/jobs/good/findings?attempt={2**70}",
        "/api/v1/jobs/bad%00job",
        "/api/v1/jobs/bad%00job/findings",
        "/api/v1/jobs/good/timeline?group=a%00b",
        "/api/v1/jobs/" + "j" * 300,
        "/jobs/bad%00job",
        f"/jobs/good?start={2**63}",
        "/jobs/good?group=%1b%5b31m",
        "/jobs/good/ranks/3000000000",
        f"/jobs/good/cell?group=0&seq={2**64}&rank=0",
        "/jobs/good/cell?group=0&seq=1&rank=-3",
    ],
)
def test_reads_validate_their_parameters(server: Server, clock: FakeClock, path: str) -> None:
    """Out-of-range ints, NUL and control characters in names: 422 naming the parameter, never 500."""
    assert post(server, healthy_doc(clock)).status_code == 200
    r = server.client.get(path)
    assert r.status_code == 422, (path, r.status_code, r.text[:300])


@pytest.mark.slow
def test_web_rank_filter_is_bounded(server: Server, clock: FakeClock) -> None:
    """A rank filter naming more ranks than the largest world size is a 400, not a huge set."""
    assert post(server, healthy_doc(clock)).status_code == 200
    server.diagnose()
    many = ",".join(["0-1048575"] * 3)
    assert server.client.get("/jobs/good", params={"ranks": many}).status_code == 400
    assert server.client.get("/jobs/good", params={"ranks": "0-1048576"}).status_code == 400
    assert server.client.get("/jobs/good", params={"ranks": "0-3"}).status_code == 200


def test_a_claimed_world_of_a_million_ranks_costs_what_was_received(server: Server, clock: FakeClock) -> None:
    """world_size 1,048,576 with 4 ranks seen: ingest, the diagnosis, the JSON API and the pages
    allocate by the ranks received (tracemalloc peak well under what one entry per claimed rank
    would take), and the missing ranks are counted whole but listed bounded."""
    doc = healthy_doc(clock)
    for s in doc["snapshots"]:
        s["world_size"] = MAX_WORLD_SIZE
    assert post(server, doc).status_code == 200
    tracemalloc.start()
    try:
        server.diagnose()
        job = server.job("good")
        page = server.client.get("/jobs/good")
        listing = server.client.get("/")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert page.status_code == 200 and listing.status_code == 200
    ranks = job["ranks"]
    assert ranks["expected"] == MAX_WORLD_SIZE and ranks["without_dump_count"] == MAX_WORLD_SIZE - 4
    assert len(ranks["without_dump"]) <= 4096 + 4
    missing = next(f for f in job["findings"] if f["kind"] == "missing_dump") if job["findings"] else None
    if missing is not None:
        assert len(missing["culprit_ranks"]) <= 4096 + 4
        assert f"+{MAX_WORLD_SIZE - 4 - 8} more" in missing["detail"]
    # One small int per claimed rank would be 28 MB, a list of them 8 MB more: the bound is far below.
    assert peak < 24 * 2**20, f"peak {peak / 2**20:.1f} MiB"


@pytest.mark.slow
def test_unexpected_errors_are_500_with_an_id_on_a_kept_connection(database_url: str, tmp_path: Path) -> None:
    """A real `flightdeck server`: a stored report of the wrong shape makes a read raise a
    TypeError. The answer is a 500 whose body holds an error id, the log has one line with it, and
    the next request on the same keep-alive connection is answered."""
    log_path = tmp_path / "server.log"
    env = {
        **os.environ,
        "FLIGHTDECK_SERVER_DATABASE_URL": database_url,
        "FLIGHTDECK_SERVER_ALLOW_UNAUTHENTICATED_INGEST": "true",
        "FLIGHTDECK_SERVER_MIGRATE": "true",  # a fresh PostgreSQL schema is migrated only when told
    }
    with ServerProcess(env, log_path) as server:
        server.start()
        base = server.url
        clock = FakeClock(time.time_ns())
        data = gzip.compress(json.dumps(healthy_doc(clock)).encode())
        with httpx.Client(base_url=base) as c:
            r = c.post("/api/v1/ingest", content=data, headers={"Content-Encoding": "gzip"})
            assert r.status_code == 200, r.text
        from flightdeck.server.db import connect

        db = connect(database_url)
        try:
            with db.write() as session, session.begin():
                session.execute(text("UPDATE jobs SET report = :r"), {"r": json.dumps("not a report")})
        finally:
            db.dispose()
        # One TCP connection, two requests: the second is answered on the same socket.
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
            first = _http_get(sock, "/api/v1/jobs/good")
            second = _http_get(sock, "/healthz")
        status, headers, body = first
        assert status == 500, body
        error_id = json.loads(body)["error_id"]
        assert len(error_id) == 16 and headers.get("connection") != "close"
        assert second[0] == 200
        time.sleep(0.2)
        lines = [ln for ln in log_path.read_text(errors="replace").splitlines() if error_id in ln]
        assert len(lines) == 1 and "TypeError" in lines[0], lines


def _http_get(sock: socket.socket, path: str) -> tuple[int, dict[str, str], str]:
    """One HTTP/1.1 GET on an open socket (keep-alive), read to the end of its body."""
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        assert chunk, "connection closed before the answer"
        buf += chunk
    head, _, rest = buf.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
    length = int(headers.get("content-length", "0"))
    while len(rest) < length:
        chunk = sock.recv(65536)
        assert chunk, "connection closed inside the body"
        rest += chunk
    return status, headers, rest[:length].decode()


def test_int64_bound_is_the_store_bound() -> None:
    """The validation's 64-bit bound is what SQLite and BIGINT hold."""
    assert INT64_MAX == 2**63 - 1


# The pusher passes a timeout per request, which the in-process TestClient only warns about.
@pytest.mark.filterwarnings("ignore:You should not use the 'timeout' argument")
def test_the_collector_sets_a_partly_refused_batch_aside_once(
    server: Server, clock: FakeClock, tmp_path: Path
) -> None:
    """The real collector pusher and queue against the real app: a batch with one bad snapshot is
    answered 422 (`applied`, with the refused list), so the pusher acknowledges the batch and moves
    the refused snapshot alone to the dead-letter table with the server's reason (never retried by
    itself); the healthy snapshots are stored once. Requeued, the refused part is refused again and
    stored nothing."""
    import random

    from prometheus_client import CollectorRegistry

    from flightdeck.collector.metrics import CollectorMetrics
    from flightdeck.collector.pusher import Outcome, Pusher
    from flightdeck.collector.queue import DurableQueue, NewBatch

    doc = healthy_doc(clock)
    bad = copy.deepcopy(doc["snapshots"][0])
    bad["job"], bad["world_size"] = "other", 0
    doc["snapshots"].append(bad)
    queue = DurableQueue(tmp_path / "state", max_bytes=1 << 20)
    metrics = CollectorMetrics(CollectorRegistry())
    pusher = Pusher(
        queue,
        client=server.client,
        url="/api/v1/ingest",
        token=AUTH["Authorization"].split()[1],
        metrics=metrics,
        rng=random.Random(1),
        max_attempts=10,
    )
    try:
        body = gzip.compress(json.dumps(doc).encode())
        assert queue.enqueue([NewBatch(doc["batch_id"], "periodic", 1, body)])
        head = queue.peek()
        assert head is not None
        assert pusher.deliver(head, deadline=time.monotonic() + 10) is Outcome.DELIVERED
        assert queue.peek() is None
        [(batch_id, status, message)] = queue.dead_letters()
        assert batch_id == doc["batch_id"] + "-refused" and status == 422
        assert "batch.snapshots[4].world_size" in message
        healthy = sum(s["entries"]["n"] for s in doc["snapshots"][:4])
        assert entry_count(server, "good") == healthy
        assert queue.requeue_dead_letters() == 1
        head = queue.peek()
        assert head is not None
        assert pusher.deliver(head, deadline=time.monotonic() + 10) is Outcome.DEAD_LETTERED
        assert queue.peek() is None and len(queue.dead_letters()) == 1
        assert entry_count(server, "good") == healthy
    finally:
        queue.close()


def test_missing_ranks_are_counted_whole_and_listed_bounded() -> None:
    """`missing_ranks` works by the ranks present: a claimed million ranks lists 4,096 + present."""
    from flightdeck.analysis.diagnose import MAX_LISTED_MISSING, missing_ranks

    listed, count = missing_ranks([0, 5, 7], 10)
    assert (listed, count) == ([1, 2, 3, 4, 6, 8, 9], 7)
    listed, count = missing_ranks([0, 1, 2, 3, 2_000_000], MAX_WORLD_SIZE)
    assert count == MAX_WORLD_SIZE - 4
    assert len(listed) == MAX_LISTED_MISSING + 4 and listed[:2] == [4, 5]


def test_migration_0006_widens_an_existing_database(database_url: str, clock: FakeClock) -> None:
    """A database at revision 0005 with data is upgraded in place: the data stays, and the values
    past 2^31 that the old INTEGER columns refused on PostgreSQL are then stored (both databases
    end with the schema of the models)."""
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    from flightdeck.server.db import migrate
    from flightdeck.server.models import Base

    db = connect_db(database_url)
    try:
        migrate(db, "0005")
        with db.write() as session, session.begin():
            session.execute(
                text(
                    "INSERT INTO entries (job_id, rank, record_id, group_id, seq, p2p_seq, op_id, sig_id, "
                    "state, retired, time_created_ns, timeout_ms, thread_name) "
                    "VALUES (1, 0, 1, 1, 5, 0, 6, 1, 2, true, 1, 600000, '')"
                )
            )
        migrate(db)
        with db.engine.connect() as conn:
            assert compare_metadata(MigrationContext.configure(conn), Base.metadata) == []
        with db.write() as session, session.begin():
            session.execute(
                text(
                    "INSERT INTO entries (job_id, rank, record_id, group_id, seq, p2p_seq, op_id, sig_id, "
                    "state, retired, time_created_ns, timeout_ms, thread_name) "
                    "VALUES (1, 0, 2, 1, :big, :big, :big, 1, 2, true, 1, 2592000000, '')"
                ),
                {"big": 2**40},
            )
        with db.read() as session:
            rows = session.execute(
                text("SELECT record_id, seq, timeout_ms FROM entries ORDER BY record_id")
            ).all()
        assert [tuple(r) for r in rows] == [(1, 5, 600000), (2, 2**40, 2592000000)]
    finally:
        db.dispose()


def connect_db(url: str) -> Any:
    """The server's database handle on `url` (not migrated)."""
    from flightdeck.server.db import connect

    return connect(url)
