"""Token scoping: a collector token bound to a host (and optionally to job name patterns) may write
only that host's ranks; a batch from another host's collector is refused whole with 403 and a
reason, nothing of it stored; a snapshot (or NIXL sample) of another host or job in a batch of the
right collector is refused alone (422 naming it, the rest of the batch applied), as an invalid one. Unscoped tokens (made before scopes, or `--any-host`) keep
working. In-process on real SQLite and PostgreSQL, through the real ingest route.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest

from flightdeck.server import store
from flightdeck.server.ingest import hash_token
from tests.support.clock import FakeClock
from tests.support.server_app import Server, make_server, nixl_wire_sample
from tests.support.server_batches import body, make_batch, scenario_dumps, snapshots

#: The committed dumps were recorded on host "vm".
HOST = "vm"
SCOPED = "fdk_scoped-token-for-vm"
JOBS = "fdk_scoped-token-for-vm-and-healthy-jobs"


@pytest.fixture
def server(database_url: str, clock: FakeClock) -> Iterator[Server]:
    """A server with an unscoped token (TOKEN), one bound to host vm, one to vm and healthy_*."""
    srv = make_server(database_url, clock)
    with srv.svc.db.write() as session, session.begin():
        store.create_token(
            session=session, name="node-vm", token_hash=hash_token(SCOPED), now_ns=clock(), host=HOST
        )
        store.create_token(
            session=session,
            name="node-vm-healthy",
            token_hash=hash_token(JOBS),
            now_ns=clock(),
            host=HOST,
            job_patterns=["healthy_*", "smoke"],
        )
    yield srv
    srv.svc.close()


def _post(srv: Server, token: str, snaps: list[Any], **kw: Any) -> Any:
    data, headers = body(make_batch(snaps, sent_at_ns=srv.clock.now_ns, **kw))
    return srv.client.post(
        "/api/v1/ingest", content=data, headers={**headers, "Authorization": f"Bearer {token}"}
    )


def _healthy() -> list[Any]:
    return snapshots([d for ds in scenario_dumps("healthy_4").values() for d in ds])


def _rejects(srv: Server) -> float | None:
    return srv.svc.registry.get_sample_value("flightdeck_ingest_rejects_total", {"reason": "scope"})


def test_a_host_bound_token_writes_its_host_only(server: Server) -> None:
    snaps = _healthy()
    assert {s.host for s in snaps} == {HOST}
    r = _post(server, SCOPED, snaps, collector_host="node-9")
    assert r.status_code == 403
    assert r.json()["detail"] == (
        "token 'node-vm' is bound to host 'vm'; this batch comes from collector host 'node-9'"
    )
    # A snapshot without a host is the collector's.
    anonymous = [replace(s, host=None) for s in snaps]
    assert _post(server, SCOPED, anonymous, collector_host="node-9").status_code == 403
    assert server.counts()["entries"] == 0 and server.counts()["jobs"] == 0
    # From the right collector, the ranks still say where they run: another host's is refused
    # alone (a dump copied from another node), the others are stored.
    moved = [replace(s, host="node-9") if s.rank == 2 else s for s in snaps]
    r = _post(server, SCOPED, moved, collector_host=HOST)
    assert r.status_code == 422, r.text
    answer = r.json()
    assert answer["applied"] is True
    assert answer["refused_count"] == sum(s.rank == 2 for s in snaps) > 0
    for x in answer["refused"]:
        assert x["rank"] == 2, x
        assert x["reason"].endswith("is bound to host 'vm'; the snapshot is of host 'node-9'"), x
    assert _ranks(server, "healthy_4") == {0, 1, 3}
    r = _post(server, SCOPED, [], collector_host=HOST, nixl=[nixl_wire_sample("r1", 5)])
    assert r.status_code == 422 and r.json()["applied"] is False
    assert "batch.nixl[0]: token 'node-vm' is bound to host 'vm'; the sample is of host 'node-1'" in r.text
    assert _rejects(server) == 4

    r = _post(server, SCOPED, snaps, collector_host=HOST)
    assert r.status_code == 200, r.text
    assert _ranks(server, "healthy_4") == {0, 1, 2, 3}


def _ranks(srv: Server, job: str) -> set[int]:
    """The ranks of `job` with stored entries."""
    r = srv.client.get(f"/api/v1/jobs/{job}/timeline?limit=10000")
    assert r.status_code == 200, r.text
    return {e["rank"] for e in r.json()["entries"]}


def test_job_patterns_limit_the_jobs(server: Server) -> None:
    snaps = _healthy()
    other = [replace(s, job="prod-train") for s in snaps]
    r = _post(server, JOBS, [*snaps[:2], *other[:1]], collector_host=HOST)
    assert r.status_code == 422, r.text
    assert r.json()["refused"] == [
        {
            "snapshot": 2,
            "job": "prod-train",
            "attempt": 0,
            "rank": other[0].rank,
            "reason": "batch.snapshots[2]: token 'node-vm-healthy' may write jobs healthy_*, smoke; "
            "the snapshot is of job 'prod-train'",
        }
    ]
    with server.svc.db.read() as session:
        assert [j.name for j in store.list_jobs(session=session)] == ["healthy_4"]
    assert (
        _post(server, JOBS, [replace(s, job="smoke") for s in snaps], collector_host=HOST).status_code == 200
    )
    assert _post(server, JOBS, snaps, collector_host=HOST).status_code == 200
    with server.svc.db.read() as session:
        assert sorted(j.name for j in store.list_jobs(session=session)) == ["healthy_4", "smoke"]


def test_unscoped_tokens_keep_working(server: Server) -> None:
    # make_server's token has no scope (as every token made before scopes existed).
    r = server.push(_healthy(), collector_host="anywhere")
    assert r.status_code == 200
    assert _rejects(server) == 0
