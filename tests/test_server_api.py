"""The server's HTTP surface in-process (server/app.py, server/access.py): health and the OpenAPI
document, and reads that require a token when told to."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.clock import FakeClock
from tests.support.server_app import AUTH, Server, make_server


@pytest.fixture
def server(database_url: str, clock: FakeClock) -> Iterator[Server]:
    """A server on a fresh database (SQLite file or PostgreSQL schema)."""
    with make_server(database_url, clock) as srv:
        yield srv


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
