"""The cluster's feeds on a real PostgreSQL. The ingest feed (server/cluster.py, store/cluster.py):
the owner of a job reads each feed row once, when the transaction that wrote it has committed,
whatever order the rows' ids commit in and however long a transaction ran. The digest feed
(server/digest_share.py): the owner reads the digests the other processes took, not its own."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from sqlalchemy.orm import Session

from flightdeck.digest import DigestBlock, DigestRequest
from flightdeck.server import store
from flightdeck.server.cluster import Cluster
from flightdeck.server.db import Database, connect, migrate
from flightdeck.server.digest_share import DigestShare
from flightdeck.server.models import Job
from flightdeck.wire import Snapshot
from tests.support.server_batches import body as batch_body
from tests.support.server_batches import make_batch, skip_stuck_view

NS = 1_000_000_000


@pytest.fixture
def db(pg_database: str) -> Iterator[Database]:
    import psycopg

    schema = "cluster_feed"
    with psycopg.connect(pg_database.replace("+psycopg", ""), autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        conn.execute(f'CREATE SCHEMA "{schema}"')
    d = connect(f"{pg_database}?options=-csearch_path%3D{schema}")
    migrate(d)
    yield d
    d.dispose()


def _job(db: Database, name: str) -> int:
    with db.write() as session, session.begin():
        job = Job(name=name, attempt=0, first_seen_ns=1, last_seen_ns=1, status="running")
        session.add(job)
        session.flush()
        return int(job.id)


def _body(rank: int) -> bytes:
    return batch_body(make_batch([s for s in skip_stuck_view() if s.rank == rank]))[0]


def _add(session: Session, job_id: int, rank: int, received_ns: int) -> int:
    return store.add_feed(session=session, job_ids=[job_id], body=_body(rank), received_ns=received_ns)[
        job_id
    ]


def _ranks(got: dict[int, list[Snapshot]], job_id: int) -> list[int]:
    return [s.rank for s in got.get(job_id, [])]


def test_each_row_is_read_once_when_its_transaction_commits_whatever_the_id_order(db: Database) -> None:
    job_id = _job(db, "skip")
    jobs = {job_id: ("skip", 0)}
    cluster = Cluster(db=db, clock=time.time_ns, on_db_error=lambda: None)
    with db.read() as session:
        session.connection(execution_options={"isolation_level": "REPEATABLE READ"})
        cluster.mark_seen(session, job_id)  # as a takeover's rebuild does: nothing before this
    assert cluster.read(jobs) == {}

    # A slow transaction takes the lower feed id and commits last; its stamp is old (a commit
    # that took a minute): a reader looking back over a time window would never see it.
    slow = db.write()
    slow.begin()
    slow_id = _add(slow, job_id, 0, time.time_ns() - 60 * NS)
    with db.write() as session, session.begin():
        fast_id = _add(session, job_id, 1, time.time_ns())
    assert slow_id < fast_id
    assert _ranks(cluster.read(jobs), job_id) == [1]
    assert cluster.read(jobs) == {}  # nothing new: the fast row is not read again
    slow.commit()
    slow.close()
    assert _ranks(cluster.read(jobs), job_id) == [0]  # read once it committed
    assert cluster.read(jobs) == {}

    # A rolled-back row never shows; rows of a job not asked for are not read.
    other = _job(db, "other")
    with db.write() as session:
        session.begin()
        _add(session, job_id, 2, time.time_ns())
        session.rollback()
    with db.write() as session, session.begin():
        _add(session, other, 2, time.time_ns())
        _add(session, job_id, 3, time.time_ns())
    assert _ranks(cluster.read(jobs), job_id) == [3]
    cluster.close()


def test_a_takeover_reads_only_what_its_rebuild_did_not_see(db: Database) -> None:
    job_id = _job(db, "skip")
    jobs = {job_id: ("skip", 0)}
    with db.write() as session, session.begin():
        _add(session, job_id, 0, time.time_ns())  # before the takeover: in the rebuild's read
    cluster = Cluster(db=db, clock=time.time_ns, on_db_error=lambda: None)
    pending = db.write()
    pending.begin()
    _add(pending, job_id, 1, time.time_ns())  # in flight while the rebuild reads
    with db.read() as session:
        session.connection(execution_options={"isolation_level": "REPEATABLE READ"})
        cluster.mark_seen(session, job_id)
    pending.commit()
    pending.close()
    assert _ranks(cluster.read(jobs), job_id) == [1]
    # A process that has no snapshot of the job (none taken yet) reads the whole feed of it.
    fresh = Cluster(db=db, clock=time.time_ns, on_db_error=lambda: None)
    assert sorted(_ranks(fresh.read(jobs), job_id)) == [0, 1]
    cluster.close()
    fresh.close()


def _digests(ranks: list[int], finished: int) -> DigestRequest:
    """One host's digests of job "big": each rank in group "0", `finished` collectives done."""
    n = len(ranks)
    block = DigestBlock(
        job="big", attempt=0, world_size=4, groups=["0"], rank=ranks, time_ns=[time.time_ns()] * n,
        n=[1] * n, g=[0] * n, entered=[finished] * n, finished=[finished] * n, open_since_ns=[0] * n,
        span=[-1] * n, span_fp=[0] * n,
    )  # fmt: skip
    return DigestRequest(host=f"host-{ranks[0]}", sent_ns=time.time_ns(), blocks=[block])


def test_an_owner_reads_the_digests_others_took_and_a_takeover_reads_all(db: Database) -> None:
    now = [0.0]

    def share() -> DigestShare:
        def db_error() -> None:
            raise AssertionError("no database error expected")

        return DigestShare(
            db=db, clock=time.time_ns, monotonic=lambda: now[0], on_db_error=db_error, first_round_s=1
        )

    def ranks(blocks: list[DigestBlock]) -> list[int]:
        return sorted(r for b in blocks for r in b.rank)

    owner, other = share(), share()
    key = {("big", 0)}
    other.add(_digests([0, 1], 5))
    owner.add(_digests([2, 3], 5))
    assert other.step(set()) == []  # writes what it took; owns nothing
    assert not owner.owns("big", 0)
    # Newly owned: the board starts from every row of the last seconds, its own ones included
    # (taken before it owned the job, so folded nowhere yet).
    assert ranks(owner.step(key)) == [0, 1, 2, 3]
    assert owner.owns("big", 0) and not other.owns("big", 0)
    now[0] += 1
    other.add(_digests([0, 1], 9))
    owner.add(_digests([2, 3], 9))  # the owner folds these at once (LiveDiagnosis.take_digests)
    other.step(set())
    got = owner.step(key)
    assert ranks(got) == [0, 1] and {b.finished[0] for b in got} == {9}
    # The owner still writes its own rows: the process taking the job over reads both.
    now[0] += 1
    owner.step(set())  # lost the job: writes what it took
    assert ranks(other.step(key)) == [0, 0, 1, 1, 2, 2, 3, 3]
