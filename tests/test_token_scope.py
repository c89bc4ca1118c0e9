"""Token scoping: a collector token bound to a host (and optionally to job name patterns) may write
only that host's ranks; a batch for another host's ranks or another job is refused with 403 and a
reason, and nothing of it is stored. Unscoped tokens (made before scopes, or `--any-host`) keep
working. In-process on real SQLite and PostgreSQL, through the real ingest route.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest

from flightdeck.server import store
from flightdeck.server.ingest import hash_token
from tests.conftest import FakeClock
from tests.test_server_api import Server, _nixl_sample, make_server
from tests.test_server_support import body, make_batch, scenario_dumps, snapshots

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
    # Claiming to be the right collector does not help: the ranks say where they run.
    moved = [replace(s, host="node-9") if s.rank == 2 else s for s in snaps]
    r = _post(server, SCOPED, moved, collector_host=HOST)
    assert r.status_code == 403
    assert "is bound to host 'vm'; snapshots[" in r.json()["detail"]
    assert "rank 2) is of host 'node-9'" in r.json()["detail"]
    # A snapshot without a host is the collector's.
    anonymous = [replace(s, host=None) for s in snaps]
    assert _post(server, SCOPED, anonymous, collector_host="node-9").status_code == 403
    r = _post(server, SCOPED, [], collector_host=HOST, nixl=[_nixl_sample("r1", 5)])
    assert r.status_code == 403 and "nixl[0] is of host 'node-1'" in r.json()["detail"]
    assert server.counts()["entries"] == 0 and server.counts()["jobs"] == 0
    assert _rejects(server) == 4

    r = _post(server, SCOPED, snaps, collector_host=HOST)
    assert r.status_code == 200, r.text
    assert server.counts()["entries"] > 0


def test_job_patterns_limit_the_jobs(server: Server) -> None:
    snaps = _healthy()
    other = [replace(s, job="prod-train") for s in snaps]
    r = _post(server, JOBS, [*snaps[:2], *other[:1]], collector_host=HOST)
    assert r.status_code == 403
    assert r.json()["detail"] == (
        "token 'node-vm-healthy' may write jobs healthy_*, smoke; snapshots[2] is of job 'prod-train'"
    )
    assert server.counts()["jobs"] == 0
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
